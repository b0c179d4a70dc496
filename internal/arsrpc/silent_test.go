package arsrpc

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/rlhub/rlhub/internal/testkit"
	pb "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// A worker whose hub accepts the connection and never answers (silent,
// or after a valid HTTP/2 preface: an empty SETTINGS frame) gives up
// after RetryFor with DeadlineExceeded and an error that names the ARS
// coordinator's address and the bound each Attach had, not a bare
// "attach: context deadline exceeded: context deadline exceeded".
func TestWorkerAgainstSilentHubNamesWhatTimedOut(t *testing.T) {
	for _, hub := range []struct {
		name  string
		first []byte
	}{
		{"silent", testkit.Silent},
		{"preface-only", testkit.PrefaceOnly},
	} {
		t.Run(hub.name, func(t *testing.T) {
			addr := testkit.SilentHub(t, hub.first)
			conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			_, err = RunWorker(ctx, WorkerConfig{Conn: conn, Name: "w", RetryFor: time.Millisecond, Logger: testkit.Logger(),
				attachWait: 200 * time.Millisecond})
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("RunWorker against a %s hub = %v, want DeadlineExceeded", hub.name, err)
			}
			for _, want := range []string{"attach to the ARS coordinator at " + addr, "no answer within 200ms"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("RunWorker against a %s hub = %q, want it to say %q", hub.name, err, want)
				}
			}
			if strings.Contains(err.Error(), "exceeded: context deadline exceeded") {
				t.Errorf("RunWorker against a %s hub = %q: the deadline said twice", hub.name, err)
			}
		})
	}
}

// leasingSilentHub is a hub that attaches a worker and leases it one
// CartPole evaluation task (with the policy inline, or without it to be
// pulled) and then answers no PullPolicy and no Report: they wait for
// the caller's deadline, as a hub wedged behind them does.
type leasingSilentHub struct {
	pb.UnimplementedARSServer
	policy []byte // nil: the lease carries none and the worker pulls it
	waits  atomic.Int64
}

func (s *leasingSilentHub) Attach(context.Context, *pb.ARSAttachRequest) (*pb.ARSAttachResponse, error) {
	return &pb.ARSAttachResponse{WorkerId: "w"}, nil
}

func (s *leasingSilentHub) Detach(context.Context, *pb.ARSDetachRequest) (*pb.ARSDetachResponse, error) {
	return &pb.ARSDetachResponse{}, nil
}

func (s *leasingSilentHub) Lease(context.Context, *pb.ARSLeaseRequest) (*pb.ARSLeaseResponse, error) {
	return &pb.ARSLeaseResponse{RunId: "r", Spec: &pb.ARSRunSpec{Env: "CartPole-v1"}, Model: "ars/r", Version: 1,
		Policy: s.policy, Tasks: []*pb.ARSTask{{Kind: pb.ARSTaskKind_ARS_TASK_KIND_EVAL}}}, nil
}

func (s *leasingSilentHub) PullPolicy(_ *pb.ARSPullPolicyRequest, stream grpc.ServerStreamingServer[pb.ARSPolicyPart]) error {
	s.waits.Add(1)
	<-stream.Context().Done()
	return stream.Context().Err()
}

func (s *leasingSilentHub) Report(ctx context.Context, _ *pb.ARSReportRequest) (*pb.ARSReportResponse, error) {
	s.waits.Add(1)
	<-ctx.Done()
	return nil, ctx.Err()
}

// A worker whose hub leases tasks but then answers no PullPolicy (or no
// Report) gives up after RetryFor as for a silent Attach: with
// DeadlineExceeded and an error naming the call, the coordinator's
// address and the bound each call had, not a bare "report: context
// deadline exceeded". It used to retry for ever, each lease clearing
// the failures.
func TestWorkerAgainstHubSilentAfterLeaseNamesWhatTimedOut(t *testing.T) {
	blob := cartPolePolicy(t)
	for _, c := range []struct {
		name, what string
		policy     []byte
	}{
		{"pull policy", "pull a policy from", nil},
		{"report", "report to", blob},
	} {
		t.Run(c.name, func(t *testing.T) {
			srv := &leasingSilentHub{policy: c.policy}
			addr := testkit.ServeGRPC(t, nil, func(g *grpc.Server) { pb.RegisterARSServer(g, srv) })
			conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			_, err = RunWorker(ctx, WorkerConfig{Conn: conn, Name: "w", RetryFor: time.Millisecond, Logger: testkit.Logger(),
				callWait: 200 * time.Millisecond})
			if ctx.Err() != nil {
				t.Fatalf("RunWorker against a hub silent on %s did not give up (%d calls waited out)", c.name, srv.waits.Load())
			}
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("RunWorker against a hub silent on %s = %v, want DeadlineExceeded", c.name, err)
			}
			for _, want := range []string{c.what + " the ARS coordinator at " + addr, "no answer within 200ms"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("RunWorker against a hub silent on %s = %q, want it to say %q", c.name, err, want)
				}
			}
			if strings.Contains(err.Error(), "exceeded: context deadline exceeded") {
				t.Errorf("RunWorker against a hub silent on %s = %q: the deadline said twice", c.name, err)
			}
		})
	}
}
