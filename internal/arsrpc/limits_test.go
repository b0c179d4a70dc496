package arsrpc

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/errs/grpcerr"
	pb "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// TestStartRunPolicyTooLarge is issue 16's ARS abuse: a StartRun with
// hidden=[4096,4096] (16.8M parameters) is refused with InvalidArgument
// naming the limit, before a trainer is built; one at the limit starts.
func TestStartRunPolicyTooLarge(t *testing.T) {
	h := startHub(t, Config{})
	client := pb.NewARSClient(dial(t, h.addr))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	spec := runSpec()
	spec.Hidden = []uint32{4096, 4096}
	_, err := client.StartRun(ctx, &pb.ARSStartRunRequest{Spec: spec})
	if err = grpcerr.FromStatus(err); !errors.Is(err, errs.ErrInvalid) || !strings.Contains(err.Error(), "--max-policy-params") {
		t.Fatalf("StartRun of a 16.8M-parameter policy: %v, want InvalidArgument naming --max-policy-params", err)
	}
	h.svc.mu.Lock()
	n := len(h.svc.c.runs)
	h.svc.mu.Unlock()
	if n != 0 {
		t.Fatalf("a refused StartRun left %d runs", n)
	}
	if infos, _ := h.store.List(ctx); len(infos) != 0 {
		t.Fatalf("a refused StartRun published %v", infos)
	}

	// The limit is the flag's: a hub allowing 2M parameters takes a
	// 1024×1024 hidden layer and refuses the 4096×4096 one.
	h2 := startHub(t, Config{MaxPolicyParams: 2 << 20})
	c2 := pb.NewARSClient(dial(t, h2.addr))
	spec.Hidden = []uint32{1024, 1024}
	if _, err := c2.StartRun(ctx, &pb.ARSStartRunRequest{Spec: spec}); err != nil {
		t.Fatalf("StartRun under the limit: %v", err)
	}
}

// TestStopRunReleasesRunState: after StopRun the run keeps its progress
// log but no longer holds its trainer (θ, statistics, noise) or iteration
// state, so the memory a run held is released; its policy stays in the
// store, owned by ARS.
func TestStopRunReleasesRunState(t *testing.T) {
	h := startHub(t, Config{})
	client := pb.NewARSClient(dial(t, h.addr))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	spec := runSpec()
	spec.Hidden = []uint32{64}
	resp, err := client.StartRun(ctx, &pb.ARSStartRunRequest{Spec: spec})
	if err != nil {
		t.Fatal(err)
	}
	h.svc.mu.Lock()
	r := h.svc.c.runs[resp.RunId]
	live := !r.released() && len(r.tasks) > 0
	h.svc.mu.Unlock()
	if !live {
		t.Fatal("a started run holds no trainer or tasks")
	}
	if _, err := client.StopRun(ctx, &pb.ARSStopRunRequest{RunId: resp.RunId}); err != nil {
		t.Fatal(err)
	}
	h.svc.mu.Lock()
	released := r.released() && r.tasks == nil && r.results == nil && r.leases == nil && r.pos == nil
	h.svc.mu.Unlock()
	if !released {
		t.Fatal("after StopRun the run still holds its trainer or iteration state")
	}
	prog := watch(t, ctx, client, resp.RunId)
	if len(prog) == 0 || !prog[len(prog)-1].Done {
		t.Fatalf("progress after StopRun: %v", prog)
	}
	if _, err := h.store.Get(ctx, resp.Model, 0); err != nil {
		t.Fatalf("the stopped run's policy: %v", err)
	}
}

// An ARS worker's name is kept for as long as the worker is attached, so
// Attach refuses one over 128 bytes (or with control characters) and
// attaches nothing. Before, a loop of Attach calls with 4 MB names took a
// real hub from 0.5 GB to 2.25 GB resident in 8 s: each worker, and its
// name, outlives its last call by the lease.
func TestWorkerNameIsBounded(t *testing.T) {
	h := startHub(t, Config{})
	client := pb.NewARSClient(dial(t, h.addr))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, name := range []string{strings.Repeat("N", 4<<20-64), strings.Repeat("N", MaxWorkerNameBytes+1), "w\x1b[2J"} {
		_, err := client.Attach(ctx, &pb.ARSAttachRequest{Name: name})
		if err = grpcerr.FromStatus(err); !errors.Is(err, errs.ErrInvalid) || !strings.Contains(err.Error(), "worker name") || len(err.Error()) > 256 {
			t.Fatalf("Attach with a %d-byte name: %.200v; want InvalidArgument, short, naming the worker name", len(name), err)
		}
	}
	if n := h.svc.Stats().Workers; n != 0 {
		t.Fatalf("refused Attach calls left %d workers", n)
	}
	if _, err := client.Attach(ctx, &pb.ARSAttachRequest{Name: strings.Repeat("n", MaxWorkerNameBytes)}); err != nil {
		t.Fatalf("Attach with a %d-byte name: %v", MaxWorkerNameBytes, err)
	}
	if n := h.svc.Stats().Workers; n != 1 {
		t.Fatalf("%d workers after one Attach, want 1", n)
	}
}
