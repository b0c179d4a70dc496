package cli

import (
	"context"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/cluster/clustertest"
	"github.com/rlhub/rlhub/internal/testkit"
)

// TestServeJoinsClusterAndStandbyTakesOver: two hubs started with --etcd
// are members; one is primary. When it stops, `cluster status` shows the
// other as primary at a larger epoch.
func TestServeJoinsClusterAndStandbyTakesOver(t *testing.T) {
	e := clustertest.Start(t)
	type served struct {
		cancel context.CancelFunc
		done   chan struct{} // closed when serve has returned code
		code   int
	}
	serve := func() *served {
		ctx, cancel := context.WithCancel(context.Background())
		s := &served{cancel: cancel, done: make(chan struct{})}
		go func() {
			defer close(s.done)
			s.code, _, _ = run(t, ctx, "serve", "--listen", "127.0.0.1:0", "--data", t.TempDir(), "--etcd", e.Endpoint,
				"--cluster", "t1", "--lease-ttl", "1s", "--log-level", "error")
		}()
		t.Cleanup(func() {
			cancel()
			select {
			case <-s.done:
			case <-time.After(60 * time.Second):
				t.Error("serve did not stop")
			}
		})
		return s
	}
	status := func() string {
		code, out, errOut := run(t, context.Background(), "cluster", "status", "--etcd", e.Endpoint, "--cluster", "t1")
		if code != 0 {
			t.Fatalf("cluster status: %s", errOut)
		}
		return out
	}
	epochRe := regexp.MustCompile(`primary (\S+)@(\S+) epoch (\d+)`)
	primary := func(out string) (id string, epoch uint64) {
		m := epochRe.FindStringSubmatch(out)
		if m == nil {
			return "", 0
		}
		ep, _ := strconv.ParseUint(m[3], 10, 64)
		return m[1], ep
	}
	a := serve()
	testkit.Eventually(t, 30*time.Second, "the first hub to be primary", func() bool { id, _ := primary(status()); return id != "" })
	firstID, firstEpoch := primary(status())
	b := serve()
	testkit.Eventually(t, 30*time.Second, "both hubs to be members", func() bool { return strings.Count(status(), "127.0.0.1:") == 3 })
	out := status()
	if !strings.Contains(out, "standby") {
		t.Fatalf("status with two hubs shows no standby:\n%s", out)
	}
	// Only a standby recorded in sync may take over.
	inSync := regexp.MustCompile(`in sync \(only these may take over\): \S+,\S+ `)
	testkit.Eventually(t, 30*time.Second, "the standby recorded in sync", func() bool { return inSync.MatchString(status()) })
	a.cancel()
	select {
	case <-a.done:
		if a.code != 0 {
			t.Fatalf("primary exited %d", a.code)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the primary did not stop")
	}
	testkit.Eventually(t, 30*time.Second, "the standby to take over", func() bool {
		id, ep := primary(status())
		return id != "" && id != firstID && ep > firstEpoch
	})
	if out := status(); strings.Count(out, "127.0.0.1:") != 2 {
		t.Fatalf("the stopped hub is still listed:\n%s", out)
	}
	b.cancel()
	select {
	case <-b.done:
	case <-time.After(60 * time.Second):
		t.Fatal("the standby did not stop")
	}
	if b.code != 0 {
		t.Fatalf("standby exited %d", b.code)
	}
}

func TestClusterStatusNeedsEtcd(t *testing.T) {
	code, _, errOut := run(t, context.Background(), "cluster", "status")
	if code == 0 || !strings.Contains(errOut, "--etcd") {
		t.Fatalf("code %d, stderr %q", code, errOut)
	}
	code, _, errOut = run(t, context.Background(), "cluster", "status", "--etcd", "127.0.0.1:1", "--timeout", "1s")
	if code == 0 || !strings.Contains(errOut, "unavailable") {
		t.Fatalf("against no etcd: code %d, stderr %q", code, errOut)
	}
}
