package relay

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/testkit"
	"github.com/rlhub/rlhub/internal/wsync"
	"github.com/rlhub/rlhub/internal/wsync/shm"
	"github.com/rlhub/rlhub/internal/wsync/wsynctest"
)

func TestMain(m *testing.M) {
	// TestRelayProcessKilled re-executes this binary as a relay process.
	if os.Getenv(childEnv) == "relay" {
		os.Exit(runRelayChild())
	}
	goleak.VerifyTestMain(m)
}

// childEnv names the helper process a re-executed test binary runs.
const childEnv = "RLHUB_WSYNC_CHILD"

func quiet() *slog.Logger { return testkit.Logger() }

// hubFixture is a real gRPC server on 127.0.0.1:0 serving WeightSync over
// an in-memory store: the relay's upstream.
type hubFixture struct {
	st   *store.Memory
	svc  *wsync.Service
	addr string
}

func startHub(t testing.TB) *hubFixture {
	t.Helper()
	st, err := store.NewMemory(store.Config{})
	if err != nil {
		t.Fatal(err)
	}
	svc, err := wsync.NewService(wsync.ServiceConfig{Versions: st, Logger: testkit.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	h := &hubFixture{st: st, svc: svc}
	// Cleanups run last-in first-out: the service drains (ending its
	// streams) before the server stops, then the store closes.
	t.Cleanup(func() { svc.Close(); st.Close() })
	h.addr = testkit.ServeGRPC(t, nil, svc.Register)
	t.Cleanup(svc.Drain)
	return h
}

func (h *hubFixture) push(t testing.TB, v uint64, words int) { pushVersion(t, h.st, v, words) }

// pushVersion pushes version v of model "m", words float32s, to st and
// returns it.
func pushVersion(t testing.TB, st store.Store, v uint64, words int) *store.Snapshot {
	t.Helper()
	snap := wsynctest.Snap(t, "m", v, words)
	if _, err := st.Push(context.Background(), store.PushRequest{Name: "m", Version: v, Expect: store.ExpectAny, Blob: snap.Blob}); err != nil {
		t.Fatal(err)
	}
	return snap
}

func dial(t testing.TB, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// waitFor fails t if cond does not hold within 20s.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	testkit.Eventually(t, 20*time.Second, what, cond)
}

// waitSegment fails t if the segment at path does not hold version v
// within 20s.
func waitSegment(t testing.TB, path string, v uint64) {
	t.Helper()
	waitFor(t, fmt.Sprintf("the relay's segment at v%d", v), func() bool {
		r, err := shm.Open(shm.ReaderConfig{Path: path})
		if err != nil {
			return false
		}
		defer r.Close()
		s, err := r.GetIfNewer(context.Background(), 0)
		return err == nil && s != nil && s.Version == v
	})
}

// failoverCollector follows a Failover source in a goroutine.
type failoverCollector struct {
	f    *wsync.Failover
	recv *wsync.Receiver
}

func startFailoverCollector(t *testing.T, dialers ...wsync.Dialer) *failoverCollector {
	t.Helper()
	return startFailoverCollectorApply(t, wsynctest.Check, dialers...)
}

// startFailoverCollectorApply is startFailoverCollector with the
// collector's ApplyFunc.
func startFailoverCollectorApply(t *testing.T, apply wsync.ApplyFunc, dialers ...wsync.Dialer) *failoverCollector {
	t.Helper()
	f, err := wsync.NewFailover(wsync.FailoverConfig{Dialers: dialers, Backoff: 10 * time.Millisecond, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	c := &failoverCollector{f: f}
	c.recv, err = wsync.NewReceiver(wsync.ReceiverConfig{Source: f, Apply: apply, OnApplied: f.Running})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.recv.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
		f.Close()
	})
	return c
}
