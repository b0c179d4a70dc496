package hub

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/store/storerpc"
	"github.com/rlhub/rlhub/internal/store/storetest"
)

func TestHubOpensStoreForServices(t *testing.T) {
	h, err := New(Config{Listen: "127.0.0.1:0", Logger: quietLogger(), Store: store.Config{Retain: 1}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st := h.Store()
	storetest.MustPush(t, st, store.PushRequest{Name: "p", Version: 1, Expect: 0, Blob: storetest.Blob(t, 1, 4)})
	info := storetest.MustPush(t, st, store.PushRequest{Name: "p", Version: 2, Expect: 1, Blob: storetest.Blob(t, 2, 4)})
	if len(info.Retained) != 1 {
		t.Errorf("retained %v, want 1 version (hub Config.Store.Retain)", info.Retained)
	}
	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Get(ctx, "p", 0); err == nil {
		t.Error("store still open after hub Close")
	}
}

func TestHubStoreSurvivesRestartWithDataDir(t *testing.T) {
	dir := t.TempDir()
	h, err := New(Config{Listen: "127.0.0.1:0", Logger: quietLogger(), DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	storetest.MustPush(t, h.Store(), store.PushRequest{Name: "p", Version: 3, Expect: 0, Blob: storetest.Blob(t, 3, 4)})
	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
	h, err = New(Config{Listen: "127.0.0.1:0", Logger: quietLogger(), DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if snap, err := h.Store().Get(ctx, "p", 0); err != nil || snap.Version != 3 {
		t.Fatalf("after restart Get = %v, %v; want version 3", snap, err)
	}
}

// A watch in progress must not hold up the hub's graceful stop: Close
// drains it (the client sees Unavailable) instead of waiting for the
// hard-stop timeout, set here far beyond the test's guard.
func TestHubCloseDrainsWatches(t *testing.T) {
	h, err := New(Config{Listen: "127.0.0.1:0", Logger: quietLogger(), StopTimeout: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Start(); err != nil {
		t.Fatal(err)
	}
	c, err := storerpc.NewClient(storerpc.ClientConfig{Addr: h.Addr().String(), MaxAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	storetest.MustPush(t, h.Store(), store.PushRequest{Name: "p", Version: 1, Expect: 0, Blob: storetest.Blob(t, 1, 4)})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	watching := make(chan struct{})
	watchErr := make(chan error, 1)
	go func() {
		watchErr <- c.Watch(ctx, "p", 0, func(*store.Snapshot, uint64) error {
			close(watching)
			return nil
		})
	}()
	<-watching
	closed := make(chan error, 1)
	go func() { closed <- h.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Fatalf("Close: %v", err)
		}
	case <-time.After(30 * time.Second): // hang guard
		t.Fatal("hub Close waited for an open watch")
	}
	if err := <-watchErr; !errors.Is(err, errs.ErrUnavailable) {
		t.Fatalf("watch ended with %v, want Unavailable", err)
	}
}
