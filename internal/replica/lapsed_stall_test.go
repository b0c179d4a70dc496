package replica

import (
	"context"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/store/storetest"
	"github.com/rlhub/rlhub/internal/testkit"
	"github.com/rlhub/rlhub/internal/wire/connlimit"
)

// TestLapsedStalledStreamKeepsNoSnapshots: a follower on the gRPC stream
// whose lease lapses while its stream is stalled in a send (it stopped
// reading: SIGSTOP, or its machine cut off) is marked lapsed and its
// context cancelled, but gRPC's SendMsg, blocked on flow control, does not
// watch that context: the stream stayed among the followers with its old
// position, so every snapshot taken after it (and the store's lent version
// bytes) was kept for it until gRPC's keepalive ended the connection (60
// + 20 s): 52 MiB after 8 publishes of 4 MiB here. A lapsed stream no
// longer keeps snapshots; what it is still sending is held until sent.
func TestLapsedStalledStreamKeepsNoSnapshots(t *testing.T) {
	var members atomic.Value
	members.Store([]string{"s1", "s2"})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	src, fenced, addr := grpcSource(t, ctx, 2, 20*time.Second, func(context.Context) ([]string, error) { return members.Load().([]string), nil },
		connlimit.ServerOptions(0, 0, 0)...) // the hub's keepalive

	// s1: a real follower on gRPC.
	d := newDPFollower(t, "", TransportGRPC)
	stop := d.followFor(ctx, addr)
	defer stop()

	// s2: takes its full sync, acknowledges it, then stops reading.
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	cs, err := cc.NewStream(ctx, &streamDesc, FollowMethod, grpc.CallContentSubtype(codecName))
	if err != nil {
		t.Fatal(err)
	}
	if err := cs.SendMsg(jsonFrame(kindHello, hello{Member: "s2", Epoch: 5, Dirs: mirroredDirs})); err != nil {
		t.Fatal(err)
	}
	readFollowUnit(t, cs)
	_ = cs.SendMsg(uvarintFrame(kindAck, 0))

	// v1 is pushed: s2's stream stalls in its send (s2 reads nothing).
	first := make(chan error, 1)
	go func() {
		_, err := fenced.Push(ctx, store.PushRequest{Name: "m", Version: 1, Blob: storetest.Blob(t, 1, 1<<20)})
		first <- err
	}()
	time.Sleep(time.Second)
	// s2's lease lapses: the refresh marks its stream lapsed and cancels it.
	members.Store([]string{"s1"})
	if err := src.RefreshStandbys(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-first; err != nil {
		t.Fatalf("push v1: %v", err)
	}
	const versions = 8
	for v := uint64(2); v <= versions; v++ {
		blob := storetest.Blob(t, v, 1<<20) // 4 MiB
		if _, err := fenced.Push(ctx, store.PushRequest{Name: "m", Version: v, Expect: v - 1, Blob: blob}); err != nil {
			t.Fatalf("push v%d: %v", v, err)
		}
	}
	var live int
	var held int64
	testkit.Eventually(t, 10*time.Second, "the snapshots s1 passed to be dropped", func() bool {
		src.mu.Lock()
		defer src.mu.Unlock()
		live, held = len(src.live), 0
		for _, s := range src.live {
			for _, c := range s.files {
				held += c.size
			}
		}
		return live <= 2
	})
	t.Logf("after the lapse and %d more publishes: %d snapshots live holding %d MiB", versions-1, live, held>>20)
}

// grpcSource serves, over gRPC on 127.0.0.1, an acks-all Source of epoch
// 5 (ackTimeout) over a file store keeping retain versions, its standbys
// read from standbys (read once before it returns); it returns the
// Source, its Fenced store and the address. Closed at cleanup.
func grpcSource(t *testing.T, ctx context.Context, retain int, ackTimeout time.Duration, standbys func(context.Context) ([]string, error), opts ...grpc.ServerOption) (*Source, *Fenced, string) {
	t.Helper()
	dir := t.TempDir()
	st, err := store.OpenFile(store.FileConfig{Dir: filepath.Join(dir, "store"), Store: store.Config{Retain: retain}, Logger: testkit.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	src, err := NewSource(SourceConfig{DataDir: dir, Epoch: 5, Acks: AcksAll, AckTimeout: ackTimeout, Logger: testkit.Logger(), Standbys: standbys})
	if err != nil {
		t.Fatal(err)
	}
	addr := testkit.ServeGRPC(t, nil, src.Register, opts...)
	t.Cleanup(func() { src.Close() })
	if err := src.RefreshStandbys(ctx); err != nil {
		t.Fatal(err)
	}
	return src, &Fenced{Store: st, Epoch: 5, Source: src}, addr
}
