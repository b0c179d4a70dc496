package benchclock

import (
	"runtime"
	"testing"
	"time"
)

func TestClocksAdvance(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	start := Now()
	x := 0
	for i := range 20_000_000 {
		x += i ^ (x >> 3)
	}
	spin := Now().Sub(start)
	if spin.Wall <= 0 {
		t.Fatalf("wall clock did not advance: %v", spin)
	}
	if HasCPU() && spin.CPU <= 0 {
		t.Fatalf("CPU clock did not advance over a busy loop: %v (x=%d)", spin, x)
	}
	// Sleeping takes wall time but (almost) no CPU time.
	s0 := Now()
	time.Sleep(20 * time.Millisecond)
	nap := Now().Sub(s0)
	if HasCPU() && nap.CPU >= nap.Wall {
		t.Fatalf("sleeping used %v CPU in %v wall", nap.CPU, nap.Wall)
	}
	var sum Span
	sum.Add(spin)
	sum.Add(nap)
	if sum.Wall != spin.Wall+nap.Wall || sum.CPU != spin.CPU+nap.CPU {
		t.Fatalf("Add: %v + %v = %v", spin, nap, sum)
	}
}
