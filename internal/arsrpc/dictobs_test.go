package arsrpc

import (
	"slices"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/rlhub/rlhub/internal/ars"
	"github.com/rlhub/rlhub/internal/env"
	"github.com/rlhub/rlhub/internal/env/dictreach"
	pb "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// A Dict-observation env (the built-in DictReach-v0) trains with V2's
// per-key filters: the policy carries the key layout, and the filters'
// statistics and θ are identical with 1, 2 and 3 workers and to the
// single-process run.
func TestDictObservationFiltersIdenticalAcrossWorkerCounts(t *testing.T) {
	spec := &pb.ARSRunSpec{Env: dictreach.Name, Seed: 5, Version: "V2", Directions: 6,
		StepSize: 0.02, Noise: 0.03, EvalEvery: 2, EvalEpisodes: 2, MaxIterations: 4}
	ref := localReference(t, spec)
	keys := []env.ObsKey{{Name: "goal", Dim: 2}, {Name: "position", Dim: 2}, {Name: "velocity", Dim: 2}}
	refKeys := ref.Stats().ByKey(keys)
	for n := 1; n <= 3; n++ {
		p, _ := distributed(t, spec, n, Config{})
		if !ars.SameObsKeys(p.ObsKeys, keys) {
			t.Fatalf("%d workers: policy keys %v", n, p.ObsKeys)
		}
		if !slices.Equal(p.Theta, ref.Theta()) {
			t.Errorf("%d workers: θ differs from the single-process run", n)
		}
		for i, k := range p.Stats.ByKey(p.ObsKeys) {
			r := refKeys[i]
			if k.Name != r.Name || k.Count != r.Count || !slices.Equal(k.Mean, r.Mean) || !slices.Equal(k.M2, r.M2) {
				t.Errorf("%d workers: filter %q differs: %+v vs %+v", n, k.Name, k, r)
			}
		}
	}
	// The keys' scales differ (goal in [-3, 3], position near 0 at the
	// start, velocity from 0): each key's filter has its own statistics.
	sd := map[string][]float64{}
	for _, k := range refKeys {
		sd[k.Name] = k.Std()
		if k.Count < 2 {
			t.Fatalf("filter %q saw %v states", k.Name, k.Count)
		}
	}
	if !(sd["goal"][0] > 2*sd["velocity"][0]) {
		t.Errorf("goal std %v, velocity std %v: keys not told apart", sd["goal"], sd["velocity"])
	}

	// An env_spec whose keys disagree with the built-in's is refused, and
	// for an env the hub does not know the keys must sum to obs_dim.
	bad := proto.Clone(spec).(*pb.ARSRunSpec)
	bad.EnvSpec = &pb.ARSEnvSpec{ObsDim: 6, ActDim: 2, ObsKeys: []*pb.ARSObsKey{{Name: "position", Dim: 2}, {Name: "goal", Dim: 2}, {Name: "velocity", Dim: 2}}}
	if _, _, err := Normalise(bad); err == nil {
		t.Error("mismatched keys accepted")
	}
	for name, ks := range map[string][]*pb.ARSObsKey{
		"short":     {{Name: "a", Dim: 1}},
		"duplicate": {{Name: "a", Dim: 1}, {Name: "a", Dim: 1}},
		"empty":     {{Name: "", Dim: 2}},
		"zero dim":  {{Name: "a", Dim: 0}, {Name: "b", Dim: 2}},
	} {
		user := &pb.ARSRunSpec{Env: "user/Dict-v0", EnvSpec: &pb.ARSEnvSpec{ObsDim: 2, ActDim: 1, ObsKeys: ks}, MaxIterations: 1}
		if _, _, err := Normalise(user); err == nil {
			t.Errorf("%s keys accepted", name)
		}
	}
	user := &pb.ARSRunSpec{Env: "user/Dict-v0", EnvSpec: &pb.ARSEnvSpec{ObsDim: 3, ActDim: 1, ObsKeys: []*pb.ARSObsKey{{Name: "b", Dim: 1}, {Name: "a", Dim: 2}}}, MaxIterations: 1}
	if _, cfg, err := Normalise(user); err != nil || !ars.SameObsKeys(cfg.Spec.ObsKeys, []env.ObsKey{{Name: "b", Dim: 1}, {Name: "a", Dim: 2}}) {
		t.Errorf("user dict env: %v, keys %v", err, cfg.Spec.ObsKeys)
	}
}
