package rlhub

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"time"

	"google.golang.org/grpc"

	"github.com/rlhub/rlhub/internal/dial"

	"github.com/rlhub/rlhub/internal/store/storerpc"
	"github.com/rlhub/rlhub/internal/wire/bulk"
	"github.com/rlhub/rlhub/internal/wsync"
	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// Ways a Collector gets versions (CollectorConfig.Via).
const (
	// ViaPush is the hub's (or a relay's) push stream; reports ride on it.
	// Given a cluster (a hub list or etcd://…), the stream is held by a
	// wsync.Failover that attaches it again when it ends, on the
	// connection, which by then follows the new primary.
	ViaPush  = "push"
	ViaStore = "store" // pulls "only if newer" and watches; reports by RPC
	// ViaDataPlane follows the hub's push fan-out on its plain-TCP data
	// plane (docs/wire.md): each version is read into one of three buffers
	// the collector reuses, each poll reports the version run, and against
	// a hub without it the collector attaches to the gRPC push stream
	// instead. A hub's address only (a relay serves no data plane).
	ViaDataPlane = "dataplane"
)

// CollectorConfig configures a Collector.
type CollectorConfig struct {
	// Hub is the hub's (or, with ViaPush, a relay's) address; required.
	Hub string
	// Model to follow; required.
	Model string
	// CollectorID names the collector in `rlhub sync status`; "" means
	// go-<pid>-<time>.
	CollectorID string
	// Via is ViaPush, ViaStore or ViaDataPlane; "" means ViaPush.
	Via string
	// Weights receives each version in place (names, dtypes and shapes
	// must match, or the version is refused and Weights left as they
	// were); nil means the collector only keeps the snapshot (Current).
	// With ViaDataPlane, Current's bytes are valid only until two newer
	// versions have arrived (the buffers are reused): use Weights, or copy.
	Weights *StateDict
	// Logger; nil means one that discards.
	Logger *slog.Logger
	// Security is TLS and the token; the zero value is plaintext.
	Security Security
}

func (c *CollectorConfig) validate() error {
	if c.Hub == "" || c.Model == "" {
		return errors.New("rlhub: CollectorConfig needs Hub and Model")
	}
	if c.CollectorID == "" {
		c.CollectorID = fmt.Sprintf("go-%d-%d", os.Getpid(), time.Now().UnixNano())
	}
	switch c.Via {
	case "":
		c.Via = ViaPush
	case ViaPush, ViaStore, ViaDataPlane:
	default:
		return fmt.Errorf("rlhub: CollectorConfig.Via %q (want %q, %q or %q)", c.Via, ViaPush, ViaStore, ViaDataPlane)
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// Collector keeps a collector's weights at the newest version of a model
// and reports the version it runs. Poll and Run may be called from any
// goroutine (applies are serialized); Close ends it.
type Collector struct {
	cfg    CollectorConfig
	conn   *grpc.ClientConn
	push   *wsync.Client          // ViaPush to one hub
	fo     *wsync.Failover        // ViaPush to a cluster: the stream, attached again after a failover
	first  *wsync.Client          // fo's first stream, closed by Close even if fo never took it
	store  *storerpc.Client       // ViaStore
	dp     *wsync.DataPlaneClient // ViaDataPlane
	bulk   *bulk.Client           // ViaDataPlane: dp's data-plane client, closed after dp
	recv   *wsync.Receiver
	mu     sync.Mutex // guards closed
	closed bool
}

// NewCollector connects to the hub (ViaPush: opens the stream, bounded by
// ctx) and returns a collector running no version yet.
func NewCollector(ctx context.Context, cfg CollectorConfig) (*Collector, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	conn, err := cfg.Security.dial().GRPC(cfg.Hub)
	if err != nil {
		return nil, fmt.Errorf("rlhub: dial %s: %w", cfg.Hub, err)
	}
	c := &Collector{cfg: cfg, conn: conn}
	var src wsync.Source
	var onApplied func(uint64)
	switch cfg.Via {
	case ViaPush:
		if t, err := dial.ParseTarget(cfg.Hub); err == nil && t.Clustered() {
			// The first stream is attached here, bounded by ctx, as for one
			// hub; the Failover attaches the next after the one it holds ends.
			first, err := wsync.Attach(ctx, wsync.ClientConfig{Conn: conn, CollectorID: cfg.CollectorID,
				Model: cfg.Model, Logger: cfg.Logger})
			if err != nil {
				conn.Close()
				return nil, err
			}
			c.fo, err = wsync.NewFailover(wsync.FailoverConfig{Logger: cfg.Logger, Dialers: []wsync.Dialer{{Name: "push",
				Dial: func(ctx context.Context, have uint64) (wsync.Source, io.Closer, error) {
					if first != nil {
						s := first
						first = nil // dials are serialized by the Failover
						return s, s, nil
					}
					s, err := wsync.Attach(ctx, wsync.ClientConfig{Conn: conn, CollectorID: cfg.CollectorID,
						Model: cfg.Model, Start: have, Logger: cfg.Logger})
					if err != nil {
						return nil, nil, err
					}
					return s, s, nil
				}}}})
			if err != nil {
				first.Close()
				conn.Close()
				return nil, err
			}
			c.first = first
			src, onApplied = c.fo, c.fo.Running
			break
		}
		c.push, err = wsync.Attach(ctx, wsync.ClientConfig{Conn: conn, CollectorID: cfg.CollectorID,
			Model: cfg.Model, Logger: cfg.Logger})
		if err != nil {
			conn.Close()
			return nil, err
		}
		src = c.push
		onApplied = func(v uint64) { _ = c.push.Running(v) }
	case ViaStore:
		c.store, err = storerpc.NewClient(storerpc.ClientConfig{Conn: conn})
		if err != nil {
			conn.Close()
			return nil, err
		}
		src = wsync.StoreSource{Store: c.store, Name: cfg.Model}
		onApplied = c.report
	case ViaDataPlane:
		c.bulk = cfg.Security.dial().Bulk() // TLS and the token, as the gRPC connection
		c.dp, err = wsync.NewDataPlaneClient(wsync.DataPlaneConfig{Addr: cfg.Hub, Bulk: c.bulk, Conn: conn,
			CollectorID: cfg.CollectorID, Model: cfg.Model, Logger: cfg.Logger})
		if err != nil {
			c.bulk.Close()
			conn.Close()
			return nil, err
		}
		src = c.dp
		onApplied = func(v uint64) { _ = c.dp.Running(v) }
	}
	var apply wsync.ApplyFunc
	if cfg.Weights != nil {
		apply = wsync.CopyInto(cfg.Weights)
	}
	c.recv, err = wsync.NewReceiver(wsync.ReceiverConfig{Source: src, Apply: apply, OnApplied: onApplied})
	if err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// report tells the hub the version a store-fed collector runs; a failed
// report is logged and the next apply reports again.
func (c *Collector) report(v uint64) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := wsync.Report(ctx, c.conn, &rlhubv1.CollectorReport{CollectorId: c.cfg.CollectorID,
		Model: c.cfg.Model, Version: v, Via: "pull"})
	if err != nil {
		c.cfg.Logger.Warn("rlhub: version report failed", "model", c.cfg.Model, "version", v, "err", err)
	}
}

// Poll applies the newest version if it is newer than the one running;
// it reports whether it applied one.
func (c *Collector) Poll(ctx context.Context) (bool, error) { return c.recv.Poll(ctx) }

// Run applies every newer version as it arrives until ctx ends.
func (c *Collector) Run(ctx context.Context) error { return c.recv.Run(ctx) }

// Version is the version the collector runs (0: none yet).
func (c *Collector) Version() uint64 { return c.recv.Version() }

// Transport is how versions arrive: "push" or "store" (the Via), and for
// ViaDataPlane "dataplane", or "grpc" once the collector fell back to the
// push stream of a hub without the data plane.
func (c *Collector) Transport() string {
	if c.dp != nil {
		return c.dp.Transport()
	}
	return c.cfg.Via
}

// Current is the snapshot of the running version (nil: none yet).
func (c *Collector) Current() *Snapshot { return c.recv.Current() }

// Close ends the stream and the connection; safe to call twice.
func (c *Collector) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	var out []error
	if c.push != nil {
		out = append(out, c.push.Close())
	}
	if c.fo != nil {
		out = append(out, c.fo.Close(), c.first.Close()) // Client.Close is safe twice
	}
	if c.store != nil {
		out = append(out, c.store.Close())
	}
	if c.dp != nil {
		out = append(out, c.dp.Close())
		c.bulk.Close()
	}
	out = append(out, c.conn.Close())
	return errors.Join(out...)
}
