package wsync

import (
	"context"
	"sync/atomic"
)

// Stats is a weight-sync service's one picture: every collector with the
// version it runs and its lag, per model, and the push fan-out's counters.
// The Status RPC, `rlhub sync status` and the metrics adapter read it.
type Stats struct {
	// Models is the lag picture of every model with collectors (Lag("")).
	Models []ModelStatus
	// Streams is the number of Attach (push) streams open now.
	Streams int64
	// VersionsSent and BytesSent count whole versions sent on push streams.
	VersionsSent, BytesSent uint64
	// Reports counts version reports received (stream and Report RPC).
	Reports uint64
}

// serviceCounters are the Service's counters (atomics: handlers update
// them without a lock).
type serviceCounters struct {
	streams      atomic.Int64
	versionsSent atomic.Uint64
	bytesSent    atomic.Uint64
	reports      atomic.Uint64
}

// Stats returns the lag picture (refreshing each model's newest version
// from Versions, as Lag does) and the counters.
func (s *Service) Stats(ctx context.Context) Stats {
	return Stats{
		Models:       s.Lag(ctx, ""),
		Streams:      s.count.streams.Load(),
		VersionsSent: s.count.versionsSent.Load(),
		BytesSent:    s.count.bytesSent.Load(),
		Reports:      s.count.reports.Load(),
	}
}
