package cli

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/cluster"
	"github.com/rlhub/rlhub/internal/cluster/clustertest"
	"github.com/rlhub/rlhub/internal/testkit"
)

// runInBackground runs `rlhub ARGS` in this process on its own goroutine
// and returns stop, which cancels Run's context and returns its exit code
// and stderr once it has returned; cleanup stops it if the test did not.
// stop may be called more than once.
func runInBackground(t *testing.T, args ...string) (stop func() (int, string)) {
	ctx, cancel := context.WithCancel(context.Background())
	type result struct {
		code   int
		stderr string
	}
	done := make(chan result, 1)
	go func() {
		code, _, stderr := run(t, ctx, args...)
		done <- result{code, stderr}
	}()
	var once sync.Once
	var r result
	stop = func() (int, string) {
		once.Do(func() {
			cancel()
			r = testkit.Recv(t, done, 60*time.Second, fmt.Sprintf("rlhub %v to stop", args))
		})
		return r.code, r.stderr
	}
	t.Cleanup(func() { stop() })
	return stop
}

// TestServeSecondariesAnnounceThemselvesAndWithdraw runs `serve --role
// reducer --etcd` (runAnnouncedSecondaries) in this process, so that
// TestMain's goleak sees its goroutines: once its secondary has attached
// to the primary it is announced in etcd; stopped, it exits 0 with the
// announcement withdrawn and the hub it ran stopped.
func TestServeSecondariesAnnounceThemselvesAndWithdraw(t *testing.T) {
	e := clustertest.Start(t)
	const name = "sec"
	stopPrimary := runInBackground(t, "serve", "--listen", "127.0.0.1:0", "--data", t.TempDir(), "--etcd", e.Endpoint,
		"--cluster", name, "--lease-ttl", "1s", "--log-level", "error")
	stopSecondaries := runInBackground(t, "serve", "--role", "reducer", "--etcd", e.Endpoint, "--cluster", name,
		"--member-id", "s1", "--listen", "127.0.0.1:0", "--data", "", "--lease-ttl", "1s", "--log-level", "error")

	rd, err := cluster.OpenReader(cluster.Config{Endpoints: []string{e.Endpoint}, Cluster: name, Logger: testkit.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	announced := func() []string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		ss, err := rd.Services(ctx, cluster.KindSecondary, "")
		if err != nil {
			t.Fatalf("list the announced secondaries: %v", err)
		}
		var ids []string
		for _, s := range ss {
			ids = append(ids, s.ID)
		}
		return ids
	}
	testkit.Eventually(t, 30*time.Second, "the secondaries to be announced as s1", func() bool {
		return slices.Contains(announced(), "s1")
	})
	if code, stderr := stopSecondaries(); code != 0 {
		t.Fatalf("serve --role reducer exited %d; stderr:\n%s", code, stderr)
	}
	if ids := announced(); len(ids) != 0 {
		t.Fatalf("announced secondaries after serve --role reducer returned: %v, want none", ids)
	}
	if code, stderr := stopPrimary(); code != 0 {
		t.Fatalf("the primary exited %d; stderr:\n%s", code, stderr)
	}
}

// TestServeSecondariesStopWithoutAPrimary: `serve --role reducer --etcd`
// for a cluster that has no primary keeps trying to attach its secondary;
// stopped, it returns at once (exit 0) rather than when the attach
// attempt under way gives up waiting for a primary (dial's
// FollowTimeout, 2 minutes), and leaves no goroutine behind (TestMain's
// goleak).
func TestServeSecondariesStopWithoutAPrimary(t *testing.T) {
	e := clustertest.Start(t)
	addrFile := filepath.Join(t.TempDir(), "addr")
	stop := runInBackground(t, "serve", "--role", "reducer", "--etcd", e.Endpoint, "--cluster", "none",
		"--member-id", "s1", "--listen", "127.0.0.1:0", "--addr-file", addrFile, "--data", "", "--log-level", "error")
	// The secondary starts attaching once its hub has an address; give it
	// a moment to be waiting for a primary. (Stopped before that, the test
	// passes without having tried the case: it cannot fail spuriously.)
	testkit.Eventually(t, 30*time.Second, "serve --role reducer to write its address", func() bool {
		b, err := os.ReadFile(addrFile)
		return err == nil && strings.HasSuffix(string(b), "\n")
	})
	time.Sleep(200 * time.Millisecond)
	if code, stderr := stop(); code != 0 {
		t.Fatalf("serve --role reducer exited %d; stderr:\n%s", code, stderr)
	}
}
