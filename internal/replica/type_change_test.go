package replica

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/rlhub/rlhub/internal/cluster"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/store/storetest"
	"github.com/rlhub/rlhub/internal/testkit"
	"github.com/rlhub/rlhub/internal/wire/bulk"
)

// TestS33FailedInstallLeavesNoPartialUnit: a unit whose install fails
// after its commit marker was written must leave the copy with the whole
// unit or none of it — the marker decides (docs/cluster.md: "the mirror
// never holds part of a unit"). Here the failure is a path whose type
// changed on the primary (a file ars/x became a directory ars/x/): the
// unit's moves come before its removals (applyUnit), so the move into
// ars/x/ fails with ENOTDIR after the store's files were moved; the
// follower's deferred clearStage then deletes the marker. The copy holds
// part of the unit, its saved position is the unit before, a restart
// cannot roll it forward, and every later full sync fails the same way.
// TestTypeChangeInstallsWholeUnits: a path that is a file on the standby
// became a directory on the primary (ars/x → ars/x/y) while the standby
// was away, in the same unit as a new version. The install used to fail
// after its commit marker (moves before removals: mkdir ars/x on a file),
// then clear the marker with the stage: the copy kept part of the unit
// (a v3 without ars/x/y) at the position before it, nothing left to roll
// it forward, and every later full sync failed the same way. A marked
// unit is now rolled forward, never cleared, and a path changing type
// installs.
func TestTypeChangeInstallsWholeUnits(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p := startDPPrimary(t, dpOptions{bulkMethod: true})
	if err := os.MkdirAll(filepath.Join(p.dir, "ars"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(p.dir, "ars", "x"), []byte("a file"), 0o644); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cfg := FollowerConfig{DataDir: dir, Member: "s1", Logger: testkit.Logger(), Bulk: bulk.NewClientConfig(bulk.ClientConfig{}),
		Dial: func(_ context.Context, addr string) (*grpc.ClientConn, error) {
			return grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		}}
	f, err := NewFollower(cfg)
	if err != nil {
		t.Fatal(err)
	}
	fctx, fcancel := context.WithCancel(ctx)
	ended := make(chan error, 1)
	go func() { ended <- f.Follow(fctx, cluster.Leader{ID: "p", Addr: p.addr, Epoch: 5}) }()
	for v := uint64(1); v <= 2; v++ {
		p.push(t, ctx, "a", v, 4096)
	}
	fcancel()
	<-ended
	if b, err := os.ReadFile(filepath.Join(dir, "ars", "x")); err != nil || string(b) != "a file" {
		t.Fatalf("ars/x on the standby: %q %v", b, err)
	}
	before := f.position()

	// While the standby is away: ars/x becomes a directory, and a's v3 is
	// committed.
	os.Remove(filepath.Join(p.dir, "ars", "x"))
	if err := os.MkdirAll(filepath.Join(p.dir, "ars", "x"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(p.dir, "ars", "x", "y"), []byte("state"), 0o644); err != nil {
		t.Fatal(err)
	}
	p.src.Changed(filepath.Join(p.dir, "ars", "x"))
	if _, _, err := p.fenced.PushCommitted(ctx, store.PushRequest{Name: "a", Version: 3, Expect: 2, Blob: bytes.Clone(storetest.Blob(t, 3, 1024))}); err != nil {
		t.Fatal(err)
	}
	var ferr error
	for i := 0; i < 3; i++ {
		fctx, fcancel := context.WithTimeout(ctx, 5*time.Second)
		ferr = f.Follow(fctx, cluster.Leader{ID: "p", Addr: p.addr, Epoch: 5})
		fcancel()
		t.Logf("full sync %d: %v (synced %v)", i, ferr, f.Synced())
	}
	_, errV3 := os.Stat(filepath.Join(dir, "store", store.VersionFile("a", 3)))
	_, errY := os.Stat(filepath.Join(dir, "ars", "x", "y"))
	_, errMk := os.Stat(filepath.Join(dir, ".replica", stageName, markerName))
	t.Logf("a v3 present: %v; ars/x/y present: %v; marker left: %v; position %+v (before %+v)", errV3 == nil, errY == nil, errMk == nil, f.position(), before)
	f2, err := NewFollower(cfg) // the standby restarts on this copy
	if err != nil {
		t.Fatalf("restart: %v", err)
	}
	_, errV3 = os.Stat(filepath.Join(dir, "store", store.VersionFile("a", 3)))
	_, errY = os.Stat(filepath.Join(dir, "ars", "x", "y"))
	if (errV3 == nil) != (errY == nil) {
		t.Fatalf("the copy holds part of one unit (a v3 present=%v, ars/x/y present=%v), saved position %+v, no marker to roll it forward; the full syncs ended: %v",
			errV3 == nil, errY == nil, f2.position(), ferr)
	}
	if !f.Synced() {
		t.Fatalf("the standby never completes a full sync: %v", ferr)
	}
	if errV3 != nil || errY != nil {
		t.Fatalf("after a full sync: a v3: %v, ars/x/y: %v", errV3, errY)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "ars", "x", "y")); err != nil || string(b) != "state" {
		t.Fatalf("ars/x/y on the standby: %q %v", b, err)
	}
}
