package cli

import (
	"bufio"
	"fmt"
	"github.com/rlhub/rlhub/internal/wsync/shm"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/rlhub/rlhub/internal/safetensors"
	"github.com/rlhub/rlhub/internal/tensor"
)

// newShmWriterCmd is the hidden `rlhub sync shm-writer`: a shared-memory
// writer that publishes versions flat out, for tests and benchmarks of
// readers in other languages (python/tests/test_wsync.py). Every element of
// every tensor of version v is float32(v), so a reader can check each
// version it read byte for byte; v stays below 2^24, where float32 is exact.
func newShmWriterCmd(g *globals) *cobra.Command {
	var path, model, spec string
	var versions, start uint64
	var slots int
	var waitStdin bool
	cmd := &cobra.Command{
		Use:    "shm-writer --path P --model M --tensors a=4x8,b=8 --versions N",
		Short:  "Publish N versions into a shared-memory segment as fast as possible (testing)",
		Hidden: true,
		Long: "shm-writer creates the segment P (replacing one that exists), prints\n" +
			"\"ready PATH BYTES\", optionally waits for a line on stdin, publishes versions\n" +
			"start..start+N-1 without pausing (every element of version v is float32(v)),\n" +
			"prints \"done N versions in DURATION\" and, with --wait-stdin, keeps the segment\n" +
			"open until stdin ends. Closing removes the segment.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if start == 0 || start+versions > 1<<24 {
				return fmt.Errorf("--start %d --versions %d: versions must lie in [1, 2^24]", start, versions)
			}
			sd, err := parseF32Spec(spec)
			if err != nil {
				return err
			}
			layout, err := safetensors.Plan(sd, nil)
			if err != nil {
				return err
			}
			blob := layout.EncodeInto(tensor.AlignedBytes(int(layout.Size)))
			data, err := tensor.BytesAsFloat32s(blob[len(layout.Header):])
			if err != nil {
				return err
			}
			w, err := shm.Create(shm.Config{Path: path, Name: model, Capacity: int64(len(blob)), Slots: slots, Replace: true})
			if err != nil {
				return err
			}
			defer w.Close()
			fmt.Fprintf(g.stdout, "ready %s %d\n", path, len(blob))
			in := bufio.NewReader(cmd.InOrStdin())
			if waitStdin {
				if _, err := in.ReadString('\n'); err != nil && err != io.EOF {
					return err
				}
			}
			t0 := time.Now()
			for v := start; v < start+versions; v++ {
				val := float32(v)
				for i := range data {
					data[i] = val
				}
				if err := w.Write(v, 0, blob); err != nil {
					return fmt.Errorf("publish v%d: %w", v, err)
				}
			}
			d := time.Since(t0)
			fmt.Fprintf(g.stdout, "done %d versions in %s (%.0f versions/s, %.2f GB/s)\n", versions, d,
				float64(versions)/d.Seconds(), float64(versions)*float64(len(blob))/d.Seconds()/1e9)
			if waitStdin {
				io.Copy(io.Discard, in)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&path, "path", "", "segment file, e.g. /dev/shm/rlhub-test (required)")
	f.StringVar(&model, "model", "m", "model name in the segment header")
	f.StringVar(&spec, "tensors", "weight=256x1024,bias=256", "float32 tensors: name=DIMxDIM,...")
	f.Uint64Var(&versions, "versions", 1000, "how many versions to publish")
	f.Uint64Var(&start, "start", 1, "first version")
	f.IntVar(&slots, "slots", 2, "slots in the segment (2 = double buffer)")
	f.BoolVar(&waitStdin, "wait-stdin", false, "wait for a line on stdin before publishing, and for stdin to end before closing")
	cmd.MarkFlagRequired("path")
	return cmd
}

// parseF32Spec parses "a=4x8,b=8" into a state dict of zeroed F32 tensors.
func parseF32Spec(spec string) (*tensor.StateDict, error) {
	sd := tensor.MakeStateDict(0)
	for _, part := range strings.Split(spec, ",") {
		name, dims, ok := strings.Cut(part, "=")
		if !ok || name == "" {
			return nil, fmt.Errorf("--tensors %q: want name=DIMxDIM,...", spec)
		}
		var shape []int64
		for _, d := range strings.Split(dims, "x") {
			n, err := strconv.ParseInt(d, 10, 64)
			if err != nil || n < 0 || n > 1<<32 {
				return nil, fmt.Errorf("--tensors %q: bad dimension %q", spec, d)
			}
			shape = append(shape, n)
		}
		if err := sd.Add(tensor.NewF32(name, shape...)); err != nil {
			return nil, err
		}
	}
	return sd, nil
}
