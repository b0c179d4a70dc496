package wsync

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/grpc"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/wire"
	"github.com/rlhub/rlhub/internal/wire/chunkcodec"
	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// ClientConfig configures a push-stream client.
type ClientConfig struct {
	// Conn reaches a hub or relay serving WeightSync. Required.
	Conn grpc.ClientConnInterface
	// CollectorID names this collector; a restarted collector reuses its
	// id. Required.
	CollectorID string
	// Model to follow. Required.
	Model string
	// Start is the version the collector already runs (0: none); only
	// newer versions are sent.
	Start uint64
	// ChunkBytes asks for chunks of at most this size; 0 means the
	// server's default.
	ChunkBytes uint32
	// Limits bound what is accepted from the server.
	Limits wire.Limits
	// Now stamps received versions' Created; nil means time.Now.
	Now func() time.Time
	// Logger; nil means slog.Default().
	Logger *slog.Logger
}

func (c *ClientConfig) validate() error {
	switch {
	case c.Conn == nil:
		return fmt.Errorf("%w: wsync: ClientConfig.Conn is nil", errs.ErrInvalid)
	case c.CollectorID == "" || c.Model == "":
		return fmt.Errorf("%w: wsync: ClientConfig needs CollectorID and Model", errs.ErrInvalid)
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return nil
}

// Client is the collector's end of the push fan-out: one Attach stream
// whose versions land in a local Board. It is a Source (safe for
// concurrent use); its snapshots are the client's own and stay valid.
//
// It does not reconnect: when the stream ends, its Source methods fail
// with errs.ErrUnavailable once the newest received version has been
// taken, and the caller (or Failover) dials again.
type Client struct {
	cfg    ClientConfig
	board  *Board
	cancel context.CancelFunc
	done   chan struct{} // closed when the receive goroutine ends

	sendMu sync.Mutex // serializes Send on stream
	stream rlhubv1.WeightSync_AttachClient

	errMu sync.Mutex
	err   error // why the stream ended; guarded by errMu
}

var _ Source = (*Client)(nil)

// Attach opens the push stream and starts receiving. It fails with
// errs.ErrUnavailable when the server cannot be reached. Close releases it.
func Attach(ctx context.Context, cfg ClientConfig) (*Client, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	sctx, cancel := context.WithCancel(context.Background())
	stop := context.AfterFunc(ctx, cancel) // ctx bounds only the opening
	stream, err := rlhubv1.NewWeightSyncClient(cfg.Conn).Attach(sctx, grpc.CallContentSubtype(chunkcodec.Name))
	if err == nil {
		err = stream.Send(&rlhubv1.SyncClientMessage{Body: &rlhubv1.SyncClientMessage_Hello{Hello: &rlhubv1.SyncHello{
			CollectorId: cfg.CollectorID, Model: cfg.Model, Version: cfg.Start, ChunkBytes: cfg.ChunkBytes,
		}}})
		if errors.Is(err, io.EOF) {
			_, err = stream.Recv() // the real error
		}
	}
	if !stop() || err != nil {
		cancel()
		if err == nil {
			err = ctx.Err()
		}
		return nil, fmt.Errorf("%w: wsync: attach to %s: %w", errs.ErrUnavailable, cfg.Model, errs.FromStatus(err))
	}
	c := &Client{cfg: cfg, board: NewBoard(cfg.Model), cancel: cancel, done: make(chan struct{}), stream: stream}
	go c.receive()
	return c, nil
}

// receive assembles versions from the stream into the board until the
// stream ends.
func (c *Client) receive() {
	defer close(c.done)
	err := c.receiveLoop()
	c.errMu.Lock()
	c.err = err
	c.errMu.Unlock()
	c.board.Close()
}

func (c *Client) receiveLoop() error {
	// With the chunk codec a chunk stays in gRPC's buffers until copied
	// once into the version's assembler.
	var m chunkcodec.Msg[*rlhubv1.SyncServerMessage]
	defer m.Release()
	for {
		if err := c.stream.RecvMsg(&m); err != nil {
			return errs.FromStatus(err)
		}
		info := m.Msg.GetInfo()
		if m.Msg != nil && info == nil {
			continue // a message this client does not know
		}
		if info == nil {
			return fmt.Errorf("%w: wsync: chunk without a version info", errs.ErrInvalid)
		}
		if info.Model != c.cfg.Model {
			return fmt.Errorf("%w: wsync: server sent model %q on the stream of %q", errs.ErrInvalid, info.Model, c.cfg.Model)
		}
		asm, err := wire.NewAssembler(info.TotalBytes, c.cfg.Limits)
		if err != nil {
			return err
		}
		for uint64(asm.Received()) < info.TotalBytes {
			if err := c.stream.RecvMsg(&m); err != nil {
				return errs.FromStatus(err)
			}
			if !m.Held() {
				return fmt.Errorf("%w: wsync: version %d ended after %d of %d bytes", errs.ErrInvalid, info.Version, asm.Received(), info.TotalBytes)
			}
			if err := m.WriteChunk(asm.Write); err != nil {
				return err
			}
		}
		f, blob, err := asm.Finish()
		if err != nil {
			return err
		}
		snap := &store.Snapshot{Name: info.Model, Version: info.Version, Epoch: info.Epoch, Blob: blob,
			Tensors: f.Tensors, Metadata: f.Metadata, Created: c.cfg.Now()}
		if err := c.board.Publish(context.Background(), snap); err != nil && !errors.Is(err, errs.ErrStale) {
			return err
		}
	}
}

func (c *Client) ended(err error) error {
	if !errors.Is(err, errs.ErrUnavailable) {
		return err
	}
	c.errMu.Lock()
	defer c.errMu.Unlock()
	if c.err != nil {
		return fmt.Errorf("%w: wsync: push stream of %q ended: %w", errs.ErrUnavailable, c.cfg.Model, c.err)
	}
	return err
}

// GetIfNewer implements Source.
func (c *Client) GetIfNewer(ctx context.Context, than uint64) (*store.Snapshot, error) {
	s, err := c.board.GetIfNewer(ctx, than)
	return s, c.ended(err)
}

// WaitNewer implements Source.
func (c *Client) WaitNewer(ctx context.Context, after uint64) (*store.Snapshot, error) {
	s, err := c.board.WaitNewer(ctx, after)
	if err != nil && ctx.Err() == nil {
		err = c.ended(err)
	}
	return s, err
}

// Running reports on the stream that the collector now runs version (use
// it as ReceiverConfig.OnApplied). Errors mean the stream has ended; they
// surface through the Source methods too.
func (c *Client) Running(version uint64) error {
	c.sendMu.Lock()
	defer c.sendMu.Unlock()
	return c.stream.Send(&rlhubv1.SyncClientMessage{Body: &rlhubv1.SyncClientMessage_Running{Running: &rlhubv1.SyncRunning{Version: version}}})
}

// Close ends the stream and waits for the receive goroutine. Safe to call
// twice.
func (c *Client) Close() error {
	c.cancel()
	<-c.done
	return nil
}

// Report sends version reports of collectors that get weights other than
// by the push stream (shared memory, relay, in process) to a hub.
func Report(ctx context.Context, conn grpc.ClientConnInterface, reports ...*rlhubv1.CollectorReport) error {
	_, err := rlhubv1.NewWeightSyncClient(conn).Report(ctx, &rlhubv1.SyncReportRequest{Reports: reports})
	return errs.FromStatus(err)
}

// Status asks a hub for the lag picture of model ("" for all).
func Status(ctx context.Context, conn grpc.ClientConnInterface, model string) ([]ModelStatus, error) {
	resp, err := rlhubv1.NewWeightSyncClient(conn).Status(ctx, &rlhubv1.SyncStatusRequest{Model: model})
	if err != nil {
		return nil, errs.FromStatus(err)
	}
	return StatusFromProto(resp), nil
}
