package cli

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/testkit"
)

// get returns the body of http://addr/path, or "" while nothing answers.
func get(addr, path string) string {
	resp, err := http.Get("http://" + addr + path)
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return ""
	}
	return string(b)
}

// --metrics-listen on serve, relay and worker ars serves each process's
// own families (and the hub's dashboard) and the probes.
func TestMetricsListenFlags(t *testing.T) {
	hubMetrics, relayMetrics, workerMetrics := freeAddr(t), freeAddr(t), freeAddr(t)
	addr := serveCLI(t, "--metrics-listen", hubMetrics)
	if code, _, errOut := run(t, context.Background(), "ping", "--wait", "--hub", addr, "--timeout", "20s"); code != 0 {
		t.Fatalf("hub never healthy: %s", errOut)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{}, 2)
	start := func(args ...string) {
		go func() { run(t, ctx, args...); done <- struct{}{} }()
	}
	start("relay", "--upstream", addr, "--model", "m", "--no-shm", "--listen", "127.0.0.1:0", "--metrics-listen", relayMetrics)
	start("worker", "ars", "--hub", addr, "--metrics-listen", workerMetrics)
	defer func() {
		cancel()
		for range 2 {
			testkit.Recv(t, done, 30*time.Second, "a process started by the test stops")
		}
	}()
	for _, c := range []struct{ addr, path, want string }{
		{hubMetrics, "/metrics", "rlhub_reducer_gradients_pushed_total"},
		{hubMetrics, "/metrics", "rlhub_aggregator_learners"},
		{hubMetrics, "/", "<title>rlhub · hub</title>"},
		{hubMetrics, "/api/state", `"role":"hub"`},
		{relayMetrics, "/metrics", "rlhub_sync_streams"},
		{workerMetrics, "/metrics", "rlhub_ars_worker_tasks_total"},
		// The probes: each process outside a cluster is ready while it serves.
		{hubMetrics, "/readyz", "ready"},
		{relayMetrics, "/readyz", "ready"},
		{workerMetrics, "/healthz", "ok"},
	} {
		testkit.Eventually(t, 20*time.Second, c.addr+c.path+" serves "+c.want, func() bool { return strings.Contains(get(c.addr, c.path), c.want) })
	}
	if body := get(workerMetrics, "/metrics"); strings.Contains(body, "rlhub_reducer_") {
		t.Error("the worker's endpoint exports the reducer's families")
	}
}
