package cluster

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/rlhub/rlhub/internal/cluster/clustertest"
	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/testkit"
)

// lateAnswers is a TCP proxy to etcd that forwards requests at once and,
// while late is set, holds each of etcd's answers back by delay: an etcd
// that applies a write but answers it late (a loaded machine, an fsync
// stall).
type lateAnswers struct {
	addr  string
	late  atomic.Bool
	delay time.Duration
}

func startLateAnswers(t *testing.T, target string, delay time.Duration) *lateAnswers {
	p := &lateAnswers{delay: delay}
	p.addr = testkit.StartProxy(t, target, func(c, s net.Conn) {
		buf := make([]byte, 64<<10)
		for {
			n, err := s.Read(buf)
			if n > 0 {
				if p.late.Load() {
					time.Sleep(p.delay)
				}
				if _, werr := c.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	}).Addr()
	return p
}

// A campaign whose first write etcd applied but answered after the
// attempt's deadline fails (Unavailable) and leaves no key in the
// election: a key left there would lead it for a member that has no term
// — clients would see it as the primary, and no other member could be
// elected while its lease lives (it renews it, for ever).
func TestFailedCampaignLeavesNoKey(t *testing.T) {
	e := clustertest.Start(t)
	const ttl = 2 * time.Second
	// Answers three attempts late: the campaign's write cannot be
	// answered in time, however the machine is loaded.
	proxy := startLateAnswers(t, strings.TrimPrefix(e.Endpoint, "http://"), 3*keeperAttempt(ttl))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	a, err := Join(ctx, Config{Endpoints: []string{"http://" + proxy.addr}, Cluster: "c", ID: "a", Addr: "127.0.0.1:1",
		LeaseTTL: ttl, Logger: testkit.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b := join(t, e.Endpoint, "c", "b", ttl)

	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{e.Endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	pfx := a.cfg.electionPrefix()
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	events := cli.Watch(wctx, pfx, clientv3.WithPrefix())
	if err := cli.RequestProgress(ctx); err != nil { // the watch is set up
		t.Fatal(err)
	}
	<-events

	proxy.late.Store(true)
	term, err := a.Campaign(ctx)
	proxy.late.Store(false)
	if err == nil {
		t.Fatalf("a's campaign was answered in time (epoch %d), through a proxy answering %v late", term.Epoch, proxy.delay)
	}
	if !errors.Is(err, errs.ErrUnavailable) {
		t.Fatalf("a's campaign: %v, want Unavailable", err)
	}
	t.Logf("a's campaign: %v", err)

	// etcd applied the write (the proxy forwards at once), and the key
	// is gone again.
	var seen []string
	put := false
	for gone := false; !gone; {
		select {
		case w := <-events:
			for _, ev := range w.Events {
				seen = append(seen, ev.Type.String()+" "+string(ev.Kv.Key))
				put = put || ev.Type == mvccpb.PUT
				gone = put && ev.Type == mvccpb.DELETE
			}
		case <-time.After(10 * time.Second):
			keys, _ := cli.Get(ctx, pfx, clientv3.WithPrefix(), clientv3.WithKeysOnly())
			st, _ := b.Status(ctx)
			t.Fatalf("a's campaign failed, yet its key stays: the election saw %v, holds %d keys, and Status names primary %v", seen, len(keys.Kvs), st.Primary)
		}
	}
	if st, err := b.Status(ctx); err != nil || st.Primary != nil {
		t.Fatalf("Status after a's failed campaign: primary %v, %v; want none", st.Primary, err)
	}
	bctx, bcancel := context.WithTimeout(ctx, 5*time.Second)
	defer bcancel()
	if _, err := b.Campaign(bctx); err != nil {
		t.Fatalf("b's campaign after a's failed one: %v", err)
	}
}
