package aggregator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/learner"
	"github.com/rlhub/rlhub/internal/safetensors"
	"github.com/rlhub/rlhub/internal/tensor"
	"github.com/rlhub/rlhub/internal/testkit"
	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// fakeClock is a settable clock for leases.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// rawAttach opens an Attach stream by hand, for protocol tests.
func rawAttach(t *testing.T, h *harness) rlhubv1.LearnerAggregator_AttachClient {
	t.Helper()
	conn, err := grpc.NewClient(h.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	s, err := rlhubv1.NewLearnerAggregatorClient(conn).Attach(testCtx(t, 60*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func hello(id string) *rlhubv1.LearnerMessage {
	return &rlhubv1.LearnerMessage{Body: &rlhubv1.LearnerMessage_Hello{Hello: &rlhubv1.Hello{LearnerId: id}}}
}

// recvEnd reads until the stream ends and returns its status code and
// message.
func recvEnd(s rlhubv1.LearnerAggregator_AttachClient) (codes.Code, string) {
	for {
		if _, err := s.Recv(); err != nil {
			st := status.Convert(err)
			return st.Code(), st.Message()
		}
	}
}

func TestLeaseRenewedByMessagesAndExpiry(t *testing.T) {
	clk := &fakeClock{now: time.Unix(1000, 0)}
	h := newHarness(t, Config{Lease: 10 * time.Second, CheckEvery: 5 * time.Millisecond, Now: clk.Now})
	s := rawAttach(t, h)
	if err := s.Send(hello("a")); err != nil {
		t.Fatal(err)
	}
	m, err := s.Recv()
	if err != nil || m.GetWelcome().GetLeaseMs() != 10000 {
		t.Fatalf("welcome = %v, %v", m, err)
	}
	lease := func() int64 {
		st, _ := h.svc.Status(context.Background(), &rlhubv1.StatusRequest{})
		if len(st.Learners) != 1 {
			return -1
		}
		return st.Learners[0].LeaseRemainingMs
	}
	// Welcome goes out before the learner is listed (register), so the
	// listing is waited for; the fake clock has not moved meanwhile.
	testkit.Eventually(t, 60*time.Second, "learner a listed with its whole lease", func() bool { return lease() == 10000 })
	clk.Advance(6 * time.Second)
	if got := lease(); got != 4000 {
		t.Fatalf("lease remaining after 6s = %dms, want 4000", got)
	}
	if err := s.Send(&rlhubv1.LearnerMessage{Body: &rlhubv1.LearnerMessage_Heartbeat{Heartbeat: &rlhubv1.Heartbeat{}}}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 60*time.Second, "the heartbeat to renew the lease", func() bool { return lease() == 10000 })
	clk.Advance(10*time.Second + time.Millisecond)
	code, msg := recvEnd(s)
	if code != codes.Unavailable || !strings.Contains(msg, "lease") || !strings.Contains(msg, `"a"`) {
		t.Fatalf("expired learner's stream ended with %v %q", code, msg)
	}
	st, _ := h.client.Status(context.Background())
	if len(st.Learners) != 0 || st.RemovedTotal != 1 || st.AttachedTotal != 1 {
		t.Fatalf("status after expiry: %+v", st)
	}
}

func TestProtocolMisuseIsRefused(t *testing.T) {
	h := newHarness(t, Config{})
	for _, tc := range []struct {
		name string
		msgs []*rlhubv1.LearnerMessage
		want string
	}{
		{"heartbeat before hello", []*rlhubv1.LearnerMessage{{Body: &rlhubv1.LearnerMessage_Heartbeat{Heartbeat: &rlhubv1.Heartbeat{}}}}, "before Hello"},
		{"reply before hello", []*rlhubv1.LearnerMessage{{Body: &rlhubv1.LearnerMessage_Reply{Reply: &rlhubv1.LearnerReply{}}}}, "before Hello"},
		{"empty id", []*rlhubv1.LearnerMessage{hello("")}, "learner id"},
		{"id with a space", []*rlhubv1.LearnerMessage{hello("a b")}, "learner id"},
		{"second hello", []*rlhubv1.LearnerMessage{hello("x"), hello("x")}, "second Hello"},
		{"empty message", []*rlhubv1.LearnerMessage{{}}, "empty message"},
	} {
		s := rawAttach(t, h)
		for _, m := range tc.msgs {
			s.Send(m)
		}
		code, msg := recvEnd(s)
		if code != codes.InvalidArgument || !strings.Contains(msg, tc.want) {
			t.Errorf("%s: stream ended with %v %q, want InvalidArgument mentioning %q", tc.name, code, msg, tc.want)
		}
	}
	testkit.Eventually(t, 60*time.Second, "no learner left attached", func() bool { return len(h.learnerIDs(t, "")) == 0 })
}

func TestSameIDReplacesTheOldStream(t *testing.T) {
	h := newHarness(t, Config{})
	old := rawAttach(t, h)
	old.Send(hello("a"))
	if _, err := old.Recv(); err != nil {
		t.Fatal(err)
	}
	repl := rawAttach(t, h)
	repl.Send(hello("a"))
	if _, err := repl.Recv(); err != nil {
		t.Fatal(err)
	}
	code, msg := recvEnd(old)
	if code != codes.Unavailable || !strings.Contains(msg, "re-attached") {
		t.Fatalf("old stream ended with %v %q", code, msg)
	}
	if ids := h.learnerIDs(t, ""); !slices.Equal(ids, []string{"a"}) {
		t.Fatalf("learners %v", ids)
	}
	// The replaced stream is removed, and counted so: attached_total −
	// removed_total stays the number attached.
	if st := h.svc.Stats(); len(st.Learners) != 1 || st.Attached != 2 || st.Removed != 1 {
		t.Fatalf("after a re-attach: %d attached, attached_total %d, removed_total %d; want 1, 2, 1", len(st.Learners), st.Attached, st.Removed)
	}
}

// A Start that fails changes nothing: the learners that took the new task
// before another refused it are put back on the current one, and its
// demand and batches still reach every learner.
func TestFailedStartLeavesTheCurrentTasksLearners(t *testing.T) {
	h := newHarness(t, Config{})
	exB := &learner.Example{ID: "b", BatchSize: 4}
	picky := exB.Config("")
	var startsA atomic.Int32
	exA := &learner.Example{ID: "a", BatchSize: 4}
	cfgA := exA.Config("")
	cfgA.OnStart = func(ctx context.Context, task string, info map[string]any) error {
		startsA.Add(1)
		return exA.OnStart(ctx, task, info)
	}
	picky.OnStart = func(ctx context.Context, task string, info map[string]any) error {
		if task == "t2" {
			return errors.New("refusing t2")
		}
		return exB.OnStart(ctx, task, info)
	}
	runLearners(t, h, cfgA, picky)
	ctx := testCtx(t, 30*time.Second)
	if _, err := h.client.Start(ctx, "t1", map[string]any{"w": testWeights}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.client.Start(ctx, "t2", map[string]any{"w": testWeights}); !errors.Is(err, errs.ErrAborted) {
		t.Fatalf("Start t2 = %v, want Aborted (b refuses it)", err)
	}
	d, err := h.client.GetDataDemand(ctx, "t1")
	if err != nil || !slices.Equal(d.Learners, []string{"a", "b"}) {
		t.Fatalf("demand for the current task t1 after a failed Start: learners %v, err %v; want [a b]", d.GetLearners(), err)
	}
	// a ran OnStart for t1, t2 and t1 again: its state is t1's.
	if n := startsA.Load(); n != 3 {
		t.Fatalf("learner a was started %d times, want 3 (t1, t2, t1 again)", n)
	}
	if _, err := h.client.Learn(ctx, "t1", regressionBatch(t, 8, 1), nil); err != nil {
		t.Fatalf("a batch of t1 after the failed Start: %v", err)
	}
}

// A task info holding NaN is refused InvalidArgument before any learner is
// started on it; the current task goes on.
func TestNaNTaskInfoIsRefusedBeforeAnyLearner(t *testing.T) {
	h := newHarness(t, Config{DataDir: t.TempDir()})
	var startedT2 atomic.Int32
	var cfgs []learner.Config
	for _, id := range []string{"a", "b"} {
		ex := &learner.Example{ID: id, BatchSize: 4}
		c := ex.Config("")
		c.OnStart = func(ctx context.Context, task string, info map[string]any) error {
			if task == "t2" {
				startedT2.Add(1)
			}
			return ex.OnStart(ctx, task, info)
		}
		cfgs = append(cfgs, c)
	}
	runLearners(t, h, cfgs...)
	ctx := testCtx(t, 30*time.Second)
	if _, err := h.client.Start(ctx, "t1", map[string]any{"w": testWeights}); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []float64{math.NaN(), math.Inf(1)} {
		_, err := h.client.Start(ctx, "t2", map[string]any{"w": testWeights, "lr": bad})
		if !errors.Is(err, errs.ErrInvalid) {
			t.Fatalf("Start with lr %v: %v, want InvalidArgument", bad, err)
		}
	}
	if n := startedT2.Load(); n != 0 {
		t.Fatalf("%d learners ran OnStart for the refused task", n)
	}
	if d, err := h.client.GetDataDemand(ctx, "t1"); err != nil || !slices.Equal(d.Learners, []string{"a", "b"}) {
		t.Fatalf("demand for t1 after the refusals: %v, %v", d.GetLearners(), err)
	}
}

// runLearners runs in-process learners (goroutines over real gRPC) until
// the test ends.
func runLearners(t *testing.T, h *harness, cfgs ...learner.Config) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var ids []string
	for _, cfg := range cfgs {
		cfg.Hub = h.addr
		cfg.Backoff = 20 * time.Millisecond
		cfg.Logger = testkit.Logger()
		ids = append(ids, cfg.ID)
		wg.Add(1)
		go func() { defer wg.Done(); learner.Run(ctx, cfg) }()
		h.waitAttached(t, "", ids...)
	}
	t.Cleanup(func() { cancel(); wg.Wait() })
}

func exampleCfg(id string, bs int64) learner.Config {
	ex := &learner.Example{ID: id, BatchSize: bs}
	return ex.Config("")
}

func TestStartRefusalNamesTheLearner(t *testing.T) {
	h := newHarness(t, Config{})
	bad := exampleCfg("b", 4)
	bad.OnStart = func(ctx context.Context, task string, info map[string]any) error {
		return errors.New("out of GPU memory")
	}
	runLearners(t, h, exampleCfg("a", 4), bad)
	ctx := testCtx(t, 30*time.Second)
	_, err := h.client.Start(ctx, "t1", map[string]any{"w": testWeights})
	if !errors.Is(err, errs.ErrAborted) || !strings.Contains(err.Error(), `learner "b"`) || !strings.Contains(err.Error(), "out of GPU memory") {
		t.Fatalf("Start with a refusing learner: %v", err)
	}
	if _, err := h.client.GetDataDemand(ctx, ""); !errors.Is(err, errs.ErrNotFound) {
		t.Fatalf("demand after a failed Start: %v, want ErrNotFound (no task)", err)
	}
	// A learner refusing for a bad task info (the example needs "w").
	if _, err := h.client.Start(ctx, "t2", map[string]any{}); err == nil {
		t.Fatal("Start without weights succeeded")
	}
}

func TestBadBatchChangesNothing(t *testing.T) {
	h := newHarness(t, Config{})
	runLearners(t, h, exampleCfg("a", 4), exampleCfg("b", 4))
	ctx := testCtx(t, 30*time.Second)
	// Before any Start there is no task: NotFound, not a stale version.
	if _, err := h.client.Learn(ctx, "", regressionBatch(t, 8, 1), nil); !errors.Is(err, errs.ErrNotFound) || errors.Is(err, errs.ErrStale) {
		t.Fatalf("learn with no task started: %v, want NotFound", err)
	}
	if _, err := h.client.Start(ctx, "t1", map[string]any{"w": testWeights}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.client.GetDataDemand(ctx, "t1"); err != nil {
		t.Fatal(err)
	}
	mismatch, _ := tensor.NewStateDict(tensor.NewF32("x", 8, 4), tensor.NewF32("y", 7))
	if _, err := h.client.Learn(ctx, "t1", mismatch, nil); !errors.Is(err, errs.ErrInvalid) || !strings.Contains(err.Error(), "rows") {
		t.Fatalf("mismatched rows: %v", err)
	}
	if _, err := h.client.Learn(ctx, "t1", regressionBatch(t, 0, 1), nil); !errors.Is(err, errs.ErrInvalid) || !strings.Contains(err.Error(), "no rows") {
		t.Fatalf("empty batch: %v", err)
	}
	if _, err := h.client.Learn(ctx, "other", regressionBatch(t, 8, 1), nil); !errors.Is(err, errs.ErrStale) {
		t.Fatalf("wrong task id: %v", err)
	}
	// A batch stream that ends early, and one that is not safetensors.
	raw := rlhubv1.NewLearnerAggregatorClient(mustConn(t, h.addr))
	for name, body := range map[string][]byte{"short": make([]byte, 100), "garbage": []byte("0123456789abcdef")} {
		ls, err := raw.Learn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		ls.Send(&rlhubv1.LearnRequest{Body: &rlhubv1.LearnRequest_Header{Header: &rlhubv1.LearnHeader{TaskId: "t1", Blob: &rlhubv1.BlobInfo{TotalBytes: 200}}}})
		ls.Send(&rlhubv1.LearnRequest{Body: &rlhubv1.LearnRequest_Chunk{Chunk: &rlhubv1.Chunk{Data: body}}})
		if _, err := ls.CloseAndRecv(); status.Code(err) != codes.InvalidArgument {
			t.Fatalf("%s batch: %v, want InvalidArgument", name, err)
		}
	}
	batch := regressionBatch(t, 8, 2)
	resp, err := h.client.Learn(ctx, "t1", batch, nil)
	if err != nil {
		t.Fatalf("good batch after bad ones: %v", err)
	}
	checkExactlyOnce(t, resp, batch)
	if ids := h.learnerIDs(t, "t1"); !slices.Equal(ids, []string{"a", "b"}) {
		t.Fatalf("learners after bad batches: %v", ids)
	}
}

func mustConn(t *testing.T, addr string) *grpc.ClientConn {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// A learner that never answers is bounded by TaskTimeout: its rows are
// re-split, it is detached, and it re-attaches by itself.
func TestSlowLearnerTimesOutAndIsResplit(t *testing.T) {
	h := newHarness(t, Config{TaskTimeout: 300 * time.Millisecond, Lease: time.Second})
	slow := exampleCfg("slow", 4)
	stuck := make(chan struct{})
	var once sync.Once
	slow.OnLearn = func(ctx context.Context, lt *learner.LearnTask) (map[string]any, error) {
		once.Do(func() { close(stuck) })
		<-ctx.Done() // hangs until the aggregator drops the stream
		return nil, ctx.Err()
	}
	runLearners(t, h, exampleCfg("a", 4), slow)
	ctx := testCtx(t, 30*time.Second)
	if _, err := h.client.Start(ctx, "t1", map[string]any{"w": testWeights}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.client.GetDataDemand(ctx, "t1"); err != nil {
		t.Fatal(err)
	}
	batch := regressionBatch(t, 8, 1)
	resp, err := h.client.Learn(ctx, "t1", batch, nil)
	if err != nil {
		t.Fatal(err)
	}
	<-stuck
	if !slices.Equal(resp.Failed, []string{"slow"}) {
		t.Fatalf("failed = %v", resp.Failed)
	}
	checkExactlyOnce(t, resp, batch)
	// It comes back on its own (the learner API re-attaches) and is
	// started on the current task.
	h.waitAttached(t, "t1", "a", "slow")
}

func TestConfigValidate(t *testing.T) {
	for _, cfg := range []Config{
		{Lease: time.Millisecond},
		{CheckEvery: -1},
		{TaskTimeout: -1},
		{OnFailure: 7},
		{ChunkBytes: 10},
		{MaxBatchBytes: -1},
	} {
		if _, err := New(cfg); err == nil {
			t.Errorf("New(%+v) succeeded", cfg)
		}
	}
	for _, s := range []string{"resplit", "fail"} {
		p, err := ParseFailurePolicy(s)
		if err != nil || p.String() != s {
			t.Errorf("ParseFailurePolicy(%q) = %v, %v", s, p, err)
		}
	}
	if _, err := ParseFailurePolicy("retry"); !errors.Is(err, errs.ErrInvalid) {
		t.Errorf("ParseFailurePolicy(retry) = %v", err)
	}
	s, err := New(Config{Logger: testkit.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	if err := errors.Join(s.Close(), s.Close()); err != nil {
		t.Fatal(fmt.Errorf("double Close: %w", err))
	}
}

// A hub stops the way hub.Close does: GracefulStop first, services after.
// Attached Go learners leave on the server's GOAWAY, so GracefulStop does
// not wait for the learners to be stopped.
func TestGracefulStopDoesNotWaitForAttachedLearners(t *testing.T) {
	svc, err := New(Config{Logger: testkit.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	lis := testkit.Listen(t) // its own server: the test is of GracefulStop itself
	srv := grpc.NewServer()
	svc.Register(srv)
	served := make(chan struct{})
	go func() { defer close(served); srv.Serve(lis) }()
	h := &harness{svc: svc, addr: lis.Addr().String()}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	for _, id := range []string{"a", "b"} {
		cfg := exampleCfg(id, 4)
		cfg.Hub, cfg.Logger = h.addr, testkit.Logger()
		wg.Add(1)
		go func() { defer wg.Done(); learner.Run(ctx, cfg) }()
	}
	testkit.Eventually(t, 60*time.Second, "two learners attached", func() bool { return len(h.learnerIDs(t, "")) == 2 })
	stopped := make(chan struct{})
	go func() { srv.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(60 * time.Second):
		srv.Stop()
		<-stopped
		t.Error("GracefulStop waited for the attached learners")
	}
	<-served
	svc.Close()
}

// Drain (called by the hub before its graceful stop) ends every Attach
// stream, whatever the learner's language, and refuses new ones.
func TestDrainEndsAttachStreams(t *testing.T) {
	h := newHarness(t, Config{})
	s := rawAttach(t, h)
	s.Send(hello("py"))
	if _, err := s.Recv(); err != nil {
		t.Fatal(err)
	}
	h.svc.Drain()
	if code, msg := recvEnd(s); code != codes.Unavailable || !strings.Contains(msg, "stopping") {
		t.Fatalf("drained stream ended with %v %q", code, msg)
	}
	late := rawAttach(t, h)
	late.Send(hello("late"))
	if code, _ := recvEnd(late); code != codes.Unavailable {
		t.Fatalf("attach after Drain ended with %v, want Unavailable", code)
	}
	if ids := h.learnerIDs(t, ""); len(ids) != 0 {
		t.Fatalf("learners after Drain: %v", ids)
	}
}

// A learner's declared resources are kept while it is attached, logged
// when it attaches and listed by Resources, so a Hello declaring megabytes
// of them is refused and nothing of it reaches the log. Before, one Attach
// with 3 MB of resources wrote a 3 MB line to a real hub's log and the hub
// kept the map for as long as the learner stayed.
func TestHelloResourcesAreBounded(t *testing.T) {
	var logs testkit.Buffer
	h := newHarness(t, Config{Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	many := map[string]string{}
	for i := range MaxResources + 1 {
		many[fmt.Sprintf("k%d", i)] = "v"
	}
	for _, tc := range []struct {
		name string
		res  map[string]string
	}{
		{"too many", many},
		{"a 3 MB value", map[string]string{"host": strings.Repeat("x", 3<<20)}},
		{"a long key", map[string]string{strings.Repeat("k", MaxResourceKeyBytes+1): "v"}},
		{"an empty key", map[string]string{"": "v"}},
	} {
		s := rawAttach(t, h)
		if err := s.Send(&rlhubv1.LearnerMessage{Body: &rlhubv1.LearnerMessage_Hello{Hello: &rlhubv1.Hello{LearnerId: "greedy", Resources: tc.res}}}); err != nil {
			t.Fatal(err)
		}
		code, msg := recvEnd(s)
		if code != codes.InvalidArgument || !strings.Contains(msg, "resource") || len(msg) > 512 {
			t.Errorf("%s: stream ended with %v and a %d-byte message %.200q, want InvalidArgument, short, naming the resources", tc.name, code, len(msg), msg)
		}
	}
	ok := map[string]string{"gpu": "1", "host": strings.Repeat("h", MaxResourceValueBytes)}
	s := rawAttach(t, h)
	if err := s.Send(&rlhubv1.LearnerMessage{Body: &rlhubv1.LearnerMessage_Hello{Hello: &rlhubv1.Hello{LearnerId: "fine", Resources: ok}}}); err != nil {
		t.Fatal(err)
	}
	if m, err := s.Recv(); err != nil || m.GetWelcome() == nil {
		t.Fatalf("learner within the bounds: %v, %v; want a welcome", m, err)
	}
	testkit.Eventually(t, 60*time.Second, "only the learner within the bounds listed, with its resources", func() bool {
		r, err := h.svc.Resources(context.Background(), &rlhubv1.ResourcesRequest{})
		return err == nil && len(r.Learners) == 1 && r.Learners[0].LearnerId == "fine" && r.Learners[0].Resources["host"] == ok["host"]
	})
	for _, line := range strings.Split(logs.String(), "\n") {
		if len(line) > 4<<10 {
			t.Errorf("a %d-byte log line: %.200q", len(line), line)
		}
	}
}

// A task id is logged, sent to every learner, shown per learner on the
// dashboard and saved with the task, so Start refuses one past 128 bytes
// or with control characters, and the calls that name a task echo at most
// 64 bytes of it. Before, Start took a 1 MB id: a 1 MB line in the hub's
// and every learner's log, a 1 MB task.json and 1 MB per learner in each
// dashboard poll.
func TestTaskIDIsBounded(t *testing.T) {
	h := newHarness(t, Config{})
	ctx := testCtx(t, 30*time.Second)
	conn, err := grpc.NewClient(h.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := rlhubv1.NewLearnerAggregatorClient(conn)
	huge := strings.Repeat("T", 1<<20)
	for _, id := range []string{huge, "task\x1b[2J"} {
		_, err := c.Start(ctx, &rlhubv1.StartRequest{TaskId: id})
		if st := status.Convert(err); st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), "task id") || len(st.Message()) > 256 {
			t.Errorf("Start with a %d-byte id: %v and a %d-byte message %.120q, want InvalidArgument, short, naming the task id", len(id), st.Code(), len(st.Message()), st.Message())
		}
	}
	if st, err := h.svc.Status(ctx, &rlhubv1.StatusRequest{}); err != nil || st.TaskId != "" {
		t.Fatalf("after the refused Starts: task %.40q, %v; want none", st.GetTaskId(), err)
	}
}

// Learn batches in progress share a byte budget: each holds a buffer of
// its announced size from its header on, so a second batch waits while a
// first, announced and not yet sent, holds the whole budget, and goes on
// once it ends.
func TestLearnBatchesInFlightShareABudget(t *testing.T) {
	batch := regressionBatch(t, 8, 1)
	blob, err := safetensors.Encode(batch, nil)
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, Config{MaxBatchBytesInFlight: int64(len(blob))})
	runLearners(t, h, exampleCfg("a", 4))
	ctx := testCtx(t, 30*time.Second)
	if _, err := h.client.Start(ctx, "t1", map[string]any{"w": testWeights}); err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(h.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	first, err := rlhubv1.NewLearnerAggregatorClient(conn).Learn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	send := func(m *rlhubv1.LearnRequest) {
		t.Helper()
		if err := first.Send(m); err != nil {
			t.Fatal(err)
		}
	}
	send(&rlhubv1.LearnRequest{Body: &rlhubv1.LearnRequest_Header{Header: &rlhubv1.LearnHeader{
		TaskId: "t1", Blob: &rlhubv1.BlobInfo{TotalBytes: uint64(len(blob))}}}})
	send(&rlhubv1.LearnRequest{Body: &rlhubv1.LearnRequest_Chunk{Chunk: &rlhubv1.Chunk{Data: blob[:10]}}}) // and then nothing, for now
	testkit.Eventually(t, 10*time.Second, "the first batch's header to take the whole budget", func() bool {
		return h.svc.batches.Full()
	})
	second := make(chan error, 1)
	go func() {
		_, err := h.client.Learn(ctx, "t1", batch, nil)
		second <- err
	}()
	select {
	case err := <-second:
		t.Fatalf("a second batch of %d bytes ended (%v) while the first held the whole budget", len(blob), err)
	case <-time.After(500 * time.Millisecond):
	}
	if n := h.svc.Stats().LearnOK; n != 0 {
		t.Fatalf("%d batches learned while the first held the whole budget", n)
	}
	send(&rlhubv1.LearnRequest{Body: &rlhubv1.LearnRequest_Chunk{Chunk: &rlhubv1.Chunk{Data: blob[10:]}}})
	if _, err := first.CloseAndRecv(); err != nil {
		t.Fatalf("the first batch: %v", err)
	}
	if err := <-second; err != nil {
		t.Fatalf("the second batch, once the first ended: %v", err)
	}
}

// A learner's reported error (up to a gRPC message) reaches the
// coordinator's error and the log bounded, saying how long it was.
func TestLearnersErrorTextIsBounded(t *testing.T) {
	h := newHarness(t, Config{})
	ex := &learner.Example{ID: "a", BatchSize: 4}
	cfg := ex.Config("")
	long := strings.Repeat("e", 100<<10)
	cfg.OnStart = func(context.Context, string, map[string]any) error { return errors.New(long) }
	runLearners(t, h, cfg)
	_, err := h.client.Start(testCtx(t, 30*time.Second), "t1", map[string]any{"w": testWeights})
	if !errors.Is(err, errs.ErrAborted) || len(err.Error()) > 2*MaxLearnerErrorBytes || !strings.Contains(err.Error(), "bytes)") {
		t.Fatalf("a learner's 100 KiB refusal: %d bytes of error text, %.200v", len(err.Error()), err)
	}
}

// A learner that attaches while a Start is in flight (another learner's
// OnStart still running) is started on that task once it is current, both
// for the first task and for a later one: it takes part in the next
// demand instead of staying attached and unused.
func TestLearnerAttachingDuringStartIsStartedOnIt(t *testing.T) {
	h := newHarness(t, Config{})
	ctx := testCtx(t, 60*time.Second)
	lateCtx, stopLate := context.WithCancel(context.Background())
	var lateWG sync.WaitGroup
	t.Cleanup(func() { stopLate(); lateWG.Wait() })
	a := exampleCfg("a", 4)
	exA := &learner.Example{ID: "a", BatchSize: 4}
	a.OnStart = func(ctx context.Context, task string, info map[string]any) error {
		// The learner of this task's id attaches while a is starting.
		late := exampleCfg("late-"+task, 4)
		late.Hub, late.Backoff, late.Logger = h.addr, 20*time.Millisecond, testkit.Logger()
		lateWG.Add(1)
		go func() { defer lateWG.Done(); learner.Run(lateCtx, late) }()
		for !slices.Contains(h.learnerIDs(t, ""), late.ID) {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(5 * time.Millisecond):
			}
		}
		return exA.OnStart(ctx, task, info)
	}
	runLearners(t, h, a)
	for i, task := range []string{"t1", "t2"} {
		if _, err := h.client.Start(ctx, task, map[string]any{"w": testWeights}); err != nil {
			t.Fatal(err)
		}
		want := []string{"a", "late-t1", "late-t2"}[:i+2]
		testkit.Eventually(t, 10*time.Second, "every attached learner started on "+task, func() bool {
			return slices.Equal(h.learnerIDs(t, task), want)
		})
	}
}

// A demand no batch could be split by (batch sizes adding up past what a
// split accepts) is refused InvalidArgument and recorded nowhere: the
// task's earlier demand still splits the next batch.
func TestAbsurdDemandIsRefusedAndChangesNothing(t *testing.T) {
	h := newHarness(t, Config{DataDir: t.TempDir()})
	var bigB atomic.Int64
	bigB.Store(4)
	b := exampleCfg("b", 4)
	demandB := b.OnDemand
	b.OnDemand = func(ctx context.Context, task string) (learner.Demand, error) {
		d, err := demandB(ctx, task)
		d.BatchSize = bigB.Load()
		return d, err
	}
	runLearners(t, h, exampleCfg("a", 4), b)
	ctx := testCtx(t, 30*time.Second)
	if _, err := h.client.Start(ctx, "t1", map[string]any{"w": testWeights}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.client.GetDataDemand(ctx, "t1"); err != nil {
		t.Fatal(err)
	}
	bigB.Store(1<<62 + 1)
	if d, err := h.client.GetDataDemand(ctx, "t1"); !errors.Is(err, errs.ErrInvalid) {
		t.Fatalf("demand adding up to %d rows: %v, err %v; want InvalidArgument", d.GetDemand().GetBatchSize(), d.GetBatchSizes(), err)
	}
	batch := regressionBatch(t, 8, 1)
	resp, err := h.client.Learn(ctx, "t1", batch, nil)
	if err != nil {
		t.Fatalf("learn after the refused demand: %v", err)
	}
	if ids, rows := shareSizes(resp); !slices.Equal(ids, []string{"a", "b"}) || !slices.Equal(rows, []int64{4, 4}) {
		t.Fatalf("shares %v %v, want the earlier demand's [a b] [4 4]", ids, rows)
	}
	checkExactlyOnce(t, resp, batch)
}

// Each share's wait is bounded by TaskTimeout on its own: a learner given
// several failed shares in one re-split round, each taking less than the
// timeout, is not detached for the time it spends on the earlier ones.
func TestResplitSharesOnOneLearnerEachHaveTheTaskTimeout(t *testing.T) {
	h := newHarness(t, Config{TaskTimeout: 2500 * time.Millisecond})
	steady := &learner.Example{ID: "a", BatchSize: 4, Delay: 1500 * time.Millisecond}
	var cfgs []learner.Config
	cfgs = append(cfgs, steady.Config(""))
	for _, id := range []string{"b", "c"} {
		c := exampleCfg(id, 4)
		c.OnLearn = func(ctx context.Context, lt *learner.LearnTask) (map[string]any, error) {
			return nil, errors.New("out of memory")
		}
		cfgs = append(cfgs, c)
	}
	runLearners(t, h, cfgs...)
	ctx := testCtx(t, 30*time.Second)
	if _, err := h.client.Start(ctx, "t1", map[string]any{"w": testWeights}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.client.GetDataDemand(ctx, "t1"); err != nil {
		t.Fatal(err)
	}
	batch := regressionBatch(t, 12, 1)
	resp, err := h.client.Learn(ctx, "t1", batch, nil)
	if err != nil {
		t.Fatalf("learn with b and c failing, a taking 1.5s a share under a 2.5s task timeout: %v", err)
	}
	if !slices.Equal(resp.Failed, []string{"b", "c"}) {
		t.Fatalf("failed = %v, want [b c]", resp.Failed)
	}
	checkExactlyOnce(t, resp, batch)
}

// A Learn for no task, or for a task that is not the current one, is
// refused at its header: the batch it announces (up to MaxBatchBytes) is
// neither waited for nor given room among the batches in flight.
func TestLearnForNoOrAnotherTaskIsRefusedAtItsHeader(t *testing.T) {
	const announced = 1 << 30
	h := newHarness(t, Config{MaxBatchBytesInFlight: announced})
	ctx := testCtx(t, 30*time.Second)
	conn, err := grpc.NewClient(h.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	refusedAtHeader := func(taskID string, want codes.Code) {
		t.Helper()
		s, err := rlhubv1.NewLearnerAggregatorClient(conn).Learn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Send(&rlhubv1.LearnRequest{Body: &rlhubv1.LearnRequest_Header{Header: &rlhubv1.LearnHeader{
			TaskId: taskID, Blob: &rlhubv1.BlobInfo{TotalBytes: announced}}}}); err != nil {
			t.Fatal(err)
		}
		// No chunk follows, and the stream stays open: the answer must not
		// wait for the batch.
		end := make(chan error, 1)
		go func() { end <- s.RecvMsg(new(rlhubv1.LearnResponse)) }()
		select {
		case err := <-end:
			if status.Code(err) != want {
				t.Fatalf("Learn(%q) before its batch = %v, want %v", taskID, err, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("Learn(%q) still waits for its batch after 5s (budget full: %v)", taskID, h.svc.batches.Full())
		}
	}
	refusedAtHeader("t1", codes.NotFound)
	runLearners(t, h, exampleCfg("a", 4))
	if _, err := h.client.Start(ctx, "t1", map[string]any{"w": testWeights}); err != nil {
		t.Fatal(err)
	}
	refusedAtHeader("t2", codes.FailedPrecondition)
}

// A share over a Go learner's MaxShareBytes fails that share only, with
// an error naming the limit: the learner reads past its chunks and stays
// attached, instead of detaching on every Learn.
func TestShareOverMaxShareBytesFailsThatShareOnly(t *testing.T) {
	h := newHarness(t, Config{OnFailure: PolicyFail})
	small := exampleCfg("a", 4)
	small.MaxShareBytes = 256
	runLearners(t, h, small, exampleCfg("b", 4))
	ctx := testCtx(t, 30*time.Second)
	if _, err := h.client.Start(ctx, "t1", map[string]any{"w": testWeights}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.client.GetDataDemand(ctx, "t1"); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		_, err := h.client.Learn(ctx, "t1", regressionBatch(t, 64, 1), nil)
		if !errors.Is(err, errs.ErrAborted) || !strings.Contains(err.Error(), `learner "a"`) || !strings.Contains(err.Error(), "MaxShareBytes") {
			t.Fatalf("Learn with a share over a's MaxShareBytes: %v", err)
		}
	}
	if st := h.svc.Stats(); st.Removed != 0 || len(st.Learners) != 2 {
		t.Fatalf("learners %v, %d removed: a detached over its share's size", st.Learners, st.Removed)
	}
}
