//go:build linux

package relay

import (
	"strings"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/testkit"
	"github.com/rlhub/rlhub/internal/wsync/wsynctest"
)

// A version over the relay's MaxModelBytes, on the data plane, is refused
// once: the relay asks for a version newer than it (not the same one again
// every Backoff, its header sent and the connection dropped each time),
// keeps serving the one it has, and counts and names the refusal. The next
// version that fits is taken.
func TestRelayRefusesAVersionOverItsMaxModelBytesOnce(t *testing.T) {
	st, err := store.NewMemory(store.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	addr, _, b := dataPlaneHubOn(t, st, testkit.Listen(t))

	relay := runRelay(t, Config{Upstream: dial(t, addr), UpstreamAddr: addr, Model: "m", ID: "relay-big",
		ShmPath: wsynctest.ShmPath(t), MaxModelBytes: 100 << 10, Backoff: 50 * time.Millisecond, Logger: quiet()})
	pushVersion(t, st, 1, 1000)
	waitFor(t, "the relay at v1", func() bool { return relay.Newest() == 1 })
	before := b.Requests()
	pushVersion(t, st, 2, 200_000) // 800 KB
	time.Sleep(2 * time.Second)
	if n := b.Requests() - before; n > 3 {
		t.Fatalf("the relay asked the hub %d times in 2 s for a version it cannot take", n)
	}
	if v := relay.Newest(); v != 1 {
		t.Fatalf("relay at v%d, want v1 (v2 is over its MaxModelBytes)", v)
	}
	if rf := relay.Refusals(); rf.Count != 1 || rf.Version != 2 || !strings.Contains(rf.Err, "exceeds the relay's MaxModelBytes") {
		t.Fatalf("refusals %+v, want v2 refused once, saying why", rf)
	}
	pushVersion(t, st, 3, 1000)
	waitFor(t, "the relay at v3", func() bool { return relay.Newest() == 3 })
}
