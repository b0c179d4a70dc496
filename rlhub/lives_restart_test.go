package rlhub_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/store/storerpc"
	"github.com/rlhub/rlhub/internal/store/storetest"
	"github.com/rlhub/rlhub/internal/testkit"
)

// A hub SIGKILLed and started again on its data names each model's life
// as before (BlobInfo.life of a pull): a restart changes no model's
// history, so followers that follow lives go on from the version they
// have. A Delete and the model pushed again start a new life, which the
// hub started again names too.
func TestHubRestartKeepsTheModelsLife(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	addr, data := testkit.FreeAddr(t), filepath.Join(t.TempDir(), "data")
	start := func(name string) *testkit.Proc {
		addrFile := filepath.Join(t.TempDir(), "addr")
		return testkit.StartProc(t, testkit.ProcConfig{Name: name, AddrFile: addrFile, Args: []string{
			"serve", "--listen", addr, "--addr-file", addrFile, "--data", data}})
	}
	hub := start("hub")
	cl, err := storerpc.NewClient(storerpc.ClientConfig{Addr: addr})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	push := func(v uint64) {
		t.Helper()
		if _, err := cl.Push(ctx, store.PushRequest{Name: "m", Version: v, Expect: v - 1, Blob: storetest.Blob(t, v, 256)}); err != nil {
			t.Fatal(err)
		}
	}
	life := func(v uint64) uint64 {
		t.Helper()
		snap, err := cl.Get(ctx, "m", 0)
		if err != nil || snap.Version != v || snap.Life() == 0 {
			t.Fatalf("the hub serves %v of life %d (%v), want v%d of a named life", snapVersion(snap), snapLife(snap), err, v)
		}
		return snap.Life()
	}
	push(1)
	push(2)
	first := life(2)

	hub.Kill()
	hub = start("hub again")
	if got := life(2); got != first {
		t.Fatalf("after a restart the hub names life %d, want %d (no Delete)", got, first)
	}
	if err := cl.Delete(ctx, "m"); err != nil {
		t.Fatal(err)
	}
	push(1)
	second := life(1)
	if second == first {
		t.Fatalf("the model deleted and pushed again names life %d, the deleted model's", second)
	}

	hub.Kill()
	start("hub once more")
	if got := life(1); got != second {
		t.Fatalf("after a restart the hub names life %d, want %d (the model pushed again)", got, second)
	}
}

func snapVersion(s *store.Snapshot) any {
	if s == nil {
		return "none"
	}
	return s.Version
}

func snapLife(s *store.Snapshot) uint64 {
	if s == nil {
		return 0
	}
	return s.Life()
}
