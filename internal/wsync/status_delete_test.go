package wsync

import (
	"context"
	"testing"

	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// Status after a model is deleted and pushed again from version 1 (rlhub
// model rm, then a fresh start) names the new model's newest version. The
// tracker's newest only grew, so `rlhub sync status` kept showing the
// deleted model's newest version (and collectors of the new one lagging
// behind it) until the new model's versions passed it. The store tells
// the lives apart (store.Snapshot.Life, as store.Skips does), and a
// status look-up reads no version (the store's read counts stay as they
// were).
func TestStatusFollowsAModelDeletedAndPushedAgain(t *testing.T) {
	ctx := context.Background()
	h := startHub(t)
	conn := dial(t, h.addr)
	for v := uint64(1); v <= 5; v++ {
		h.push(t, v, 100)
	}
	if err := Report(ctx, conn, &rlhubv1.CollectorReport{CollectorId: "c", Model: "m", Version: 5}); err != nil {
		t.Fatal(err)
	}
	newest := func() (uint64, uint64) {
		t.Helper()
		st, err := Status(ctx, conn, "m")
		if err != nil || len(st) != 1 || len(st[0].Collectors) != 1 {
			t.Fatalf("status %+v, %v; want model m with one collector", st, err)
		}
		return st[0].Newest, st[0].Collectors[0].Lag
	}
	if n, _ := newest(); n != 5 {
		t.Fatalf("newest %d before the Delete, want 5", n)
	}
	if err := h.st.Delete(ctx, "m"); err != nil {
		t.Fatal(err)
	}
	h.push(t, 1, 100)
	if err := Report(ctx, conn, &rlhubv1.CollectorReport{CollectorId: "c", Model: "m", Version: 1}); err != nil {
		t.Fatal(err)
	}
	reads := func() uint64 {
		for _, ms := range h.st.Stats().Models {
			if ms.Name == "m" {
				return ms.Reads
			}
		}
		return 0
	}
	before := reads()
	if n, lag := newest(); n != 1 || lag != 0 {
		t.Fatalf("after the Delete and a push of v1: newest %d, the collector at v1 lags %d; want newest 1, lag 0", n, lag)
	}
	h.push(t, 2, 100)
	if n, lag := newest(); n != 2 || lag != 1 {
		t.Fatalf("after v2 of the new model: newest %d, lag %d; want 2 and 1", n, lag)
	}
	if r := reads(); r != before {
		t.Fatalf("status read versions: the store's reads went from %d to %d", before, r)
	}
}
