package run

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/testkit"
)

// curve.csv's wall_seconds and summary.json's wall_seconds are "seconds
// since the run started". A run interrupted after iteration 2 (which
// took at least 400 ms of wall time) and continued with OutResume must
// not report iterations 0–2 as having taken ~0 s, nor a whole run shorter
// than its first part: the resumed Run re-receives the earlier iterations
// from the hub and stamps them with the time since the resume began.
func TestRunResumeKeepsWallClock(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	dir := t.TempDir()
	ictx, stop := context.WithCancel(ctx)
	_, err := Run(ictx, Config{Spec: cartPole(7, 300), Workers: 1, WorkerCommand: workerCommand(t), Out: dir, Logger: testkit.Logger(),
		Observer: ObserverFunc(func(it Iteration) {
			if it.Iteration == 1 {
				time.Sleep(400 * time.Millisecond) // iteration 2 arrives ≥ 0.4 s after the start
			}
			if it.Iteration == 2 {
				stop()
			}
		})})
	stop()
	if err == nil {
		t.Fatal("interrupted run returned no error")
	}
	before := readCurve(t, dir)
	wall2, _ := strconv.ParseFloat(before[3][6], 64) // iteration 2's wall_seconds
	if before[3][0] != "2" || wall2 < 0.4 {
		t.Fatalf("before the resume: row %v", before[3])
	}
	sum, err := Run(ctx, Config{Spec: cartPole(7, 300), Workers: 1, WorkerCommand: workerCommand(t), Out: dir, OutMode: OutResume, Logger: testkit.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	after := readCurve(t, dir)
	again, _ := strconv.ParseFloat(after[3][6], 64)
	if again != wall2 {
		t.Errorf("curve.csv: iteration 2's wall_seconds was %v before --resume, %v after", wall2, again)
	}
	if sum.WallSeconds < wall2 {
		t.Errorf("summary wall_seconds %v (%.0f env steps/s over %d steps) after a run whose iteration 2 alone came at %v s", sum.WallSeconds, sum.StepsPerSecond, sum.Steps, wall2)
	}
	// --resume of the finished run (README's resume line run twice):
	// nothing is trained, the outputs are rewritten.
	again2, err := Run(ctx, Config{Spec: cartPole(7, 300), Workers: 1, WorkerCommand: workerCommand(t), Out: dir, OutMode: OutResume, Logger: testkit.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	if again2.WallSeconds < sum.WallSeconds {
		t.Errorf("resuming the finished run rewrote summary wall_seconds %v as %v (env_steps_per_second %.0f → %.0f)", sum.WallSeconds, again2.WallSeconds, sum.StepsPerSecond, again2.StepsPerSecond)
	}
}

// A row's wall_seconds is the value curve.csv holds: CI once saw a
// summary say 6.210765413000001 and the same run's summary rebuilt from
// curve.csv at a later --resume say 6.210765413 (fewer seconds).
func TestRowWallIsWhatCurveHolds(t *testing.T) {
	for _, v := range []float64{6.210765413000001, 1.0 / 3, 123456.789012345678, 1e-7 / 3} {
		w := roundG(v)
		back, err := strconv.ParseFloat(formatG(w), 64)
		if err != nil || back != w {
			t.Errorf("%v: row keeps %v, curve.csv reads back %v", v, w, back)
		}
	}
}
