package hub

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/store/storetest"
	"github.com/rlhub/rlhub/internal/testkit"
	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// One peer IP holds at most Limits.MaxStreamsPerPeer gRPC streams open at
// once: a watch past the cap fails RESOURCE_EXHAUSTED at once, naming the
// flag, while the peer's open watches and its unary calls go on and
// another peer IP (127.0.0.2, loopback too) is not counted against it; a
// closed stream frees its place.
func TestStreamsPerPeerAreCapped(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	h, err := New(Config{Listen: "127.0.0.1:0", Logger: testkit.Logger(), Limits: Limits{MaxStreamsPerPeer: 3}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	if err := h.Start(); err != nil {
		t.Fatal(err)
	}
	blob := storetest.Blob(t, 1, 64)
	if _, err := h.Store().Push(ctx, store.PushRequest{Name: "m", Version: 1, Blob: blob}); err != nil {
		t.Fatal(err)
	}
	// from dials the hub from the loopback address ip.
	from := func(ip string) rlhubv1.ModelStoreClient {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
		conn, err := grpc.NewClient(h.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) { return d.DialContext(ctx, "tcp", addr) }))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return rlhubv1.NewModelStoreClient(conn)
	}
	// watch opens a watch for versions after 1 and waits until the hub
	// counts it (or refused it: the returned stream then fails).
	watch := func(c rlhubv1.ModelStoreClient, ip string, want int) (rlhubv1.ModelStore_WatchClient, context.CancelFunc) {
		t.Helper()
		wctx, wcancel := context.WithCancel(ctx)
		w, err := c.Watch(wctx, &rlhubv1.StoreWatchRequest{Model: "m", After: 1})
		if err != nil {
			t.Fatal(err)
		}
		if want > 0 {
			testkit.Eventually(t, 10*time.Second, "the hub counting the watch", func() bool { return h.streams.Held(ip) == want })
		}
		return w, wcancel
	}
	a := from("127.0.0.1")
	var open []rlhubv1.ModelStore_WatchClient
	var closeFirst context.CancelFunc
	for i := 1; i <= 3; i++ {
		w, c := watch(a, "127.0.0.1", i)
		if i == 1 {
			closeFirst = c
		} else {
			defer c()
		}
		open = append(open, w)
	}
	over, stop := watch(a, "127.0.0.1", 0)
	defer stop()
	_, err = over.Recv()
	if st, _ := status.FromError(err); st.Code() != codes.ResourceExhausted || !strings.Contains(st.Message(), "--max-streams-per-peer") {
		t.Fatalf("a fourth watch from one peer: %v, want RESOURCE_EXHAUSTED naming --max-streams-per-peer", err)
	}
	if _, err := a.List(ctx, &rlhubv1.StoreListRequest{}); err != nil {
		t.Fatalf("a unary call from the peer at its cap: %v", err)
	}
	other, stopOther := watch(from("127.0.0.2"), "127.0.0.2", 1)
	defer stopOther()

	closeFirst()
	testkit.Eventually(t, 10*time.Second, "the closed watch's place freed", func() bool { return h.streams.Held("127.0.0.1") == 2 })
	again, stopAgain := watch(a, "127.0.0.1", 3)
	defer stopAgain()
	if _, err := h.Store().Push(ctx, store.PushRequest{Name: "m", Version: 2, Expect: store.ExpectAny, Blob: blob}); err != nil {
		t.Fatal(err)
	}
	for i, w := range append(open[1:], other, again) {
		m, err := w.Recv()
		if err != nil || m.GetHeader().GetBlob().GetVersion() != 2 {
			t.Fatalf("watch %d: %v, %v; want version 2", i, m, err)
		}
	}
}
