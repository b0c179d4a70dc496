package metrics_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/rlhub/rlhub/internal/aggregator"
	"github.com/rlhub/rlhub/internal/arsrpc"
	"github.com/rlhub/rlhub/internal/hub"
	"github.com/rlhub/rlhub/internal/hub/hubtest"
	"github.com/rlhub/rlhub/internal/learner"
	"github.com/rlhub/rlhub/internal/metrics"
	"github.com/rlhub/rlhub/internal/optim"
	"github.com/rlhub/rlhub/internal/reduce"
	"github.com/rlhub/rlhub/internal/reducer"
	"github.com/rlhub/rlhub/internal/safetensors"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/tensor"
	"github.com/rlhub/rlhub/internal/testkit"
	"github.com/rlhub/rlhub/internal/wsync"
	pb "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// rig is a real hub with its metrics endpoint on 127.0.0.1:0, a reducer
// model, a learner attached to the aggregator and an ARS worker (with its
// own metrics endpoint) in this process.
type rig struct {
	h          *hub.Hub
	addr       string
	conn       *grpc.ClientConn
	rc         *reducer.Client
	agg        *aggregator.Client
	ars        pb.ARSClient
	workerAddr string
}

const rigModel = "policy"

func startRig(t *testing.T) *rig { return startRigWith(t, true) }

// startRigWith starts the rig; without withWorker no ARS worker runs (the
// test starts one with startWorker when it wants runs to progress).
func startRigWith(t *testing.T, withWorker bool) *rig {
	t.Helper()
	h := hubtest.Start(t, hub.Config{Logger: testkit.Logger(), MetricsListen: "127.0.0.1:0",
		Reducer: reducer.Config{BatchSize: 2, MaxWait: time.Millisecond}})
	r := &rig{h: h, addr: h.Addr().String()}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sd, err := tensor.NewStateDict(tensor.NewF32("w", 4))
	if err != nil {
		t.Fatal(err)
	}
	blob, err := safetensors.Encode(sd, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.Store().Push(ctx, store.PushRequest{Name: rigModel, Version: 1, Expect: 0, Blob: blob}); err != nil {
		t.Fatal(err)
	}
	r.conn, err = grpc.NewClient(r.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.conn.Close() })
	r.rc, err = reducer.NewClient(reducer.ClientConfig{Hub: r.addr, ClientID: "rig"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.rc.Close() })
	if _, _, err := r.rc.Register(ctx, reducer.ModelConfig{Model: rigModel, Reduction: reduce.Sum, Optimizer: optim.Config{Kind: optim.SGD, LR: 0.01}}); err != nil {
		t.Fatal(err)
	}
	r.agg = aggregator.NewClient(r.conn)
	r.ars = pb.NewARSClient(r.conn)

	// One learner (the example learner; it pushes no gradients here, so
	// the reducer's counts are the test's own pushes).
	lctx, lcancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	ex := &learner.Example{ID: "learner-1", BatchSize: 8}
	lcfg := ex.Config(r.addr)
	lcfg.Logger = testkit.Logger()
	wg.Add(1)
	go func() { defer wg.Done(); learner.Run(lctx, lcfg) }()

	t.Cleanup(func() { lcancel(); wg.Wait() })
	if withWorker {
		r.startWorker(t)
	}
	testkit.Eventually(t, 30*time.Second, "the learner attaches", func() bool {
		st, err := r.agg.HubStats(ctx)
		return err == nil && len(st.Learners) == 1
	})
	return r
}

// startWorker runs one ARS worker with live counters behind its own
// metrics endpoint (r.workerAddr) until the test ends.
func (r *rig) startWorker(t *testing.T) {
	t.Helper()
	live := &arsrpc.WorkerCounters{}
	ws, err := metrics.New(metrics.Config{Listen: "127.0.0.1:0", Role: "ars worker", Sources: metrics.Sources{Worker: live}, Logger: testkit.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	r.workerAddr = ws.Addr()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); ws.Run(ctx) }()
	go func() {
		defer wg.Done()
		arsrpc.RunWorker(ctx, arsrpc.WorkerConfig{Conn: r.conn, Name: "w0", Live: live, Logger: testkit.Logger()})
	}()
	t.Cleanup(func() { cancel(); wg.Wait() })
}

// pushGrads pushes n gradients computed on the model's current version
// and returns how many the reducer refused at once (none expected).
func (r *rig) pushGrads(t *testing.T, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := range n {
		g := tensor.NewF32("w", 4)
		f, _ := g.Float32s()
		f[i%4] = 1
		sd, err := tensor.NewStateDict(g)
		if err != nil {
			t.Fatal(err)
		}
		snap, err := r.h.Store().Get(ctx, rigModel, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := r.rc.PushGrad(ctx, rigModel, snap.Version, sd); err != nil {
			t.Fatalf("push %d: %v", i, err)
		}
	}
}

// learn runs one aggregator task on the learner.
func (r *rig) learn(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := r.agg.Start(ctx, "task-1", map[string]any{"w": []any{0.0, 0.0, 0.0, 0.0}}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.agg.GetDataDemand(ctx, "task-1"); err != nil {
		t.Fatal(err)
	}
	x, y := tensor.NewF32("x", 8, 4), tensor.NewF32("y", 8)
	sd, err := tensor.NewStateDict(x, y)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.agg.Learn(ctx, "task-1", sd, map[string]string{"step": "1"}); err != nil {
		t.Fatal(err)
	}
}

// report tells weight sync that collector id runs version of the model.
func (r *rig) report(t *testing.T, id string, version uint64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := wsync.Report(ctx, r.conn, &pb.CollectorReport{CollectorId: id, Model: rigModel, Version: version, Via: "shm"}); err != nil {
		t.Fatal(err)
	}
}

// startARS starts an LQR run of the given iterations, evaluating every
// iteration.
func (r *rig) startARS(t *testing.T, iterations uint32) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	spec := &pb.ARSRunSpec{Env: "LQR", Seed: 1, Directions: 4, EvalEvery: 1, EvalEpisodes: 1, MaxIterations: iterations}
	start, err := r.ars.StartRun(ctx, &pb.ARSStartRunRequest{Spec: spec})
	if err != nil {
		t.Fatal(err)
	}
	return start.RunId
}

// scrape GETs http://addr/metrics and parses it.
func scrape(t *testing.T, addr string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %d %v", resp.StatusCode, err)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(string(body)))
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	return fams
}

// value returns the sample of family name whose labels include want
// ("k=v" pairs), summed over matches; found reports whether any matched.
func value(fams map[string]*dto.MetricFamily, name string, want ...string) (v float64, found bool) {
	f := fams[name]
	if f == nil {
		return 0, false
	}
	for _, m := range f.Metric {
		labels := map[string]string{}
		for _, l := range m.Label {
			labels[l.GetName()] = l.GetValue()
		}
		ok := true
		for _, kv := range want {
			k, val, _ := strings.Cut(kv, "=")
			if labels[k] != val {
				ok = false
			}
		}
		if !ok {
			continue
		}
		found = true
		switch {
		case m.Counter != nil:
			v += m.Counter.GetValue()
		case m.Gauge != nil:
			v += m.Gauge.GetValue()
		case m.Histogram != nil:
			v += float64(m.Histogram.GetSampleCount())
		case m.Untyped != nil:
			v += m.Untyped.GetValue()
		}
	}
	return v, found
}
