package cli

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/rlhub/rlhub/internal/safetensors"
	"github.com/rlhub/rlhub/internal/store"
)

// newModelBenchCmd is the hidden `rlhub model bench`: the Go client's push
// and pull timings of one safetensors file, measured in process (no process
// start-up or file I/O inside the timed region), so a client in another
// language can be compared against it on the same hub in the same run
// (scripts/bench_python_client.py).
func newModelBenchCmd(g *globals, client clientFunc) *cobra.Command {
	var name string
	var start uint64
	var reps, warmup int
	cmd := &cobra.Command{
		Use:    "bench --name NAME --start V [--reps N] [--warmup N] FILE.safetensors",
		Short:  "Time pushes and pulls of FILE with the Go client (benchmarking)",
		Hidden: true,
		Long: "bench pushes FILE as versions start..start+warmup+reps-1 of NAME and pulls each back,\n" +
			"timing every call after the first warmup pairs (which dial the hub and its data\n" +
			"plane, so that a long-lived client is measured), and prints one JSON object per\n" +
			"timed call: {\"op\", \"bytes\", \"seconds\"}.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if warmup < 0 || reps < 1 {
				return fmt.Errorf("--warmup %d, --reps %d: want --warmup ≥ 0 and --reps ≥ 1", warmup, reps)
			}
			blob, err := readAligned(args[0])
			if err != nil {
				return err
			}
			if _, err := safetensors.Decode(blob); err != nil {
				return fmt.Errorf("%s: %w", args[0], err)
			}
			c, ctx, done, err := client(cmd.Context())
			if err != nil {
				return err
			}
			defer done()
			enc := json.NewEncoder(g.stdout)
			for i := range warmup + reps {
				emit := func(op string, n int, d time.Duration) error {
					if i < warmup {
						return nil
					}
					return enc.Encode(map[string]any{"op": op, "bytes": n, "seconds": d.Seconds()})
				}
				v := start + uint64(i)
				t0 := time.Now()
				// The store takes ownership of Blob but never modifies it, so
				// the one buffer serves every push.
				if _, err := c.Push(ctx, store.PushRequest{Name: name, Version: v, Expect: store.ExpectAny, Blob: blob}); err != nil {
					return fmt.Errorf("push %s v%d: %w", name, v, err)
				}
				if err := emit("push", len(blob), time.Since(t0)); err != nil {
					return err
				}
				t0 = time.Now()
				snap, err := c.Get(ctx, name, 0)
				if err != nil {
					return fmt.Errorf("pull %s: %w", name, err)
				}
				if err := emit("pull", len(snap.Blob), time.Since(t0)); err != nil {
					return err
				}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&name, "name", "", "model name (required)")
	f.Uint64Var(&start, "start", 1, "first version pushed")
	f.IntVar(&reps, "reps", 3, "timed push/pull pairs")
	f.IntVar(&warmup, "warmup", 0, "untimed push/pull pairs first")
	cmd.MarkFlagRequired("name")
	return cmd
}
