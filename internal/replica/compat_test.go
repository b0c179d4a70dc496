package replica_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/rlhub/rlhub/internal/aggregator"
	"github.com/rlhub/rlhub/internal/cluster/clustertest"
	"github.com/rlhub/rlhub/internal/optim"
	"github.com/rlhub/rlhub/internal/reducer"
	"github.com/rlhub/rlhub/internal/safetensors"
	"github.com/rlhub/rlhub/internal/store/storetest"
	"github.com/rlhub/rlhub/internal/tensor"
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
	// Reducer steps: their journal reaches a standby of either build
	// from a primary of the other (a newer primary sends an older
	// standby the journal whole, not as appends it cannot take).
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	gsd, _ := tensor.NewStateDict(tensor.FromFloat32s("w", []int64{4}, make([]float32, 4)))
	gblob, err := safetensors.Encode(gsd, nil)
	if err != nil {
		t.Fatal(err)
	}
	grad, _ := tensor.NewStateDict(tensor.FromFloat32s("w", []int64{4}, []float32{1, 1, 1, 1}))
	c.push("g", 1, 0, gblob)
	step := func(h *hubProc, want uint64) {
		t.Helper()
		rc, err := reducer.NewClient(reducer.ClientConfig{Hub: h.addr, ClientID: fmt.Sprintf("compat-%d", want)})
		if err != nil {
			t.Fatal(err)
		}
		defer rc.Close()
		if want == 2 {
			if _, _, err := rc.Register(ctx, reducer.ModelConfig{Model: "g", Optimizer: optim.Config{Kind: optim.SGD, LR: 0.1}}); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := rc.PushGrad(ctx, "g", want-1, grad); err != nil {
			t.Fatalf("gradient on g v%d: %v", want-1, err)
		}
		testkit.Eventually(t, time.Minute, "g's step published", func() bool { return c.newest("g").Version >= want })
	}
	journal := func(h *hubProc) (uint64, []byte) {
		steps, err := reducer.ReadJournal(filepath.Join(h.data, "reducer"), "g")
		raw, _ := os.ReadFile(filepath.Join(h.data, "reducer", "g", "journal.log"))
		if err != nil || len(steps) == 0 {
			return 0, raw
		}
		return steps[len(steps)-1].Version, raw
	}
	for v := uint64(2); v <= 4; v++ {
		step(old, v)
	}
	testkit.Eventually(t, time.Minute, "g's journal through v4 on the new build's standby", func() bool {
		v, _ := journal(upgraded)
		return v == 4
	})

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
	for v := uint64(5); v <= 7; v++ {
		step(upgraded, v)
	}
	testkit.Eventually(t, time.Minute, "g's journal through v7 on the old build's standby, the primary's byte for byte", func() bool {
		v, b := journal(old)
		_, a := journal(upgraded)
		return v == 7 && bytes.Equal(a, b)
	})

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
