// Command fusion prints a hash of what ARS computes on the environments
// whose arithmetic is rlhub's own Go code (no Go math library function
// whose bits depend on GOAMD64): each environment's states and rewards
// under fixed actions, and short training runs (a linear policy,
// the paper's step and Adam with gradient clipping). TestNoFusedMultiplyAdd
// builds it at GOAMD64=v1 and v3 and requires the same output.
package main

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"slices"

	"github.com/rlhub/rlhub/internal/ars"
	"github.com/rlhub/rlhub/internal/env"
	_ "github.com/rlhub/rlhub/internal/env/dictreach"
	_ "github.com/rlhub/rlhub/internal/env/mjenv"
	"github.com/rlhub/rlhub/internal/optim"
)

type hash struct{ b []byte }

func (h *hash) add(xs ...float64) {
	for _, x := range xs {
		h.b = binary.LittleEndian.AppendUint64(h.b, math.Float64bits(x))
	}
}

func (h *hash) String() string { s := sha256.Sum256(h.b); return fmt.Sprintf("%x", s[:8]) }

func main() {
	for _, name := range []string{"LQR", "DictReach-v0", "Hopper-v5", "Ant-v5", "Humanoid-v5"} {
		if !slices.Contains(env.Names(), name) {
			continue // MuJoCo not built in
		}
		e, err := env.Make(name)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		sp := e.Spec()
		var eh hash
		eh.add(e.Reset(rand.New(rand.NewPCG(7, 7)))...)
		a := make([]float64, max(sp.ActDim, 1))
		for i := range 200 {
			for j := range a {
				a[j] = float64((i*7+j*3)%9-4) / 4 // exact, no math library
			}
			obs, r, term, trunc := e.Step(a)
			eh.add(obs...)
			eh.add(r)
			if term || trunc {
				eh.add(e.Reset(rand.New(rand.NewPCG(uint64(i), 1)))...)
			}
		}
		var th hash
		for _, c := range []struct {
			hidden []int
			update ars.Update
		}{
			{nil, ars.Update{}},
			{nil, ars.Update{Optimizer: optim.Config{Kind: optim.Adam}, GradientMax: 0.5}},
		} {
			cfg := ars.Config{Env: name, Spec: sp, Seed: 3, Hidden: c.hidden, Update: c.update,
				Hyper:     ars.Hyper{Version: ars.V2t, Directions: 4, Top: 2, StepSize: 0.02, Noise: 0.05},
				EvalEvery: 2, EvalEpisodes: 2, MaxIterations: 3}
			tr, err := ars.RunLocal(cfg, e, func(r ars.Report) { th.add(r.EvalMean, r.EvalStd, r.TrainMean, r.Update.SigmaR) })
			if err != nil {
				fmt.Fprintln(os.Stderr, name, err)
				os.Exit(1)
			}
			th.add(tr.Theta()...)
			th.add(tr.Stats().Mean...)
			th.add(tr.Stats().M2...)
		}
		fmt.Printf("%s env %s train %s\n", name, &eh, &th)
		env.Close(e)
	}
}
