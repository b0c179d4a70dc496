//go:build linux

package wsync

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/store/storerpc"
	"github.com/rlhub/rlhub/internal/testkit"
	"github.com/rlhub/rlhub/internal/wire/bulk"
	"github.com/rlhub/rlhub/internal/wsync/wsynctest"
	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// dpHub is a hub's weight-sync service with its data-plane watch (unless
// noDP) and gRPC push stream on one port, over an in-memory store.
type dpHub struct {
	st   *store.Memory
	svc  *Service
	addr string
}

func startDPHub(t *testing.T, noDP bool) *dpHub {
	t.Helper()
	st, err := store.NewMemory(store.Config{})
	if err != nil {
		t.Fatal(err)
	}
	svc, err := NewService(ServiceConfig{Versions: st, NoDataPlane: noDP, Logger: testkit.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	ss, err := storerpc.New(storerpc.Config{Store: st, NoBulk: noDP, Logger: testkit.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	b := bulk.NewServer()
	svc.RegisterBulk(b)
	ss.RegisterBulk(b)
	addr := testkit.ServeGRPC(t, b.Listen(testkit.Listen(t)), func(g *grpc.Server) { svc.Register(g); ss.Register(g) })
	t.Cleanup(func() { ss.Drain(); svc.Drain(); b.Close(); svc.Close(); st.Close() })
	return &dpHub{st: st, svc: svc, addr: addr}
}

func (h *dpHub) push(t *testing.T, v uint64, words int) {
	t.Helper()
	snap := wsynctest.Snap(t, "m", v, words)
	if _, err := h.st.Push(context.Background(), store.PushRequest{Name: "m", Version: v, Expect: store.ExpectAny, Blob: snap.Blob}); err != nil {
		t.Fatal(err)
	}
}

// dpCollector is a DataPlaneClient with a Receiver following it.
type dpCollector struct {
	client  *DataPlaneClient
	cancel  context.CancelFunc
	done    chan error
	mu      sync.Mutex
	applied []uint64
}

func startDPCollector(t *testing.T, cfg DataPlaneConfig) *dpCollector {
	t.Helper()
	cl, err := NewDataPlaneClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	c := &dpCollector{client: cl, done: make(chan error, 1)}
	r, err := NewReceiver(ReceiverConfig{Source: cl, Start: cfg.Start,
		Apply: func(s *store.Snapshot) error {
			if err := wsynctest.Check(s); err != nil {
				return err
			}
			c.mu.Lock()
			c.applied = append(c.applied, s.Version)
			c.mu.Unlock()
			return nil
		},
		OnApplied: func(v uint64) { cl.Running(v) },
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c.cancel = cancel
	go func() { c.done <- r.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-c.done; cl.Close() })
	return c
}

func (c *dpCollector) versions() []uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.applied)
}

// Collectors following a hub over the data plane get every version, whole
// and in order, when they keep up; the hub counts what it sent and shows
// each collector at the version it runs.
func TestDataPlaneCollectorsGetEveryVersionInOrder(t *testing.T) {
	h := startDPHub(t, false)
	var cs []*dpCollector
	for _, id := range []string{"a", "b", "c"} {
		cs = append(cs, startDPCollector(t, DataPlaneConfig{Addr: h.addr, Conn: dial(t, h.addr), CollectorID: id, Model: "m", Logger: testkit.Logger()}))
	}
	const last = 6
	for v := uint64(1); v <= last; v++ {
		h.push(t, v, 50_000+int(v)) // sizes change: buffers are regrown
		for _, c := range cs {
			testkit.Eventually(t, 20*time.Second, "every collector at the new version", func() bool {
				got := c.versions()
				return len(got) > 0 && got[len(got)-1] == v
			})
		}
	}
	want := []uint64{1, 2, 3, 4, 5, 6}
	for i, c := range cs {
		if got := c.versions(); !slices.Equal(got, want) {
			t.Errorf("collector %d applied %v, want %v", i, got, want)
		}
		if tr := c.client.Transport(); tr != "dataplane" {
			t.Errorf("collector %d transport %q, want dataplane", i, tr)
		}
		if s := c.client.Skipped(); s != 0 {
			t.Errorf("collector %d: %d versions reported skipped, want 0", i, s)
		}
	}
	if st := h.svc.Stats(context.Background()); st.VersionsSent != 3*last {
		t.Errorf("hub sent %d versions, want %d", st.VersionsSent, 3*last)
	}
	testkit.Eventually(t, 20*time.Second, "status showing the collectors at the newest over the data plane", func() bool {
		st := h.svc.Lag(context.Background(), "m")
		if len(st) != 1 || len(st[0].Collectors) != 3 {
			return false
		}
		for _, c := range st[0].Collectors {
			if c.Version != last || c.Via != ViaDataPlane {
				return false
			}
		}
		return true
	})
}

// A collector that did not poll while versions landed gets the newest one
// and the skip is reported, not silent.
func TestDataPlaneSlowCollectorSkipsVisibly(t *testing.T) {
	h := startDPHub(t, false)
	cl, err := NewDataPlaneClient(DataPlaneConfig{Addr: h.addr, CollectorID: "slow", Model: "m", Logger: testkit.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx := context.Background()
	h.push(t, 1, 1000)
	s, err := cl.WaitNewer(ctx, 0)
	if err != nil || s.Version != 1 {
		t.Fatalf("first: %v, %v", s, err)
	}
	for v := uint64(2); v <= 5; v++ {
		h.push(t, v, 1000)
	}
	s, err = cl.WaitNewer(ctx, 1)
	if err != nil || s.Version != 5 {
		t.Fatalf("after 1: %v, %v; want version 5", s, err)
	}
	if err := wsynctest.Check(s); err != nil {
		t.Fatal(err)
	}
	if got := cl.Skipped(); got != 3 {
		t.Fatalf("skipped %d, want 3 (versions 2–4)", got)
	}
	// GetIfNewer: the store's data-plane pull, "not modified" as nil.
	if s, err := cl.GetIfNewer(ctx, 5); s != nil || err != nil {
		t.Fatalf("GetIfNewer(5) = %v, %v; want nil, nil", s, err)
	}
	h.push(t, 6, 1000)
	if s, err := cl.GetIfNewer(ctx, 5); err != nil || s.Version != 6 || wsynctest.Check(s) != nil {
		t.Fatalf("GetIfNewer(5) = %v, %v; want version 6 whole", s, err)
	}
}

// Against a hub without the data-plane watch (the method unregistered,
// or a bare gRPC server) the client follows the push stream instead, and
// still gets every version in order.
func TestDataPlaneFallsBackToThePushStream(t *testing.T) {
	for _, tc := range []struct {
		name string
		hub  func(t *testing.T) (addr string, push func(v uint64))
	}{
		{"method-unregistered", func(t *testing.T) (string, func(uint64)) {
			h := startDPHub(t, true)
			return h.addr, func(v uint64) { h.push(t, v, 2000) }
		}},
		{"no-data-plane", func(t *testing.T) (string, func(uint64)) {
			h := startHub(t)
			return h.addr, func(v uint64) { h.push(t, v, 2000) }
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr, push := tc.hub(t)
			c := startDPCollector(t, DataPlaneConfig{Addr: addr, Conn: dial(t, addr), CollectorID: "fb", Model: "m", Logger: testkit.Logger()})
			for v := uint64(1); v <= 3; v++ {
				push(v)
				testkit.Eventually(t, 20*time.Second, "the collector at the new version", func() bool {
					got := c.versions()
					return len(got) > 0 && got[len(got)-1] == v
				})
			}
			if got := c.versions(); !slices.Equal(got, []uint64{1, 2, 3}) {
				t.Fatalf("applied %v, want [1 2 3]", got)
			}
			if tr := c.client.Transport(); tr != "grpc" {
				t.Fatalf("transport %q, want grpc", tr)
			}
		})
	}
	// No fallback configured: a clear Unavailable, not a hang.
	h := startDPHub(t, true)
	cl, err := NewDataPlaneClient(DataPlaneConfig{Addr: h.addr, CollectorID: "x", Model: "m", Logger: testkit.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if _, err := cl.WaitNewer(context.Background(), 0); !errors.Is(err, errs.ErrUnavailable) {
		t.Fatalf("without a fallback: %v, want Unavailable", err)
	}
}

// A version cut off mid-body is an error, never a snapshot: the version
// the collector holds stays whole, and it asks again after it.
func TestDataPlaneTruncatedVersionIsAnError(t *testing.T) {
	const n = 300_000
	up := wsynctest.ServeScript(t, helloVersion, wsynctest.Whole(wsynctest.Snap(t, "m", 1, n)),
		wsynctest.Cut(wsynctest.Snap(t, "m", 2, n)), wsynctest.Whole(wsynctest.Snap(t, "m", 3, n)))
	ctx := context.Background()
	cl, err := NewDataPlaneClient(DataPlaneConfig{Addr: up.Addr, CollectorID: "t", Model: "m", Logger: testkit.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	v1, err := cl.WaitNewer(ctx, 0)
	if err != nil || v1.Version != 1 {
		t.Fatalf("first: %v, %v", v1, err)
	}
	if got, err := cl.WaitNewer(ctx, 1); !errors.Is(err, errs.ErrUnavailable) || got != nil {
		t.Fatalf("cut-off version: %v, %v; want nil and Unavailable", got, err)
	}
	if err := wsynctest.Check(v1); err != nil {
		t.Fatalf("the held version after the cut: %v", err)
	}
	v3, err := cl.WaitNewer(ctx, 1)
	if err != nil || v3.Version != 3 || wsynctest.Check(v3) != nil || wsynctest.Check(v1) != nil {
		t.Fatalf("after the cut: %v, %v; want version 3 whole with version 1 still whole", v3, err)
	}
	for i, want := range []uint64{0, 1, 1} {
		if a := testkit.Recv(t, up.Afters, 20*time.Second, "a poll"); a != want {
			t.Fatalf("poll %d after %d, want %d", i, a, want)
		}
	}
}

// Close ends a long poll in progress at once.
func TestDataPlaneCloseEndsAPoll(t *testing.T) {
	h := startDPHub(t, false)
	cl, err := NewDataPlaneClient(DataPlaneConfig{Addr: h.addr, CollectorID: "c", Model: "m", Logger: testkit.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { _, err := cl.WaitNewer(context.Background(), 0); errc <- err }()
	testkit.Eventually(t, 20*time.Second, "the poll to reach the hub", func() bool {
		st := h.svc.Lag(context.Background(), "m")
		return len(st) == 1 && len(st[0].Collectors) == 1
	})
	cl.Close()
	if err := testkit.Recv(t, errc, 3*time.Second, "WaitNewer to end after Close"); !errors.Is(err, errs.ErrUnavailable) {
		t.Fatalf("WaitNewer after Close: %v, want Unavailable", err)
	}
}

// helloVersion is a data-plane weight-sync watch request's "after": its
// SyncHello's version.
func helloVersion(hb []byte) (uint64, bool) {
	var hello rlhubv1.SyncHello
	if proto.Unmarshal(hb, &hello) != nil {
		return 0, false
	}
	return hello.Version, true
}

// A model deleted and pushed again, followed over the data plane (a
// Failover of DataPlaneDialer, as Go collectors on a cluster follow it):
// a collector that follows lives takes the new model's newest at once;
// before, the data-plane watch sent only versions newer than the one the
// collector ran, and it stayed on the deleted model's v5. One that does
// not ask keeps today's rule, and a new life at an older epoch than
// delivered (a deposed primary's) is never delivered.
func TestDataPlaneFollowsAModelDeletedAndPushedAgain(t *testing.T) {
	ctx := context.Background()
	h := startDPHub(t, false)
	for v := uint64(1); v <= 5; v++ {
		wsynctest.PushLife(t, h.st, v, 3, v)
	}
	follow := func(id string, lives bool) *livesRecorder {
		f, err := NewFailover(FailoverConfig{Dialers: []Dialer{DataPlaneDialer("dp", h.addr, nil, nil, id, "m")},
			FollowLives: lives, Backoff: 10 * time.Millisecond, Logger: testkit.Logger()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		return startLivesFollower(t, f, lives, nil)
	}
	lives, older := follow("lives", true), follow("older", false)
	waitFor(t, "both collectors at v5", func() bool { return lives.last().version == 5 && older.last().version == 5 })
	oldLife := lives.last().life
	if oldLife == 0 {
		t.Fatal("v5 came over the data plane with no life")
	}
	if err := h.st.Delete(ctx, "m"); err != nil {
		t.Fatal(err)
	}
	stale := wsynctest.PushLife(t, h.st, 1, 2, 101)
	fresh := wsynctest.PushLife(t, h.st, 2, 3, 102)
	waitFor(t, "the lives collector at the new life's v2", func() bool { return lives.last().blob == fresh })
	if got := lives.last(); got.life == oldLife || got.life == 0 || got.version != 2 || got.epoch != 3 {
		t.Fatalf("applied v%d epoch %d life %d (deleted life %d), want the new life's v2 at epoch 3", got.version, got.epoch, got.life, oldLife)
	}
	if lives.sawBlob(stale) {
		t.Fatal("the new life's v1 of epoch 2 was delivered after epoch 3")
	}
	if got := older.last(); got.version != 5 || got.life != oldLife {
		t.Fatalf("a collector not following lives applied v%d of life %d, want the deleted life's v5 (today's rule)", got.version, got.life)
	}
	var v6 string
	for v := uint64(3); v <= 6; v++ {
		v6 = wsynctest.PushLife(t, h.st, v, 3, 100+v)
	}
	waitFor(t, "both collectors at the new life's v6", func() bool { return lives.last().blob == v6 && older.last().blob == v6 })
}
