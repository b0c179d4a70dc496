package rlhub_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/testkit"
	"github.com/rlhub/rlhub/rlhub"
)

// A ViaPush collector of one hub keeps going when the hub is SIGKILLed and
// started again on its address and data: its stream ended with the hub,
// and it attaches again, takes the version pushed to the restarted hub,
// and runs only newer versions than it had.
func TestCollectorViaPushFollowsARestartedHub(t *testing.T) {
	const model = "policy"
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	addr, data := testkit.FreeAddr(t), filepath.Join(t.TempDir(), "data")
	start := func(name string) *testkit.Proc {
		addrFile := filepath.Join(t.TempDir(), "addr")
		return testkit.StartProc(t, testkit.ProcConfig{Name: name, AddrFile: addrFile, Args: []string{
			"serve", "--listen", addr, "--addr-file", addrFile, "--data", data}})
	}
	hub := start("hub")
	s, err := rlhub.DialStore(rlhub.StoreConfig{Addr: addr})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Push(ctx, model, 1, 0, weights(1)); err != nil {
		t.Fatal(err)
	}
	local := weights(0)
	c, err := rlhub.NewCollector(ctx, rlhub.CollectorConfig{Hub: addr, Model: model, CollectorID: "go-restart",
		Weights: local, Logger: testkit.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	runCtx, stopRun := context.WithCancel(ctx)
	var runErr error
	ran := make(chan struct{})
	go func() { defer close(ran); runErr = c.Run(runCtx) }()
	defer func() { stopRun(); <-ran }()
	at := func(v uint64) {
		t.Helper()
		testkit.Eventually(t, time.Minute, fmt.Sprintf("the collector at v%d", v), func() bool {
			select {
			case <-ran:
				t.Fatalf("the collector stopped: %v", runErr)
			default:
			}
			return c.Version() >= v
		})
		if w, err := local.Tensors()[0].Float32s(); err != nil || w[0] != float32(v) || w[1] != -float32(v) {
			t.Fatalf("weights %v (%v) at v%d", w, err, v)
		}
	}
	at(1)
	hub.Kill()
	start("hub again")
	testkit.Eventually(t, time.Minute, "v2 pushed to the restarted hub", func() bool {
		_, err := s.Push(ctx, model, 2, 1, weights(2))
		return err == nil
	})
	at(2)
	if got := c.Version(); got != 2 {
		t.Fatalf("collector at v%d after the restart, want v2", got)
	}
}
