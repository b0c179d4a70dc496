package dial_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/rlhub/rlhub/internal/cluster/clustertest"
	"github.com/rlhub/rlhub/internal/dial"
	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/hub"
	"github.com/rlhub/rlhub/internal/hub/hubtest"
	"github.com/rlhub/rlhub/internal/testkit"
	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// hung is a primary whose machine died with calls in flight: its
// connections stay open and answer nothing (no reset, as after a power
// loss), until the test ends.
type hung struct {
	calls atomic.Int64
	gone  chan struct{}
}

type hungStore struct {
	rlhubv1.UnimplementedModelStoreServer
	*hung
}

type hungReducer struct {
	rlhubv1.UnimplementedReducerServer
	*hung
}

func (h *hung) wait(ctx context.Context) error {
	h.calls.Add(1)
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-h.gone:
		return status.Error(codes.Unavailable, "test over")
	}
}

func (h hungStore) List(ctx context.Context, _ *rlhubv1.StoreListRequest) (*rlhubv1.StoreListResponse, error) {
	return nil, h.wait(ctx)
}

func (h hungReducer) Register(ctx context.Context, _ *rlhubv1.ReducerRegisterRequest) (*rlhubv1.ReducerRegisterResponse, error) {
	return nil, h.wait(ctx)
}

// TestElectionEndsWhatWasInFlightOnTheOldPrimary: a connection given etcd
// follows the election itself, not only after a call fails. The primary
// hangs with a write, a read and a data-plane request in flight (its
// connections answer nothing, as when its machine dies), and loses its
// term; a standby is elected. The write ends with Unavailable (its
// outcome unknown: sent once, never resent), the read is sent again to the
// new primary and answered, and the data-plane request's context ends
// with a *dial.PrimaryMovedError — each long before its own deadline
// (without the election watch, they would wait for it).
func TestElectionEndsWhatWasInFlightOnTheOldPrimary(t *testing.T) {
	e := clustertest.Start(t)
	c := ctx(t)
	h := &hung{gone: make(chan struct{})}
	hungAddr := testkit.ServeGRPC(t, nil, func(g *grpc.Server) {
		rlhubv1.RegisterModelStoreServer(g, hungStore{hung: h})
		rlhubv1.RegisterReducerServer(g, hungReducer{hung: h})
	})
	t.Cleanup(func() { close(h.gone) }) // runs before ServeGRPC's stop
	next := hubtest.Start(t, hub.Config{Logger: testkit.Logger()})
	members, t0, won, conn := electTwo(t, c, e, [2]string{hungAddr, next.Addr().String()})
	testkit.Eventually(t, 20*time.Second, "the connection to follow the first primary", func() bool {
		p, ok := dial.CurrentPrimary(conn)
		return ok && p.Addr == hungAddr && p.Epoch == t0.Epoch
	})

	// Deadlines far beyond the waits below: only the election ends them.
	long, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	write, read, plane := make(chan error, 1), make(chan error, 1), make(chan error, 1)
	go func() {
		_, err := rlhubv1.NewReducerClient(conn).Register(long, &rlhubv1.ReducerRegisterRequest{Model: "m"})
		write <- err
	}()
	go func() {
		_, err := rlhubv1.NewModelStoreClient(conn).List(long, &rlhubv1.StoreListRequest{})
		read <- err
	}()
	go func() {
		pctx, done := dial.PlaneContext(conn, long)
		<-pctx.Done()
		plane <- done(fmt.Errorf("bulk: %w", pctx.Err()))
	}()
	testkit.Eventually(t, 20*time.Second, "the write and the read in flight on the first primary", func() bool { return h.calls.Load() == 2 })

	members[0].Close() // its term ends; its server hangs on
	t1 := testkit.Recv(t, won, 20*time.Second, "the standby's election")
	if t1 == nil {
		t.Fatal("the standby was not elected")
	}
	err := testkit.Recv(t, write, time.Minute, "the write in flight on the old primary to end")
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "the primary moved") {
		t.Fatalf("the write in flight: %v, want Unavailable (the primary moved)", err)
	}
	if err := testkit.Recv(t, read, time.Minute, "the read in flight on the old primary to end"); err != nil {
		t.Fatalf("the read in flight: %v, want it answered by the new primary", err)
	}
	err = testkit.Recv(t, plane, time.Minute, "the data-plane request on the old primary to end")
	var pm *dial.PrimaryMovedError
	if !errors.As(err, &pm) || !errors.Is(err, errs.ErrUnavailable) || pm.From.Addr != hungAddr || pm.To.Addr != next.Addr().String() || pm.To.Epoch != t1.Epoch {
		t.Fatalf("the data-plane request: %v, want a PrimaryMovedError from %s to %s (epoch %d)", err, hungAddr, next.Addr(), t1.Epoch)
	}
	if n := h.calls.Load(); n != 2 {
		t.Fatalf("the old primary saw %d calls, want 2 (the write never resent)", n)
	}
}
