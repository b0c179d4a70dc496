//go:build linux

package relay

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/testkit"
	"github.com/rlhub/rlhub/internal/wsync"
)

// A version that outgrows the relay's segment where no bigger segment fits
// (a container's 64 MiB /dev/shm): the relay cannot republish it into
// shared memory, so it must not keep the old segment open with the old
// version as if it were current. Its shm collectors move on (to the
// relay's stream, which has the version) and get the new version.
func TestRelayThatCannotGrowItsSegmentLetsShmCollectorsMoveOn(t *testing.T) {
	h := startHub(t)
	h.push(t, 1, 1<<18) // 1 MiB: a 2 MiB slot, the segment about 20 MiB
	path := filepath.Join(testkit.SmallTmpfs(t, "64m"), "rlhub-m")
	relay := runRelay(t, Config{Upstream: dial(t, h.addr), Model: "m", ID: "relay-grow", ShmPath: path, ReportEvery: 10 * time.Millisecond, Logger: quiet()})
	waitSegment(t, path, 1)

	relayConn, upConn := dial(t, relay.Addr()), dial(t, h.addr)
	c := startFailoverCollector(t,
		wsync.ShmDialer("relay-shm", path, "m"),
		wsync.PushDialer("relay-stream", relayConn, "shm-collector", "m"),
		wsync.PushDialer("upstream", upConn, "shm-collector", "m"))
	waitFor(t, "the collector at v1 on the segment", func() bool { return c.recv.Version() == 1 })
	if cur := c.f.Current(); cur != "relay-shm" {
		t.Fatalf("collector on %q, want relay-shm", cur)
	}

	// 16 MiB: a segment of two 32 MiB slots does not fit in 64 MiB.
	h.push(t, 2, 4<<20)
	waitFor(t, "the relay at v2", func() bool { return relay.Newest() == 2 })
	deadline := time.Now().Add(10 * time.Second)
	for c.recv.Version() != 2 {
		if time.Now().After(deadline) {
			t.Fatalf("shm collector still at v%d on %q 10s after the relay got v2 it could not put in its segment",
				c.recv.Version(), c.f.Current())
		}
		time.Sleep(10 * time.Millisecond)
	}
}
