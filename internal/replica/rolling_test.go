package replica_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/cluster/clustertest"
	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/store/storerpc"
	"github.com/rlhub/rlhub/internal/store/storetest"
	"github.com/rlhub/rlhub/internal/testkit"
)

// TestRollingRestartGatedByReadiness upgrades the cluster the way an
// orchestrator does (a StatefulSet's rolling update: highest ordinal
// first, whichever hub is the primary): each hub in turn is stopped with
// SIGTERM and started again on its data, and the next is stopped only once
// the restarted one's /readyz answers 200. A writer pushes versions,
// following the primary, throughout. No acknowledged version is lost: the
// newest version at the end is the last one acknowledged, with its bytes,
// and every hub is ready again — two standbys synced with the primary of
// the final epoch, and that primary.
func TestRollingRestartGatedByReadiness(t *testing.T) {
	e := clustertest.Start(t)
	c := newClusterTTL(t, e.Endpoint, 3, "2s", "--metrics-listen", "127.0.0.1:0")
	const model, floats = "pol", 4096
	l0, _ := c.leader(0)
	c.push(model, 1, 0, storetest.Blob(t, 1, floats))

	blob := func(v uint64) []byte { return storetest.Blob(t, v, floats) }

	// The writer: the next version on the last acknowledged one, through
	// whichever hub is the primary now; a version that landed before its
	// answer was lost shows as stale at that version and counts as
	// acknowledged (c.push's rule). The push in flight when the writer
	// stops has no answer: it may or may not have landed (unknown).
	ctx, stop := context.WithCancel(context.Background())
	var (
		mu      sync.Mutex
		acked   = uint64(1)
		unknown uint64
		fails   int
	)
	werr := make(chan error, 1)
	var wg sync.WaitGroup
	wg.Go(func() {
		werr <- func() error {
			for ctx.Err() == nil {
				mu.Lock()
				v := acked + 1
				mu.Unlock()
				st, err := c.status()
				if err != nil || st.Primary == nil {
					time.Sleep(50 * time.Millisecond)
					continue
				}
				cl, err := storerpc.NewClient(storerpc.ClientConfig{Addr: st.Primary.Addr, MaxAttempts: 1, CallTimeout: 10 * time.Second})
				if err != nil {
					return err
				}
				_, err = cl.Push(ctx, store.PushRequest{Name: model, Version: v, Expect: v - 1, Blob: blob(v)})
				cl.Close()
				var se *errs.StaleError
				switch {
				case err == nil, errors.As(err, &se) && se.CurrentVersion == v:
					mu.Lock()
					acked = v
					mu.Unlock()
				case ctx.Err() != nil:
					mu.Lock()
					unknown = v
					mu.Unlock()
				case errors.Is(err, errs.ErrUnavailable), errors.Is(err, context.DeadlineExceeded):
					mu.Lock()
					fails++
					mu.Unlock()
					time.Sleep(50 * time.Millisecond)
				default:
					return fmt.Errorf("push v%d to %s: %w", v, st.Primary, err)
				}
			}
			return nil
		}()
	})
	defer func() { stop(); wg.Wait() }()

	ackedNow := func() uint64 {
		mu.Lock()
		defer mu.Unlock()
		return acked
	}
	ready := func(h *hubProc) string {
		t.Helper()
		var body string
		testkit.Eventually(t, 60*time.Second, h.id+"'s /readyz to answer 200", func() bool {
			as := metricsAddrs(h)
			if len(as) == 0 {
				return false
			}
			code, b, err := readyz(as[len(as)-1][0])
			body = b
			return err == nil && code == http.StatusOK
		})
		return body
	}
	for _, h := range c.hubs {
		ready(h)
	}
	for i := len(c.hubs) - 1; i >= 0; i-- {
		h := c.hubs[i]
		before := ackedNow()
		h.proc.Stop(syscall.SIGTERM, 20*time.Second)
		if sig, killed := h.proc.KilledBy(); killed {
			t.Fatalf("%s did not stop on SIGTERM within 20 s (killed by %v)", h.id, sig)
		}
		c.start(h)
		t.Logf("%s restarted (acknowledged before its stop: v%d): /readyz %q", h.id, before, ready(h))
		// The writer goes on between restarts, so each one happens under load.
		testkit.Eventually(t, 60*time.Second, "a version acknowledged after "+h.id+"'s restart", func() bool { return ackedNow() > before+2 })
	}
	stop()
	wg.Wait()
	if err := <-werr; err != nil {
		t.Fatal(err)
	}
	last := ackedNow()
	l, p := c.leader(0)
	snap := c.newest(model)
	want := last
	if unknown == last+1 && snap.Version == unknown {
		want = unknown // the unanswered push landed: allowed, whole
	}
	if snap.Version != want || !bytes.Equal(snap.Blob, blob(want)) {
		t.Fatalf("newest %s v%d (%d bytes) after the rolling restart, want the last acknowledged v%d (or the unanswered v%d) with its bytes",
			model, snap.Version, len(snap.Blob), last, unknown)
	}
	for _, h := range c.hubs {
		want := fmt.Sprintf("standby, synced with the primary of epoch %d", l.Epoch)
		if h == p {
			want = fmt.Sprintf("primary, epoch %d", l.Epoch)
		}
		testkit.Eventually(t, 30*time.Second, fmt.Sprintf("%s's /readyz to say %q", h.id, want), func() bool {
			as := metricsAddrs(h)
			code, b, err := readyz(as[len(as)-1][0])
			return err == nil && code == http.StatusOK && b == want
		})
	}
	mu.Lock()
	t.Logf("rolling restart of 3 hubs: v%d acknowledged in all (%d refused or unanswered pushes retried), epoch %d → %d", last, fails, l0.Epoch, l.Epoch)
	mu.Unlock()
}
