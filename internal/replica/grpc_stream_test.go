package replica

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/rlhub/rlhub/internal/cluster"
	"github.com/rlhub/rlhub/internal/testkit"
)

// grpcFollower follows src, served on gRPC at addr, as member, following
// again whenever its stream ends (as a standby's Node does) until the
// test ends; it returns the follower and how many streams it opened.
func grpcFollower(t *testing.T, addr, member string, again bool) (*Follower, func() int) {
	t.Helper()
	f, err := NewFollower(FollowerConfig{DataDir: t.TempDir(), Member: member, Logger: testkit.Logger(),
		Dial: func(_ context.Context, a string) (*grpc.ClientConn, error) {
			return grpc.NewClient(a, grpc.WithTransportCredentials(insecure.NewCredentials()))
		}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		streams int
	)
	t.Cleanup(func() { cancel(); wg.Wait() })
	wg.Go(func() {
		for ctx.Err() == nil {
			mu.Lock()
			streams++
			mu.Unlock()
			_ = f.Follow(ctx, cluster.Leader{ID: "p", Addr: addr, Epoch: 5})
			if !again {
				return
			}
			select {
			case <-ctx.Done():
			case <-time.After(20 * time.Millisecond):
			}
		}
	})
	testkit.Eventually(t, 30*time.Second, member+"'s full sync", f.Synced)
	return f, func() int { mu.Lock(); defer mu.Unlock(); return streams }
}

// TestFailedShippingEndsTheGRPCStream: a snapshot whose walk fails ends
// the follower's stream with an error, on gRPC as on the data plane. The
// stream's end waited for the follower's next frame, which a follower
// waiting for its next unit never sends: the stream stayed, and every
// publish after waited for it until its acknowledgement timeout. Now the
// follower follows again (a new full sync) and the publishes go on.
func TestFailedShippingEndsTheGRPCStream(t *testing.T) {
	dir := t.TempDir()
	src, err := NewSource(SourceConfig{DataDir: dir, Epoch: 5, Acks: AcksAll, AckTimeout: 2 * time.Second, Logger: testkit.Logger(),
		Standbys: func(context.Context) ([]string, error) { return []string{"s"}, nil }})
	if err != nil {
		t.Fatal(err)
	}
	addr := testkit.ServeGRPC(t, nil, src.Register)
	t.Cleanup(func() { src.Close() })
	_, streams := grpcFollower(t, addr, "s", true)
	ctx := context.Background()
	sb, _ := src.Prepare(ctx)
	if err := src.Sync(ctx, sb); err != nil {
		t.Fatalf("first publish: %v", err)
	}
	file := filepath.Join(dir, "reducer", "m", "state.json")
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	src.Changed(filepath.Join(file, "under-a-file")) // the next snapshot's walk fails (not a directory)
	// Acknowledged or not: the follower's next stream's full sync holds it.
	err = src.Sync(ctx, sb)
	t.Logf("the publish whose snapshot failed: %v", err)
	for i := range 3 {
		if err := src.Sync(ctx, sb); err != nil {
			t.Fatalf("publish %d after one failed snapshot (the follower opened %d streams): %v", i, streams(), err)
		}
	}
	if n := streams(); n < 2 {
		t.Fatalf("the follower opened %d streams: the failed one was not ended", n)
	}
}

// TestLapsedGRPCStreamEnds: a follower on gRPC whose lease lapsed (a
// refresh no longer lists it) has its stream ended at the primary, not
// only cancelled: it stayed open, idle, holding every snapshot after the
// one it had, and Close waited for it.
func TestLapsedGRPCStreamEnds(t *testing.T) {
	var mu sync.Mutex
	registered := []string{"cut"}
	src, err := NewSource(SourceConfig{DataDir: t.TempDir(), Epoch: 5, Logger: testkit.Logger(),
		Standbys: func(context.Context) ([]string, error) { mu.Lock(); defer mu.Unlock(); return registered, nil }})
	if err != nil {
		t.Fatal(err)
	}
	addr := testkit.ServeGRPC(t, nil, src.Register)
	grpcFollower(t, addr, "cut", false)
	ctx := context.Background()
	if err := src.RefreshStandbys(ctx); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	registered = nil // its lease lapsed
	mu.Unlock()
	if err := src.RefreshStandbys(ctx); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, "the lapsed stream to end at the primary", func() bool {
		acked, _ := src.Followers()
		_, ok := acked["cut"]
		return !ok
	})
	done := make(chan error, 1)
	go func() { done <- src.Close() }()
	select {
	case err := <-done:
		if err != nil && !errors.Is(err, context.Canceled) {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Source.Close waits for the lapsed stream")
	}
}

// TestLedTermIsKeptAndSentInTheHello: the term a hub led (Follower.Lead,
// called as it becomes primary) survives its restart, only grows, and its
// hello names it, as the primary's full sync needs to tell its lineage.
func TestLedTermIsKeptAndSentInTheHello(t *testing.T) {
	dir := t.TempDir()
	newFollower := func() *Follower {
		f, err := NewFollower(FollowerConfig{DataDir: dir, Member: "s", Logger: testkit.Logger(),
			Dial: func(_ context.Context, a string) (*grpc.ClientConn, error) {
				return grpc.NewClient(a, grpc.WithTransportCredentials(insecure.NewCredentials()))
			}})
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	f := newFollower()
	if lineage, err := f.Lead(9); err != nil || lineage != 0 {
		t.Fatalf("a new copy leading term 9: lineage %d, %v (want 0)", lineage, err)
	}
	f = newFollower() // restarted
	if lineage, err := f.Lead(8); err != nil || lineage != 9 || f.ledTerm() != 9 {
		t.Fatalf("after leading 9, Lead(8): lineage %d, led %d, %v (want 9 and 9)", lineage, f.ledTerm(), err)
	}
	src, err := NewSource(SourceConfig{DataDir: t.TempDir(), Epoch: 10, Logger: testkit.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	addr := testkit.ServeGRPC(t, nil, src.Register)
	t.Cleanup(func() { src.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	wg.Go(func() { _ = f.Follow(ctx, cluster.Leader{ID: "p", Addr: addr, Epoch: 10}) })
	testkit.Eventually(t, 30*time.Second, "the full sync", f.Synced)
	src.mu.Lock()
	defer src.mu.Unlock()
	for p := range src.followers {
		if p.led != 9 {
			t.Fatalf("the primary has the follower's led term as %d, want 9", p.led)
		}
		return
	}
	t.Fatal("no follower at the primary")
}

// TestHelloWithABadMemberIDIsRefused: the member id a hello names is
// logged and counts acknowledgements; one that is not a member id (10 KiB
// of it here) is refused as invalid, without echoing it, and the stream
// never becomes a follower.
func TestHelloWithABadMemberIDIsRefused(t *testing.T) {
	src, cc := primaryOnGRPC(t)
	for _, member := range []string{strings.Repeat("m", 10<<10), "", "a b", "../x"} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		cs, err := cc.NewStream(ctx, &streamDesc, FollowMethod)
		if err != nil {
			t.Fatal(err)
		}
		if err := cs.SendMsg(jsonFrame(kindHello, hello{Member: member, Epoch: 5, Dirs: mirroredDirs})); err != nil {
			t.Fatal(err)
		}
		var m wrapperspb.BytesValue
		err = cs.RecvMsg(&m)
		cancel()
		if status.Code(err) != codes.InvalidArgument || len(err.Error()) > 200 || (member != "" && strings.Contains(err.Error(), member)) {
			t.Fatalf("hello naming member %.20q (%d bytes): %v (want a short InvalidArgument)", member, len(member), err)
		}
	}
	if acked, _ := src.Followers(); len(acked) != 0 {
		t.Fatalf("followers after refused hellos: %v", acked)
	}
}

// TestHelloThatDoesNotParseIsNotEchoed: encoding/json quotes a number it
// cannot store in its error; a hello of 1 MiB of digits came back whole
// in the stream's status (past gRPC's header limits and the 2 KiB bound
// on error text). The status is short now.
func TestHelloThatDoesNotParseIsNotEchoed(t *testing.T) {
	_, cc := primaryOnGRPC(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cs, err := cc.NewStream(ctx, &streamDesc, FollowMethod)
	if err != nil {
		t.Fatal(err)
	}
	hello := append([]byte(`{"member":"s1","epoch":1`), bytes.Repeat([]byte("9"), 1<<20)...)
	if err := cs.SendMsg(frame(kindHello, append(hello, '}'))); err != nil {
		t.Fatal(err)
	}
	var m wrapperspb.BytesValue
	err = cs.RecvMsg(&m)
	if status.Code(err) != codes.InvalidArgument || len(err.Error()) > 500 {
		t.Fatalf("a hello of 1 MiB of digits: %d bytes of error, code %v (want a short InvalidArgument)", len(fmt.Sprint(err)), status.Code(err))
	}
}

// primaryOnGRPC is a Source of epoch 5 served on gRPC, with a connection
// to it for raw Follow streams; both end with the test.
func primaryOnGRPC(t *testing.T) (*Source, *grpc.ClientConn) {
	t.Helper()
	src, err := NewSource(SourceConfig{DataDir: t.TempDir(), Epoch: 5, Logger: testkit.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	addr := testkit.ServeGRPC(t, nil, src.Register)
	t.Cleanup(func() { src.Close() })
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return src, cc
}
