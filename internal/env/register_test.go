package env

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

type constEnv struct{ obs []float64 }

func (c *constEnv) Spec() Spec                     { return Spec{Name: "test-const-v0", ObsDim: 1, ActDim: 1} }
func (c *constEnv) Reset(rng *rand.Rand) []float64 { return c.obs }
func (c *constEnv) Step(a []float64) ([]float64, float64, bool, bool) {
	return c.obs, a[0], false, false
}

func TestRegisterLookup(t *testing.T) {
	Register("test-const-v0", func() (Env, error) { return &constEnv{obs: []float64{1}}, nil })
	ctor, ok := Lookup("test-const-v0")
	if !ok {
		t.Fatal("Lookup after Register: not found")
	}
	e, err := ctor()
	if err != nil {
		t.Fatal(err)
	}
	if _, r, _, _ := e.Step([]float64{2.5}); r != 2.5 {
		t.Errorf("reward = %v, want 2.5", r)
	}
	if !slices.Contains(RegisteredNames(), "test-const-v0") {
		t.Errorf("RegisteredNames() = %v, missing test-const-v0", RegisteredNames())
	}
	if _, ok := Lookup("no-such-env-v9"); ok {
		t.Error("Lookup of an unregistered name succeeded")
	}
	defer func() {
		r := recover()
		if r == nil || !strings.Contains(r.(string), "twice") {
			t.Errorf("duplicate Register: recovered %v, want a panic naming the duplicate", r)
		}
	}()
	Register("test-const-v0", func() (Env, error) { return nil, nil })
}
