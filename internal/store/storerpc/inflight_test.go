package storerpc_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/store/storerpc"
	"github.com/rlhub/rlhub/internal/store/storetest"
	"github.com/rlhub/rlhub/internal/testkit"
	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// TestPushesInFlightShareABudget: each push holds its announced size
// from its header on, however slowly its body comes; many at the largest
// size, trickled, held all of it at once. With room for one push's bytes
// (MaxPushBytesInFlight), a second push waits, holding nothing, until
// the first ends, and then lands; a push larger than the whole budget
// still goes through on its own.
func TestPushesInFlightShareABudget(t *testing.T) {
	blob := storetest.Blob(t, 1, 1<<16)
	mem, err := store.NewMemory(store.Config{})
	if err != nil {
		t.Fatal(err)
	}
	svc, err := storerpc.New(storerpc.Config{Store: mem, MaxPushBytesInFlight: int64(len(blob))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { svc.Close(); mem.Close() })
	addr := testkit.ServeGRPC(t, nil, svc.Register)
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	rpc := rlhubv1.NewModelStoreClient(conn)
	ctx := ctxT(t)

	first, err := rpc.Push(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := first.Send(header("a", 1, 0, uint64(len(blob)))); err != nil {
		t.Fatal(err)
	}
	if err := first.Send(chunk(blob[:10])); err != nil { // and then nothing, for now
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, "the first push's header to take the whole budget", func() bool {
		return storerpc.PushBudgetFull(svc)
	})
	c := newClient(t, storerpc.ClientConfig{Addr: addr})
	t.Cleanup(func() { c.Close() })
	second := make(chan error, 1)
	go func() {
		_, err := c.Push(ctx, store.PushRequest{Name: "b", Version: 1, Blob: blob})
		second <- err
	}()
	select {
	case err := <-second:
		t.Fatalf("a second push of %d bytes ended (%v) while the first held the whole budget", len(blob), err)
	case <-time.After(500 * time.Millisecond):
	}
	if _, err := mem.Get(context.Background(), "b", 0); err == nil {
		t.Fatal("the second push landed while the first held the whole budget")
	}
	if err := first.Send(chunk(blob[10:])); err != nil {
		t.Fatal(err)
	}
	if _, err := first.CloseAndRecv(); err != nil {
		t.Fatalf("the first push: %v", err)
	}
	if err := <-second; err != nil {
		t.Fatalf("the second push, once the first ended: %v", err)
	}
	big := storetest.Blob(t, 2, 1<<17) // twice the budget
	if _, err := c.Push(ctx, store.PushRequest{Name: "c", Version: 1, Blob: big}); err != nil {
		t.Fatalf("a push larger than the budget, alone: %v", err)
	}
}
