package hub

import (
	"context"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/reducer"
	"github.com/rlhub/rlhub/internal/tensor"
	"github.com/rlhub/rlhub/internal/testkit"
)

// A gradient the hub acknowledged survives a graceful stop (SIGTERM's
// path: Close) although its batch was not due yet: the secondary forwards
// what it holds before it stops, and the restarted hub has the step.
func TestGracefulStopAppliesAcknowledgedGradients(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dir := t.TempDir()
	model, _ := tensor.NewStateDict(tensor.NewF32("w", 8))
	cfg := Config{Listen: "127.0.0.1:0", DataDir: dir, Logger: testkit.Logger(),
		Reducer: reducer.Config{BatchSize: 4, MaxWait: 3 * time.Second}}
	h, c := startWithSGDModel(t, ctx, cfg, model)
	res, err := c.PushGrad(ctx, "m", 1, model)
	if err != nil {
		t.Fatal(err)
	}
	_ = res
	if err := h.Close(); err != nil { // what SIGTERM does
		t.Fatal(err)
	}
	st := h.Reducer().Stats()
	if st.Total.Applied != 1 || st.Total.DroppedTotal() != 0 {
		t.Fatalf("after a graceful stop: pushed %d applied %d dropped %v", st.Total.Pushed, st.Total.Applied, st.Total.Dropped)
	}
	h2, err := New(Config{Listen: "127.0.0.1:0", DataDir: dir, Logger: testkit.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	defer h2.Close()
	snap, err := h2.Store().Get(ctx, "m", 0)
	if err != nil {
		t.Fatal(err)
	}
	if snap.Version < 2 {
		t.Fatalf("acknowledged gradient lost by a graceful stop: model m still at v%d after restart (stats: applied %d, dropped %v)", snap.Version, st.Total.Applied, st.Total.Dropped)
	}
}

// Run that cannot listen closes what New opened: the data directory is
// not left locked (nor the services running) for the next hub.
func TestRunThatCannotListenReleasesTheDataDir(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	dir := t.TempDir()
	h, err := New(Config{Listen: busy.Addr().String(), DataDir: dir, Logger: testkit.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	err = h.Run(context.Background())
	t.Logf("Run: %v", err)
	if err == nil {
		t.Fatal("Run on a busy port succeeded")
	}
	h2, err := New(Config{Listen: "127.0.0.1:0", DataDir: dir, Logger: testkit.Logger()})
	if err != nil {
		if strings.Contains(err.Error(), "in use") {
			t.Fatalf("after Run failed to listen, --data %s is still locked: %v", filepath.Base(dir), err)
		}
		t.Fatal(err)
	}
	h2.Close()
}
