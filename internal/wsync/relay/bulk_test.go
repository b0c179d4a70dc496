//go:build linux

package relay

import (
	"bytes"
	"context"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/store/storerpc"
	"github.com/rlhub/rlhub/internal/testkit"
	"github.com/rlhub/rlhub/internal/wire/bulk"
	"github.com/rlhub/rlhub/internal/wsync"
	"github.com/rlhub/rlhub/internal/wsync/shm"
	"github.com/rlhub/rlhub/internal/wsync/wsynctest"
	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// dataPlaneHub serves a store's data-plane pulls and watches (storerpc on
// a bulk.Server) and weight sync's gRPC methods (for reports) on one port.
func dataPlaneHub(t *testing.T, st store.Store) string {
	t.Helper()
	addr, _, _ := dataPlaneHubOn(t, st, testkit.Listen(t))
	return addr
}

// dataPlaneHubOn is dataPlaneHub on lis; it returns the weight sync
// service too (its tracker: how collectors follow) and the data plane's
// server (its requests).
func dataPlaneHubOn(t *testing.T, st store.Store, lis net.Listener) (string, *wsync.Service, *bulk.Server) {
	t.Helper()
	ss, err := storerpc.New(storerpc.Config{Store: st, Logger: testkit.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	ws, err := wsync.NewService(wsync.ServiceConfig{Versions: st, Logger: testkit.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	b := bulk.NewServer()
	ss.RegisterBulk(b)
	addr := testkit.ServeGRPC(t, b.Listen(lis), func(g *grpc.Server) { ws.Register(g) })
	t.Cleanup(func() { ss.Drain(); ws.Drain(); b.Close(); ws.Close() })
	return addr, ws, b
}

func runRelay(t *testing.T, cfg Config) *Relay {
	t.Helper()
	relay, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- relay.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return relay
}

// A relay with UpstreamAddr follows the store's data-plane watch: each
// version lands in its segment (read back whole, CRC checked) and on its
// board, and its own version is reported upstream.
func TestRelayFollowsTheDataPlane(t *testing.T) {
	st, err := store.NewMemory(store.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	addr := dataPlaneHub(t, st)
	path := wsynctest.ShmPath(t)
	relay := runRelay(t, Config{Upstream: dial(t, addr), UpstreamAddr: addr, Model: "m", ID: "relay-dp",
		ShmPath: path, ReportEvery: 10 * time.Millisecond, Logger: quiet()})
	for v := uint64(1); v <= 4; v++ {
		snap := pushVersion(t, st, v, 100_000+int(v))
		waitFor(t, "the relay at the new version", func() bool { return relay.Newest() == v })
		r, err := shm.Open(shm.ReaderConfig{Path: path, Verify: true})
		if err != nil {
			t.Fatal(err)
		}
		got, err := r.GetIfNewer(context.Background(), 0)
		r.Close()
		if err != nil || got == nil || got.Version != v || !bytes.Equal(got.Blob, snap.Blob) {
			t.Fatalf("segment: %v, %v; want version %d whole", got, err, v)
		}
	}
	if relay.noBulk {
		t.Fatal("relay fell back to the push stream against a hub that serves the data plane")
	}
}

// Following the data plane into a segment, the relay copies a version for
// its stream collectors only when one waits or asks: with none attached
// the board stays empty; one that attaches gets the newest version (copied
// out of the segment, whole), and one that stays gets every later one.
func TestRelayCopiesForStreamCollectorsOnDemand(t *testing.T) {
	st, err := store.NewMemory(store.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	addr := dataPlaneHub(t, st)
	relay := runRelay(t, Config{Upstream: dial(t, addr), UpstreamAddr: addr, Model: "m", ID: "relay-lazy",
		ShmPath: wsynctest.ShmPath(t), Logger: quiet()})
	push := func(v uint64) *store.Snapshot { return pushVersion(t, st, v, 50_000+int(v)) }
	for v := uint64(1); v <= 3; v++ {
		push(v)
		waitFor(t, "the relay at the new version", func() bool { return relay.Newest() == v })
	}
	if s := relay.Board().Newest(); s != nil {
		t.Fatalf("with no stream collector the relay copied version %d to its board", s.Version)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cl, err := wsync.Attach(ctx, wsync.ClientConfig{Conn: dial(t, relay.Addr()), CollectorID: "stream", Model: "m"})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	got, err := cl.WaitNewer(ctx, 0)
	if err != nil || got.Version != 3 {
		t.Fatalf("a stream collector attaching at v3 got %v, %v", got, err)
	}
	if err := wsynctest.Check(got); err != nil {
		t.Fatal(err)
	}
	for v := uint64(4); v <= 6; v++ {
		want := push(v)
		got, err := cl.WaitNewer(ctx, v-1)
		if err != nil || got.Version != v || !bytes.Equal(got.Blob, want.Blob) {
			t.Fatalf("the attached stream collector got %v, %v; want version %d whole", got, err, v)
		}
	}
}

// A relay that receives a version cut off mid-stream never publishes it:
// the segment stays at the previous version, the relay asks again after
// that one, and the next whole version is published.
func TestRelayNeverPublishesAVersionCutOffMidStream(t *testing.T) {
	const n = 300_000
	snaps := map[uint64]*store.Snapshot{1: wsynctest.Snap(t, "m", 1, n), 2: wsynctest.Snap(t, "m", 2, n), 3: wsynctest.Snap(t, "m", 3, n)}
	up := wsynctest.ServeScript(t, watchAfter, wsynctest.Whole(snaps[1]), wsynctest.Cut(snaps[2]), wsynctest.Whole(snaps[3]))
	afters, cut := up.Afters, up.Cuts
	path := wsynctest.ShmPath(t)
	relay := runRelay(t, Config{Upstream: dial(t, up.Addr), UpstreamAddr: up.Addr, Model: "m",
		ShmPath: path, Backoff: time.Millisecond, Logger: quiet()})
	if a := testkit.Recv(t, afters, 20*time.Second, "first poll"); a != 0 {
		t.Fatalf("first poll after %d, want 0", a)
	}
	if a := testkit.Recv(t, afters, 20*time.Second, "second poll"); a != 1 {
		t.Fatalf("second poll after %d, want 1", a)
	}
	testkit.Recv(t, cut, 20*time.Second, "the cut-off version")
	if a := testkit.Recv(t, afters, 20*time.Second, "poll after the cut"); a != 1 {
		t.Fatalf("after the cut the relay asked for versions after %d, want 1 (version 2 must not count as had)", a)
	}
	waitFor(t, "version 3 at the relay", func() bool { return relay.Newest() == 3 })
	r, err := shm.Open(shm.ReaderConfig{Path: path, Verify: true})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	got, err := r.GetIfNewer(context.Background(), 0)
	if err != nil || got.Version != 3 || !bytes.Equal(got.Blob, snaps[3].Blob) {
		t.Fatalf("segment: %v, %v; want version 3 whole", got, err)
	}
}

// A collector following a write in progress on the relay's segment (a
// copying reader copies each piece as soon as the relay marks it final)
// never delivers a version the relay received cut off mid-stream: the
// relay aborts the slot, the follower drops what it copied, and it
// delivers the next whole version. The upstream holds each cut-off
// version half sent for a while, so the follower is copying it when the
// cut comes; over several rounds at least one such follow must have been
// abandoned.
func TestRelayFollowerNeverDeliversAVersionCutOffMidStream(t *testing.T) {
	const n = 400_000 // 1.6 MB: readers follow versions of 1 MiB and more
	const rounds = 5
	script := []wsynctest.Answer{wsynctest.Whole(wsynctest.Snap(t, "m", 1, n))}
	for k := uint64(1); k <= rounds; k++ {
		cut := wsynctest.Cut(wsynctest.Snap(t, "m", 2*k, n))
		cut.Hold = 200 * time.Millisecond
		script = append(script, cut, wsynctest.Whole(wsynctest.Snap(t, "m", 2*k+1, n)))
	}
	up := wsynctest.ServeScript(t, watchAfter, script...)
	path := wsynctest.ShmPath(t)
	relay := runRelay(t, Config{Upstream: dial(t, up.Addr), UpstreamAddr: up.Addr, Model: "m",
		ShmPath: path, Backoff: time.Millisecond, Logger: quiet()})
	waitFor(t, "version 1 at the relay", func() bool { return relay.Newest() == 1 })
	r, err := shm.Open(shm.ReaderConfig{Path: path, Verify: true}) // a copying reader follows by default
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	have := uint64(0)
	for have < 2*rounds+1 {
		s, err := r.WaitNewer(ctx, have)
		if err != nil {
			t.Fatalf("after v%d: %v", have, err)
		}
		if s.Version%2 == 0 || wsynctest.Check(s) != nil {
			t.Fatalf("the follower delivered v%d (%v); every even version was cut off", s.Version, wsynctest.Check(s))
		}
		have = s.Version
	}
	st := r.Stats()
	t.Logf("reader stats %+v", st)
	if st.Abandoned == 0 {
		t.Fatalf("the reader followed no cut-off write in %d rounds (stats %+v): the test did not test following", rounds, st)
	}
}

// watchAfter is a data-plane store watch request's "after".
func watchAfter(hb []byte) (uint64, bool) {
	var req rlhubv1.StoreWatchRequest
	if proto.Unmarshal(hb, &req) != nil {
		return 0, false
	}
	return req.After, true
}

// A relay that fell back to the push stream (its upstream had no data
// plane) asks for the data plane again once that stream ends: here the
// hub is replaced, at the same address, by one that serves it (an
// upgraded hub, a new primary). Before, the fallback lasted the relay's
// life, and a hub that hung up mid-handshake (going away) looked like one
// without a data plane.
func TestRelayAsksForTheDataPlaneAgain(t *testing.T) {
	st, err := store.NewMemory(store.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	push := func(v uint64) { pushVersion(t, st, v, 10_000) }
	// The first hub: weight sync's gRPC methods alone.
	ws1, err := wsync.NewService(wsync.ServiceConfig{Versions: st, Logger: testkit.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	lis := testkit.Listen(t)
	addr := lis.Addr().String()
	srv1 := grpc.NewServer()
	ws1.Register(srv1)
	served := make(chan struct{})
	go func() { defer close(served); _ = srv1.Serve(lis) }() // the owner: stopped below
	relay := runRelay(t, Config{Upstream: dial(t, addr), UpstreamAddr: addr, Model: "m", ID: "relay-again",
		ShmPath: wsynctest.ShmPath(t), ReportEvery: 10 * time.Millisecond, Backoff: 20 * time.Millisecond, Logger: quiet()})
	push(1)
	waitFor(t, "the relay at v1 over the push stream", func() bool { return relay.Newest() == 1 })
	via := func(ws *wsync.Service) string {
		for _, ms := range ws.Tracker().Status("m") {
			for _, c := range ms.Collectors {
				if c.ID == "relay-again" {
					return c.Via
				}
			}
		}
		return ""
	}
	if v := via(ws1); v == "relay/data-plane" {
		t.Fatalf("the first hub has no data plane, yet hears the relay via %s", v)
	}

	// The second hub, at the same address, with the data plane.
	ws1.Drain()
	srv1.Stop()
	<-served
	ws1.Close()
	_, ws2, _ := dataPlaneHubOn(t, st, testkit.ListenAt(t, addr))
	push(2)
	waitFor(t, "the relay at v2, following the new hub over the data plane", func() bool {
		return relay.Newest() == 2 && via(ws2) == "relay/data-plane"
	})
}

// TestRelayRefusesAnOlderEpoch: the upstream the relay follows answers
// v1 of epoch 5 (the primary), then v2 of epoch 1 (a deposed primary's,
// reached through a stale lookup), then v3 of epoch 5. The collectors'
// own clients refuse an epoch below one delivered; the relay published
// v2/e1 to its segment and board as newer. It refuses it now, asks again
// after v1, and publishes v3.
func TestRelayRefusesAnOlderEpoch(t *testing.T) {
	const n = 10_000
	v1, v2, v3 := wsynctest.Snap(t, "m", 1, n), wsynctest.Snap(t, "m", 2, n), wsynctest.Snap(t, "m", 3, n)
	v1.Epoch, v2.Epoch, v3.Epoch = 5, 1, 5
	up := wsynctest.ServeScript(t, watchAfter, wsynctest.Whole(v1), wsynctest.Whole(v2), wsynctest.Whole(v3))
	path := wsynctest.ShmPath(t)
	relay := runRelay(t, Config{Upstream: dial(t, up.Addr), UpstreamAddr: up.Addr, Model: "m",
		ShmPath: path, Backoff: time.Millisecond, Logger: quiet()})
	for _, want := range []uint64{0, 1, 1} { // after v2/e1, again after v1
		if a := testkit.Recv(t, up.Afters, 20*time.Second, "a poll"); a != want {
			t.Fatalf("the relay asked for versions after %d, want %d", a, want)
		}
	}
	waitFor(t, "version 3 at the relay", func() bool { return relay.Newest() == 3 })
	r, err := shm.Open(shm.ReaderConfig{Path: path, Verify: true})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	got, err := r.GetIfNewer(context.Background(), 0)
	if err != nil || got.Version != 3 || got.Epoch != 5 || !bytes.Equal(got.Blob, v3.Blob) {
		t.Fatalf("segment: %v, %v; want version 3 of epoch 5", got, err)
	}
}

// A relay following the data plane (UpstreamAddr) into a segment follows
// the upstream model's lives: deleted and pushed again from version 1, the
// new model's newest reaches the relay's push-stream collectors that
// follow lives at once (the segment cannot take a version not newer than
// its own: the board takes it, and the segment's older head is not copied
// back over it). Before, the watch asked only for versions newer than the
// relay's, and its collectors stayed on the deleted model's v5. An
// older-epoch life is still refused as a deposed primary's.
func TestRelayOnTheDataPlaneFollowsAModelDeletedAndPushedAgain(t *testing.T) {
	ctx := context.Background()
	st, err := store.NewMemory(store.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	addr := dataPlaneHub(t, st)
	push := func(v, epoch, fill uint64) string {
		t.Helper()
		snap := wsynctest.Snap(t, "m", fill, 64)
		if _, err := st.Push(ctx, store.PushRequest{Name: "m", Version: v, Epoch: epoch, Expect: store.ExpectAny, Blob: snap.Blob}); err != nil {
			t.Fatal(err)
		}
		return string(snap.Blob)
	}
	for v := uint64(1); v <= 5; v++ {
		push(v, 3, v)
	}
	relay := runRelay(t, Config{Upstream: dial(t, addr), UpstreamAddr: addr, Model: "m", ID: "relay-dp-lives",
		ShmPath: wsynctest.ShmPath(t), Logger: quiet()})
	local := startLivesCollector(t, relay.Addr(), "local", true)
	waitFor(t, "the relay's collector at v5", func() bool { return local.last().version == 5 })
	oldLife := local.last().life
	if oldLife == 0 {
		t.Fatal("v5 reached the relay's collector with no life")
	}
	if err := st.Delete(ctx, "m"); err != nil {
		t.Fatal(err)
	}
	stale := push(1, 2, 101)
	fresh := push(2, 3, 102)
	waitFor(t, "the relay's collector at the new life's v2", func() bool { return local.last().blob == fresh })
	if got := local.last(); got.life == oldLife || got.life == 0 || got.epoch != 3 {
		t.Fatalf("applied v%d epoch %d life %d (deleted life %d), want the new life's v2 at epoch 3", got.version, got.epoch, got.life, oldLife)
	}
	for _, a := range local.all() {
		if a.blob == stale {
			t.Fatal("the relay republished the new life's v1 of epoch 2 after serving epoch 3")
		}
	}
	if relay.noBulk {
		t.Fatal("relay fell back to the push stream against a hub that serves the data plane")
	}
	var v6 string
	for v := uint64(3); v <= 6; v++ {
		v6 = push(v, 3, 100+v)
	}
	waitFor(t, "the relay's collector at the new life's v6", func() bool { return local.last().blob == v6 })
}
