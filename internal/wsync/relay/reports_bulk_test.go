//go:build linux

package relay

import (
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/store/storerpc"
	"github.com/rlhub/rlhub/internal/testkit"
	"github.com/rlhub/rlhub/internal/wire/bulk"
	"github.com/rlhub/rlhub/internal/wsync"
	"github.com/rlhub/rlhub/internal/wsync/wsynctest"
)

// The relay follows a hub's data plane, then the hub at that address is
// replaced by one without it (a new primary started with
// --no-store-data-plane): the relay follows the push stream, and the hub
// sees the relay at the version it runs, not the last one it took on the
// data plane, which it went on reporting every tick.
func TestRelayReportsWhatItRunsAfterFallingBackToThePushStream(t *testing.T) {
	st, err := store.NewMemory(store.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	push := func(v uint64) { pushVersion(t, st, v, 1000) }
	lis := testkit.Listen(t)
	addr := lis.Addr().String()
	// The first hub: data plane + weight sync, stopped in the test.
	ss, err := storerpc.New(storerpc.Config{Store: st, Logger: testkit.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	ws1, err := wsync.NewService(wsync.ServiceConfig{Versions: st, Logger: testkit.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	b := bulk.NewServer()
	ss.RegisterBulk(b)
	srv1 := grpc.NewServer()
	ws1.Register(srv1)
	served := make(chan struct{})
	go func() { defer close(served); _ = srv1.Serve(b.Listen(lis)) }()
	relay := runRelay(t, Config{Upstream: dial(t, addr), UpstreamAddr: addr, Model: "m", ID: "relay-x",
		ShmPath: wsynctest.ShmPath(t), ReportEvery: 10 * time.Millisecond, Backoff: 20 * time.Millisecond, Logger: quiet()})
	push(1)
	waitFor(t, "relay at v1 over the data plane", func() bool { return relay.Newest() == 1 })
	ss.Drain()
	ws1.Drain()
	b.Close()
	srv1.Stop()
	<-served
	ws1.Close()

	// The second hub at the same address: weight sync's gRPC methods only.
	ws2, err := wsync.NewService(wsync.ServiceConfig{Versions: st, Logger: testkit.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ws2.Close() })
	testkit.ServeGRPC(t, testkit.ListenAt(t, addr), ws2.Register)
	t.Cleanup(ws2.Drain)
	push(2)
	push(3)
	waitFor(t, "relay at v3 over the push stream", func() bool { return relay.Newest() == 3 })
	seen := func() (uint64, string) {
		for _, ms := range ws2.Tracker().Status("m") {
			for _, c := range ms.Collectors {
				if c.ID == "relay-x" {
					return c.Version, c.Via
				}
			}
		}
		return 0, ""
	}
	// The hub hears v3 on the push stream, and then keeps it over many
	// ReportEvery.
	waitFor(t, "the hub to see the relay at v3", func() bool { v, _ := seen(); return v == 3 })
	deadline := time.Now().Add(time.Second)
	for time.Now().Before(deadline) {
		if v, via := seen(); v != 3 {
			t.Fatalf("the relay runs v3 on the push stream; the hub sees it at v%d via %q", v, via)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
