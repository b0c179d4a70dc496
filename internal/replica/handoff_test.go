package replica_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/rlhub/rlhub/internal/cluster/clustertest"
	"github.com/rlhub/rlhub/internal/store/storetest"
)

// TestRoleSwitchNeverRefusesAConnection: while a standby is elected and
// turns into the hub (its standby server stops, the store opens, the hub
// starts), clients keep opening fresh connections to it and asking its
// health. Every one is answered: a connection made between the two roles
// waits for the hub instead of being refused or reset (the address used
// to be closed and bound again at each switch). The primary is killed
// until at least one probe started inside such a switch, at most 5 times.
func TestRoleSwitchNeverRefusesAConnection(t *testing.T) {
	e := clustertest.Start(t)
	c := newCluster(t, e.Endpoint, 2)
	l, p := c.leader(0)
	c.push("pol", 1, 0, storetest.Blob(t, 1, 64))

	var inGap, probes int
	for kill := 1; inGap == 0; kill++ {
		if kill > 5 {
			t.Fatalf("no probe of %d started inside a switch in 5 failovers", probes)
		}
		next := c.standbys(p)[0]
		c.synced(next, l)

		ctx, cancel := context.WithCancel(context.Background())
		type result struct {
			gap bool
			err error
		}
		results := make(chan result, 1<<16)
		var wg sync.WaitGroup
		for range 3 {
			wg.Go(func() {
				for ctx.Err() == nil {
					// A switch is under way when the log says elected but
					// not yet serving (for any term after l's).
					out := next.out.String()
					gap := strings.LastIndex(out, `msg="cluster: elected primary"`) > strings.LastIndex(out, `msg="cluster: serving as primary"`)
					results <- result{gap: gap, err: probe(next.addr)}
				}
			})
		}
		time.Sleep(50 * time.Millisecond) // probes under way before the kill
		p.kill()
		nl, np := c.leader(l.Epoch)
		if np != next {
			cancel()
			wg.Wait()
			t.Fatalf("%s took over, want the only standby %s", np.id, next.id)
		}
		time.Sleep(200 * time.Millisecond)
		cancel()
		wg.Wait()
		close(results)
		for r := range results {
			probes++
			if r.gap {
				inGap++
			}
			if r.err != nil {
				t.Fatalf("failover %d: a connection to %s during its switch to primary failed: %v", kill, next.id, r.err)
			}
		}
		t.Logf("failover %d: %d probes so far, %d started inside a switch", kill, probes, inGap)
		c.start(p) // the victim rejoins as a standby for the next round
		l, p = nl, np
	}
}

// probe opens a fresh connection to addr and asks its health once, with
// no retry: a refused or reset connection is an error.
func probe(addr string) error {
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	resp, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		return err
	}
	if resp.Status != healthpb.HealthCheckResponse_SERVING {
		return fmt.Errorf("health %v", resp.Status)
	}
	return nil
}
