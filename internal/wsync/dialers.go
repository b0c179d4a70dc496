package wsync

import (
	"context"
	"fmt"
	"io"
	"strings"

	"google.golang.org/grpc"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/wsync/shm"
)

// ShmDialer is a Dialer that opens a segment (for Failover) with a leasing
// reader, the default shm collector: each version is leased in place, a
// Receiver's CopyInto copies it straight from the slot into the
// collector's weights (one copy) and releases the slot at once
// (Releaser). Where it cannot lease (a segment with 2 slots, every entry
// held, a file it may not write) the reader copies instead, and the
// Failover logs why (shm.Reader.CopyReason). A segment whose writer has
// closed it or died counts as unreachable. A segment of another model
// than model is refused (shm.ReaderConfig.Model): a collector would
// otherwise load its weights.
func ShmDialer(name, path, model string) Dialer {
	return ShmReaderDialer(name, shm.ReaderConfig{Path: path, Model: model, Lease: true})
}

// ShmCopyDialer is ShmDialer with a copying reader: each version is
// copied into one of two private buffers (a snapshot valid until two
// newer ones are taken), and a Receiver with CopyInto copies it again
// into the weights. It is bound by memory bandwidth: the writer's copy
// and two copies per reader of each version; BenchmarkDeliver's
// shm-copy-into took 4.6 memcpys of the model to reach 2 collectors'
// weights (19 at 8), the default 4.8 (13 at 8) on a 2-core machine at
// load 5–10 (docs/benchlog/2026-12-01-s8-speed.md).
func ShmCopyDialer(name, path, model string) Dialer {
	return ShmReaderDialer(name, shm.ReaderConfig{Path: path, Model: model})
}

var _ Releaser = (*shm.Reader)(nil)

// The shm transport's writer publishes and its reader is a Source, like
// every other transport's.
var (
	_ Publisher  = (*shm.Writer)(nil)
	_ Source     = (*shm.Reader)(nil)
	_ LifeSource = (*shm.Reader)(nil) // the segment names its life
)

// ShmReaderDialer is ShmDialer with a reader configured by cfg, e.g. one
// that leases (cfg.Lease) so collectors use versions in place: its
// snapshots then stay valid until a newer version is taken from the
// Failover (which keeps a failed leasing source mapped until then).
func ShmReaderDialer(name string, cfg shm.ReaderConfig) Dialer {
	return Dialer{Name: name, Dial: func(context.Context, uint64) (Source, io.Closer, error) {
		r, err := shm.Open(cfg)
		if err != nil {
			return nil, nil, err
		}
		if !r.WriterAlive() {
			r.Close()
			return nil, nil, fmt.Errorf("%w: wsync: the writer of %s is gone", errs.ErrUnavailable, cfg.Path)
		}
		return r, r, nil
	}}
}

// PushDialer is a Dialer that attaches to a hub's or relay's push stream.
// Its client reuses receive buffers (ClientConfig.ReuseBuffers): a
// Failover's snapshots already live only as long as a shm.Reader's. Its
// DialLives attaches following lives (ClientConfig.FollowLives).
func PushDialer(name string, conn grpc.ClientConnInterface, collectorID, model string) Dialer {
	attach := func(ctx context.Context, cfg ClientConfig) (Source, io.Closer, error) {
		c, err := Attach(ctx, cfg)
		if err != nil {
			return nil, nil, err
		}
		return c, c, nil
	}
	cfg := ClientConfig{Conn: conn, CollectorID: collectorID, Model: model, ReuseBuffers: true}
	return Dialer{Name: name,
		Dial: func(ctx context.Context, have uint64) (Source, io.Closer, error) {
			cfg := cfg
			cfg.Start = have
			return attach(ctx, cfg)
		},
		DialLives: func(ctx context.Context, have, life uint64) (Source, io.Closer, error) {
			cfg := cfg
			cfg.Start, cfg.FollowLives, cfg.StartLife = have, true, life
			return attach(ctx, cfg)
		},
	}
}

// DefaultShmPath is the conventional segment of a model on this host.
func DefaultShmPath(model string) string {
	return "/dev/shm/rlhub-" + strings.ReplaceAll(model, "/", "_")
}
