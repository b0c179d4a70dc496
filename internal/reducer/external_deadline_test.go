package reducer

import (
	"context"
	"runtime"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/rlhub/rlhub/internal/optim"
	"github.com/rlhub/rlhub/internal/reduce"
	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// TestAuditExternalStepDeadlineCoversSend: a host attaches, is welcomed and
// then stops reading its stream (a wedged host process whose gRPC transport
// still answers pings). The step's gradient is larger than the stream's
// flow-control window, so the primary's stream.Send blocks. The step must
// still fail after ExternalStepTimeout (documented: "bounds one external
// step: waiting for a host ... plus the host's step"), counting the
// gradient dropped (publish_failed).
// TestExternalStepDeadlineCoversTheSend: a host that attached and then
// stops reading (its process wedged, its transport alive) blocked the
// step's Send on flow control with the model's step lock held: the step
// never timed out, the gradient was never counted, and the model took no
// step again. At ExternalStepTimeout the host is now detached, which ends
// the Send, and the step fails counted.
func TestExternalStepDeadlineCoversTheSend(t *testing.T) {
	old := ExternalStepTimeout
	ExternalStepTimeout = 2 * time.Second
	t.Cleanup(func() { ExternalStepTimeout = old })

	const rows = 1 << 17 // fc.weight is 2 MiB of float32
	e := newTestEnv(t, Config{Secondaries: 1, BatchSize: 1, MaxWait: time.Millisecond}, testLayout(rows))
	e.register(ModelConfig{Optimizer: optim.Config{Kind: External}, Reduction: "sum"})

	// The host: a real gRPC client with a fixed 64 KiB window (no BDP
	// growth), which says hello, reads the welcome and then never reads.
	conn, err := grpc.NewClient(e.addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	hctx, hcancel := context.WithCancel(context.Background())
	t.Cleanup(hcancel)
	s, err := rlhubv1.NewOptimizerHostClient(conn).Attach(hctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Send(&rlhubv1.HostMessage{Body: &rlhubv1.HostMessage_Hello{Hello: &rlhubv1.HostHello{Model: e.model}}}); err != nil {
		t.Fatal(err)
	}
	if m, err := s.Recv(); err != nil || m.GetWelcome() == nil {
		t.Fatalf("welcome: %v %v", m, err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := e.client("c", 3).PushGrad(ctx, "m", 1, gradFor(rows, "c", 1)); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	deadline := start.Add(ExternalStepTimeout + 10*time.Second)
	for time.Now().Before(deadline) {
		st := e.svc.Stats()
		if st.Total.Dropped[reduce.ReasonPublish] == 1 {
			t.Logf("step failed after %v", time.Since(start))
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	buf := make([]byte, 1<<20)
	n := runtime.Stack(buf, true)
	var stuck []string
	for _, g := range strings.Split(string(buf[:n]), "\n\n") {
		if strings.Contains(g, "externalStep") {
			stuck = append(stuck, g)
		}
	}
	t.Fatalf("ExternalStepTimeout is %v, yet %v later the step is still in flight (stats %+v); the stepping goroutine:\n%s",
		ExternalStepTimeout, time.Since(start).Round(time.Second), e.svc.Stats().Total, strings.Join(stuck, "\n"))
}
