package replica_test

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/rlhub/rlhub/internal/aggregator"
	"github.com/rlhub/rlhub/internal/cluster/clustertest"
	"github.com/rlhub/rlhub/internal/store/storetest"
	"github.com/rlhub/rlhub/internal/testkit"
)

// TestRollingUpgrade is a rolling upgrade in both directions between two
// builds: `make compat BASE=REV` (scripts/compat.sh) builds REV's rlhub
// and names it in RLHUB_COMPAT_BASE_BIN. A primary of the old build and a
// standby of the new one; the primary killed, the new build serves, the
// old one restarted on its data follows it and acknowledges its
// publishes (acks all); then the new one killed, and the old build serves
// every acknowledged version byte for byte. Not in CI: it needs a second
// build.
func TestRollingUpgrade(t *testing.T) {
	base := os.Getenv("RLHUB_COMPAT_BASE_BIN")
	if base == "" {
		t.Skip("set RLHUB_COMPAT_BASE_BIN to an older build's rlhub (make compat BASE=REV)")
	}
	e := clustertest.Start(t)
	c := newClusterBin(t, e.Endpoint, 1, "2s", base) // h0: the old build
	l1, old := c.leader(0)
	upgraded := &hubProc{t: t, id: "h1", data: t.TempDir()} // this build
	upgraded.bin = rlhubBinary(t)
	c.hubs = append(c.hubs, upgraded)
	c.start(upgraded)
	c.synced(upgraded, l1)
	logFollow(t, upgraded)

	blobs := map[uint64][]byte{}
	push := func(v, epoch uint64) {
		t.Helper()
		blobs[v] = storetest.Blob(t, v, 4096)
		if info := c.push("pol", v, v-1, blobs[v]); info.Version != v || info.Epoch != epoch {
			t.Fatalf("push v%d: landed as v%d epoch %d, want epoch %d", v, info.Version, info.Epoch, epoch)
		}
	}
	check := func(v uint64) {
		t.Helper()
		if snap := c.newest("pol"); snap.Version != v || !bytes.Equal(snap.Blob, blobs[v]) {
			t.Fatalf("the primary has pol v%d (%d bytes), want v%d byte-identical", snap.Version, len(snap.Blob), v)
		}
	}
	for v := uint64(1); v <= 3; v++ {
		push(v, l1.Epoch) // acknowledged by the new build's standby
	}

	old.kill()
	l2, p2 := c.leader(l1.Epoch)
	if p2 != upgraded {
		t.Fatalf("primary after the kill: %s, want the upgraded %s", p2.id, upgraded.id)
	}
	check(3)
	// State this build keeps where the old build mirrors nothing (the
	// aggregator's task, aggregator/): the old build, which refuses a
	// unit naming a path outside its directories, must be sent none.
	l := testkit.StartProc(t, testkit.ProcConfig{Name: "learner", Args: []string{"--log-level", "warn", "learner", "example",
		"--hub", upgraded.addr, "--id", "l1", "--batch-size", "4"}})
	defer l.Kill()
	conn, err := grpc.NewClient(upgraded.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	agg := aggregator.NewClient(conn)
	testkit.Eventually(t, 60*time.Second, "a task started on the upgraded primary", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := agg.Start(ctx, "t1", map[string]any{"w": []any{1.0, 2.0}})
		return err == nil
	})
	c.start(old) // the old build again, on its data, as a standby
	c.synced(old, l2)
	logFollow(t, old)
	for v := uint64(4); v <= 5; v++ {
		push(v, l2.Epoch) // acknowledged by the old build's standby
	}

	upgraded.kill()
	if _, p3 := c.leader(l2.Epoch); p3 != old {
		t.Fatalf("primary after the second kill: %s, want the old build's %s", p3.id, old.id)
	}
	check(5)
}

// logFollow logs how h follows (its last "following the primary" line:
// the transport the two builds agreed on).
func logFollow(t *testing.T, h *hubProc) {
	out := h.out.String()
	if i := strings.LastIndex(out, `msg="replica: following the primary"`); i >= 0 {
		t.Logf("%s: %s", h.id, strings.SplitN(out[i:], "\n", 2)[0])
	}
}
