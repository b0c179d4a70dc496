package run

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/rlhub/rlhub/internal/testkit"
	pb "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// A hub SIGKILLed while StartRun writes the new run's first state (its
// state.json half written, StartRun unanswered) leaves a run that was
// never acknowledged: the hubs started after it do not log it at ERROR
// as an unreadable run, and a StartRun retried with the same key starts
// a run that goes on.
func TestHubKilledInStartRunLeavesNoUnreadableRun(t *testing.T) {
	data := t.TempDir()
	h := startHub(t, "127.0.0.1:0", data, "snapshot:1")
	conn, err := grpc.NewClient(h.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := pb.NewARSClient(conn).StartRun(ctx, &pb.ARSStartRunRequest{Spec: durableSpec(), RequestId: "k"}); err == nil {
		t.Fatal("StartRun answered by a hub told to crash in its first state write")
	}
	h.Wait(t, 30*time.Second)
	if by := killedBy(h); by != "killed" {
		t.Fatalf("hub ended %q, want killed", by)
	}
	if _, err := os.Stat(filepath.Join(data, "ars", "run-1", "state.json")); !os.IsNotExist(err) {
		t.Fatalf("state.json after the crash: %v (the crash point moved?)", err)
	}

	for i := range 2 {
		addrFile := filepath.Join(t.TempDir(), "addr")
		h := testkit.StartProc(t, testkit.ProcConfig{Name: "hub", AddrFile: addrFile, StartTimeout: 30 * time.Second,
			Args: []string{"--log-level", "info", "serve", "--listen", "127.0.0.1:0", "--data", data, "--addr-file", addrFile}})
		conn, err := grpc.NewClient(h.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := pb.NewARSClient(conn).StartRun(ctx, &pb.ARSStartRunRequest{Spec: durableSpec(), RequestId: "k"})
		conn.Close()
		if err != nil {
			t.Fatalf("start %d: StartRun retried: %v", i, err)
		}
		h.Stop(os.Interrupt, 20*time.Second)
		if out := h.Output(); strings.Contains(out, "level=ERROR") {
			t.Fatalf("start %d (run %s) logged at ERROR:\n%s", i, resp.RunId, out)
		}
	}
}
