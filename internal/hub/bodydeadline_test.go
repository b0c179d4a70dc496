package hub

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/rlhub/rlhub/internal/aggregator"
	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/learner"
	"github.com/rlhub/rlhub/internal/reducer"
	"github.com/rlhub/rlhub/internal/safetensors"
	"github.com/rlhub/rlhub/internal/store/storetest"
	"github.com/rlhub/rlhub/internal/tensor"
	"github.com/rlhub/rlhub/internal/testkit"
	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// filled is a one-tensor state dict "w" of n float32s, all v.
func filled(n int, v float32) *tensor.StateDict {
	w := tensor.NewF32("w", int64(n))
	f, _ := w.Float32s()
	for i := range f {
		f[i] = v
	}
	sd, _ := tensor.NewStateDict(w)
	return sd
}

// openBulkPush opens a data-plane connection, sends a request for method
// with header and waits for "continue": the body is the caller's to send.
// The returned reader reads the server's frames that follow.
func openBulkPush(t *testing.T, addr, method string, header proto.Message) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second)) // a hang guard, not a measurement
	h, _ := proto.Marshal(header)
	br := sendBulkRequest(t, c, "", method, h)
	if k, err := br.ReadByte(); err != nil || k != 2 {
		t.Fatalf("want continue (2), got %d, %v", k, err)
	}
	return c, br
}

// readBulkFinal reads a final frame; with hangup it expects the server
// to close the connection after it.
func readBulkFinal(t *testing.T, br *bufio.Reader, hangup bool) *spb.Status {
	t.Helper()
	if k, err := br.ReadByte(); err != nil || k != 3 {
		t.Fatalf("want a final frame (3), got %d, %v", k, err)
	}
	var n [4]byte
	if _, err := io.ReadFull(br, n[:]); err != nil {
		t.Fatal(err)
	}
	raw := make([]byte, binary.LittleEndian.Uint32(n[:]))
	if _, err := io.ReadFull(br, raw); err != nil {
		t.Fatal(err)
	}
	st := &spb.Status{}
	if err := proto.Unmarshal(raw, st); err != nil {
		t.Fatal(err)
	}
	if !hangup {
		return st
	}
	if _, err := br.ReadByte(); err == nil {
		t.Fatal("the server kept the connection open after the cut-off")
	}
	return st
}

// The SRE review's denial of service: a gradient push whose body comes a
// byte at a time, each byte well within the body idle timeout, held its
// connection and its secondary's queue slot for as long as the client
// liked. With a body deadline (Limits.BodyTimeout + length at
// BodyMinRate) the push is answered DeadlineExceeded naming the limit,
// the connection closes, the cut is counted on /metrics, and the
// gradient is never applied, while honest pushes land meanwhile and
// afterwards — including one whose body is slow but within the bound.
func TestTrickledDataPlanePushIsCutOff(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const n = 256
	h, c := startWithSGDModel(t, ctx, Config{Listen: "127.0.0.1:0", Logger: testkit.Logger(), MetricsListen: "127.0.0.1:0",
		Reducer: reducer.Config{BatchSize: 1},
		Limits:  Limits{BodyTimeout: 500 * time.Millisecond}}, filled(n, 0))
	addr := h.Addr().String()

	version := func() uint64 {
		snap, err := h.Store().Get(ctx, "m", 0)
		if err != nil {
			t.Fatal(err)
		}
		return snap.Version
	}

	// A gradient of 1000s: were it ever applied, the weights would show it.
	hostile, _ := safetensors.Encode(filled(n, 1000), nil)
	conn, br := openBulkPush(t, addr, reducer.BulkPushMethod, &rlhubv1.ReducerPushHeader{ClientId: "trickler", Seq: 1,
		Blob: &rlhubv1.BlobInfo{Model: "m", Version: version(), TotalBytes: uint64(len(hostile))}})
	// ~1 KiB at a byte per 20 ms would take 20 s: far past the bound.
	sent := testkit.Trickle(conn, hostile, 20*time.Millisecond)
	var wg sync.WaitGroup
	wg.Go(func() { // an honest push meanwhile, on its own connection
		if _, err := c.PushGrad(ctx, "m", 0, filled(n, 1)); err != nil {
			t.Errorf("an honest push beside the trickling one: %v", err)
		}
	})
	st := readBulkFinal(t, br, true)
	if codes.Code(st.GetCode()) != codes.DeadlineExceeded || !strings.Contains(st.GetMessage(), "body timeout") ||
		strings.Contains(st.GetMessage(), "trickler") {
		t.Fatalf("the trickled push was answered %v %q, want DeadlineExceeded naming the body timeout", codes.Code(st.GetCode()), st.GetMessage())
	}
	<-sent
	wg.Wait()
	m := scrapeMetrics(t, h.MetricsAddr(), "")
	for _, want := range []string{
		`rlhub_conns_refused_total{reason="body_timeout"} 1`,
		`rlhub_dataplane_requests_total{code="DeadlineExceeded",method="rlhub.v1.Reducer/Push"} 1`,
	} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}

	// Slow but within the bound: half the body, a pause, the rest.
	slow, _ := safetensors.Encode(filled(n, 1), nil)
	conn, br = openBulkPush(t, addr, reducer.BulkPushMethod, &rlhubv1.ReducerPushHeader{ClientId: "slow", Seq: 1,
		Blob: &rlhubv1.BlobInfo{Model: "m", Version: version(), TotalBytes: uint64(len(slow))}})
	if _, err := conn.Write(slow[:len(slow)/2]); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	if _, err := conn.Write(slow[len(slow)/2:]); err != nil {
		t.Fatal(err)
	}
	if st := readBulkFinal(t, br, false); codes.Code(st.GetCode()) != codes.OK {
		t.Fatalf("a slow push within the bound: %v %q", codes.Code(st.GetCode()), st.GetMessage())
	}
	// And an honest push afterwards.
	if _, err := c.PushGrad(ctx, "m", 0, filled(n, 1)); err != nil {
		t.Fatalf("an honest push after the cut-off: %v", err)
	}

	// Three gradients of 1s applied at lr 0.1, the trickled one never.
	testkit.Eventually(t, 20*time.Second, "the honest gradients applied", func() bool { return version() == 4 })
	snap, err := h.Store().Get(ctx, "m", 0)
	if err != nil {
		t.Fatal(err)
	}
	w, _ := snap.Tensors.Get("w").Float32s()
	for i, x := range w {
		if d := x - (-0.3); d > 1e-5 || d < -1e-5 {
			t.Fatalf("w[%d] = %v, want -0.3 (three honest gradients, the trickled one never applied)", i, x)
		}
	}
}

// sendPush sends first, then body in pieces of piece bytes with gap
// between them, on a client stream of msgs (chunk wraps a piece), until
// all is sent or the server ended the stream; then it closes its side and
// returns the call's status.
func sendPush(stream grpc.ClientStream, first proto.Message, chunk func([]byte) proto.Message, body []byte, piece int, gap time.Duration) error {
	if err := stream.SendMsg(first); err != nil {
		return recvStatus(stream)
	}
	for len(body) > 0 {
		k := min(piece, len(body))
		if err := stream.SendMsg(chunk(body[:k])); err != nil {
			return recvStatus(stream)
		}
		body = body[k:]
		time.Sleep(gap)
	}
	return recvStatus(stream)
}

func recvStatus(stream grpc.ClientStream) error {
	_ = stream.CloseSend()
	return stream.RecvMsg(&emptypb.Empty{})
}

// The same denial of service over gRPC: grpc-go bounds a client-streaming
// call only by the client's own deadline, and keepalive does not stop a
// sender that sends a byte at a time. The hub ends a push stream (store,
// gradient or learner batch) whose body is not in within Limits.BodyTimeout + length at
// BodyMinRate with DeadlineExceeded naming the limit; nothing is stored
// or applied, and honest pushes go on meanwhile and afterwards, a slow
// one within the bound included.
func TestTrickledGRPCPushIsCutOff(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const n = 256
	h, _ := startWithSGDModel(t, ctx, Config{Listen: "127.0.0.1:0", Logger: testkit.Logger(), MetricsListen: "127.0.0.1:0",
		Reducer: reducer.Config{BatchSize: 1},
		Limits:  Limits{BodyTimeout: 500 * time.Millisecond}}, filled(n, 0))
	conn, err := grpc.NewClient(h.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	storePush := func(model string, version uint64, blob []byte, piece int, gap time.Duration) error {
		stream, err := rlhubv1.NewModelStoreClient(conn).Push(ctx)
		if err != nil {
			return err
		}
		first := &rlhubv1.StorePushRequest{Body: &rlhubv1.StorePushRequest_Header{Header: &rlhubv1.StorePushHeader{
			Blob: &rlhubv1.BlobInfo{Model: model, Version: version, TotalBytes: uint64(len(blob))}, ExpectAny: true}}}
		return sendPush(stream, first, func(b []byte) proto.Message {
			return &rlhubv1.StorePushRequest{Body: &rlhubv1.StorePushRequest_Chunk{Chunk: &rlhubv1.Chunk{Data: b}}}
		}, blob, piece, gap)
	}
	gradPush := func(blob []byte, piece int, gap time.Duration) error {
		stream, err := rlhubv1.NewReducerClient(conn).Push(ctx)
		if err != nil {
			return err
		}
		first := &rlhubv1.ReducerPushRequest{Body: &rlhubv1.ReducerPushRequest_Header{Header: &rlhubv1.ReducerPushHeader{
			ClientId: "trickler", Seq: 1, Blob: &rlhubv1.BlobInfo{Model: "m", Version: 1, TotalBytes: uint64(len(blob))}}}}
		return sendPush(stream, first, func(b []byte) proto.Message {
			return &rlhubv1.ReducerPushRequest{Body: &rlhubv1.ReducerPushRequest_Chunk{Chunk: &rlhubv1.Chunk{Data: b}}}
		}, blob, piece, gap)
	}
	learnPush := func(blob []byte, piece int, gap time.Duration) error {
		stream, err := rlhubv1.NewLearnerAggregatorClient(conn).Learn(ctx)
		if err != nil {
			return err
		}
		first := &rlhubv1.LearnRequest{Body: &rlhubv1.LearnRequest_Header{Header: &rlhubv1.LearnHeader{
			TaskId: "t", Blob: &rlhubv1.BlobInfo{TotalBytes: uint64(len(blob))}}}}
		return sendPush(stream, first, func(b []byte) proto.Message {
			return &rlhubv1.LearnRequest{Body: &rlhubv1.LearnRequest_Chunk{Chunk: &rlhubv1.Chunk{Data: b}}}
		}, blob, piece, gap)
	}
	cutOff := func(what string, err error) {
		t.Helper()
		st, _ := status.FromError(err)
		if st.Code() != codes.DeadlineExceeded || !strings.Contains(st.Message(), "body-timeout") || strings.Contains(st.Message(), "trickler") {
			t.Errorf("%s: %v, want DeadlineExceeded naming the body timeout", what, err)
		}
	}

	// A task for the learner batch (one for no task is refused at its
	// header, before its body).
	lctx, lcancel := context.WithCancel(ctx)
	var learners sync.WaitGroup
	defer func() { lcancel(); learners.Wait() }()
	lcfg := (&learner.Example{ID: "a", BatchSize: 4}).Config(h.Addr().String())
	lcfg.Logger = testkit.Logger()
	learners.Go(func() { learner.Run(lctx, lcfg) })
	agg := aggregator.NewClient(conn)
	testkit.Eventually(t, 10*time.Second, "learner attached", func() bool {
		r, err := agg.Resources(ctx)
		return err == nil && len(r) == 1
	})
	if _, err := agg.Start(ctx, "t", map[string]any{"w": []any{0.5, -1.0, 2.0, 0.25}}); err != nil {
		t.Fatal(err)
	}

	blob := storetest.Blob(t, 1, n) // ~1 KiB: at a byte per 20 ms, 20 s
	hostile, _ := safetensors.Encode(filled(n, 1000), nil)
	var wg sync.WaitGroup
	wg.Go(func() { cutOff("trickled store push", storePush("s", 1, blob, 1, 20*time.Millisecond)) })
	wg.Go(func() { cutOff("trickled gradient push", gradPush(hostile, 1, 20*time.Millisecond)) })
	// A learner batch is a push too: its buffer is held from its header on.
	wg.Go(func() { cutOff("trickled learner batch", learnPush(blob, 1, 20*time.Millisecond)) })
	if err := storePush("honest", 1, blob, 1<<20, 0); err != nil { // meanwhile
		t.Fatalf("an honest push beside the trickling ones: %v", err)
	}
	wg.Wait()
	if _, err := h.Store().Get(ctx, "s", 0); !errors.Is(err, errs.ErrNotFound) {
		t.Fatalf("the trickled store push left a model: %v", err)
	}
	// Slow but within the bound: two halves with a pause; then one more.
	if err := storePush("honest", 2, blob, len(blob)/2+1, 100*time.Millisecond); err != nil {
		t.Fatalf("a slow push within the bound: %v", err)
	}
	if err := storePush("honest", 3, blob, 1<<20, 0); err != nil {
		t.Fatalf("an honest push after the cut-off: %v", err)
	}
	if snap, err := h.Store().Get(ctx, "m", 0); err != nil || snap.Version != 1 {
		t.Fatalf("the trickled gradient moved the model: %v", err)
	}
	m := scrapeMetrics(t, h.MetricsAddr(), "")
	for _, call := range []string{"Push/rlhub.v1.ModelStore", "Push/rlhub.v1.Reducer", "Learn/rlhub.v1.LearnerAggregator"} {
		method, svc, _ := strings.Cut(call, "/")
		want := `rlhub_grpc_server_handled_total{grpc_code="DeadlineExceeded",grpc_method="` + method + `",grpc_service="` + svc + `",grpc_type="client_stream"} 1`
		if !strings.Contains(m, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

// A learner batch is bound like a push until its body is in (its end of
// stream read), not through the learning that follows: a batch sent at
// once, to learners busy for longer than --body-timeout, is learned, not
// cut DeadlineExceeded while they work.
func TestLearnBatchIsNotCutWhileLearnersWork(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	h, err := New(Config{Listen: "127.0.0.1:0", Logger: testkit.Logger(), Limits: Limits{BodyTimeout: time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if err := h.Start(); err != nil {
		t.Fatal(err)
	}
	addr := h.Addr().String()
	lctx, lcancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { lcancel(); wg.Wait() }()
	ex := &learner.Example{ID: "a", BatchSize: 4, Delay: 2 * time.Second}
	lcfg := ex.Config(addr)
	lcfg.Logger = testkit.Logger()
	wg.Go(func() { learner.Run(lctx, lcfg) })

	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := aggregator.NewClient(conn)
	testkit.Eventually(t, 10*time.Second, "learner attached", func() bool {
		r, err := c.Resources(ctx)
		return err == nil && len(r) == 1
	})
	if _, err := c.Start(ctx, "t1", map[string]any{"w": []any{0.5, -1.0, 2.0, 0.25}}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.GetDataDemand(ctx, "t1"); err != nil {
		t.Fatal(err)
	}
	rows := int64(4)
	x := tensor.NewF32("x", rows, 4)
	y := tensor.NewF32("y", rows)
	ids := &tensor.Tensor{Name: "row", DType: tensor.I64, Shape: []int64{rows}, Data: tensor.AlignedBytes(int(rows) * 8)}
	for i := range rows {
		binary.LittleEndian.PutUint64(ids.Data[i*8:], uint64(i))
	}
	batch, _ := tensor.NewStateDict(x, y, ids)
	start := time.Now()
	_, err = c.Learn(ctx, "t1", batch, nil)
	if err != nil {
		t.Fatalf("Learn of a ~200-byte batch sent at once, learner busy 2s, --body-timeout 1s: after %v: %v", time.Since(start).Round(time.Millisecond), err)
	}
}
