package arsrpc

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/testkit"
	pb "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// refusingARS is a hub's ARS service that answers every Attach with one
// status, counting the calls.
type refusingARS struct {
	pb.UnimplementedARSServer
	code    codes.Code
	attachs atomic.Int64
}

func (r *refusingARS) Attach(context.Context, *pb.ARSAttachRequest) (*pb.ARSAttachResponse, error) {
	r.attachs.Add(1)
	return nil, status.Error(r.code, "refused by the test")
}

// dialRefusing serves a refusingARS on 127.0.0.1:0 and dials it.
func dialRefusing(t *testing.T, code codes.Code) (*refusingARS, *grpc.ClientConn) {
	t.Helper()
	srv := &refusingARS{code: code}
	addr := testkit.ServeGRPC(t, nil, func(g *grpc.Server) { pb.RegisterARSServer(g, srv) })
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return srv, conn
}

// A worker whose credentials lack the right (PermissionDenied) returns
// the refusal after one attempt: it does not retry it for RetryFor. The
// same worker retries an Unavailable hub, which shows the count can rise.
func TestWorkerDoesNotRetryAPermanentRefusal(t *testing.T) {
	srv, conn := dialRefusing(t, codes.PermissionDenied)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := RunWorker(ctx, WorkerConfig{Conn: conn, Name: "w", MaxTasks: 1, RetryFor: time.Minute, Logger: testkit.Logger()})
	if !errors.Is(err, errs.ErrPermission) {
		t.Fatalf("RunWorker = %v, want the PermissionDenied refusal", err)
	}
	if n := srv.attachs.Load(); n != 1 {
		t.Fatalf("the refused Attach was sent %d times, want once", n)
	}

	down, conn2 := dialRefusing(t, codes.Unavailable)
	ctx2, cancel2 := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := RunWorker(ctx2, WorkerConfig{Conn: conn2, Name: "w", MaxTasks: 1, RetryFor: time.Minute, Logger: testkit.Logger()})
		done <- err
	}()
	testkit.Eventually(t, 30*time.Second, "the worker retrying an Unavailable hub", func() bool { return down.attachs.Load() >= 3 })
	cancel2()
	testkit.Recv(t, done, 30*time.Second, "the worker to stop")
}
