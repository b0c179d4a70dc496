package replica

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/store/storetest"
	"github.com/rlhub/rlhub/internal/testkit"
)

// TestAckPastTheUnitsSentIsRefused: a follower that acknowledges a unit
// the primary never sent on its stream (a buggy or stale standby) had
// the ack taken on trust: with acks all, the next publish was
// acknowledged at once, by a standby that never received it. Such an
// ack now ends the stream (InvalidArgument) and counts for nothing: the
// publish waits for a standby that holds it.
func TestAckPastTheUnitsSentIsRefused(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	src, fenced, addr := grpcSource(t, ctx, 3, 2*time.Second, func(context.Context) ([]string, error) { return []string{"s1"}, nil })

	// s1, raw: takes its full sync (unit 0), then acknowledges a unit far
	// past it.
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	sctx, scancel := context.WithCancel(ctx)
	defer scancel()
	cs, err := cc.NewStream(sctx, &streamDesc, FollowMethod, grpc.CallContentSubtype(codecName))
	if err != nil {
		t.Fatal(err)
	}
	if err := cs.SendMsg(jsonFrame(kindHello, hello{Member: "s1", Epoch: 5, Dirs: mirroredDirs})); err != nil {
		t.Fatal(err)
	}
	readFollowUnit(t, cs)
	const bogus = 1 << 40
	if err := cs.SendMsg(uvarintFrame(kindAck, bogus)); err != nil {
		t.Fatal(err)
	}
	ended := make(chan error, 1)
	go func() {
		for {
			var m wrapperspb.BytesValue
			if err := cs.RecvMsg(&m); err != nil {
				ended <- err
				return
			}
		}
	}()
	select {
	case err := <-ended:
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "past the newest unit sent") {
			t.Errorf("the stream acknowledging unit %d ended with %v, want InvalidArgument naming the ack past the units sent", uint64(bogus), err)
		}
	case <-time.After(5 * time.Second):
		t.Errorf("the stream acknowledging unit %d, never sent, is still open 5s later", uint64(bogus))
	}

	// The bogus ack counts for nothing: a publish is not acknowledged by s1.
	blob1 := storetest.Blob(t, 1, 1<<16)
	_, err = fenced.Push(ctx, store.PushRequest{Name: "m", Version: 1, Blob: blob1})
	if err == nil {
		t.Fatalf("push v1 acknowledged (acks all, standby s1) though s1 never received it; s1 acknowledged unit %d, never sent", uint64(bogus))
	}
	if !errors.Is(err, store.ErrNotAcknowledged) {
		t.Fatalf("push v1 with s1 gone: %v, want not acknowledged", err)
	}
	scancel()

	// A real s1 follows: it takes v1 with its full sync, and the next
	// publish is acknowledged once it holds it.
	d := newDPFollower(t, "", TransportGRPC)
	stop := d.followFor(ctx, addr)
	defer stop()
	testkit.Eventually(t, 30*time.Second, "a real s1 past its full sync", src.Followed)
	blob2 := storetest.Blob(t, 2, 1<<16)
	if _, err := fenced.Push(ctx, store.PushRequest{Name: "m", Version: 2, Expect: store.ExpectAny, Blob: blob2}); err != nil {
		t.Fatalf("push v2 with a real s1 following: %v", err)
	}
	d.same(t, "m", 1, blob1)
	d.same(t, "m", 2, blob2)
}

// TestClaimReleaseDeleteOnAFaultyDiskStepDown: a primary whose Claim,
// Release or Delete fails on its own storage (here a read-only file
// system: EROFS, as ENOSPC or EIO) hands the fault to Fault, as a push
// or a state write does, so it steps down for a standby; the write fails
// as Unavailable. Before, those three returned the store's error and the
// primary kept its term.
func TestClaimReleaseDeleteOnAFaultyDiskStepDown(t *testing.T) {
	dir := t.TempDir()
	storeDir := filepath.Join(dir, "store")
	st, err := store.OpenFile(store.FileConfig{Dir: storeDir, Store: store.Config{Retain: 3}, Logger: testkit.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	src, err := NewSource(SourceConfig{DataDir: dir, Epoch: 5, Acks: AcksAll, Logger: testkit.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	var mu sync.Mutex
	var faults []error
	fenced := &Fenced{Store: st, Epoch: 5, Source: src, Fault: func(err error) bool {
		mu.Lock()
		defer mu.Unlock()
		faults = append(faults, err)
		return true // a standby follows: step down
	}}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, req := range []store.PushRequest{
		{Name: "free", Version: 1, Blob: storetest.Blob(t, 1, 1<<12)},
		{Name: "owned", Version: 1, Owner: "alice", Claim: true, Blob: storetest.Blob(t, 2, 1<<12)},
	} {
		if _, err := fenced.Push(ctx, req); err != nil {
			t.Fatalf("push %s: %v", req.Name, err)
		}
	}

	readOnlyBind(t, storeDir)
	for _, w := range []struct {
		what string
		do   func() error
	}{
		{"claim", func() error { return fenced.Claim(ctx, "free", "bob") }},
		{"release", func() error { return fenced.Release(ctx, "owned", "alice") }},
		{"delete", func() error { return fenced.Delete(ctx, "free") }},
	} {
		mu.Lock()
		before := len(faults)
		mu.Unlock()
		err := w.do()
		mu.Lock()
		told := faults[before:]
		mu.Unlock()
		if !errors.Is(err, errs.ErrUnavailable) || !strings.Contains(err.Error(), "steps down for a standby") {
			t.Errorf("%s on a read-only store: %v, want Unavailable: the primary steps down", w.what, err)
		}
		if len(told) != 1 || !errors.Is(told[0], syscall.EROFS) {
			t.Errorf("%s on a read-only store: Fault told %v, want the EROFS once", w.what, told)
		}
	}
}

// readOnlyBind makes dir read-only (a read-only bind mount over it,
// undone at the test's end): every write under it from then on fails
// with EROFS, as on a file system the kernel remounted read-only.
func readOnlyBind(t *testing.T, dir string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("a read-only bind mount needs root")
	}
	if out, err := exec.Command("mount", "--bind", dir, dir).CombinedOutput(); err != nil {
		t.Skipf("bind mount %s: %v: %s", dir, err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", dir, err, out)
		}
	})
	if out, err := exec.Command("mount", "-o", "remount,bind,ro", dir).CombinedOutput(); err != nil {
		t.Fatalf("remount %s read-only: %v: %s", dir, err, out)
	}
}
