package wsync

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"
	"unsafe"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/errs/grpcerr"
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
	// FollowLives asks the server to follow the model's lives
	// (docs/weight-sync.md, "Lives"): a version of another life than the
	// one sent last (than StartLife, at first) is sent at once, though not
	// newer, and WaitNewerLife returns it. false: only newer versions, as
	// from a server that predates lives.
	FollowLives bool
	// StartLife is the life of Start (store.Snapshot.Life; 0: unknown).
	StartLife uint64
	// ChunkBytes asks for chunks of at most this size; 0 means the
	// server's default.
	ChunkBytes uint32
	// Limits bound what is accepted from the server.
	Limits wire.Limits
	// ReuseBuffers receives each version into the memory of a version the
	// consumer has moved past instead of allocating (and faulting in) a
	// new buffer per version: a few buffers serve every delivery. A
	// snapshot then stays valid only until the consumer has taken two newer
	// versions from this client (as with shm.Reader), and the client serves
	// one consumer. false: every version gets fresh memory and its snapshot
	// stays valid forever, which a relay (it republishes snapshots by
	// pointer) needs.
	ReuseBuffers bool
	// Now stamps received versions' Created; nil means time.Now.
	Now func() time.Time
	// AnswerWithin bounds how long Attach waits for the server to show it
	// is alive by answering a health check (grpc.health.v1.Health/Check,
	// public) on Conn; any answer will do, a refusal too. The push stream
	// has no first message from the server (a version is sent only when
	// one newer than Start exists), so without it a server that accepted
	// the connection, even completed the HTTP/2 preface, and then answers
	// nothing would look like one with no newer version until keepalive
	// ended the stream. 0 means DefaultAnswerWithin; negative skips the
	// check.
	AnswerWithin time.Duration
	// Logger; nil means slog.Default().
	Logger *slog.Logger
}

// DefaultAnswerWithin is ClientConfig.AnswerWithin's default.
const DefaultAnswerWithin = 10 * time.Second

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
	if c.AnswerWithin == 0 {
		c.AnswerWithin = DefaultAnswerWithin
	}
	return nil
}

// Client is the collector's end of the push fan-out: one Attach stream
// whose versions land in a local Board. It is a Source (safe for
// concurrent use); its snapshots are the client's own and stay valid
// (with ClientConfig.ReuseBuffers: until two newer ones have been taken).
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

	// With ReuseBuffers: the receive goroutine picks the buffer for a
	// version, and consumers take snapshots, under bufMu, so a buffer is
	// never picked while a consumer may still use it.
	bufMu sync.Mutex
	taken [2]*byte // blobs of the last two snapshots taken, newest last
	pool  [][]byte // buffers versions were received into, at most maxPooled
}

// maxPooled bounds a reusing client's buffers: two taken, the newest on the
// board (not yet taken), and the one being received into.
const maxPooled = 4

var (
	_ Source     = (*Client)(nil)
	_ LifeSource = (*Client)(nil)
)

// Attach opens the push stream and starts receiving. It fails with
// errs.ErrUnavailable when the server cannot be reached or answers nothing
// within ClientConfig.AnswerWithin. Close releases it.
func Attach(ctx context.Context, cfg ClientConfig) (*Client, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if err := answers(ctx, cfg); err != nil {
		return nil, err
	}
	sctx, cancel := context.WithCancel(context.Background())
	stop := context.AfterFunc(ctx, cancel) // ctx bounds only the opening
	stream, err := rlhubv1.NewWeightSyncClient(cfg.Conn).Attach(sctx, grpc.CallContentSubtype(chunkcodec.Name))
	if err == nil {
		err = stream.Send(&rlhubv1.SyncClientMessage{Body: &rlhubv1.SyncClientMessage_Hello{Hello: &rlhubv1.SyncHello{
			CollectorId: cfg.CollectorID, Model: cfg.Model, Version: cfg.Start, ChunkBytes: cfg.ChunkBytes,
			FollowLives: cfg.FollowLives, Life: cfg.StartLife,
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
		return nil, fmt.Errorf("%w: wsync: attach to %s: %w", errs.ErrUnavailable, cfg.Model, grpcerr.FromStatus(err))
	}
	c := &Client{cfg: cfg, board: NewBoard(cfg.Model), cancel: cancel, done: make(chan struct{}), stream: stream}
	go c.receive()
	return c, nil
}

// answers checks that cfg.Conn's server answers a health check within
// cfg.AnswerWithin (and ctx): any status it sends proves it alive, even a
// refusal or Unimplemented (a server without the health service); only
// no answer at all, or no connection, fails Attach, with
// errs.ErrUnavailable.
func answers(ctx context.Context, cfg ClientConfig) error {
	if cfg.AnswerWithin < 0 {
		return nil
	}
	hctx, cancel := context.WithTimeout(ctx, cfg.AnswerWithin)
	defer cancel()
	// Fail-fast: a connection that is not ready fails the check at once
	// (Unavailable: the caller dials again), where a cluster connection's
	// wait-for-ready would wait for gRPC's reconnect back-off to look the
	// primary up again. A collector re-attaching at once after its
	// primary was killed found the connection still ready, and its check
	// waited up to a second past the new primary's election.
	_, err := healthpb.NewHealthClient(cfg.Conn).Check(hctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(false))
	switch code := status.Code(err); {
	case code == codes.DeadlineExceeded && ctx.Err() == nil:
		return fmt.Errorf("%w: wsync: attach to %s: the server sent nothing within %v (ClientConfig.AnswerWithin): it is hung or stopped",
			errs.ErrUnavailable, cfg.Model, cfg.AnswerWithin)
	case code == codes.DeadlineExceeded || code == codes.Canceled || code == codes.Unavailable:
		return fmt.Errorf("%w: wsync: attach to %s: %w", errs.ErrUnavailable, cfg.Model, grpcerr.FromStatus(err))
	}
	return nil
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
			return grpcerr.FromStatus(err)
		}
		info := m.Msg.GetInfo()
		if m.Msg != nil && info == nil {
			continue // a message this client does not know
		}
		if info == nil {
			return fmt.Errorf("%w: wsync: chunk without a version info", errs.ErrInvalid)
		}
		if info.Model != c.cfg.Model {
			return fmt.Errorf("%w: wsync: server sent model %s on the stream of %s", errs.ErrInvalid, errs.Quote(info.Model), errs.Quote(c.cfg.Model))
		}
		asm, err := wire.NewAssemblerInto(c.freeBuffer(info.TotalBytes), info.TotalBytes, c.cfg.Limits)
		if err != nil {
			return err
		}
		for uint64(asm.Received()) < info.TotalBytes {
			if err := c.stream.RecvMsg(&m); err != nil {
				return grpcerr.FromStatus(err)
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
		c.keep(blob)
		snap := store.WithLife(&store.Snapshot{Name: info.Model, Version: info.Version, Epoch: info.Epoch, Blob: blob,
			Tensors: f.Tensors, Metadata: f.Metadata, Created: c.cfg.Now()}, info.Life)
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

// freeBuffer returns a buffer of at least total bytes that no snapshot the
// consumer may use lives in, or nil (allocate) when reuse is off or none
// is free.
func (c *Client) freeBuffer(total uint64) []byte {
	if !c.cfg.ReuseBuffers {
		return nil
	}
	c.bufMu.Lock()
	defer c.bufMu.Unlock()
	var newest *byte
	if s := c.board.Newest(); s != nil {
		newest = unsafe.SliceData(s.Blob)
	}
	for i, b := range c.pool {
		p := unsafe.SliceData(b)
		if p == newest || p == c.taken[0] || p == c.taken[1] {
			continue
		}
		if uint64(cap(b)) >= total {
			return b
		}
		// Free but too small (the model grew): forget it.
		c.pool = append(c.pool[:i], c.pool[i+1:]...)
		return nil
	}
	return nil
}

// keep adds a freshly allocated receive buffer to the pool.
func (c *Client) keep(blob []byte) {
	if !c.cfg.ReuseBuffers {
		return
	}
	c.bufMu.Lock()
	defer c.bufMu.Unlock()
	p := unsafe.SliceData(blob)
	for _, b := range c.pool {
		if unsafe.SliceData(b) == p {
			return
		}
	}
	if len(c.pool) < maxPooled {
		c.pool = append(c.pool, blob[:cap(blob)])
	}
}

// took records that the consumer has taken s; called with bufMu held.
func (c *Client) took(s *store.Snapshot) {
	if p := unsafe.SliceData(s.Blob); p != c.taken[1] {
		c.taken[0], c.taken[1] = c.taken[1], p
	}
}

// GetIfNewer implements Source.
func (c *Client) GetIfNewer(ctx context.Context, than uint64) (*store.Snapshot, error) {
	return c.GetIfNewerLife(ctx, than, 0)
}

// GetIfNewerLife implements LifeSource: with ClientConfig.FollowLives the
// server sends a new life's newest at once, and it is returned here.
func (c *Client) GetIfNewerLife(ctx context.Context, than, life uint64) (*store.Snapshot, error) {
	if c.cfg.ReuseBuffers {
		c.bufMu.Lock()
		defer c.bufMu.Unlock()
	}
	s, err := c.board.GetIfNewerLife(ctx, than, life)
	if s != nil && c.cfg.ReuseBuffers {
		c.took(s)
	}
	return s, c.ended(err)
}

// WaitNewer implements Source.
func (c *Client) WaitNewer(ctx context.Context, after uint64) (*store.Snapshot, error) {
	return c.WaitNewerLife(ctx, after, 0)
}

// WaitNewerLife implements LifeSource: with ClientConfig.FollowLives the
// server sends a new life's newest at once, and it is returned here.
func (c *Client) WaitNewerLife(ctx context.Context, after, life uint64) (*store.Snapshot, error) {
	s, err := c.board.WaitNewerLife(ctx, after, life)
	if err != nil && ctx.Err() == nil {
		err = c.ended(err)
	}
	if s != nil && c.cfg.ReuseBuffers {
		// s's buffer may have been picked for a later version since the
		// wait returned (s was no longer the newest); take the newest under
		// bufMu instead, which cannot be.
		c.bufMu.Lock()
		s = c.board.Newest()
		c.took(s)
		c.bufMu.Unlock()
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
	return grpcerr.FromStatus(err)
}

// Status asks a hub for the lag picture of model ("" for all).
func Status(ctx context.Context, conn grpc.ClientConnInterface, model string) ([]ModelStatus, error) {
	resp, err := rlhubv1.NewWeightSyncClient(conn).Status(ctx, &rlhubv1.SyncStatusRequest{Model: model})
	if err != nil {
		return nil, grpcerr.FromStatus(err)
	}
	return StatusFromProto(resp), nil
}
