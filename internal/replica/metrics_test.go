package replica_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/cluster/clustertest"
	"github.com/rlhub/rlhub/internal/metrics"
	"github.com/rlhub/rlhub/internal/store/storetest"
	"github.com/rlhub/rlhub/internal/testkit"
)

var metricsLine = regexp.MustCompile(`msg="metrics serving" addr=(http://[0-9.:]+) role=("[^"]+"|[^ ]+)`)

// metricsAddrs lists the metrics endpoints h logged, oldest first, with
// their roles.
func metricsAddrs(h *hubProc) [][2]string {
	var out [][2]string
	for _, m := range metricsLine.FindAllStringSubmatch(h.out.String(), -1) {
		out = append(out, [2]string{m[1], strings.Trim(m[2], `"`)})
	}
	return out
}

// scrape reads one endpoint's rlhub_cluster_* samples ("name" or
// `name{member="h1"}` → value).
func scrape(t *testing.T, url string) (map[string]float64, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url+"/metrics", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(line, "rlhub_cluster_") {
			continue
		}
		name, val, ok := strings.Cut(line, " ")
		if v, err := strconv.ParseFloat(val, 64); ok && err == nil {
			out[name] = v
		}
	}
	return out, nil
}

// readyz is one endpoint's readiness probe: its status and body.
func readyz(url string) (int, string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url+"/readyz", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<10))
	return resp.StatusCode, strings.TrimSpace(string(b)), err
}

// dashboardCluster reads one endpoint's dashboard Cluster panel
// (/api/state); nil when it has none.
func dashboardCluster(t *testing.T, url string) *metrics.ClusterState {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url+"/api/state", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s/api/state: %v", url, err)
	}
	defer resp.Body.Close()
	var st metrics.State
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatalf("%s/api/state: %v", url, err)
	}
	return st.Cluster
}

// TestStandbysServeClusterMetrics: with --metrics-listen, a standby
// serves its role, the epoch it follows, that it is synced and the units
// it applied; the primary serves its role and each standby's lag; and the
// standby that takes over serves the primary's endpoint with the new
// epoch. Each endpoint's readiness probe says the same role: the primary
// and a synced standby are ready, and the standby that takes over is
// ready as the primary of the new epoch. Each dashboard's Cluster panel
// (/api/state) says the same role and epoch, and which standbys the
// in-sync record lists: the standby, then none (with the warning).
func TestStandbysServeClusterMetrics(t *testing.T) {
	e := clustertest.Start(t)
	c := newCluster(t, e.Endpoint, 2, "--metrics-listen", "127.0.0.1:0")
	l1, p1 := c.leader(0)
	c.push("pol", 1, 0, storetest.Blob(t, 1, 64))
	c.push("pol", 2, 1, storetest.Blob(t, 2, 64))
	sb := c.hubs[0]
	if sb == p1 {
		sb = c.hubs[1]
	}
	last := func(h *hubProc, role string) string {
		var url string
		testkit.Eventually(t, 30*time.Second, h.id+" to log a metrics endpoint of role "+role, func() bool {
			as := metricsAddrs(h)
			if len(as) == 0 || as[len(as)-1][1] != role {
				return false
			}
			url = as[len(as)-1][0]
			return true
		})
		return url
	}
	sbURL := last(sb, "hub (standby)")
	var got map[string]float64
	testkit.Eventually(t, 30*time.Second, "the standby's cluster metrics", func() bool {
		var err error
		got, err = scrape(t, sbURL)
		return err == nil && got["rlhub_cluster_synced"] == 1 && got["rlhub_cluster_units_applied_total"] >= 1
	})
	if got["rlhub_cluster_primary"] != 0 || got["rlhub_cluster_epoch"] != float64(l1.Epoch) || got["rlhub_cluster_replicated_unit"] < 1 {
		t.Fatalf("standby %s metrics %v, want primary 0, epoch %d, a unit applied", sb.id, got, l1.Epoch)
	}
	// Never primary: it shipped nothing.
	for _, how := range []string{"whole", "append", "cut"} {
		if v, ok := got[fmt.Sprintf("rlhub_cluster_shipped_bytes_total{how=%q}", how)]; !ok || v != 0 {
			t.Fatalf("standby %s: rlhub_cluster_shipped_bytes_total{how=%q} %v (present %v), want 0", sb.id, how, v, ok)
		}
	}
	// Its copy was checked on start and found whole.
	if got["rlhub_cluster_scrubs_total"] < 1 || got["rlhub_cluster_damaged_files_total"] != 0 {
		t.Fatalf("standby %s: %v scrubs, %v damaged files; want 1 or more and 0", sb.id, got["rlhub_cluster_scrubs_total"], got["rlhub_cluster_damaged_files_total"])
	}
	wantReady := func(url, who, want string) {
		t.Helper()
		code, body, err := readyz(url)
		if err != nil || code != http.StatusOK || body != want {
			t.Fatalf("%s's /readyz: %d %q (%v), want 200 %q", who, code, body, err, want)
		}
	}
	wantReady(sbURL, "the standby", fmt.Sprintf("standby, synced with the primary of epoch %d", l1.Epoch))
	if c := dashboardCluster(t, sbURL); c == nil || c.Role != "standby" || c.Epoch != l1.Epoch || !c.Synced {
		t.Fatalf("standby %s's dashboard cluster %+v, want a synced standby of epoch %d", sb.id, c, l1.Epoch)
	}
	pURL := last(p1, "hub")
	lag := fmt.Sprintf(`rlhub_cluster_standby_lag_units{member=%q}`, sb.id)
	testkit.Eventually(t, 30*time.Second, "the primary's cluster metrics", func() bool {
		var err error
		got, err = scrape(t, pURL)
		_, hasLag := got[lag]
		return err == nil && hasLag
	})
	if got["rlhub_cluster_primary"] != 1 || got["rlhub_cluster_epoch"] != float64(l1.Epoch) || got["rlhub_cluster_replicated_unit"] < 2 {
		t.Fatalf("primary %s metrics %v, want primary 1, epoch %d, units asked for by two publishes", p1.id, got, l1.Epoch)
	}
	// Both versions reached the standby, from snapshots or from its own
	// cut (its full sync, at least one).
	shipped := got[`rlhub_cluster_shipped_bytes_total{how="whole"}`] + got[`rlhub_cluster_shipped_bytes_total{how="cut"}`]
	if blobs := float64(2 * len(storetest.Blob(t, 1, 64))); shipped < blobs || got["rlhub_cluster_cuts_total"] < 1 {
		t.Fatalf("primary %s shipped %v bytes whole and in cuts (want the two versions' %v at least), %v cuts (want 1 or more)",
			p1.id, shipped, blobs, got["rlhub_cluster_cuts_total"])
	}
	if got["rlhub_cluster_in_sync_standbys"] != 1 { // it acknowledged both publishes
		t.Fatalf("primary %s: rlhub_cluster_in_sync_standbys %v, want 1", p1.id, got["rlhub_cluster_in_sync_standbys"])
	}
	wantReady(pURL, "the primary", fmt.Sprintf("primary, epoch %d", l1.Epoch))
	if c := dashboardCluster(t, pURL); c == nil || c.Role != "primary" || c.Epoch != l1.Epoch || !slices.Equal(c.InSync, []string{sb.id}) ||
		len(c.Standbys) != 1 || c.Standbys[0].ID != sb.id || !c.Standbys[0].InSync || c.Warning != "" {
		t.Fatalf("primary %s's dashboard cluster %+v, want epoch %d, %s connected and in sync, no warning", p1.id, c, l1.Epoch, sb.id)
	}

	p1.kill()
	l2, _ := c.leader(l1.Epoch)
	newURL := last(sb, "hub")
	testkit.Eventually(t, 30*time.Second, "the new primary's cluster metrics", func() bool {
		var err error
		got, err = scrape(t, newURL)
		return err == nil && got["rlhub_cluster_primary"] == 1 && got["rlhub_cluster_epoch"] == float64(l2.Epoch)
	})
	wantReady(newURL, "the new primary", fmt.Sprintf("primary, epoch %d", l2.Epoch))
	// The dead primary stays listed (it holds everything acknowledged)
	// until the new term acknowledges a publish it lacks: then none can
	// take over.
	if v := got["rlhub_cluster_in_sync_standbys"]; v != 1 {
		t.Fatalf("the new primary before its first publish: rlhub_cluster_in_sync_standbys %v, want 1 (%s)", v, p1.id)
	}
	c.push("pol", 3, 2, storetest.Blob(t, 3, 64))
	if got, err := scrape(t, newURL); err != nil || got["rlhub_cluster_in_sync_standbys"] != 0 {
		t.Fatalf("the new primary after a publish: rlhub_cluster_in_sync_standbys %v (%v), want 0", got["rlhub_cluster_in_sync_standbys"], err)
	}
	if c := dashboardCluster(t, newURL); c == nil || c.Role != "primary" || c.Epoch != l2.Epoch || len(c.InSync) != 0 || c.Warning == "" {
		t.Fatalf("the new primary's dashboard cluster %+v, want epoch %d, none in sync and the warning", c, l2.Epoch)
	}
}

// TestProbesWhileNotAMember: a hub that has not joined its cluster yet
// (etcd not up) serves --metrics-listen all the same: its liveness probe
// answers 200 and its readiness probe 503 "not a cluster member", with
// rlhub_cluster_member 0. Before, nothing listened until the first join,
// so an orchestrator's liveness probe killed every hub whose etcd was
// slow to start or restarting. Once etcd is back, it joins and the same
// flag serves its role.
func TestProbesWhileNotAMember(t *testing.T) {
	e := clustertest.Start(t)
	e.Kill()
	c := newCluster(t, e.Endpoint, 1, "--metrics-listen", "127.0.0.1:0")
	h := c.hubs[0]
	var url string
	testkit.Eventually(t, 30*time.Second, "a metrics endpoint before the hub joins", func() bool {
		as := metricsAddrs(h)
		if len(as) == 0 {
			return false
		}
		url = as[len(as)-1][0]
		return true
	})
	code, body, err := readyz(url)
	if err != nil || code != http.StatusServiceUnavailable || body != "not a cluster member (joining, or out after a local fault)" {
		t.Fatalf("/readyz while joining: %d %q (%v), want 503 saying it is not a member", code, body, err)
	}
	if code, err := healthz(url); err != nil || code != http.StatusOK {
		t.Fatalf("/healthz while joining: %d (%v), want 200", code, err)
	}
	got, err := scrape(t, url)
	if err != nil || got["rlhub_cluster_member"] != 0 || got["rlhub_cluster_primary"] != 0 {
		t.Fatalf("metrics while joining: %v (%v), want rlhub_cluster_member 0, not primary", got, err)
	}

	e.Restart()
	l, _ := c.leader(0)
	testkit.Eventually(t, 30*time.Second, "the primary's readiness", func() bool {
		as := metricsAddrs(h)
		if len(as) == 0 || as[len(as)-1][1] != "hub" {
			return false
		}
		code, body, err := readyz(as[len(as)-1][0])
		return err == nil && code == http.StatusOK && body == fmt.Sprintf("primary, epoch %d", l.Epoch)
	})
}

// healthz is one endpoint's liveness probe status.
func healthz(url string) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url+"/healthz", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}
