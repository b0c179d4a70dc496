package wsync

import (
	"context"
	"log/slog"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/rlhub/rlhub/internal/testkit"
	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// drainingHub takes the hello, then ends the stream UNAVAILABLE, as a hub
// does while it shuts down ("weight sync is shutting down").
type drainingHub struct {
	rlhubv1.UnimplementedWeightSyncServer
	attaches atomic.Int64
}

func (h *drainingHub) Attach(s grpc.BidiStreamingServer[rlhubv1.SyncClientMessage, rlhubv1.SyncServerMessage]) error {
	h.attaches.Add(1)
	if _, err := s.Recv(); err != nil {
		return err
	}
	time.Sleep(time.Millisecond)
	return status.Error(codes.Unavailable, "weight sync is shutting down")
}

// A source that opens and then fails before serving anything (a draining
// hub) is dialed again after the Failover's backoff, not at once: 366
// attaches in half a second at a 100 ms backoff before.
func TestFailoverBacksOffFromASourceThatNeverServes(t *testing.T) {
	h := &drainingHub{}
	addr := testkit.ServeGRPC(t, nil, func(g *grpc.Server) { rlhubv1.RegisterWeightSyncServer(g, h) })
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()

	f, err := NewFailover(FailoverConfig{Dialers: []Dialer{PushDialer("hub", conn, "c1", "m")},
		Backoff: 100 * time.Millisecond, Logger: testkit.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	if _, err := f.WaitNewer(ctx, 0); err == nil {
		t.Fatal("WaitNewer on a source that never serves returned a version")
	}
	// Backoff is 100ms: a backed-off Failover attaches some 5 times in 500ms.
	if n := h.attaches.Load(); n > 20 {
		t.Fatalf("%d attaches in 500ms with Backoff 100ms: a source that opens and then fails is redialed with no pause", n)
	}
}

// countHandler counts log records with a given message.
type countHandler struct {
	msg string
	n   *atomic.Int64
}

func (h countHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h countHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Message == h.msg {
		h.n.Add(1)
	}
	return nil
}
func (h countHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h countHandler) WithGroup(string) slog.Handler      { return h }

// A Failover on the data-plane dialer of a hub that is down (its dial is
// lazy and succeeds; the first poll fails at once) waits its backoff
// between tries: 14607 failed polls, each logged, in half a second before.
func TestFailoverBacksOffFromADeadHubOnTheDataPlane(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close() // the hub is down: connection refused

	var fails atomic.Int64
	f, err := NewFailover(FailoverConfig{Dialers: []Dialer{DataPlaneDialer("hub", addr, nil, nil, "c1", "m")},
		Backoff: 100 * time.Millisecond, Logger: slog.New(countHandler{"wsync: source failed, failing over", &fails})})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	if _, err := f.WaitNewer(ctx, 0); err == nil {
		t.Fatal("WaitNewer on a dead hub returned a version")
	}
	if n := fails.Load(); n > 20 {
		t.Fatalf("%d failed polls of a dead hub in 500ms with Backoff 100ms (each logged at Info)", n)
	}
}
