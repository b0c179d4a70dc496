package storerpc_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/status"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/errs/grpcerr"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/store/storerpc"
	"github.com/rlhub/rlhub/internal/store/storetest"
	"github.com/rlhub/rlhub/internal/testkit"
	"github.com/rlhub/rlhub/internal/wire/chunkcodec"
	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// harness is a real gRPC server on 127.0.0.1:0 over an in-memory store, and
// a raw client of it, so tests can send streams no well-behaved client would.
type harness struct {
	mem  *store.Memory
	rpc  rlhubv1.ModelStoreClient
	opts []grpc.CallOption // per-call options (the codec)
}

func start(t *testing.T, cfg store.Config) *harness {
	t.Helper()
	h, _ := startAddr(t, cfg)
	return h
}

// startAddr is start, also returning the server's address (for a
// storerpc.Client).
func startAddr(t *testing.T, cfg store.Config) (*harness, string) {
	t.Helper()
	mem, err := store.NewMemory(cfg)
	if err != nil {
		t.Fatal(err)
	}
	svc, err := storerpc.New(storerpc.Config{Store: mem})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { svc.Close(); mem.Close() })
	addr := testkit.ServeGRPC(t, nil, svc.Register)
	t.Cleanup(svc.Drain) // before the graceful stop: ends the watches
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &harness{mem: mem, rpc: rlhubv1.NewModelStoreClient(conn)}, addr
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func header(name string, version, expect, total uint64) *rlhubv1.StorePushRequest {
	return &rlhubv1.StorePushRequest{Body: &rlhubv1.StorePushRequest_Header{Header: &rlhubv1.StorePushHeader{
		Blob:   &rlhubv1.BlobInfo{Model: name, Version: version, TotalBytes: total},
		Expect: expect,
	}}}
}

func chunk(b []byte) *rlhubv1.StorePushRequest {
	return &rlhubv1.StorePushRequest{Body: &rlhubv1.StorePushRequest_Chunk{Chunk: &rlhubv1.Chunk{Data: b}}}
}

// rawPush sends msgs on one push stream and returns the final status.
func rawPush(t *testing.T, h *harness, msgs ...*rlhubv1.StorePushRequest) error {
	t.Helper()
	stream, err := h.rpc.Push(ctxT(t), h.opts...)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range msgs {
		if err := stream.Send(m); err != nil {
			break // the server answered early; CloseAndRecv has it
		}
	}
	_, err = stream.CloseAndRecv()
	return err
}

// Both receive paths: the stock proto codec (as from Python) and the blob
// codec (as from the Go client).
func TestBadPushStreamsLeaveStoreUnchanged(t *testing.T) {
	for _, codec := range []string{grpcproto.Name, chunkcodec.Name} {
		t.Run(codec, func(t *testing.T) {
			h := start(t, store.Config{MaxModelBytes: 1 << 20})
			h.opts = []grpc.CallOption{grpc.CallContentSubtype(codec)}
			testBadPushes(t, h)
		})
	}
}

func testBadPushes(t *testing.T, h *harness) {
	storetest.MustPush(t, h.mem, store.PushRequest{Name: "m", Version: 1, Expect: 0, Blob: storetest.Blob(t, 1, 4)})
	before := storetest.Capture(t, h.mem)
	good := storetest.Blob(t, 2, 64)
	n := uint64(len(good))
	for _, tc := range []struct {
		name string
		msgs []*rlhubv1.StorePushRequest
		code codes.Code
	}{
		{"empty stream", nil, codes.InvalidArgument},
		{"chunk before header", []*rlhubv1.StorePushRequest{chunk(good)}, codes.InvalidArgument},
		{"header without blob info", []*rlhubv1.StorePushRequest{{Body: &rlhubv1.StorePushRequest_Header{Header: &rlhubv1.StorePushHeader{}}}}, codes.InvalidArgument},
		{"truncated stream", []*rlhubv1.StorePushRequest{header("m", 2, 1, n), chunk(good[:n/2])}, codes.InvalidArgument},
		{"header only", []*rlhubv1.StorePushRequest{header("m", 2, 1, n)}, codes.InvalidArgument},
		{"overrun", []*rlhubv1.StorePushRequest{header("m", 2, 1, n-1), chunk(good)}, codes.InvalidArgument},
		{"second header", []*rlhubv1.StorePushRequest{header("m", 2, 1, n), chunk(good[:8]), header("m", 2, 1, n)}, codes.InvalidArgument},
		// 1 PiB announced: refused from the header alone (allocating it
		// would crash the test).
		{"oversize announced", []*rlhubv1.StorePushRequest{header("m", 2, 1, 1<<50)}, codes.ResourceExhausted},
		{"bad name", []*rlhubv1.StorePushRequest{header("../x", 2, 1, n), chunk(good)}, codes.InvalidArgument},
		{"huge header length", []*rlhubv1.StorePushRequest{header("m", 2, 1, n), chunk([]byte{0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0})}, codes.InvalidArgument},
		{"corrupt blob", []*rlhubv1.StorePushRequest{header("m", 2, 1, n), chunk(append([]byte{}, good[:8]...)), chunk(make([]byte, n-8))}, codes.InvalidArgument},
		{"stale expectation", []*rlhubv1.StorePushRequest{header("m", 2, 7, n), chunk(good)}, codes.FailedPrecondition},
		{"unknown model expected", []*rlhubv1.StorePushRequest{header("new", 2, 1, n), chunk(good)}, codes.FailedPrecondition},
		// 2^64-1 is the Go API's ExpectAny: on the wire, without
		// expect_any, it is a version no model reaches, not "unchecked".
		{"expect past the largest version", []*rlhubv1.StorePushRequest{header("m", 2, ^uint64(0), n), chunk(good)}, codes.InvalidArgument},
	} {
		err := rawPush(t, h, tc.msgs...)
		if status.Code(err) != tc.code {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.code)
		}
		if d := storetest.Capture(t, h.mem).Diff(before); d != "" {
			t.Fatalf("%s changed the store: %s", tc.name, d)
		}
	}
	// The stale error carries the current version across the wire.
	err := rawPush(t, h, header("m", 2, 7, n), chunk(good))
	var se *errs.StaleError
	if !errors.As(grpcerr.FromStatus(err), &se) || se.CurrentVersion != 1 {
		t.Errorf("stale push: %v, want StaleError at version 1", err)
	}
	// And the good push still lands.
	if err := rawPush(t, h, header("m", 2, 1, n), chunk(good[:10]), chunk(good[10:])); err != nil {
		t.Fatalf("good push: %v", err)
	}
}

func TestPushCancelledMidStreamChangesNothing(t *testing.T) {
	h := start(t, store.Config{})
	good := storetest.Blob(t, 1, 1024)
	ctx, cancel := context.WithCancel(ctxT(t))
	stream, err := h.rpc.Push(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(header("m", 1, 0, uint64(len(good)))); err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(chunk(good[:100])); err != nil {
		t.Fatal(err)
	}
	cancel()
	// Receive without CloseSend: a half-close could reach the server before
	// the cancellation and end the push as truncated instead.
	if err := stream.RecvMsg(new(rlhubv1.StorePushResponse)); status.Code(err) != codes.Canceled {
		t.Fatalf("cancelled push: %v", err)
	}
	// The server sees the cancellation; nothing lands.
	if infos, err := h.mem.List(ctxT(t)); err != nil || len(infos) != 0 {
		t.Fatalf("List after cancelled push = %v, %v", infos, err)
	}
}

func TestPullRejectsIfNewerWithVersion(t *testing.T) {
	h := start(t, store.Config{})
	storetest.MustPush(t, h.mem, store.PushRequest{Name: "m", Version: 1, Expect: 0, Blob: storetest.Blob(t, 1, 4)})
	zero := uint64(0)
	stream, err := h.rpc.Pull(ctxT(t), &rlhubv1.StorePullRequest{Model: "m", Version: 1, IfNewerThan: &zero})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("pull with version and if_newer_than: %v, want InvalidArgument", err)
	}
}

func TestPullStreamsStoredBytesInChunks(t *testing.T) {
	h := start(t, store.Config{})
	blob := storetest.Blob(t, 1, 10000)
	storetest.MustPush(t, h.mem, store.PushRequest{Name: "m", Version: 1, Expect: 0, Blob: blob})
	stream, err := h.rpc.Pull(ctxT(t), &rlhubv1.StorePullRequest{Model: "m", ChunkBytes: 4096})
	if err != nil {
		t.Fatal(err)
	}
	msg, err := stream.Recv()
	if err != nil || msg.GetHeader() == nil {
		t.Fatalf("first message %v, %v; want a header", msg, err)
	}
	hdr := msg.GetHeader()
	if hdr.Blob.TotalBytes != uint64(len(blob)) || hdr.Blob.ChunkBytes != 4096 || hdr.Metadata["seed"] != "1" {
		t.Errorf("header %v", hdr)
	}
	var got []byte
	for {
		msg, err := stream.Recv()
		if err != nil {
			break
		}
		if c := msg.GetChunk(); c == nil || len(c.Data) > 4096 {
			t.Fatalf("bad chunk message %v", msg)
		}
		got = append(got, msg.GetChunk().Data...)
	}
	if string(got) != string(blob) {
		t.Fatal("pulled bytes differ from the stored blob")
	}
}
