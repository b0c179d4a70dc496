package replica_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/cluster/clustertest"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/store/storerpc"
	"github.com/rlhub/rlhub/internal/store/storetest"
	"github.com/rlhub/rlhub/internal/testkit"
)

// TestStandbyBackFromAnOldTermGetsTheNewTermsBytes is the end-to-end case
// of the full sync's term rule (TestFullSyncSendsTheTermsFilesToAStandbyNewToIt
// drives the rule against an inventory), with real processes, SIGSTOP and
// SIGKILL:
//
//  1. standby C is stopped; primary A commits v2 of a model (64 MiB, more
//     than C's socket takes in) and ships it to standby B, waiting for C
//     to acknowledge it;
//  2. A is killed before anyone acknowledged v2, B is stopped and C
//     continued: C drops the unit it could not take in whole and, in
//     sync (it has every acknowledged version), is
//     elected and acknowledges another v2, of the same size and other
//     bytes;
//  3. B is continued: it holds A's v2 under the same name and size, and
//     takes its full sync from C.
//
// B must then hold C's bytes: once C is killed and B elected, a pull of v2
// gives what C acknowledged. Keeping files by size alone kept A's bytes
// under C's manifest.
func TestStandbyBackFromAnOldTermGetsTheNewTermsBytes(t *testing.T) {
	if testing.Short() {
		t.Skip("three hubs, two failovers")
	}
	e := clustertest.Start(t)
	// A 10 s lease: C, stopped, keeps its membership (and A's publish
	// keeps waiting for it) through step 1, a second or two. (C is stopped,
	// not killed: a standby whose stream ends leaves the in-sync record at
	// once, and could not take over. And v2 is larger than the socket
	// buffers: a stopped process's socket takes in what fits, and C would
	// apply a small v2 once continued.)
	c := newClusterTTL(t, e.Endpoint, 3, "10s", "--replica-ack-timeout", "60s")
	const model = "pol"
	lA, a := c.leader(0)
	ledBy(t, a, lA.Epoch)
	const floats = 16 << 20 // 64 MiB
	c.push(model, 1, 0, storetest.Blob(t, 1, floats))
	sbs := c.standbys(a)
	b, cc := sbs[0], sbs[1]
	for _, h := range sbs {
		c.synced(h, lA)
	}
	versionFile := func(h *hubProc) string {
		return filepath.Join(h.data, "store", store.VersionFile(model, 2))
	}
	old, acked := storetest.Blob(t, 2, floats), storetest.Blob(t, 3, floats)
	if len(old) != len(acked) || bytes.Equal(old, acked) {
		t.Fatal("the two v2 blobs must have one size and other bytes")
	}

	// 1. A commits v2, B applies it, C (stopped) does not.
	cc.signal(syscall.SIGSTOP)
	stopped := map[*hubProc]bool{cc: true}
	defer func() {
		for h, s := range stopped {
			if s {
				h.signal(syscall.SIGCONT)
			}
		}
	}()
	cl, err := storerpc.NewClient(storerpc.ClientConfig{Addr: a.addr, MaxAttempts: 1, CallTimeout: 60 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	pushed := make(chan error, 1)
	go func() {
		_, err := cl.Push(context.Background(), store.PushRequest{Name: model, Version: 2, Expect: 1, Blob: old})
		pushed <- err
	}()
	testkit.Eventually(t, 30*time.Second, b.id+" holding A's v2", func() bool {
		got, err := os.ReadFile(versionFile(b))
		return err == nil && bytes.Equal(got, old)
	})

	// 2. A dies unacknowledged; C takes over without v2.
	a.kill()
	if err := <-pushed; err == nil {
		t.Fatal("A acknowledged v2 while C, stopped, had not applied it (did step 1 outlast C's lease?)")
	}
	b.signal(syscall.SIGSTOP)
	stopped[b] = true
	cc.signal(syscall.SIGCONT)
	stopped[cc] = false
	lC, p := c.leader(lA.Epoch)
	if p != cc {
		t.Fatalf("%s elected at epoch %d, want %s (%s is stopped)", p.id, lC.Epoch, cc.id, b.id)
	}
	ledBy(t, cc, lC.Epoch)
	if info := c.push(model, 2, 1, acked); info.Epoch != lC.Epoch {
		t.Fatalf("v2 through %s landed at epoch %d, want %d (its own)", cc.id, info.Epoch, lC.Epoch)
	}
	if snap := c.newest(model); snap.Version != 2 || !bytes.Equal(snap.Blob, acked) {
		t.Fatalf("%s serves v%d, not the v2 it acknowledged", cc.id, snap.Version)
	}

	// 3. B comes back from A's term and syncs from C.
	b.signal(syscall.SIGCONT)
	stopped[b] = false
	c.synced(b, lC)
	got, err := os.ReadFile(versionFile(b))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, acked) {
		t.Fatalf("%s, in sync with %s at epoch %d, holds A's unacknowledged v2 (equal to it: %v), not the v2 %s acknowledged",
			b.id, cc.id, lC.Epoch, bytes.Equal(got, old), cc.id)
	}
	cc.kill()
	lB, p := c.leader(lC.Epoch)
	if p != b {
		t.Fatalf("%s elected at epoch %d, want %s", p.id, lB.Epoch, b.id)
	}
	if snap := c.newest(model); snap.Version != 2 || !bytes.Equal(snap.Blob, acked) {
		t.Fatalf("%s, elected after %s, serves v%d (A's bytes: %v), not the v2 %s acknowledged",
			b.id, cc.id, snap.Version, bytes.Equal(snap.Blob, old), cc.id)
	}
}

// ledBy checks that h, primary of epoch, recorded the term as led in its
// data directory (Follower.Lead): its copy's lineage from then on.
func ledBy(t *testing.T, h *hubProc, epoch uint64) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(h.data, ".replica", "led"))
	if err != nil || strings.TrimSpace(string(b)) != strconv.FormatUint(epoch, 10) {
		t.Fatalf("%s, primary of epoch %d, recorded %q as the term it led (%v)", h.id, epoch, b, err)
	}
}
