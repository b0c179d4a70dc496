package replica_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/cluster"
	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/store/storetest"
	"github.com/rlhub/rlhub/internal/testkit"
)

// A standby whose disk is full cannot apply the primary's units. It used
// to stay a member and follow again every 200 ms, so every acks-all
// publish waited for it until --replica-ack-timeout and failed, for as
// long as the disk stayed full. Now it leaves the cluster (ERROR, naming
// the write that failed): publishes go on without it, and it joins again
// after --replica-fault-backoff, catching up once there is room.
func TestStandbyWithAFullDiskLeavesTheCluster(t *testing.T) {
	disk := testkit.SmallTmpfs(t, "16m")
	primary := &hubProc{t: t, id: "h0", data: t.TempDir()}
	standby := &hubProc{t: t, id: "h1", data: filepath.Join(disk, "data"), args: []string{"--replica-fault-backoff", "2s", "--metrics-listen", "127.0.0.1:0"}}
	c, _ := primaryAndStandby(t, "full", primary, standby)

	// The disk fills up (another process's file): less room is left than
	// one 1 MiB version takes. Every push from then on, until the standby
	// has hit its full disk and for five after, is acknowledged, with one
	// attempt and the default 10 s acknowledgement timeout.
	ballast := filepath.Join(disk, "ballast")
	fill(t, ballast, 512<<10)
	cl := c.client(primary.addr)
	var (
		n    uint64
		last []byte
		full uint64 // the version pushed when the standby first said so
	)
	for full == 0 || n < full+5 {
		n++
		if n > 40 {
			t.Fatalf("40 versions of 1 MiB and the standby's disk never full:\n%s", standby.out.String())
		}
		last = storetest.Blob(t, n, 1<<18)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		_, err := cl.Push(ctx, store.PushRequest{Name: "m", Version: n, Expect: store.ExpectAny, Blob: last})
		cancel()
		if err != nil {
			t.Fatalf("push v%d (the standby's disk full since v%d): %v", n, full, err)
		}
		if full == 0 && strings.Contains(standby.out.String(), "no space left on device") {
			full = n
		}
	}
	if out := standby.out.String(); !strings.Contains(out, "cluster: left the cluster: this hub cannot write its data") {
		t.Fatalf("the standby did not say it left for its full disk:\n%s", out)
	}
	// Out of the cluster it says so to its probes and metrics (the
	// endpoint moves with each join: port 0).
	testkit.Eventually(t, 30*time.Second, "the standby's metrics out of the cluster", func() bool {
		as := metricsAddrs(standby)
		if len(as) == 0 {
			return false
		}
		got, err := scrape(t, as[len(as)-1][0])
		code, _, rerr := readyz(as[len(as)-1][0])
		return err == nil && rerr == nil && got["rlhub_cluster_member"] == 0 && got["rlhub_cluster_faults_total"] >= 1 && code == 503
	})

	// Room again: it joins, and its copy catches up with the newest version.
	if err := os.Remove(ballast); err != nil {
		t.Fatal(err)
	}
	want := filepath.Join(standby.data, "store", "m", fmt.Sprintf("v%020d.safetensors", n))
	testkit.Eventually(t, 60*time.Second, fmt.Sprintf("the standby's copy of v%d", n), func() bool {
		b, err := os.ReadFile(want)
		return err == nil && bytes.Equal(b, last)
	})
	testkit.Eventually(t, 30*time.Second, "the standby a member again", func() bool {
		st, err := c.status()
		if err != nil {
			return false
		}
		for _, m := range st.Members {
			if m.ID == standby.id {
				return true
			}
		}
		return false
	})
	if s := c.newest("m"); s.Version != n || !bytes.Equal(s.Blob, last) {
		t.Fatalf("the primary's newest is v%d, want v%d as pushed", s.Version, n)
	}
}

// primaryAndStandby starts, on a new etcd, primary (id h0) alone, then
// standby (h1) once h0 leads, and returns when h1 is synced and every
// publish of h0 waits for it (from the primary's next read of the members
// on): the cluster and h0's term.
func primaryAndStandby(t *testing.T, name string, primary, standby *hubProc) (*testCluster, cluster.Leader) {
	t.Helper()
	c := &testCluster{t: t, etcd: startEtcd(t), name: fmt.Sprintf("%s%d", name, os.Getpid()), leaseTTL: "2s"}
	c.hubs = append(c.hubs, primary)
	c.start(primary)
	l, p := c.leader(0)
	if p != primary {
		t.Fatalf("the primary is %s, want %s (the only hub)", p.id, primary.id)
	}
	c.hubs = append(c.hubs, standby)
	c.start(standby)
	c.synced(standby, l)
	testkit.Eventually(t, 30*time.Second, "the primary to wait for "+standby.id, func() bool {
		return strings.Contains(primary.out.String(), `msg="replica: registered standbys" members=`+standby.id)
	})
	return c, l
}

// fill writes path with zeros until its file system has at most left
// bytes free (statfs's available blocks).
func fill(t *testing.T, path string, left int64) {
	t.Helper()
	var st syscall.Statfs_t
	if err := syscall.Statfs(filepath.Dir(path), &st); err != nil {
		t.Fatal(err)
	}
	size := int64(st.Bavail)*st.Bsize - left
	if size <= 0 {
		return
	}
	if err := os.WriteFile(path, make([]byte, size), 0o644); err != nil {
		t.Fatalf("fill %s with %d bytes: %v", path, size, err)
	}
}

// A primary whose disk is full fails every write, and the reducer stops
// its models until a restart. With a standby following, it now steps down
// for it at the first write that fails on its storage (that write fails
// as Unavailable: nothing was committed, and a following client writes
// again to the next primary), leaves the cluster, and joins again as a
// standby once there is room.
func TestPrimaryWithAFullDiskStepsDown(t *testing.T) {
	disk := testkit.SmallTmpfs(t, "16m")
	primary := &hubProc{t: t, id: "h0", data: filepath.Join(disk, "data"), args: []string{"--replica-fault-backoff", "2s"}}
	standby := &hubProc{t: t, id: "h1", data: t.TempDir()}
	c, l := primaryAndStandby(t, "pfull", primary, standby)
	blobs := map[uint64][]byte{}
	for v := uint64(1); v <= 2; v++ {
		blobs[v] = storetest.Blob(t, v, 1<<18)
		c.push("m", v, store.ExpectAny, blobs[v])
	}

	fill(t, filepath.Join(disk, "ballast"), 512<<10)
	blobs[3] = storetest.Blob(t, 3, 1<<18)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	_, err := c.client(primary.addr).Push(ctx, store.PushRequest{Name: "m", Version: 3, Expect: store.ExpectAny, Blob: blobs[3]})
	cancel()
	if !errors.Is(err, errs.ErrUnavailable) || !strings.Contains(err.Error(), "no space left on device") {
		t.Fatalf("push to the primary with its disk full: %v, want Unavailable naming the full disk", err)
	}
	l2, p2 := c.leader(l.Epoch)
	if p2 != standby {
		t.Fatalf("after h0's disk filled, %s leads (%v), want h1", p2.id, l2)
	}
	c.push("m", 3, store.ExpectAny, blobs[3])
	if s := c.newest("m"); s.Version != 3 || !bytes.Equal(s.Blob, blobs[3]) || s.Epoch != l2.Epoch {
		t.Fatalf("newest after the step-down: v%d epoch %d, want v3 as pushed at epoch %d", s.Version, s.Epoch, l2.Epoch)
	}
	out := primary.out.String()
	for _, w := range []string{"cluster: this primary cannot write its store; stepping down for a standby", "cluster: left the cluster: this hub cannot write its data"} {
		if !strings.Contains(out, w) {
			t.Errorf("h0 did not log %q:\n%s", w, out)
		}
	}

	// Room again: h0 follows h1, and its copy holds every version.
	if err := os.Remove(filepath.Join(disk, "ballast")); err != nil {
		t.Fatal(err)
	}
	want := filepath.Join(primary.data, "store", "m", fmt.Sprintf("v%020d.safetensors", 3))
	testkit.Eventually(t, 60*time.Second, "h0's copy of v3", func() bool {
		b, err := os.ReadFile(want)
		return err == nil && bytes.Equal(b, blobs[3])
	})
}
