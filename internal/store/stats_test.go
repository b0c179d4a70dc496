package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/store/storetest"
)

// Stats counts what was done: versions landed, pushes refused, versions
// handed or lent to readers, and what is held.
func TestStatsCountsPushesRefusalsAndReads(t *testing.T) {
	for name, open := range map[string]func(t *testing.T) interface {
		store.Store
		store.Lender
		store.StatsReader
	}{
		"memory": func(t *testing.T) interface {
			store.Store
			store.Lender
			store.StatsReader
		} {
			s, err := store.NewMemory(store.Config{Retain: 2})
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
		"file": func(t *testing.T) interface {
			store.Store
			store.Lender
			store.StatsReader
		} {
			s, err := store.OpenFile(store.FileConfig{Dir: t.TempDir(), Store: store.Config{Retain: 2}})
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
	} {
		t.Run(name, func(t *testing.T) {
			s := open(t)
			defer s.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if st := s.Stats(); len(st.Models) != 0 {
				t.Fatalf("empty store: Stats = %+v", st)
			}
			var sizes []int64
			for v := uint64(1); v <= 3; v++ {
				b := storetest.Blob(t, v, 16*int(v))
				sizes = append(sizes, int64(len(b)))
				storetest.MustPush(t, s, store.PushRequest{Name: "p", Version: v, Expect: v - 1, Blob: b})
			}
			if _, err := s.Push(ctx, store.PushRequest{Name: "p", Version: 2, Expect: store.ExpectAny, Blob: storetest.Blob(t, 9, 4)}); err == nil {
				t.Fatal("stale push succeeded")
			}
			if _, err := s.Get(ctx, "p", 0); err != nil {
				t.Fatal(err)
			}
			if snap, err := s.GetIfNewer(ctx, "p", 3); err != nil || snap != nil {
				t.Fatalf("GetIfNewer(3) = %v, %v; want nothing newer", snap, err)
			}
			_, release, err := s.Lend(ctx, "p", 2)
			if err != nil {
				t.Fatal(err)
			}
			release()
			if _, err := s.WaitNewer(ctx, "p", 1); err != nil {
				t.Fatal(err)
			}
			st := s.Stats()
			want := store.ModelStats{Name: "p", Version: 3, Retained: 2, Bytes: sizes[2], RetainedBytes: sizes[1] + sizes[2],
				Pushes: 3, Refused: 1, Reads: 3, ReadBytes: uint64(sizes[2] + sizes[1] + sizes[2])}
			if len(st.Models) != 1 || st.Models[0] != want {
				t.Fatalf("Stats = %+v\nwant     %+v", st.Models, want)
			}
		})
	}
}
