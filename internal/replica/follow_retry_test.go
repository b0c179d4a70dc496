package replica_test

import (
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/cluster/clustertest"
	"github.com/rlhub/rlhub/internal/testkit"
)

// TestStandbyRetriesAStreamThatFailedToOpen: a standby whose stream from
// the primary fails to open (the primary is stopped, its lease still
// good) tries again once the primary answers, under the same primary.
// It used to wait for the primary to change first: the watcher of who
// leads was waited for before it was told to stop, so a failed stream
// left the standby unsynced for the whole term (the secure cluster test
// caught it when a standby dialed during the primary's start).
func TestStandbyRetriesAStreamThatFailedToOpen(t *testing.T) {
	e := clustertest.Start(t)
	c := newClusterTTL(t, e.Endpoint, 1, "20s") // a lease that outlives the stop
	l, p := c.leader(0)
	p.signal(syscall.SIGSTOP)
	h := &hubProc{t: t, id: "h1", data: t.TempDir()}
	c.hubs = append(c.hubs, h)
	c.start(h)
	testkit.Eventually(t, 60*time.Second, "h1 to join", func() bool {
		return strings.Contains(h.out.String(), `msg="cluster: joined"`)
	})
	// The stream's opening gives up after 3 s (openTimeout); the primary
	// stays stopped until it has (a fixed wait could end before a loaded
	// machine has h1 even try), and well within its 20 s lease.
	testkit.Eventually(t, 15*time.Second, "h1's first stream from the stopped primary to fail", func() bool {
		return strings.Contains(h.out.String(), `msg="replica: stream from the primary ended"`)
	})
	p.signal(syscall.SIGCONT)
	c.synced(h, l)
	if st, err := c.status(); err != nil || st.Primary == nil || st.Primary.Epoch != l.Epoch {
		t.Fatalf("status %+v, %v: want the first primary's term %d throughout", st, err, l.Epoch)
	}
}
