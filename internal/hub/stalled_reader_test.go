package hub

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/rlhub/rlhub/internal/metrics"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/store/storetest"
	"github.com/rlhub/rlhub/internal/testkit"
	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// loans is a store whose versions lent to readers (store.Lender) are
// counted until released.
type loans struct {
	store.Store
	out atomic.Int64
}

func (l *loans) track(snap *store.Snapshot, release func(), err error) (*store.Snapshot, func(), error) {
	if err != nil {
		return nil, nil, err
	}
	l.out.Add(1)
	var once sync.Once
	return snap, func() { once.Do(func() { l.out.Add(-1); release() }) }, nil
}

func (l *loans) Lend(ctx context.Context, name string, version uint64) (*store.Snapshot, func(), error) {
	return l.track(store.Borrow(ctx, l.Store, name, version))
}

func (l *loans) LendNewer(ctx context.Context, name string, after uint64) (*store.Snapshot, func(), error) {
	return l.track(store.BorrowNewer(ctx, l.Store.(store.Waiter), name, after))
}

func (l *loans) WaitNewer(ctx context.Context, name string, after uint64) (*store.Snapshot, error) {
	return l.Store.(store.Waiter).WaitNewer(ctx, name, after)
}

// A client that opens a pull, a watch or a weight stream and stops
// reading held the version being sent for as long as it liked: gRPC's
// flow control blocks the hub's send, keepalive pings (answered by the
// client's transport whether or not it reads) keep the connection, and
// the store cannot recycle the version meanwhile — one per stream left
// unread. The hub ends such a stream once the version is not taken
// within Limits.BodyTimeout + its length at BodyMinRate, UNAVAILABLE
// naming the limit, releases the version, and counts the cut; a reader
// that reads is served the same version whole.
func TestStalledReaderIsCutOff(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// Larger than what gRPC's flow control and the sockets let through
	// unread, so the hub's send blocks; due in 7 s, which a reader that
	// reads meets even under the race detector on a loaded machine.
	const size = 40 << 20
	var lent *loans
	h, err := New(Config{Listen: "127.0.0.1:0", Logger: testkit.Logger(), MetricsListen: "127.0.0.1:0",
		Limits:    Limits{BodyTimeout: 2 * time.Second, BodyMinRate: 8 << 20},
		WrapStore: func(s store.Store) store.Store { lent = &loans{Store: s}; return lent }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	if err := h.Start(); err != nil {
		t.Fatal(err)
	}
	blob := storetest.Blob(t, 1, size/4)
	if _, err := h.Store().Push(ctx, store.PushRequest{Name: "m", Version: 1, Blob: blob}); err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(h.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	storeC, syncC := rlhubv1.NewModelStoreClient(conn), rlhubv1.NewWeightSyncClient(conn)

	// Each stream, and how many body bytes a message of it carries.
	type reader struct {
		name  string
		s     grpc.ClientStream
		recv  func() (int, error)
		first bool // the version's head was read
	}
	open := func() []*reader {
		pull, err := storeC.Pull(ctx, &rlhubv1.StorePullRequest{Model: "m"})
		if err != nil {
			t.Fatal(err)
		}
		watch, err := storeC.Watch(ctx, &rlhubv1.StoreWatchRequest{Model: "m"})
		if err != nil {
			t.Fatal(err)
		}
		attach, err := syncC.Attach(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := attach.Send(&rlhubv1.SyncClientMessage{Body: &rlhubv1.SyncClientMessage_Hello{Hello: &rlhubv1.SyncHello{
			CollectorId: "stalled", Model: "m"}}}); err != nil {
			t.Fatal(err)
		}
		pulled := func(m *rlhubv1.StorePullResponse, err error) (int, error) { return len(m.GetChunk().GetData()), err }
		synced := func(m *rlhubv1.SyncServerMessage, err error) (int, error) { return len(m.GetChunk().GetData()), err }
		return []*reader{
			{name: "pull", s: pull, recv: func() (int, error) { return pulled(pull.Recv()) }},
			{name: "watch", s: watch, recv: func() (int, error) { return pulled(watch.Recv()) }},
			{name: "weight stream", s: attach, recv: func() (int, error) { return synced(attach.Recv()) }},
		}
	}
	// readVersion reads one version's head and bytes (every stream here
	// sends a head, then chunks), or until the stream fails.
	readVersion := func(r *reader) (int, error) {
		got := 0
		for got < size {
			n, err := r.recv()
			if err != nil {
				return got, err
			}
			got += n
		}
		return got, nil
	}

	stalled := open()
	for _, r := range stalled {
		if _, err := r.recv(); err != nil { // the head: the version is lent now
			t.Fatalf("%s: %v", r.name, err)
		}
	}
	if n := lent.out.Load(); n != 3 {
		t.Fatalf("%d versions lent to the three streams, want 3", n)
	}
	// No reader reads: past the deadline (2 s + 5 s) every stream is
	// cut and its handler returns, releasing the version.
	deadline := time.Now().Add(30 * time.Second)
	for lent.out.Load() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d versions still lent to readers that stopped reading", lent.out.Load())
		}
		time.Sleep(20 * time.Millisecond)
	}
	// What they had not read is cut short by UNAVAILABLE naming the limit.
	for _, r := range stalled {
		got, err := readVersion(r)
		if st, _ := status.FromError(err); st.Code() != codes.Unavailable || !strings.Contains(st.Message(), "body-timeout") {
			t.Errorf("%s: the stalled stream ended with %v after %d of %d bytes, want UNAVAILABLE naming the body timeout", r.name, err, got, size)
		}
		if got >= size {
			t.Errorf("%s: the stalled reader got the whole version", r.name)
		}
	}
	m := scrapeMetrics(t, h.MetricsAddr(), "")
	if want := `rlhub_grpc_streams_cut_total{direction="sent"} 3`; !strings.Contains(m, want) {
		t.Errorf("/metrics lacks %s", want)
	}
	// The dashboard's Turned away panel says the same.
	resp, err := http.Get("http://" + h.MetricsAddr() + "/api/state")
	if err != nil {
		t.Fatal(err)
	}
	var st metrics.State
	err = json.NewDecoder(resp.Body).Decode(&st)
	resp.Body.Close()
	if err != nil || st.Refusals == nil || !slices.Contains(st.Refusals.StreamsCut, metrics.Count{Name: "sent", N: 3}) {
		t.Errorf("/api/state refusals %+v (%v), want 3 streams cut while sent", st.Refusals, err)
	}

	// Readers that read are served whole, and nothing is cut.
	for _, r := range open() {
		if got, err := readVersion(r); err != nil || got != size {
			t.Errorf("%s: a reader that reads got %d of %d bytes: %v", r.name, got, size, err)
		}
	}
	if m := scrapeMetrics(t, h.MetricsAddr(), ""); !strings.Contains(m, `rlhub_grpc_streams_cut_total{direction="sent"} 3`) {
		t.Errorf("a reader that read was cut")
	}
}
