package aggregator

import (
	"bufio"
	"context"
	"encoding/binary"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/rlhub/rlhub/internal/learner"
	"github.com/rlhub/rlhub/internal/tensor"
	"github.com/rlhub/rlhub/internal/testkit"
	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// The test binary doubles as a learner process: with RLHUB_AGG_CHILD set it
// runs learner.Example against RLHUB_AGG_CHILD_HUB and prints its events on
// stdout, so tests can start, watch and SIGKILL real learner processes.
func TestMain(m *testing.M) {
	if id := os.Getenv("RLHUB_AGG_CHILD"); id != "" {
		os.Exit(childLearner(id))
	}
	goleak.VerifyTestMain(m)
}

func childLearner(id string) int {
	bs, _ := strconv.ParseInt(os.Getenv("RLHUB_AGG_CHILD_BS"), 10, 64)
	delay, _ := time.ParseDuration(os.Getenv("RLHUB_AGG_CHILD_DELAY"))
	ex := &learner.Example{ID: id, BatchSize: bs, Delay: delay, BadInfo: os.Getenv("RLHUB_AGG_CHILD_BAD") != "", Events: os.Stdout}
	cfg := ex.Config(os.Getenv("RLHUB_AGG_CHILD_HUB"))
	if os.Getenv("RLHUB_AGG_CHILD_NOOP") != "" { // benchmarks: transport only
		cfg.OnLearn = func(ctx context.Context, t *learner.LearnTask) (map[string]any, error) {
			return map[string]any{"rows": float64(t.Rows)}, nil
		}
	}
	cfg.Backoff = 50 * time.Millisecond
	cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	cfg.OnAttach = func() { ex.Events.Write([]byte("attached\n")) }
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	go func() { io.Copy(io.Discard, os.Stdin); stop() }() // the parent died or closed stdin
	learner.Run(ctx, cfg)
	return 0
}

type childOpts struct {
	batchSize int64
	delay     time.Duration
	badInfo   bool
	noop      bool // OnLearn does nothing but count rows
}

// proc is a learner process started by a test.
type proc struct {
	id       string
	cmd      *exec.Cmd
	stdin    io.WriteCloser
	lines    chan string
	readDone chan struct{}
	waited   bool
}

func startLearner(t testing.TB, addr, id string, o childOpts) *proc {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(),
		"RLHUB_AGG_CHILD="+id,
		"RLHUB_AGG_CHILD_HUB="+addr,
		"RLHUB_AGG_CHILD_BS="+strconv.FormatInt(o.batchSize, 10),
		"RLHUB_AGG_CHILD_DELAY="+o.delay.String(),
		"GORACE=atexit_sleep_ms=0", // the race runtime otherwise sleeps 1s at exit
	)
	if o.badInfo {
		cmd.Env = append(cmd.Env, "RLHUB_AGG_CHILD_BAD=1")
	}
	if o.noop {
		cmd.Env = append(cmd.Env, "RLHUB_AGG_CHILD_NOOP=1")
	}
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{id: id, cmd: cmd, stdin: stdin, lines: make(chan string, 1024), readDone: make(chan struct{})}
	go func() {
		defer close(p.readDone)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			select {
			case p.lines <- sc.Text():
			default: // nobody is watching that many lines
			}
		}
	}()
	t.Cleanup(p.stop)
	return p
}

// waitLine waits for a line starting with prefix.
func (p *proc) waitLine(t testing.TB, prefix string) string {
	t.Helper()
	deadline := time.NewTimer(60 * time.Second)
	defer deadline.Stop()
	for {
		select {
		case l := <-p.lines:
			if strings.HasPrefix(l, prefix) {
				return l
			}
		case <-deadline.C:
			t.Fatalf("learner %s: no %q line within 60s", p.id, prefix)
		}
	}
}

// kill sends SIGKILL and reaps the process.
func (p *proc) kill() {
	if p.waited {
		return
	}
	p.cmd.Process.Kill()
	<-p.readDone
	p.cmd.Wait()
	p.waited = true
}

// stop asks the process to exit (SIGTERM), then kills it after 20s.
func (p *proc) stop() {
	if p.waited {
		return
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	p.stdin.Close()
	select {
	case <-p.readDone:
	case <-time.After(20 * time.Second):
		p.cmd.Process.Kill()
		<-p.readDone
	}
	p.cmd.Wait()
	p.waited = true
}

// harness is an aggregator Service on a real gRPC server on 127.0.0.1:0
// with a coordinator Client.
type harness struct {
	svc    *Service
	addr   string
	client *Client
}

func newHarness(t testing.TB, cfg Config) *harness {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = testkit.Logger()
	}
	svc, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	addr := testkit.ServeGRPC(t, nil, svc.Register)
	t.Cleanup(func() { svc.Close() }) // before the stop: detaches learners, so their streams end
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &harness{svc: svc, addr: addr, client: NewClient(conn)}
}

func testCtx(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// learnerIDs lists the attached learners; with task set, those started on it.
func (h *harness) learnerIDs(t testing.TB, task string) []string {
	st, err := h.svc.Status(context.Background(), &rlhubv1.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, l := range st.Learners {
		if task == "" || l.StartedTask == task {
			ids = append(ids, l.LearnerId)
		}
	}
	return ids
}

func (h *harness) waitAttached(t testing.TB, task string, ids ...string) {
	t.Helper()
	var seen []string
	defer func() {
		if t.Failed() {
			t.Logf("attached in order: %v (want %v)", seen, ids)
		}
	}()
	testkit.Eventually(t, 60*time.Second, "learners "+strings.Join(ids, ",")+" attached in that order", func() bool {
		seen = h.learnerIDs(t, task)
		return slices.Equal(seen, ids)
	})
}

// startLearners starts processes one after another (each attached before
// the next starts, so the attach order is the given order).
func (h *harness) startLearners(t testing.TB, opts ...childOpts) []*proc {
	var ps []*proc
	var ids []string
	for i, o := range opts {
		id := "L" + strconv.Itoa(i+1)
		ps = append(ps, startLearner(t, h.addr, id, o))
		ids = append(ids, id)
		h.waitAttached(t, "", ids...)
	}
	return ps
}

var testWeights = []any{0.5, -1.0, 2.0, 0.25}

// regressionBatch builds x [rows, 4], y [rows] and row ids 0..rows-1.
func regressionBatch(t testing.TB, rows int64, seed uint64) *tensor.StateDict {
	t.Helper()
	r := rand.New(rand.NewPCG(seed, 7))
	x := tensor.NewF32("x", rows, int64(len(testWeights)))
	xs, _ := x.Float32s()
	for i := range xs {
		xs[i] = float32(r.NormFloat64())
	}
	y := tensor.NewF32("y", rows)
	ys, _ := y.Float32s()
	for i := range ys {
		ys[i] = float32(r.NormFloat64())
	}
	ids := &tensor.Tensor{Name: "row", DType: tensor.I64, Shape: []int64{rows}, Data: tensor.AlignedBytes(int(rows) * 8)}
	for i := range rows {
		binary.LittleEndian.PutUint64(ids.Data[i*8:], uint64(i))
	}
	sd, err := tensor.NewStateDict(x, y, ids)
	if err != nil {
		t.Fatal(err)
	}
	return sd
}

// numbers reads a list of ints and floats as float64s.
func numbers(t testing.TB, v *rlhubv1.Value) []float64 {
	t.Helper()
	var out []float64
	for _, e := range v.GetListValue().GetValues() {
		switch k := e.GetKind().(type) {
		case *rlhubv1.Value_IntValue:
			out = append(out, float64(k.IntValue))
		case *rlhubv1.Value_FloatValue:
			out = append(out, k.FloatValue)
		default:
			t.Fatalf("list element %v is not a number", e)
		}
	}
	return out
}

func field(v *rlhubv1.Value, k string) *rlhubv1.Value { return v.GetMapValue().GetFields()[k] }

func strs(v *rlhubv1.Value) []string {
	var out []string
	for _, e := range v.GetListValue().GetValues() {
		out = append(out, e.GetStringValue())
	}
	return out
}

// checkExactlyOnce checks that the merged "rows" is 0..rows-1 in order and
// that the shares' gradients add up to the whole batch's.
func checkExactlyOnce(t testing.TB, resp *rlhubv1.LearnResponse, batch *tensor.StateDict) {
	t.Helper()
	rows, _ := BatchRows(batch)
	got := numbers(t, field(resp.Info, "rows"))
	if int64(len(got)) != rows {
		t.Fatalf("merged info has %d row ids, batch has %d rows", len(got), rows)
	}
	for i, r := range got {
		if r != float64(i) {
			t.Fatalf("row id %d at position %d: rows not processed exactly once in order", int(r), i)
		}
	}
	w := make([]float32, len(testWeights))
	for i, v := range testWeights {
		w[i] = float32(v.(float64))
	}
	want, wantLoss, err := learner.LinearGrad(batch, w)
	if err != nil {
		t.Fatal(err)
	}
	g := numbers(t, field(resp.Info, "grad"))
	if len(g) != len(w)*len(resp.Shares) {
		t.Fatalf("grad has %d numbers for %d shares of dimension %d", len(g), len(resp.Shares), len(w))
	}
	sum := make([]float64, len(w))
	for i, x := range g {
		sum[i%len(w)] += x
	}
	for j := range w {
		if math.Abs(sum[j]-want[j]) > 1e-6*(1+math.Abs(want[j])) {
			t.Fatalf("summed share gradient[%d] = %v, whole batch gives %v", j, sum[j], want[j])
		}
	}
	var loss float64
	for _, l := range numbers(t, field(resp.Info, "loss_sum")) {
		loss += l
	}
	if math.Abs(loss-wantLoss) > 1e-6*(1+wantLoss) {
		t.Fatalf("summed loss %v, whole batch gives %v", loss, wantLoss)
	}
}
