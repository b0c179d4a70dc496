package testkit

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "1" {
		os.Exit(childMain(os.Args[1:]))
	}
	goleak.VerifyTestMain(Main(m))
}

// recorder is a testing.TB that records a failure instead of ending the
// test, so the helpers' own failures can be checked.
type recorder struct {
	testing.TB
	msg    string
	failed bool
}

func (r *recorder) Helper() {}
func (r *recorder) Fatalf(format string, args ...any) {
	r.failed = true
	r.msg = fmt.Sprintf(format, args...)
	panic(r)
}

func catch(r *recorder, f func()) {
	defer func() {
		if p := recover(); p != nil && p != r {
			panic(p)
		}
	}()
	f()
}

func TestServeGRPCServesAndStops(t *testing.T) {
	var addr string
	t.Run("serve", func(t *testing.T) {
		addr = ServeGRPC(t, nil, func(s *grpc.Server) { healthpb.RegisterHealthServer(s, health.NewServer()) })
		cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		resp, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
		if err != nil || resp.Status != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("health check = %v, %v", resp, err)
		}
	})
	// After the subtest's cleanup the port is closed.
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if _, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(false)); err == nil {
		t.Fatal("the server still answered after cleanup")
	}
}

func TestEventually(t *testing.T) {
	var n atomic.Int32
	Eventually(t, 10*time.Second, "the third poll", func() bool { return n.Add(1) >= 3 })
	if n.Load() != 3 {
		t.Fatalf("polled %d times, want 3", n.Load())
	}
	r := &recorder{TB: t}
	catch(r, func() { Eventually(r, 20*time.Millisecond, "never", func() bool { return false }) })
	if !r.failed || !strings.Contains(r.msg, "waiting for") {
		t.Fatalf("Eventually on a false condition: failed=%v msg=%q", r.failed, r.msg)
	}
}

func TestRecv(t *testing.T) {
	ch := make(chan int, 1)
	ch <- 7
	if got := Recv(t, ch, time.Second, "seven"); got != 7 {
		t.Fatalf("Recv = %d, want 7", got)
	}
	r := &recorder{TB: t}
	catch(r, func() { Recv(r, ch, 20*time.Millisecond, "nothing") })
	if !r.failed {
		t.Fatal("Recv on an empty channel did not fail")
	}
	close(ch)
	r = &recorder{TB: t}
	catch(r, func() { Recv(r, ch, time.Second, "closed") })
	if !r.failed {
		t.Fatal("Recv on a closed channel did not fail")
	}
}

// SilentHubCounting counts the connections it accepted.
func TestSilentHubCountsAccepts(t *testing.T) {
	addr, accepted := SilentHubCounting(t, []byte{1})
	for i := 1; i <= 2; i++ {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		// The hub writes its first byte once it counted the connection.
		if _, err := io.ReadFull(c, make([]byte, 1)); err != nil {
			t.Fatal(err)
		}
		if n := accepted(); n != i {
			t.Fatalf("after %d connections: %d accepted", i, n)
		}
	}
}
