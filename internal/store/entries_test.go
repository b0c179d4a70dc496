package store_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/store/storetest"
)

// TestCallsOnNamesNeverPushedLeaveNoEntries: a wait on a name no one
// pushed, a push refused on one, a claim given up on one: each made an
// entry in the store's model map that stayed for good (200,000 cancelled
// waits held 89 MiB, and every List, Stats and quota check scanned them
// under the store's lock). They are gone once no call uses them; a
// waiter still waiting keeps its entry, and a push wakes it.
func TestCallsOnNamesNeverPushedLeaveNoEntries(t *testing.T) {
	s, err := store.NewMemory(store.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	bg := context.Background()
	for i := range 1000 {
		ctx, cancel := context.WithCancel(bg)
		cancel()
		if _, err := s.WaitNewer(ctx, fmt.Sprintf("w%d", i), 0); err == nil {
			t.Fatal("a cancelled wait returned a version")
		}
		if _, err := s.Push(bg, store.PushRequest{Name: fmt.Sprintf("p%d", i), Version: 2, Expect: 7, Blob: storetest.Blob(t, 1, 4)}); err == nil {
			t.Fatal("a push expecting version 7 of a new model landed")
		}
	}
	if err := s.Claim(bg, "c", "me"); err != nil {
		t.Fatal(err)
	}
	if err := s.Release(bg, "c", "me"); err != nil {
		t.Fatal(err)
	}
	if n := store.Entries(s); n != 0 {
		t.Fatalf("%d model entries after calls on names never pushed, want 0", n)
	}

	// A waiter holds its entry; the push it waits for wakes it.
	var wg sync.WaitGroup
	got := make(chan uint64, 1)
	wg.Go(func() {
		ctx, cancel := context.WithTimeout(bg, 30*time.Second)
		defer cancel()
		if snap, err := s.WaitNewer(ctx, "late", 0); err == nil {
			got <- snap.Version
		}
		close(got)
	})
	for store.Entries(s) != 1 {
		time.Sleep(time.Millisecond)
	}
	if _, err := s.Push(bg, store.PushRequest{Name: "late", Version: 1, Blob: storetest.Blob(t, 1, 4)}); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if v := <-got; v != 1 {
		t.Fatalf("the waiter got version %d, want 1", v)
	}
	if n := store.Entries(s); n != 1 {
		t.Fatalf("%d entries with one model pushed, want 1", n)
	}
}
