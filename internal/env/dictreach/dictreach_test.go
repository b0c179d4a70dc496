package dictreach

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/rlhub/rlhub/internal/env"
)

func TestDictReach(t *testing.T) {
	e, err := env.Make(Name)
	if err != nil {
		t.Fatal(err)
	}
	sp := e.Spec()
	sum := 0
	for _, k := range sp.ObsKeys {
		sum += k.Dim
	}
	if sum != sp.ObsDim || len(sp.ObsKeys) != 3 || sp.ObsKeys[0].Name != "goal" {
		t.Fatalf("spec %+v", sp)
	}
	obs := e.Reset(rand.New(rand.NewPCG(1, 2)))
	for i, v := range obs {
		lim := [6]float64{3, 3, 0.5, 0.5, 0, 0}[i]
		if math.Abs(v) > lim {
			t.Fatalf("reset observation %v", obs)
		}
	}
	goal := [2]float64{obs[0], obs[1]}
	// An action beyond the bounds is clipped: 10 acts as 1.
	obs, r, term, trunc := e.Step([]float64{10, -10})
	if obs[4] != 0.2 || obs[5] != -0.2 || term || trunc {
		t.Fatalf("step: obs %v term %v trunc %v", obs, term, trunc)
	}
	dx, dy := obs[2]-goal[0], obs[3]-goal[1]
	if want := -0.1*math.Sqrt(dx*dx+dy*dy) - 0.02; math.Abs(r-want) > 1e-15 {
		t.Fatalf("reward %v, want %v", r, want)
	}
	for i := 2; i <= 100; i++ {
		_, _, term, trunc = e.Step([]float64{0, 0})
		if term || trunc != (i == 100) {
			t.Fatalf("step %d: term %v trunc %v", i, term, trunc)
		}
	}
}
