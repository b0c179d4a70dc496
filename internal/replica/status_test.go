package replica_test

import (
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/cluster/clustertest"
	"github.com/rlhub/rlhub/internal/store/storetest"
	"github.com/rlhub/rlhub/internal/testkit"
)

// statusRow is one member's row of `rlhub cluster status`.
type statusRow struct{ role, unit, lag, synced string }

// clusterStatus runs `rlhub cluster status` and returns its rows by member
// id and its whole output.
func (c *testCluster) clusterStatus(t *testing.T) (map[string]statusRow, string) {
	t.Helper()
	p := testkit.StartProc(t, testkit.ProcConfig{Name: "cluster status", Path: c.bin,
		Args: []string{"cluster", "status", "--etcd", c.etcd, "--cluster", c.name, "--timeout", "3s"}})
	if st := p.Wait(t, time.Minute); !st.Success() {
		t.Fatalf("cluster status: %v\n%s", st, p.Output())
	}
	out := p.Output()
	rows := map[string]statusRow{}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) == 7 && f[0] != "MEMBER" {
			rows[f[0]] = statusRow{role: f[2], unit: f[4], lag: f[5], synced: f[6]}
		}
	}
	return rows, out
}

// TestClusterStatusShowsReplication: `rlhub cluster status` gives each
// member's replication unit, and each standby's lag (as the primary
// counts its acknowledgements) and sync. With --replica-acks 1 a standby
// SIGSTOPped falls behind by exactly the publishes made meanwhile, while
// the other keeps up; it does not answer itself ("?", and why, below the
// table); resumed, it catches up.
func TestClusterStatusShowsReplication(t *testing.T) {
	e := clustertest.Start(t)
	// A lease that outlives the stop: the stopped standby stays a member.
	c := newClusterTTL(t, e.Endpoint, 3, "20s", "--replica-acks", "1")
	l, primary := c.leader(0)
	standbys := c.standbys(primary)
	for _, h := range standbys {
		c.synced(h, l)
	}
	for v := uint64(1); v <= 2; v++ {
		c.push("pol", v, v-1, storetest.Blob(t, v, 256))
	}
	caughtUp := func(rows map[string]statusRow, ids ...string) bool {
		p := rows[primary.id]
		if p.role != "primary" || p.unit == "?" || p.unit == "0" {
			return false
		}
		for _, id := range ids {
			if r := rows[id]; r.role != "standby" || r.unit != p.unit || r.lag != "0" || r.synced != "yes" {
				return false
			}
		}
		return true
	}
	var out string
	testkit.Eventually(t, 30*time.Second, "every standby caught up in cluster status", func() bool {
		var rows map[string]statusRow
		rows, out = c.clusterStatus(t)
		return caughtUp(rows, standbys[0].id, standbys[1].id)
	})
	rows, _ := c.clusterStatus(t)
	before := rows[primary.id].unit

	stopped, running := standbys[0], standbys[1]
	stopped.signal(syscall.SIGSTOP)
	for v := uint64(3); v <= 5; v++ {
		c.push("pol", v, v-1, storetest.Blob(t, v, 256))
	}
	rows, out = c.clusterStatus(t)
	if p := rows[primary.id].unit; p == before {
		t.Fatalf("the primary's unit did not move over three publishes (%s):\n%s", p, out)
	}
	if !caughtUp(rows, running.id) {
		t.Errorf("the running standby is not caught up:\n%s", out)
	}
	if r := rows[stopped.id]; r.unit != "?" || r.lag != "3" || r.synced != "?" ||
		!strings.Contains(out, stopped.id+": replication unknown: ") {
		t.Errorf("the stopped standby shows %+v, want unit ?, lag 3, synced ?, and why:\n%s", r, out)
	}
	stopped.signal(syscall.SIGCONT)
	testkit.Eventually(t, 30*time.Second, "the resumed standby caught up in cluster status", func() bool {
		rows, out = c.clusterStatus(t)
		return caughtUp(rows, stopped.id, running.id)
	})
	t.Logf("cluster status:\n%s", out)
}
