package replica

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/cluster"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/store/storetest"
)

// followFor runs one Follow of addr until the returned stop is called.
func (d *dpFollower) followFor(ctx context.Context, addr string) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		d.ends <- d.f.Follow(ctx, cluster.Leader{ID: "p", Addr: addr, Epoch: 5})
	}()
	return func() { cancel(); <-done }
}

// TestFullSyncSendsAVersionWrittenTwiceInTheTerm: a model deleted and
// pushed again at the same version and size while the standby is away
// (its lease held). The standby's full sync on its return names this
// term, so it kept its copies of the term's version files by size: it
// held the old bytes at that name and acknowledged the new publish (acks
// all) over them. A deleted model's files are now sent again.
func TestFullSyncSendsAVersionWrittenTwiceInTheTerm(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p := startDPPrimary(t, dpOptions{bulkMethod: true})
	d := newDPFollower(t, "", TransportAuto)
	stop := d.followFor(ctx, p.addr)

	old := storetest.Blob(t, 1, 1<<18)
	if _, err := p.fenced.Push(ctx, store.PushRequest{Name: "m", Version: 1, Blob: bytes.Clone(old)}); err != nil {
		t.Fatal(err)
	}
	d.same(t, "m", 1, old)
	stop() // the standby goes away (its lease still held: registered)

	// Delete and push again while it is away: neither can be acknowledged.
	short, c1 := context.WithTimeout(ctx, 300*time.Millisecond)
	err := p.fenced.Delete(short, "m")
	c1()
	t.Logf("delete while the standby is away: %v", err)
	nu := storetest.Blob(t, 2, 1<<18) // same size, other bytes
	if len(nu) != len(old) || bytes.Equal(nu, old) {
		t.Fatalf("want same size, other bytes: %d %d", len(nu), len(old))
	}
	short, c2 := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err = p.fenced.Push(short, store.PushRequest{Name: "m", Version: 1, Blob: bytes.Clone(nu)})
	c2()
	t.Logf("push of the new v1 while the standby is away: %v", err)

	// The standby comes back; the client retries the push (the same bytes):
	// it is acknowledged once the standby took its full sync.
	stop = d.followFor(ctx, p.addr)
	defer stop()
	if _, err := p.fenced.Push(ctx, store.PushRequest{Name: "m", Version: 1, Blob: bytes.Clone(nu)}); err != nil {
		t.Fatalf("retried push: %v", err)
	}
	acked, _ := p.src.Followers()
	t.Logf("acknowledged (acks all); follower units: %v", acked)
	d.same(t, "m", 1, nu)
}
