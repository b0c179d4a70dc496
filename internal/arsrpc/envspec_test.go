package arsrpc

import (
	"errors"
	"testing"

	"github.com/rlhub/rlhub/internal/errs"
	pb "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// An environment the hub cannot make runs with the spaces its env_spec
// gives (Python workers on Gymnasium serve it); a built-in one must agree
// with an env_spec given with it.
func TestNormaliseEnvSpec(t *testing.T) {
	es := func(obs, discrete, act uint32) *pb.ARSEnvSpec {
		return &pb.ARSEnvSpec{ObsDim: obs, Discrete: discrete, ActDim: act}
	}
	for _, tc := range []struct {
		name     string
		env      string
		spec     *pb.ARSEnvSpec
		ok       bool
		obs, out int
		discrete bool
	}{
		{"builtin", "CartPole-v1", nil, true, 4, 2, true},
		{"builtin with matching spec", "CartPole-v1", es(4, 2, 0), true, 4, 2, true},
		{"builtin with other spec", "CartPole-v1", es(4, 3, 0), false, 0, 0, false},
		{"external discrete", "user/Grid-v0", es(6, 3, 0), true, 6, 3, true},
		{"external box", "user/Arm-v0", es(11, 0, 2), true, 11, 2, false},
		{"external without spec", "user/Arm-v0", nil, false, 0, 0, false},
		{"external both kinds", "user/Arm-v0", es(11, 2, 2), false, 0, 0, false},
		{"external no actions", "user/Arm-v0", es(11, 0, 0), false, 0, 0, false},
		{"external no observations", "user/Arm-v0", es(0, 2, 0), false, 0, 0, false},
		{"external huge", "user/Arm-v0", es(1<<16+1, 2, 0), false, 0, 0, false},
		{"no name", "", es(3, 2, 0), false, 0, 0, false},
	} {
		in := &pb.ARSRunSpec{Env: tc.env, Seed: 1, MaxIterations: 1, EnvSpec: tc.spec}
		s, cfg, err := Normalise(in)
		if !tc.ok {
			if !errors.Is(err, errs.ErrInvalid) {
				t.Errorf("%s: got %v, want an ErrInvalid", tc.name, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		a := cfg.Arch()
		if a.ObsDim != tc.obs || a.OutDim != tc.out || a.Discrete != tc.discrete || s.Env != tc.env {
			t.Errorf("%s: arch %+v of %q, want obs %d, out %d, discrete %v", tc.name, a, s.Env, tc.obs, tc.out, tc.discrete)
		}
	}
}
