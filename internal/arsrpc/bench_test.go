package arsrpc

import (
	"context"
	"fmt"
	"testing"
	"time"

	pb "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// BenchmarkIteration measures one ARS iteration end to end over gRPC on
// loopback (hub + in-process workers): lease, policy, rollouts, report,
// update, publish to the store. With CartPole's cheap steps the figure is
// mostly coordination; env-steps/s and the per-iteration cost are
// reported, never asserted.
func BenchmarkIteration(b *testing.B) {
	for _, dirs := range []uint32{16, 256} {
		for _, n := range []int{1, 2} {
			b.Run(fmt.Sprintf("directions=%d/workers=%d", dirs, n), func(b *testing.B) {
				benchIteration(b, Config{}, dirs, n)
			})
		}
	}
}

// BenchmarkIterationStateWrites is BenchmarkIteration without and with
// the durable run state (DataDir: a progress-log append and a state.json
// replace, both fsynced, per iteration), side by side in one run.
func BenchmarkIterationStateWrites(b *testing.B) {
	for _, dirs := range []uint32{16, 256} {
		for _, state := range []string{"memory", "disk"} {
			b.Run(fmt.Sprintf("directions=%d/state=%s", dirs, state), func(b *testing.B) {
				cfg := Config{}
				if state == "disk" {
					cfg.DataDir = b.TempDir()
				}
				benchIteration(b, cfg, dirs, 2)
			})
		}
	}
}

func benchIteration(b *testing.B, cfg Config, dirs uint32, n int) {
	h := startHub(b, cfg)
	stop := workers(b, h.addr, n)
	client := pb.NewARSClient(dial(b, h.addr))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	spec := &pb.ARSRunSpec{Env: "CartPole-v1", Seed: 1, Directions: dirs, Top: dirs / 2,
		EvalEvery: 1 << 30, MaxIterations: uint32(b.N)}
	b.ResetTimer()
	start, err := client.StartRun(ctx, &pb.ARSStartRunRequest{Spec: spec})
	if err != nil {
		b.Fatal(err)
	}
	prog := watch(b, ctx, client, start.RunId)
	b.StopTimer()
	steps := prog[len(prog)-1].Steps
	b.ReportMetric(float64(steps)/b.Elapsed().Seconds(), "env-steps/s")
	b.ReportMetric(float64(steps)/float64(b.N), "env-steps/op")
	var tasks int64
	for _, s := range stop() {
		tasks += s.Tasks
	}
	b.ReportMetric(float64(tasks)/float64(b.N), "tasks/op")
}
