package cli

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/rlhub/rlhub/internal/arsrpc"
	"github.com/rlhub/rlhub/internal/testkit"
	pb "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// serve --ars-max-ended-runs 2 (without --data): of three ARS runs that
// ended, the hub keeps the newest two, and WatchRun of the oldest fails
// NotFound saying the hub keeps the newest 2. Before, the bound
// (arsrpc.Config.MaxEndedRuns) had no flag: every hub kept 1,000.
func TestServeARSMaxEndedRuns(t *testing.T) {
	code, errOut := serveOrRefusal(t, func(addr string) {
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		wctx, wcancel := context.WithCancel(ctx)
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			arsrpc.RunWorker(wctx, arsrpc.WorkerConfig{Conn: conn, Name: "w0", Logger: testkit.Logger()})
		}()
		defer func() { wcancel(); wg.Wait() }()

		c := pb.NewARSClient(conn)
		spec := &pb.ARSRunSpec{Env: "CartPole-v1", Directions: 1, MaxIterations: 1, EvalEvery: 1, EvalEpisodes: 1}
		var ids []string
		for i := range 3 {
			spec.Seed = uint64(i)
			r, err := c.StartRun(ctx, &pb.ARSStartRunRequest{Spec: spec})
			if err != nil {
				t.Fatal(err)
			}
			if err := watchToEnd(ctx, c, r.RunId); err != nil {
				t.Fatalf("run %s: %v", r.RunId, err)
			}
			ids = append(ids, r.RunId)
		}
		err = watchToEnd(ctx, c, ids[0])
		if status.Code(err) != codes.NotFound || !strings.Contains(err.Error(), "keeps the newest 2 ended runs") {
			t.Errorf("WatchRun of the oldest of 3 ended runs: %v, want NotFound saying the hub keeps the newest 2", err)
		}
		for _, id := range ids[1:] {
			if err := watchToEnd(ctx, c, id); err != nil {
				t.Errorf("WatchRun of kept run %s: %v", id, err)
			}
		}
	}, "--ars-max-ended-runs", "2")
	if code != 0 {
		t.Errorf("serve --ars-max-ended-runs 2: exit %d, stderr %q", code, strings.TrimSpace(errOut))
	}
}

// watchToEnd follows run id's progress to its final entry.
func watchToEnd(ctx context.Context, c pb.ARSClient, id string) error {
	stream, err := c.WatchRun(ctx, &pb.ARSWatchRunRequest{RunId: id})
	if err != nil {
		return err
	}
	for {
		p, err := stream.Recv()
		if err == io.EOF {
			return fmt.Errorf("progress ended without a final entry")
		}
		if err != nil {
			return err
		}
		if p.Done {
			return nil
		}
	}
}
