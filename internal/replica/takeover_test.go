package replica_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/cluster"
	"github.com/rlhub/rlhub/internal/cluster/clustertest"
	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/store/storerpc"
	"github.com/rlhub/rlhub/internal/store/storetest"
	"github.com/rlhub/rlhub/internal/testkit"
)

// twoStoppedPrimaries starts three hubs, pushes pol v1 through the
// primary, SIGSTOPs it, SIGSTOPs the standby elected in its place as soon
// as etcd names it, and waits (60 s at most) until etcd names the last
// hub, p2, primary at epoch l2.
func twoStoppedPrimaries(t *testing.T) (p0 *hubProc, l1 cluster.Leader, p2 *hubProc, l2 cluster.Leader) {
	t.Helper()
	e := clustertest.Start(t)
	c := newCluster(t, e.Endpoint, 3)
	l0, p0 := c.leader(0)
	c.push("pol", 1, 0, storetest.Blob(t, 1, 64))
	for _, h := range c.standbys(p0) {
		c.synced(h, l0)
	}

	// Stop the next primary from the watch on the election, as soon as
	// etcd names it (it has served nothing yet).
	r, err := cluster.OpenReader(cluster.Config{Endpoints: []string{c.etcd}, Cluster: c.name, DialTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	pids := map[string]int{}
	for _, h := range c.hubs {
		pids[h.id] = h.proc.Pid()
	}
	wctx, wcancel := context.WithCancel(context.Background())
	elected := make(chan cluster.Leader, 1)
	stopErr := make(chan error, 1)
	var wg sync.WaitGroup
	wg.Go(func() {
		done := false
		_ = r.WatchLeader(wctx, func(l cluster.Leader) {
			if done || l.Epoch <= l0.Epoch || l.ID == p0.id {
				return
			}
			done = true
			stopErr <- syscall.Kill(pids[l.ID], syscall.SIGSTOP)
			elected <- l
		})
	})
	stopWatch := func() { wcancel(); wg.Wait() }
	defer stopWatch()

	p0.signal(syscall.SIGSTOP)
	l1 = testkit.Recv(t, elected, 60*time.Second, "a standby elected in place of "+p0.id)
	if err := <-stopErr; err != nil {
		t.Fatalf("SIGSTOP %s: %v", l1.ID, err)
	}
	stopWatch()
	for _, h := range c.hubs {
		if h.id != p0.id && h.id != l1.ID {
			p2 = h
		}
	}

	testkit.Eventually(t, 60*time.Second, p2.id+" elected after "+l1.String(), func() bool {
		st, err := c.status()
		if err != nil || st.Primary == nil || st.Primary.Epoch <= l1.Epoch {
			return false
		}
		if st.Primary.ID != p2.id {
			t.Fatalf("%s elected while it is stopped", st.Primary)
		}
		l2 = *st.Primary
		return true
	})

	return p0, l1, p2, l2
}

// TestTakeoverAfterTwoStoppedPrimaries: the primary h0 is SIGSTOPped, and
// so is the standby elected in its place the moment etcd names it — before
// the last standby could follow it: that standby's stream to it is being
// opened, on a process that accepts connections (the kernel's backlog) and
// answers nothing. The last standby is elected once both leases expire,
// and must serve at once: a push through it, with h0 and h1 still
// stopped, is acknowledged within 5 s of its election. (Before the fix its
// stream's data-plane handshake ignored the cancellation and held the
// takeover for its own 10 s timeout, answering "this hub is a standby; the
// primary is <the stopped hub>" meanwhile.)
func TestTakeoverAfterTwoStoppedPrimaries(t *testing.T) {
	p0, l1, p2, l2 := twoStoppedPrimaries(t)
	cl, err := storerpc.NewClient(storerpc.ClientConfig{Addr: p2.addr, MaxAttempts: 1, CallTimeout: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	// Well below the 10 s the stuck opening held the takeover for, and
	// far above the few milliseconds an elected standby takes to serve.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var info store.Info
	for {
		info, err = cl.Push(ctx, store.PushRequest{Name: "pol", Version: 2, Expect: 1, Blob: storetest.Blob(t, 2, 64)})
		if err == nil || !errors.Is(err, errs.ErrUnavailable) || ctx.Err() != nil {
			break
		}
		time.Sleep(20 * time.Millisecond) // refused as a standby still: try again
	}
	if err != nil {
		t.Fatalf("%s elected at epoch %d acknowledged no push within 5s while %s and %s stay stopped: %v\n%s log:\n%s",
			p2.id, l2.Epoch, p0.id, l1.ID, err, p2.id, p2.out)
	}
	if info.Version != 2 || info.Epoch != l2.Epoch {
		t.Fatalf("push through %s landed as v%d epoch %d, want v2 epoch %d", p2.id, info.Version, info.Epoch, l2.Epoch)
	}
	out := p2.out.String()
	t.Logf("%s: elected → serving as primary %v (its log)", p2.id,
		lineTime(out, `msg="cluster: serving as primary"`).Sub(lineTime(out, `msg="cluster: elected primary"`)).Round(time.Millisecond))
}

// TestTakeoverTimes measures the scenario above RLHUB_TAKEOVER_RUNS times
// (skipped when unset; figures to the log, docs/benchlog): the last hub's
// election → its "serving as primary" line (both from its log; waited for
// up to 60 s), and the test's view from etcd naming it to the line.
func TestTakeoverTimes(t *testing.T) {
	runs, _ := strconv.Atoi(os.Getenv("RLHUB_TAKEOVER_RUNS"))
	if runs <= 0 {
		t.Skip("RLHUB_TAKEOVER_RUNS unset")
	}
	var took []time.Duration
	for i := range runs {
		t.Run(strconv.Itoa(i), func(t *testing.T) {
			_, _, p2, l2 := twoStoppedPrimaries(t)
			named := time.Now()
			line := fmt.Sprintf(`msg="cluster: serving as primary" epoch=%d `, l2.Epoch)
			testkit.Eventually(t, 60*time.Second, p2.id+" serving", func() bool { return strings.Contains(p2.out.String(), line) })
			seen := time.Since(named)
			out := p2.out.String()
			d := lineTime(out, line).Sub(lineTime(out, `msg="cluster: elected primary"`))
			took = append(took, d)
			t.Logf("run %d: %s elected → serving %v (its log); etcd named it → the line seen %v", i, p2.id, d.Round(time.Millisecond), seen.Round(time.Millisecond))
		})
	}
	if len(took) == 0 {
		return
	}
	slices.Sort(took)
	t.Logf("elected → serving over %d runs: min %v median %v max %v", len(took), took[0].Round(time.Millisecond),
		took[len(took)/2].Round(time.Millisecond), took[len(took)-1].Round(time.Millisecond))
}

var timeRE = regexp.MustCompile(`^time=(\S+) `)

// lineTime is the time of the last log line holding msg (zero if none).
func lineTime(out, msg string) time.Time {
	var at time.Time
	for line := range strings.SplitSeq(out, "\n") {
		if !strings.Contains(line, msg) {
			continue
		}
		if m := timeRE.FindStringSubmatch(strings.TrimSpace(line)); m != nil {
			if ts, err := time.Parse(time.RFC3339Nano, m[1]); err == nil {
				at = ts
			}
		}
	}
	return at
}
