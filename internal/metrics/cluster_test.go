package metrics_test

import (
	"encoding/json"
	"io"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/metrics"
	"github.com/rlhub/rlhub/internal/testkit"
)

// clusterEndpoint is a metrics endpoint whose only source is a cluster
// member's stats, which the test sets.
type clusterEndpoint struct {
	addr string
	mu   sync.Mutex
	st   metrics.ClusterStats
}

func startClusterEndpoint(t *testing.T, maxLabels int, st metrics.ClusterStats) *clusterEndpoint {
	t.Helper()
	e := &clusterEndpoint{st: st}
	e.addr = serveSources(t, maxLabels, metrics.Sources{Cluster: func() metrics.ClusterStats {
		e.mu.Lock()
		defer e.mu.Unlock()
		return e.st
	}})
	return e
}

// serveSources starts a metrics endpoint (role "hub") over src, closed
// when the test ends, and returns its address; maxLabels 0 is the default.
func serveSources(t *testing.T, maxLabels int, src metrics.Sources) string {
	t.Helper()
	ms, err := metrics.New(metrics.Config{Listen: "127.0.0.1:0", Role: "hub", MaxLabelValues: maxLabels, Logger: testkit.Logger(), Sources: src})
	if err != nil {
		t.Fatal(err)
	}
	ms.Start()
	t.Cleanup(func() { ms.Close() })
	return ms.Addr()
}

func (e *clusterEndpoint) set(st metrics.ClusterStats) {
	e.mu.Lock()
	e.st = st
	e.mu.Unlock()
}

// get fetches path from addr and returns its body.
func get(t *testing.T, addr, path string) string {
	t.Helper()
	hc := &http.Client{Timeout: 10 * time.Second}
	var body string
	testkit.Eventually(t, 10*time.Second, "GET "+path, func() bool {
		resp, err := hc.Get("http://" + addr + path)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		body = string(b)
		return err == nil && resp.StatusCode == http.StatusOK
	})
	return body
}

// The dashboard's Cluster panel (/api/state and the page's first render)
// says what the rlhub_cluster_* families say: the role, the epoch, a
// standby's sync, the primary's standbys by id with their lag (bounded by
// MaxLabelValues, sorted) and which the in-sync record lists, a warning
// when it lists none, and the scrub counters.
func TestDashboardClusterState(t *testing.T) {
	cases := []struct {
		name string
		in   metrics.ClusterStats
		want metrics.ClusterState
		page []string // in the page's first render
	}{{
		name: "primary, no standby in sync",
		in: metrics.ClusterStats{Primary: true, Epoch: 4, Unit: 90, KeepsInSync: true,
			Lag: map[string]uint64{"hub-c": 7, "hub-a": 0, "hub-b": 2}, Scrubs: 1},
		want: metrics.ClusterState{Role: "primary", Epoch: 4, Unit: 90, KeepsInSync: true, InSync: []string{},
			Warning:  "the in-sync record lists no standby: no standby may take over; if this primary dies, no hub serves until it is back",
			Standbys: []metrics.StandbyState{{ID: "hub-a"}, {ID: "hub-b", Lag: 2}}, Connected: 3, Scrubs: 1},
		page: []string{`data-role="primary"`, `epoch <b class="epoch">4</b>`, `<p class="warning">`, `<tr data-standby="hub-b" class="behind"><td>hub-b</td><td class="lag">2</td>`},
	}, {
		name: "primary, standbys in sync",
		in: metrics.ClusterStats{Primary: true, Epoch: 5, Unit: 3, KeepsInSync: true, InSync: []string{"hub-c", "hub-b", "hub-a"},
			Lag: map[string]uint64{"hub-b": 1, "hub-a": 0}},
		want: metrics.ClusterState{Role: "primary", Epoch: 5, Unit: 3, KeepsInSync: true, InSyncStandbys: 3, InSync: []string{"hub-a", "hub-b"},
			Standbys: []metrics.StandbyState{{ID: "hub-a", InSync: true}, {ID: "hub-b", Lag: 1, InSync: true}}, Connected: 2},
		page: []string{`in-sync standbys <b class="count">3</b>: hub-a, hub-b`},
	}, {
		name: "primary without the record (acks not all)",
		in:   metrics.ClusterStats{Primary: true, Epoch: 6, Unit: 1, Lag: map[string]uint64{"hub-a": 0}},
		want: metrics.ClusterState{Role: "primary", Epoch: 6, Unit: 1, InSync: []string{},
			Standbys: []metrics.StandbyState{{ID: "hub-a"}}, Connected: 1},
		page: []string{`no in-sync record (--replica-acks not all)`, `<td class="lag">0</td><td>–</td>`},
	}, {
		name: "standby, synced, damaged files",
		in:   metrics.ClusterStats{Epoch: 4, Unit: 88, Applied: 120, Synced: true, Scrubs: 2, DamagedFiles: 1},
		want: metrics.ClusterState{Role: "standby", Epoch: 4, Unit: 88, Applied: 120, Synced: true, Scrubs: 2, Damaged: 1,
			InSync: []string{}, Standbys: []metrics.StandbyState{}},
		page: []string{`data-role="standby"`, `<span class="synced">synced</span> · 120 units applied`, `<span class="damaged warn">damaged files <b>1</b>`},
	}, {
		name: "outside after a fault",
		in:   metrics.ClusterStats{Outside: true, Faults: 1, Epoch: 4},
		want: metrics.ClusterState{Role: "outside", Epoch: 4, Faults: 1, InSync: []string{}, Standbys: []metrics.StandbyState{}},
		page: []string{`outside the cluster</b>`, `faults <b class="faults">1</b>`},
	}}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := startClusterEndpoint(t, 2, c.in)
			var st metrics.State
			if err := json.Unmarshal([]byte(get(t, e.addr, "/api/state")), &st); err != nil {
				t.Fatal(err)
			}
			if st.Cluster == nil {
				t.Fatal("/api/state has no cluster")
			}
			if !reflect.DeepEqual(*st.Cluster, c.want) {
				t.Errorf("cluster state\n got %+v\nwant %+v", *st.Cluster, c.want)
			}
			page := get(t, e.addr, "/")
			for _, s := range c.page {
				if !strings.Contains(page, s) {
					t.Errorf("page lacks %q", s)
				}
			}
			if warned := strings.Contains(page, `class="warning"`); warned != (c.want.Warning != "") {
				t.Errorf("page shows a warning: %v, want %v", warned, c.want.Warning != "")
			}
		})
	}
}

// A process outside a cluster has no Cluster panel.
func TestDashboardWithoutCluster(t *testing.T) {
	addr := serveSources(t, 0, metrics.Sources{})
	if body := get(t, addr, "/api/state"); strings.Contains(body, `"cluster"`) {
		t.Errorf("/api/state of a process outside a cluster: %s", body)
	}
	if page := get(t, addr, "/"); strings.Contains(page, `id="cluster"`) {
		t.Error("the page of a process outside a cluster has a Cluster panel")
	}
}
