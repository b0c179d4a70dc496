package cli

import (
	"bufio"
	"encoding/json"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/rlhub/rlhub/internal/reducer"
	"github.com/rlhub/rlhub/internal/store/storerpc"
	"github.com/rlhub/rlhub/internal/tensor"
)

// newLoopBenchCmd is the hidden `rlhub bench-loop`: one learner of the
// learner-loop benchmark (scripts/bench_learner_loop.py) driven by the Go
// clients, so the Python client can be compared with it on the same hub in
// the same run. The gradient is a fixed nn.Linear(in, out)-shaped state
// dict (weight [out, in], bias [out]).
//
// Modes: "loop" pushes a gradient, then pulls the newest version if it is
// newer than the one it holds (into one reused buffer); "push" only
// pushes; "sync" pushes, then waits for a version newer than its base and
// takes it. It prints one JSON object per timed iteration (the first
// iteration is untimed).
func newLoopBenchCmd(g *globals) *cobra.Command {
	var hubAddr, model, mode, id string
	var in, out, iters int
	var ready bool
	cmd := &cobra.Command{
		Use:    "bench-loop --hub ADDR --model M --mode loop|push|sync",
		Short:  "One Go learner of the learner-loop benchmark (benchmarking)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if mode != "loop" && mode != "push" && mode != "sync" {
				return fmt.Errorf("--mode %q: want loop, push or sync", mode)
			}
			ctx := cmd.Context()
			rc, err := reducer.NewClient(reducer.ClientConfig{Hub: hubAddr, ClientID: id})
			if err != nil {
				return err
			}
			defer rc.Close()
			sc, err := storerpc.NewClient(storerpc.ClientConfig{Addr: hubAddr})
			if err != nil {
				return err
			}
			defer sc.Close()
			w := make([]float32, in*out)
			b := make([]float32, out)
			for i := range w {
				w[i] = 1e-6 * float32(i%7)
			}
			grads, err := tensor.NewStateDict(
				tensor.FromFloat32s("weight", []int64{int64(out), int64(in)}, w),
				tensor.FromFloat32s("bias", []int64{int64(out)}, b))
			if err != nil {
				return err
			}
			snap, err := sc.Get(ctx, model, 0)
			if err != nil {
				return err
			}
			base := snap.Version
			buf := make([]byte, len(snap.Blob))
			enc := json.NewEncoder(g.stdout)
			for i := range iters + 1 {
				if i == 1 && ready { // after one untimed iteration: start on a line from stdin
					fmt.Fprintln(g.stdout, "ready")
					if _, err := bufio.NewReader(cmd.InOrStdin()).ReadString('\n'); err != nil {
						return fmt.Errorf("waiting for the start: %w", err)
					}
				}
				t0 := time.Now()
				if _, err := rc.PushGrad(ctx, model, base, grads); err != nil {
					return fmt.Errorf("push: %w", err)
				}
				t1 := time.Now()
				pulled := 0
				switch mode {
				case "loop":
					s, err := sc.GetIfNewerInto(ctx, model, base, buf)
					if err != nil {
						return fmt.Errorf("pull: %w", err)
					}
					if s != nil {
						base, pulled = s.Version, len(s.Blob)
					}
				case "sync":
					s, err := sc.WaitNewer(ctx, model, base)
					if err != nil {
						return fmt.Errorf("wait: %w", err)
					}
					base, pulled = s.Version, len(s.Blob)
				}
				t2 := time.Now()
				if i == 0 {
					continue
				}
				if err := enc.Encode(map[string]any{"push_start": t0.UnixNano(), "push_end": t1.UnixNano(),
					"end": t2.UnixNano(), "version": base, "pulled": pulled}); err != nil {
					return err
				}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&hubAddr, "hub", "127.0.0.1:7470", "hub address")
	f.StringVar(&model, "model", "", "model name (registered with the reducer)")
	f.StringVar(&mode, "mode", "loop", "loop, push or sync")
	f.StringVar(&id, "id", "", "client id")
	f.IntVar(&in, "in", 1000, "input features of the nn.Linear-shaped gradient")
	f.IntVar(&out, "out", 1000, "output features")
	f.IntVar(&iters, "iters", 100, "iterations")
	f.BoolVar(&ready, "ready", false, "after one untimed iteration print \"ready\" and wait for a line on stdin")
	cmd.MarkFlagRequired("model")
	return cmd
}
