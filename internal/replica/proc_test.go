package replica_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/rlhub/rlhub/internal/cluster"
	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/store/storerpc"
	"github.com/rlhub/rlhub/internal/testkit"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(testkit.Main(m),
		// etcd's client keeps a resolver goroutine per process.
		goleak.IgnoreTopFunction("google.golang.org/grpc/internal/grpcsync.(*CallbackSerializer).run"),
	)
}

var clusterSeq atomic.Int64

// rlhubBinary is the binary under test (testkit.Binary).
func rlhubBinary(t testing.TB) string { return testkit.Binary(t) }

// syncBuffer is kept for tests that still wire a process's output by
// hand; new ones use testkit.StartProc.
type syncBuffer = testkit.Buffer

// hubProc is one `rlhub serve --etcd` process; start replaces proc, out
// and addr on each (re)start.
type hubProc struct {
	t        testing.TB
	id, data string
	args     []string
	proc     *testkit.Proc
	out      *testkit.Buffer
	addr     string
	bin      string // this hub's executable; "" means the cluster's
}

// cluster is one etcd and the hubs of one cluster.
type testCluster struct {
	t        testing.TB
	etcd     string
	name     string
	leaseTTL string
	hubs     []*hubProc
	bin      string // the hubs' executable; "" means testkit.Binary
	etcdSec  cluster.EtcdSecurity
}

func newCluster(t testing.TB, etcd string, n int, extra ...string) *testCluster {
	return newClusterTTL(t, etcd, n, "1s", extra...)
}

func newClusterTTL(t testing.TB, etcd string, n int, ttl string, extra ...string) *testCluster {
	return newClusterBin(t, etcd, n, ttl, "", extra...)
}

// newClusterBin is newClusterTTL with the hubs run from bin ("" means
// testkit.Binary): an A/B of two builds in one run.
func newClusterBin(t testing.TB, etcd string, n int, ttl, bin string, extra ...string) *testCluster {
	c := &testCluster{t: t, etcd: etcd, name: fmt.Sprintf("c%d-%d", os.Getpid(), clusterSeq.Add(1)), leaseTTL: ttl, bin: bin}
	for i := range n {
		h := &hubProc{t: t, id: fmt.Sprintf("h%d", i), data: t.TempDir(), args: extra}
		c.hubs = append(c.hubs, h)
		c.start(h)
	}
	return c
}

func (c *testCluster) start(h *hubProc) {
	t := c.t
	t.Helper()
	addrFile := filepath.Join(t.TempDir(), "addr")
	args := append([]string{"--log-level", "info", "serve", "--listen", "127.0.0.1:0", "--data", h.data, "--addr-file", addrFile,
		"--etcd", c.etcd, "--cluster", c.name, "--lease-ttl", c.leaseTTL, "--member-id", h.id}, h.args...)
	bin := c.bin
	if h.bin != "" {
		bin = h.bin
	}
	h.proc = testkit.StartProc(t, testkit.ProcConfig{Name: "hub " + h.id, Path: bin, Args: args, AddrFile: addrFile})
	h.out, h.addr = h.proc.Out(), h.proc.Addr()
}

// kill SIGKILLs the hub and waits for it (nothing if it has ended).
func (h *hubProc) kill() { h.proc.Kill() }

func (h *hubProc) signal(s syscall.Signal) {
	h.t.Helper()
	h.proc.Signal(h.t, s)
}

func (c *testCluster) status() (cluster.Status, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	return cluster.Read(ctx, cluster.Config{Endpoints: []string{c.etcd}, Cluster: c.name, DialTimeout: 2 * time.Second, Security: c.etcdSec})
}

// leader waits for a primary elected after epoch `after` that serves its
// term and returns it with its process. A hub elected with a copy older
// than a standby's resigns for it at once (Node.standby); such a passing
// term is skipped, or a test that kills "the primary" would kill that
// standby-again while the primary it yielded to serves on.
// standbys are the cluster's hubs but primary.
func (c *testCluster) standbys(primary *hubProc) []*hubProc {
	var out []*hubProc
	for _, h := range c.hubs {
		if h != primary {
			out = append(out, h)
		}
	}
	return out
}

func (c *testCluster) leader(after uint64) (cluster.Leader, *hubProc) {
	c.t.Helper()
	var l cluster.Leader
	var p *hubProc
	testkit.Eventually(c.t, 60*time.Second, fmt.Sprintf("a primary with an epoch above %d serving its term", after), func() bool {
		st, err := c.status()
		if err != nil || st.Primary == nil || st.Primary.Epoch <= after {
			return false
		}
		l, p = *st.Primary, nil
		for _, h := range c.hubs {
			if h.id == l.ID {
				p = h
			}
		}
		if p == nil {
			c.t.Fatalf("primary %s is none of the test's hubs", l)
		}
		return strings.Contains(p.out.String(), fmt.Sprintf("msg=\"cluster: serving as primary\" epoch=%d ", l.Epoch))
	})
	return l, p
}

// synced waits until h has applied a full sync from primary l (its log
// says so for l's epoch) and, when l keeps an in-sync record (acks all),
// l has recorded h in it: h may take over from then on.
func (c *testCluster) synced(h *hubProc, l cluster.Leader) {
	c.t.Helper()
	testkit.Eventually(c.t, 60*time.Second, h.id+" synced with "+l.String(), func() bool {
		out := h.out.String()
		i := strings.LastIndex(out, `msg="replica: full sync applied"`)
		return i >= 0 && strings.HasSuffix(strings.SplitN(out[i:], "\n", 2)[0], fmt.Sprintf(" epoch=%d", l.Epoch))
	})
	testkit.Eventually(c.t, 60*time.Second, h.id+" recorded in sync by "+l.String(), func() bool {
		st, err := c.status()
		return err == nil && (st.InSync == nil || st.InSync.Epoch != l.Epoch || st.InSync.Has(h.id))
	})
}

func (c *testCluster) client(addr string) *storerpc.Client {
	c.t.Helper()
	cl, err := storerpc.NewClient(storerpc.ClientConfig{Addr: addr, MaxAttempts: 1, CallTimeout: 20 * time.Second})
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { cl.Close() })
	return cl
}

// push writes one version through whichever hub is the primary now,
// following it through refusals and a hub that is down, as a following
// client does. A version that landed before an answer was lost shows as
// stale at that version and counts as pushed.
func (c *testCluster) push(name string, version, expect uint64, blob []byte) store.Info {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var lastErr error
	for ctx.Err() == nil {
		st, err := c.status()
		if err == nil && st.Primary != nil {
			cl, cerr := storerpc.NewClient(storerpc.ClientConfig{Addr: st.Primary.Addr, MaxAttempts: 1, CallTimeout: 15 * time.Second})
			if cerr != nil {
				c.t.Fatal(cerr)
			}
			info, err := cl.Push(ctx, store.PushRequest{Name: name, Version: version, Expect: expect, Blob: blob})
			cl.Close()
			var se *errs.StaleError
			switch {
			case err == nil:
				return info
			case errors.As(err, &se) && se.CurrentVersion == version:
				return store.Info{Name: name, Version: version, Epoch: se.CurrentEpoch}
			case !errors.Is(err, errs.ErrUnavailable):
				c.t.Fatalf("push %s v%d to %s: %v", name, version, st.Primary, err)
			}
			lastErr = err
		}
		time.Sleep(100 * time.Millisecond)
	}
	c.t.Fatalf("push %s v%d: no primary took it within 60s: %v", name, version, lastErr)
	return store.Info{}
}

// newest reads a model's newest version from the primary, following it.
func (c *testCluster) newest(name string) *store.Snapshot {
	c.t.Helper()
	var snap *store.Snapshot
	var lastErr error
	defer func() {
		if snap == nil {
			c.t.Logf("the last pull of %s: %v", name, lastErr)
		}
	}()
	testkit.Eventually(c.t, 60*time.Second, "the primary to answer a pull of "+name, func() bool {
		st, err := c.status()
		if err != nil || st.Primary == nil {
			lastErr = fmt.Errorf("no primary in the cluster's status (%v)", err)
			return false
		}
		cl, err := storerpc.NewClient(storerpc.ClientConfig{Addr: st.Primary.Addr, MaxAttempts: 1, CallTimeout: 10 * time.Second})
		if err != nil {
			lastErr = err
			return false
		}
		defer cl.Close()
		snap, lastErr = cl.Get(context.Background(), name, 0)
		return lastErr == nil
	})
	return snap
}
