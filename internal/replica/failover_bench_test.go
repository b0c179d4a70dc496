package replica_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/cluster/clustertest"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/store/storerpc"
	"github.com/rlhub/rlhub/internal/store/storetest"
	"github.com/rlhub/rlhub/internal/testkit"
)

// TestFailoverTimes measures failover: the primary SIGKILLed while a
// client publishes as fast as it can, to the first version the new
// primary publishes (acknowledged by every standby left), p50/p99 over
// RLHUB_FAILOVER_KILLS kills (skipped when unset) at a 2s lease. The
// killed hub is restarted on its data after each kill, so every kill
// finds three hubs. Figures go to the log (docs/benchlog).
func TestFailoverTimes(t *testing.T) {
	kills, _ := strconv.Atoi(os.Getenv("RLHUB_FAILOVER_KILLS"))
	if kills <= 0 {
		t.Skip("set RLHUB_FAILOVER_KILLS=N to measure failover over N kills")
	}
	e := startEtcd(t)
	c := newClusterTTL(t, e, 3, "2s")
	blob := storetest.Blob(t, 1, 1<<16)

	type landed struct {
		at    time.Time
		epoch uint64
	}
	var mu sync.Mutex
	var log []landed
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { // the publisher: follows the primary through etcd
		v := uint64(0)
		for {
			select {
			case <-stop:
				return
			default:
			}
			st, err := c.status()
			if err != nil || st.Primary == nil {
				time.Sleep(20 * time.Millisecond)
				continue
			}
			cl, _ := storerpc.NewClient(storerpc.ClientConfig{Addr: st.Primary.Addr, MaxAttempts: 1, CallTimeout: 3 * time.Second})
			for {
				select {
				case <-stop:
					cl.Close()
					return
				default:
				}
				info, err := cl.Push(context.Background(), store.PushRequest{Name: "pol", Version: v + 1, Expect: store.ExpectAny, Blob: blob})
				if err != nil {
					if cur, gerr := cl.List(context.Background()); gerr == nil {
						for _, i := range cur {
							if i.Name == "pol" {
								v = max(v, i.Version)
							}
						}
					}
					break
				}
				v = info.Version
				mu.Lock()
				log = append(log, landed{at: time.Now(), epoch: info.Epoch})
				mu.Unlock()
			}
			cl.Close()
			time.Sleep(10 * time.Millisecond)
		}
	})
	defer func() { close(stop); wg.Wait() }()

	var took []time.Duration
	after := uint64(0)
	for k := range kills {
		l, p := c.leader(after)
		testkit.Eventually(t, 60*time.Second, "a version published by the primary of epoch "+strconv.FormatUint(l.Epoch, 10), func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(log) > 0 && log[len(log)-1].epoch == l.Epoch
		})
		killed := time.Now()
		p.kill()
		var first time.Time
		testkit.Eventually(t, 60*time.Second, "the new primary's first version", func() bool {
			mu.Lock()
			defer mu.Unlock()
			for _, x := range log {
				if x.epoch > l.Epoch {
					first = x.at
					return true
				}
			}
			return false
		})
		took = append(took, first.Sub(killed))
		t.Logf("kill %d: %v (epoch %d → next)", k+1, first.Sub(killed).Round(time.Millisecond), l.Epoch)
		after = l.Epoch
		c.start(p) // back on its data: three hubs for the next kill
		testkit.Eventually(t, 60*time.Second, "three members again", func() bool {
			st, err := c.status()
			return err == nil && len(st.Members) == 3
		})
		time.Sleep(3 * time.Second) // let it finish its full sync and campaign
	}
	slices.Sort(took)
	q := func(p float64) time.Duration { return took[min(len(took)-1, int(p*float64(len(took))))] }
	t.Logf("failover, kill → first version by the new primary, lease 2s, %d kills: p50 %v p99 %v max %v",
		len(took), q(0.50).Round(time.Millisecond), q(0.99).Round(time.Millisecond), took[len(took)-1].Round(time.Millisecond))
}

// TestReplicationCost measures the store's push and pull throughput on a
// single hub and on a cluster primary with two standbys (acks all, and
// acks 0), interleaved in one run (RLHUB_REPLICATION_COST=1; skipped
// otherwise).
func TestReplicationCost(t *testing.T) {
	if os.Getenv("RLHUB_REPLICATION_COST") == "" {
		t.Skip("set RLHUB_REPLICATION_COST=1 to measure")
	}
	const n, size = 100, 1 << 20 // 1 MiB blobs (256 Ki float32)
	blob := storetest.Blob(t, 1, size/4)
	single := startPlainHub(t)
	e := startEtcd(t)
	all := newClusterTTL(t, e, 3, "2s")
	lAll, _ := all.leader(0)
	async := newClusterTTL(t, e, 3, "2s", "--replica-acks", "0")
	lAsync, _ := async.leader(0)
	measure := func(addr string) (pushes, pulls float64) {
		cl, err := storerpc.NewClient(storerpc.ClientConfig{Addr: addr, MaxAttempts: 1})
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		ctx := context.Background()
		model := fmt.Sprintf("m%d", time.Now().UnixNano())
		start := time.Now()
		for v := uint64(1); v <= n; v++ {
			if _, err := cl.Push(ctx, store.PushRequest{Name: model, Version: v, Expect: v - 1, Blob: blob}); err != nil {
				t.Fatalf("push to %s: %v", addr, err)
			}
		}
		pushes = n / time.Since(start).Seconds()
		start = time.Now()
		for range n {
			if _, err := cl.Get(ctx, model, 0); err != nil {
				t.Fatal(err)
			}
		}
		pulls = n / time.Since(start).Seconds()
		return pushes, pulls
	}
	for round := range 3 {
		sp, sl := measure(single)
		cp, cl := measure(lAll.Addr)
		ap, al := measure(lAsync.Addr)
		t.Logf("round %d, 1 MiB: single hub %.1f pushes/s %.1f pulls/s; primary + 2 standbys, acks all: %.1f pushes/s (%.2fx) %.1f pulls/s (%.2fx); acks 0: %.1f pushes/s (%.2fx) %.1f pulls/s (%.2fx)",
			round+1, sp, sl, cp, cp/sp, cl, cl/sl, ap, ap/sp, al, al/sl)
	}
}

func startEtcd(t *testing.T) string {
	t.Helper()
	return clustertest.Start(t).Endpoint
}

// startPlainHub runs `rlhub serve` without a cluster.
func startPlainHub(t *testing.T) string {
	t.Helper()
	addrFile := filepath.Join(t.TempDir(), "addr")
	return testkit.StartProc(t, testkit.ProcConfig{Name: "plain hub", AddrFile: addrFile,
		Args: []string{"--log-level", "warn", "serve", "--listen", "127.0.0.1:0", "--data", t.TempDir(), "--addr-file", addrFile}}).Addr()
}
