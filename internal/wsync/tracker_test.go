package wsync

import (
	"testing"
	"time"
)

func TestTrackerLagAndHistogram(t *testing.T) {
	now := time.Unix(1000, 0)
	tr := NewTracker(func() time.Time { return now }, time.Minute, 0)
	tr.SawVersion("m", 10)
	tr.SawVersion("m", 7) // newest never goes back
	tr.Report("a", "m", "push", 10)
	tr.Report("b", "m", "shm", 9)
	tr.Report("c", "m", "push", 3)
	tr.SetAttached("c", "m", true)
	tr.Report("d", "m", "", 12) // ahead of what this server saw: lag 0
	tr.Report("x", "other", "pull", 1)

	st := tr.Status("m")
	if len(st) != 1 || st[0].Newest != 10 || len(st[0].Collectors) != 4 {
		t.Fatalf("status = %+v", st)
	}
	wantLag := map[string]uint64{"a": 0, "b": 1, "c": 7, "d": 0}
	for _, c := range st[0].Collectors {
		if c.Lag != wantLag[c.ID] {
			t.Errorf("collector %s lag %d, want %d", c.ID, c.Lag, wantLag[c.ID])
		}
	}
	if !st[0].Collectors[2].Attached || st[0].Collectors[1].Via != "shm" {
		t.Errorf("collector fields lost: %+v", st[0].Collectors)
	}
	// Buckets 0,1,2,4,8,...: two at 0, one at 1, one in (4, 8].
	wantHist := []uint64{2, 1, 0, 0, 1, 0, 0, 0, 0}
	for i, b := range st[0].Histogram {
		if b.Count != wantHist[i] {
			t.Errorf("bucket ≤%d = %d, want %d", b.Max, b.Count, wantHist[i])
		}
	}
	if all := tr.Status(""); len(all) != 2 || all[0].Model != "m" || all[1].Model != "other" {
		t.Fatalf("all models = %+v", all)
	}

	// Detached collectors are forgotten after the window; attached are not.
	now = now.Add(2 * time.Minute)
	st = tr.Status("m")
	if len(st[0].Collectors) != 1 || st[0].Collectors[0].ID != "c" {
		t.Fatalf("after forget window: %+v", st[0].Collectors)
	}
	if st := tr.Status("unknown"); len(st) != 1 || len(st[0].Collectors) != 0 {
		t.Fatalf("unknown model status = %+v", st)
	}
}

// A later life of a model (deleted and pushed again) sets the newest
// even when lower; a version of an earlier life, seen late, changes
// nothing; life 0 (unknown) only grows the newest.
func TestTrackerNewestFollowsLives(t *testing.T) {
	tr := NewTracker(nil, 0, 0)
	tr.SawLife("m", 9, 1)
	tr.SawLife("m", 2, 2)
	if n := tr.Newest("m"); n != 2 {
		t.Fatalf("newest %d after life 2's v2, want 2", n)
	}
	tr.SawLife("m", 10, 1)
	tr.SawVersion("m", 1)
	if n := tr.Newest("m"); n != 2 {
		t.Fatalf("newest %d after a late v10 of life 1 and an unknown v1, want 2", n)
	}
	tr.SawVersion("m", 3)
	if n := tr.Newest("m"); n != 3 {
		t.Fatalf("newest %d, want 3", n)
	}
}
