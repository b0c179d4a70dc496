package cli

import (
	"context"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/rlhub/rlhub/internal/testkit"
	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// TestSecondSignalStopsAtOnce: the first SIGINT asks serve for a graceful
// stop, which waits up to --stop-timeout for calls in progress (here a
// push whose body never comes, allowed a minute by --body-timeout). An
// operator's second Ctrl-C was swallowed (the signal context stayed
// registered until the command returned): it now ends the process at once.
func TestSecondSignalStopsAtOnce(t *testing.T) {
	addrFile := filepath.Join(t.TempDir(), "addr")
	h := testkit.StartProc(t, testkit.ProcConfig{Name: "hub", AddrFile: addrFile, Args: []string{"--log-level", "warn", "serve",
		"--listen", "127.0.0.1:0", "--data", "", "--addr-file", addrFile, "--stop-timeout", "5m", "--body-timeout", "5m"}})
	conn, err := grpc.NewClient(h.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	push, err := rlhubv1.NewModelStoreClient(conn).Push(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := push.Send(&rlhubv1.StorePushRequest{Body: &rlhubv1.StorePushRequest_Header{Header: &rlhubv1.StorePushHeader{
		Blob: &rlhubv1.BlobInfo{Model: "m", Version: 1, TotalBytes: 1 << 20}}}}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond) // the push is in the handler, waiting for its body
	h.Signal(t, syscall.SIGINT)
	select {
	case <-h.Done():
		t.Fatal("the hub stopped at the first SIGINT though a push was in progress: nothing held the graceful stop")
	case <-time.After(time.Second):
	}
	h.Signal(t, syscall.SIGINT)
	select {
	case <-h.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("30 s after a second SIGINT the hub is still stopping gracefully (its --stop-timeout is 5m)")
	}
	if sig, ok := h.KilledBy(); !ok || sig != syscall.SIGINT {
		t.Fatalf("the hub ended by %v (signalled %v), want killed by the second SIGINT", sig, ok)
	}
}
