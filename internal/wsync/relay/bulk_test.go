//go:build linux

package relay

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"net"
	"sync"
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
	lis := testkit.Listen(t)
	addr := testkit.ServeGRPC(t, b.Listen(lis), func(g *grpc.Server) { ws.Register(g) })
	t.Cleanup(func() { ss.Drain(); ws.Drain(); b.Close(); ws.Close() })
	return addr
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
		snap := wsynctest.Snap(t, "m", v, 100_000+int(v))
		if _, err := st.Push(context.Background(), store.PushRequest{Name: "m", Version: v, Expect: store.ExpectAny, Blob: snap.Blob}); err != nil {
			t.Fatal(err)
		}
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
	push := func(v uint64) *store.Snapshot {
		snap := wsynctest.Snap(t, "m", v, 50_000+int(v))
		if _, err := st.Push(context.Background(), store.PushRequest{Name: "m", Version: v, Expect: store.ExpectAny, Blob: snap.Blob}); err != nil {
			t.Fatal(err)
		}
		return snap
	}
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
	lis := testkit.Listen(t)
	const n = 300_000
	snaps := map[uint64]*store.Snapshot{1: wsynctest.Snap(t, "m", 1, n), 2: wsynctest.Snap(t, "m", 2, n), 3: wsynctest.Snap(t, "m", 3, n)}
	afters := make(chan uint64, 16)
	cut := make(chan struct{}, 1)
	var wg sync.WaitGroup
	ctx, cancel := context.WithCancel(context.Background())
	defer func() { cancel(); lis.Close(); wg.Wait() }()
	wg.Go(func() {
		step := 0
		for {
			conn, err := lis.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer conn.Close()
				context.AfterFunc(ctx, func() { conn.Close() })
				for {
					after, ok := readWatchRequest(conn)
					if !ok {
						return
					}
					afters <- after
					switch step++; step {
					case 1:
						wsynctest.WriteVersion(conn, snaps[1], len(snaps[1].Blob), true)
					case 2:
						wsynctest.WriteVersion(conn, snaps[2], len(snaps[2].Blob)/2, false) // cut off
						cut <- struct{}{}
						return
					case 3:
						wsynctest.WriteVersion(conn, snaps[3], len(snaps[3].Blob), true)
					default:
						<-ctx.Done()
						return
					}
				}
			})
		}
	})
	path := wsynctest.ShmPath(t)
	relay := runRelay(t, Config{Upstream: dial(t, lis.Addr().String()), UpstreamAddr: lis.Addr().String(), Model: "m",
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

// readWatchRequest reads the magic (on a new connection) or one request
// frame and returns its StoreWatchRequest.after.
func readWatchRequest(conn net.Conn) (uint64, bool) {
	var head [8]byte
	if _, err := io.ReadFull(conn, head[:1]); err != nil {
		return 0, false
	}
	if head[0] == 'R' { // the hello (magic + u16-length token), once per connection
		if _, err := io.ReadFull(conn, head[1:]); err != nil {
			return 0, false
		}
		var tl [2]byte
		if _, err := io.ReadFull(conn, tl[:]); err != nil {
			return 0, false
		}
		if _, err := io.ReadFull(conn, make([]byte, binary.LittleEndian.Uint16(tl[:]))); err != nil {
			return 0, false
		}
		if _, err := conn.Write([]byte(bulk.Magic)); err != nil {
			return 0, false
		}
		if _, err := io.ReadFull(conn, head[:1]); err != nil {
			return 0, false
		}
	}
	var l [4]byte
	if _, err := io.ReadFull(conn, l[:2]); err != nil {
		return 0, false
	}
	if _, err := io.ReadFull(conn, make([]byte, binary.LittleEndian.Uint16(l[:2]))); err != nil {
		return 0, false
	}
	if _, err := io.ReadFull(conn, l[:]); err != nil {
		return 0, false
	}
	hb := make([]byte, binary.LittleEndian.Uint32(l[:]))
	if _, err := io.ReadFull(conn, hb); err != nil {
		return 0, false
	}
	var req rlhubv1.StoreWatchRequest
	if proto.Unmarshal(hb, &req) != nil {
		return 0, false
	}
	return req.After, true
}
