package reducer

import "time"

// Clock is the time source of the reducer's flush timers and latency
// figures. Tests inject a fake one; nil in a Config means the real clock.
type Clock interface {
	Now() time.Time
	// At returns a channel that receives once at (or after) t, and a stop
	// function that frees the timer. A t not after Now fires at once.
	At(t time.Time) (<-chan time.Time, func())
}

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

func (realClock) At(t time.Time) (<-chan time.Time, func()) {
	tm := time.NewTimer(time.Until(t))
	return tm.C, func() { tm.Stop() }
}
