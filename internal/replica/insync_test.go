package replica_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/cluster"
	"github.com/rlhub/rlhub/internal/store/storetest"
	"github.com/rlhub/rlhub/internal/testkit"
)

// kill -9 alone loses nothing acknowledged, whatever the order. The
// standbys are killed; the primary goes on without them once their leases
// lapse and acknowledges two more versions; it is killed in turn and the
// standbys start again. Neither may serve: their copies lack what the
// primary acknowledged alone (the in-sync record lists the primary only).
// Once the old primary is back it is elected, the standbys follow it, and
// every hub holds the last acknowledged version. Before the record, a
// restarted standby was elected with its old copy and the old primary,
// back, followed it and dropped the versions it had acknowledged.
// forget-in-sync (an operator's choice once the in-sync members are lost
// for good) lets the others take over.
func TestStaleStandbysDoNotTakeOver(t *testing.T) {
	c := newCluster(t, startEtcd(t), 3)
	l, p := c.leader(0)
	blobs := map[uint64][]byte{}
	push := func(v uint64) {
		t.Helper()
		blobs[v] = storetest.Blob(t, v, 1<<12)
		c.push("m", v, v-1, blobs[v])
	}
	push(1)
	standbys := c.standbys(p)
	for _, h := range standbys {
		h.kill()
	}
	push(2) // waits for the dead standbys until their leases lapse
	push(3)
	if st, err := c.status(); err != nil || st.InSync == nil || strings.Join(st.InSync.Members, ",") != p.id {
		t.Fatalf("in-sync record after the standbys died: %+v %v, want %s alone", st.InSync, err, p.id)
	}
	p.kill()
	for _, h := range standbys {
		c.start(h)
	}
	// Each says it waits for an in-sync member — or one serves.
	serving := func() *hubProc {
		for _, h := range standbys {
			if strings.Contains(h.out.String(), "cluster: serving as primary") {
				return h
			}
		}
		return nil
	}
	testkit.Eventually(t, 30*time.Second, "the restarted standbys to wait for an in-sync member", func() bool {
		waiting := 0
		for _, h := range standbys {
			if strings.Contains(h.out.String(), "only an in-sync member may take over") {
				waiting++
			}
		}
		return waiting == len(standbys) || serving() != nil
	})
	if h := serving(); h != nil {
		t.Fatalf("%s served with a copy that lacks acknowledged versions:\n%s", h.id, h.out.String())
	}

	c.start(p)
	l2, p2 := c.leader(l.Epoch)
	if p2 != p {
		t.Fatalf("the new primary is %s, want %s (the only in-sync copy)", p2.id, p.id)
	}
	for _, h := range standbys {
		c.synced(h, l2)
	}
	if snap := c.newest("m"); snap.Version != 3 || !bytes.Equal(snap.Blob, blobs[3]) {
		t.Fatalf("after the in-sync primary's return: m v%d, want v3 as pushed", snap.Version)
	}
	// Standbys that caught up are in sync again: one takes over a kill.
	testkit.Eventually(t, 30*time.Second, "the standbys recorded in sync", func() bool {
		st, err := c.status()
		return err == nil && st.InSync != nil && len(st.InSync.Members) == 3
	})
	p.kill()
	l3, _ := c.leader(l2.Epoch)
	if snap := c.newest("m"); snap.Version != 3 || !bytes.Equal(snap.Blob, blobs[3]) {
		t.Fatalf("after a kill of the in-sync primary: m v%d on %s, want v3", snap.Version, l3)
	}
}

// An operator who lost the in-sync members for good forgets the record:
// the members left take over with what they hold.
func TestForgetInSyncLetsTheOthersTakeOver(t *testing.T) {
	etcd := startEtcd(t)
	c := newCluster(t, etcd, 2)
	l, p := c.leader(0)
	c.push("m", 1, 0, storetest.Blob(t, 1, 64))
	standby := c.standbys(p)[0]
	c.synced(standby, l) // holds v1: killed before its full sync, it took over with nothing
	standby.kill()
	c.push("m", 2, 1, storetest.Blob(t, 2, 64))
	p.kill() // its disk is lost with it
	c.start(standby)
	testkit.Eventually(t, 30*time.Second, standby.id+" to wait for an in-sync member", func() bool {
		return strings.Contains(standby.out.String(), "only an in-sync member may take over")
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rec, err := cluster.ForgetInSync(ctx, cluster.Config{Endpoints: []string{etcd}, Cluster: c.name})
	if err != nil || rec == nil || !rec.Has(p.id) {
		t.Fatalf("ForgetInSync: %+v %v, want the record listing %s", rec, err, p.id)
	}
	if _, h := c.leader(l.Epoch); h != standby {
		t.Fatalf("the new primary is %s, want %s", h.id, standby.id)
	}
	if snap := c.newest("m"); snap.Version != 1 {
		t.Fatalf("m at v%d after forgetting, want v1 (what the standby held)", snap.Version)
	}
}
