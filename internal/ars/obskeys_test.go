package ars

import (
	"errors"
	"slices"
	"testing"

	"github.com/rlhub/rlhub/internal/env"
	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/safetensors"
)

// The key layout of a Dict observation travels with the policy; a bad one
// in a blob is refused; ByKey splits the flat statistics key by key.
func TestObsKeysRoundTripAndSplit(t *testing.T) {
	keys := []env.ObsKey{{Name: "b", Dim: 1}, {Name: "a", Dim: 3}}
	cfg := Config{Env: "user/Dict-v0", Spec: env.Spec{Name: "user/Dict-v0", ObsDim: 4, ActDim: 1, ObsKeys: keys},
		Hyper: Hyper{Version: V2, Directions: 2, StepSize: 0.1, Noise: 0.1}, MaxIterations: 1}
	tr, err := NewTrainer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range [][]float64{{1, 2, 3, 4}, {5, 6, 7, 8}, {0, 1, 0, 1}} {
		tr.stats.Push(x)
	}
	blob, err := tr.PolicyOf().Encode()
	if err != nil {
		t.Fatal(err)
	}
	p, err := DecodePolicy(blob)
	if err != nil {
		t.Fatal(err)
	}
	if !SameObsKeys(p.ObsKeys, keys) {
		t.Fatalf("decoded keys %v", p.ObsKeys)
	}
	by := p.Stats.ByKey(p.ObsKeys)
	if by[0].Name != "b" || !slices.Equal(by[0].Mean, []float64{2}) || by[1].Name != "a" || !slices.Equal(by[1].Mean, p.Stats.Mean[1:]) || by[1].Count != 3 {
		t.Fatalf("ByKey %+v", by)
	}
	f, _ := safetensors.Decode(blob)
	for _, bad := range []string{`[{"name":"b","dim":1}]`, `[{"name":"a","dim":2},{"name":"a","dim":2}]`, `not json`, `[{"name":"","dim":4}]`} {
		meta := map[string]string{}
		for k, v := range f.Metadata {
			meta[k] = v
		}
		meta["ars.obs_keys"] = bad
		if _, err := PolicyFromStateDict(f.Tensors, meta); !errors.Is(err, errs.ErrInvalid) {
			t.Errorf("obs_keys %s: %v", bad, err)
		}
	}
	cfg.Spec.ObsKeys = []env.ObsKey{{Name: "b", Dim: 2}}
	if _, err := NewTrainer(cfg); !errors.Is(err, errs.ErrInvalid) {
		t.Errorf("keys summing to 2 of 4: %v", err)
	}
}
