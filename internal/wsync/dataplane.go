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
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	hubdial "github.com/rlhub/rlhub/internal/dial"
	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/errs/grpcerr"
	"github.com/rlhub/rlhub/internal/safetensors"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/wire"
	"github.com/rlhub/rlhub/internal/wire/bulk"
	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// Push fan-out on the data plane (docs/weight-sync.md, "Push fan-out on
// the data plane"): a collector attached to the hub long-polls
// DataPlaneWatchMethod; each answer is the newest version as a data frame
// written with writev straight from the store's snapshot, so each
// version's bytes are written once per connection with no per-collector
// copy (the gRPC push stream copies them into HTTP/2 frames per stream).
const (
	// DataPlaneWatchMethod: header SyncHello (collector_id, model,
	// version = the version the collector runs: only newer ones are sent,
	// wait_ms; chunk_bytes is ignored). The hub records the version as the
	// collector's report (via ViaDataPlane), waits up to wait_ms (0 or more
	// than DataPlaneWait: DataPlaneWait) for
	// a version newer than it and answers it as a data frame whose header
	// is a StorePullHeader (body: the version's safetensors bytes;
	// skipped: version numbers between the one asked after and the one
	// sent; blob.life: the version's life), or "not modified" (the
	// collector asks again). With follow_lives (and life, the life of
	// version) it also answers at once the newest version of another life,
	// though not newer (docs/weight-sync.md, "Lives").
	DataPlaneWatchMethod = "rlhub.v1.WeightSync/Watch"
	// ViaDataPlane is how data-plane collectors show in status.
	ViaDataPlane = "push-dp"
)

// DataPlaneWait is how long one data-plane watch waits for a newer version
// before it answers "not modified".
const DataPlaneWait = 5 * time.Second

// RegisterBulk implements hub.BulkService: the data-plane watch, unless
// ServiceConfig.NoDataPlane.
func (s *Service) RegisterBulk(b *bulk.Server) {
	if s.cfg.NoDataPlane {
		return
	}
	b.Handle(DataPlaneWatchMethod, s.bulkWatch)
}

func (s *Service) bulkWatch(ctx context.Context, r *bulk.Request) (proto.Message, error) {
	hello := &rlhubv1.SyncHello{}
	if err := proto.Unmarshal(r.Header, hello); err != nil {
		return nil, fmt.Errorf("%w: watch header: %v", errs.ErrInvalid, err)
	}
	if err := checkIDs(hello.CollectorId, hello.Model, ""); err != nil {
		return nil, fmt.Errorf("watch: %w", err)
	}
	if s.ctx.Err() != nil {
		return nil, fmt.Errorf("%w: weight sync is shutting down", errs.ErrUnavailable)
	}
	id, model, after := hello.CollectorId, hello.Model, hello.Version
	if err := s.tracker.Report(id, model, ViaDataPlane, after); err != nil {
		return nil, fmt.Errorf("watch: %w", err)
	}
	s.count.reports.Add(1)
	wait := DataPlaneWait
	if w := time.Duration(hello.WaitMs) * time.Millisecond; w > 0 && w < wait {
		wait = w
	}
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	stop := context.AfterFunc(s.ctx, cancel)
	defer stop()
	life := uint64(0) // versions only grow, unless the collector follows lives
	if hello.FollowLives {
		life = hello.Life
	}
	snap, release, err := store.BorrowNewerLife(wctx, s.cfg.Versions, model, after, life)
	if err != nil {
		switch {
		case s.ctx.Err() != nil:
			return nil, fmt.Errorf("%w: weight sync is shutting down", errs.ErrUnavailable)
		case ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded):
			h, err := proto.Marshal(&rlhubv1.StorePullHeader{Blob: &rlhubv1.BlobInfo{Model: model, Version: after}, NotModified: true})
			if err != nil {
				return nil, err
			}
			return nil, r.Reply(h)
		}
		return nil, err
	}
	// Borrowed until Reply returns, when the kernel has taken every byte:
	// a hub's store can then hand the blob back to the reducer.
	defer release()
	s.tracker.SawLife(model, snap.Version, snap.Life())
	skip := skipped(after, snap.Version)
	if life != 0 && snap.Life() != life {
		skip = 0 // another life's versions are numbered afresh
	}
	h, err := proto.Marshal(&rlhubv1.StorePullHeader{
		Blob: &rlhubv1.BlobInfo{Model: snap.Name, Version: snap.Version, Epoch: snap.Epoch, TotalBytes: uint64(len(snap.Blob)),
			Life: snap.Life()},
		Metadata:        snap.Metadata,
		CreatedUnixNano: snap.Created.UnixNano(),
		Skipped:         skip,
	})
	if err != nil {
		return nil, err
	}
	if err := r.Reply(h, snap.Blob); err != nil {
		return nil, err
	}
	s.count.versionsSent.Add(1)
	s.count.bytesSent.Add(uint64(len(snap.Blob)))
	return nil, nil
}

// skipped is how many version numbers lie between after and sent; a
// collector that had none (after 0) skipped nothing.
func skipped(after, sent uint64) uint64 {
	if after == 0 || sent <= after+1 {
		return 0
	}
	return sent - after - 1
}

// DataPlaneConfig configures a DataPlaneClient.
type DataPlaneConfig struct {
	// Addr is the hub's address (its data plane shares the gRPC port), or
	// a cluster target ("h1:p1,h2:p2", "etcd://E/NAME"; internal/dial):
	// the client then follows the cluster's primary through Conn, which
	// must be a connection from dial.Config.GRPC on the same target (see
	// "Following a cluster" on DataPlaneClient). Required.
	Addr string
	// Bulk makes the data-plane calls (internal/dial builds one with the
	// connection's TLS and token); nil means a plaintext client of its
	// own, closed by Close.
	Bulk *bulk.Client
	// Conn, when set, is the fallback: against a hub without the
	// data-plane watch (UNIMPLEMENTED, or no data plane) the client
	// attaches to its gRPC push stream instead (Attach with ReuseBuffers),
	// for its whole life. nil: such a hub fails the call with
	// errs.ErrUnavailable.
	Conn grpc.ClientConnInterface
	// CollectorID names this collector (reported with every poll).
	// Required.
	CollectorID string
	// Model to follow. Required.
	Model string
	// Start is the version the collector already runs (0: none).
	Start uint64
	// FollowLives asks the hub to follow the model's lives
	// (docs/weight-sync.md, "Lives"): WaitNewerLife returns the newest
	// version of another life than the one the collector runs at once,
	// though not newer, as does the fallback stream. false: only newer
	// versions, and WaitNewerLife is WaitNewer.
	FollowLives bool
	// Limits bound what is accepted (MaxBytes: the largest version; 0
	// means wire's default).
	Limits wire.Limits
	// PollSlack is added to DataPlaneWait for each poll's deadline; 0
	// means 10 s.
	PollSlack time.Duration
	// Logger; nil means slog.Default().
	Logger *slog.Logger
}

func (c *DataPlaneConfig) validate() error {
	switch {
	case c.Addr == "":
		return fmt.Errorf("%w: wsync: DataPlaneConfig.Addr is empty", errs.ErrInvalid)
	case c.CollectorID == "" || c.Model == "":
		return fmt.Errorf("%w: wsync: DataPlaneConfig needs CollectorID and Model", errs.ErrInvalid)
	case len(c.CollectorID) > maxIDBytes || len(c.Model) > maxIDBytes:
		return fmt.Errorf("%w: wsync: collector id and model are limited to %d bytes", errs.ErrInvalid, maxIDBytes)
	case c.PollSlack < 0:
		return fmt.Errorf("%w: wsync: negative PollSlack", errs.ErrInvalid)
	case hubdial.IsCluster(c.Addr) && followerConn(c.Conn) == nil:
		return fmt.Errorf("%w: wsync: DataPlaneConfig.Addr names a cluster: Conn must be a connection to it (dial.Config.GRPC)", errs.ErrInvalid)
	}
	if c.Limits.MaxBytes <= 0 {
		c.Limits.MaxBytes = 4 << 30 // wire.Limits' default
	}
	if c.PollSlack == 0 {
		c.PollSlack = 10 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return nil
}

// dpBuffers is how many receive buffers a DataPlaneClient cycles through:
// the last two snapshots taken stay whole while a third is received.
const dpBuffers = 3

// DataPlaneClient is a collector following a hub over the data plane: a
// Source whose WaitNewer long-polls DataPlaneWatchMethod and reads each
// version from the socket straight into a reused receive buffer
// (io.ReadFull, no intermediate copy), and whose GetIfNewer is the same
// poll with a 1 ms wait. A version is returned only once its
// final status was OK and it parsed as valid safetensors: a connection
// that breaks mid-version is errs.ErrUnavailable and nothing is returned
// (the buffer it was read into holds no snapshot taken).
//
// Snapshots stay valid until two newer versions have been taken from the
// client (as PushDialer's). The hub learns the version the collector runs
// from each poll (the after it asks for), so Running is needed only on the
// gRPC fallback. Calls are serialized: one Receiver per client. Against a
// hub without the data-plane watch it attaches to the push stream (see
// DataPlaneConfig.Conn); Transport tells which it uses.
//
// Following a cluster (Addr a cluster target): every poll dials the
// primary Conn follows (dial.PlaneAddr); a poll a standby refuses makes
// Conn follow the primary the refusal names, and any other failed poll
// makes it resolve again (dial.PlaneFailed), so SIGKILL of the primary
// costs the election and nothing else: WaitNewer keeps polling (backing
// off up to followBackoffMax) until a primary answers or ctx ends, and
// returns any error but errs.ErrUnavailable (a dead, hung or standby hub,
// or no primary yet). The fallback stream, on a cluster, is
// attached again when it ends. A version is asked for after the one the
// collector runs, so versions delivered only grow; a version whose epoch
// is older than one already delivered (a deposed primary's) is refused as
// unavailable and the primary looked up again, never delivered; versions
// the new primary never had show in Skipped (the hub counts them from
// the after in each poll).
type DataPlaneClient struct {
	cfg     DataPlaneConfig
	bulk    *bulk.Client
	ownBulk bool
	follow  interface{ Target() string } // Conn when Addr is a cluster target; else nil

	callMu sync.Mutex // serializes calls; guards the fields below it
	bufs   [dpBuffers][]byte
	taken  [2]int // indices into bufs of the last two snapshots taken, newest last; -1: none

	mu       sync.Mutex // guards the fields below; held only briefly
	fallback *Client    // set once
	closed   bool
	cancel   context.CancelFunc // ends the call in progress (Close)
	nskipped uint64             // skipped, for Skipped
	epoch    uint64             // the newest epoch delivered
	follows  uint64             // failed polls followed, for Follows
	noDP     int                // consecutive not-supported polls on a cluster
}

var (
	_ Source     = (*DataPlaneClient)(nil)
	_ LifeSource = (*DataPlaneClient)(nil)
)

// NewDataPlaneClient returns a client; it connects on its first call.
func NewDataPlaneClient(cfg DataPlaneConfig) (*DataPlaneClient, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	c := &DataPlaneClient{cfg: cfg, bulk: cfg.Bulk, taken: [2]int{-1, -1}}
	if hubdial.IsCluster(cfg.Addr) {
		c.follow = followerConn(cfg.Conn)
	}
	if c.bulk == nil {
		c.bulk, c.ownBulk = bulk.NewClient(), true
	}
	return c, nil
}

// Transport is "dataplane", or "grpc" once the client fell back to the
// push stream.
func (c *DataPlaneClient) Transport() string {
	if c.current() != nil {
		return "grpc"
	}
	return "dataplane"
}

// current is the fallback client, nil while on the data plane.
func (c *DataPlaneClient) current() *Client {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.fallback
}

// Skipped counts the version numbers the hub reported skipped (newer
// versions landed while the collector was not polling; it gets the
// newest).
func (c *DataPlaneClient) Skipped() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nskipped
}

// GetIfNewer implements Source: the newest version if newer than than;
// nil, nil when it is not, or when the model has no version yet.
func (c *DataPlaneClient) GetIfNewer(ctx context.Context, than uint64) (*store.Snapshot, error) {
	return c.GetIfNewerLife(ctx, than, 0)
}

// GetIfNewerLife implements LifeSource: with DataPlaneConfig.FollowLives
// it also returns the newest version of another life than life (the life
// of than; 0: unknown); without, it is GetIfNewer.
func (c *DataPlaneClient) GetIfNewerLife(ctx context.Context, than, life uint64) (*store.Snapshot, error) {
	if !c.cfg.FollowLives {
		life = 0
	}
	c.callMu.Lock()
	defer c.callMu.Unlock()
	if err := c.usable(); err != nil {
		return nil, err
	}
	if f := c.current(); f != nil {
		return c.fallbackGetIfNewer(ctx, f, than, life)
	}
	hello := &rlhubv1.SyncHello{CollectorId: c.cfg.CollectorID, Model: c.cfg.Model, Version: than, WaitMs: 1,
		FollowLives: c.cfg.FollowLives, Life: life}
	snap, err := c.call(ctx, DataPlaneWatchMethod, hello, than, life)
	if errors.Is(err, errs.ErrNotFound) {
		return nil, nil
	}
	if err != nil && c.noDataPlane(err) {
		if err := c.fallBack(ctx, than, life); err != nil {
			return nil, err
		}
		// The fallback's first read is admitted as every later one is
		// (its epoch checked and recorded).
		return c.fallbackGetIfNewer(ctx, c.current(), than, life)
	}
	return snap, err
}

// fallbackGetIfNewer is GetIfNewerLife on the gRPC fallback f, admitting
// what it returns (c.admit: the epoch rule) and letting f go when the
// primary it followed is gone. Called with callMu held.
func (c *DataPlaneClient) fallbackGetIfNewer(ctx context.Context, f *Client, than, life uint64) (*store.Snapshot, error) {
	snap, err := f.GetIfNewerLife(ctx, than, life)
	if err == nil && snap != nil {
		if err = c.admit(snap, than, life); err != nil {
			snap = nil
		}
	}
	if err != nil && c.follow != nil && errors.Is(err, errs.ErrUnavailable) {
		c.dropFallback(f)
	}
	return snap, err
}

// WaitNewer implements Source: long polls until a version newer than after
// arrives, ctx ends, or a poll fails.
func (c *DataPlaneClient) WaitNewer(ctx context.Context, after uint64) (*store.Snapshot, error) {
	return c.WaitNewerLife(ctx, after, 0)
}

// WaitNewerLife implements LifeSource: with DataPlaneConfig.FollowLives it
// also returns the newest version of another life than life (the life of
// after; 0: unknown) at once; without, it is WaitNewer.
func (c *DataPlaneClient) WaitNewerLife(ctx context.Context, after, life uint64) (*store.Snapshot, error) {
	if !c.cfg.FollowLives {
		life = 0
	}
	c.callMu.Lock()
	defer c.callMu.Unlock()
	wait := followBackoffBase
	for {
		if err := c.usable(); err != nil {
			return nil, err
		}
		var snap *store.Snapshot
		var err error
		if f := c.current(); f != nil {
			if snap, err = f.WaitNewerLife(ctx, after, life); err == nil {
				err = c.admit(snap, after, life)
			}
			if err != nil && c.follow != nil && ctx.Err() == nil && errors.Is(err, errs.ErrUnavailable) {
				c.dropFallback(f) // on a cluster the stream is attached again, to the new primary
			}
		} else {
			hello := &rlhubv1.SyncHello{CollectorId: c.cfg.CollectorID, Model: c.cfg.Model, Version: after,
				FollowLives: c.cfg.FollowLives, Life: life}
			snap, err = c.call(ctx, DataPlaneWatchMethod, hello, after, life)
			if err != nil && c.noDataPlane(err) {
				if err = c.fallBack(ctx, after, life); err == nil {
					continue
				}
			} else if errors.Is(err, bulk.ErrNotSupported) && c.follow != nil {
				err = fmt.Errorf("%w: wsync: %w", errs.ErrUnavailable, err) // maybe a dying primary: followed
				hubdial.PlaneFailed(c.follow, err)
			}
		}
		switch {
		case err == nil && snap != nil:
			return snap, nil
		case ctx.Err() != nil:
			return nil, ctx.Err()
		case err == nil:
			wait = followBackoffBase // not modified: poll again
			continue
		case c.follow == nil || !errors.Is(err, errs.ErrUnavailable) || c.usable() != nil:
			return nil, err
		}
		// A cluster: the primary died, refused, or is being elected.
		c.cfg.Logger.Debug("wsync: data-plane poll failed; following the primary", "addr", c.cfg.Addr, "err", err)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-t.C:
		}
		wait = min(2*wait, followBackoffMax)
	}
}

// Following a cluster: the pause after a failed poll doubles from
// followBackoffBase up to followBackoffMax.
const (
	followBackoffBase = 20 * time.Millisecond
	followBackoffMax  = 250 * time.Millisecond
)

// followerConn is conn as a connection internal/dial may follow a cluster
// with, or nil.
func followerConn(conn grpc.ClientConnInterface) interface{ Target() string } {
	if t, ok := conn.(interface{ Target() string }); ok && conn != nil {
		return t
	}
	return nil
}

// Follows counts the failed polls after which the client followed the
// primary again (looked it up, or went where a standby said it is).
func (c *DataPlaneClient) Follows() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.follows
}

// admit checks a version from the fallback stream, taken after version
// after of life life (0: unknown), against the epochs delivered before (see "Following a cluster"),
// records its epoch and counts the versions it skipped (the data plane's
// come from the hub).
func (c *DataPlaneClient) admit(snap *store.Snapshot, after, life uint64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if snap.Epoch < c.epoch {
		return fmt.Errorf("%w: wsync: version %d of %s has epoch %d, older than epoch %d already delivered (a deposed primary)",
			errs.ErrUnavailable, snap.Version, errs.Quote(snap.Name), snap.Epoch, c.epoch)
	}
	c.epoch = snap.Epoch
	if !newLife(snap, life) { // another life's versions are numbered afresh, as the hub counts them
		c.nskipped += skipped(after, snap.Version)
	}
	return nil
}

// dropFallback closes the fallback stream f after it ended, so the next
// poll tries the data plane (of the new primary) again.
func (c *DataPlaneClient) dropFallback(f *Client) {
	c.mu.Lock()
	if c.fallback == f {
		c.fallback = nil
	}
	c.mu.Unlock()
	f.Close()
}

// Running implements the report a Receiver's OnApplied makes: on the data
// plane the next poll carries it; on the fallback stream it is sent.
func (c *DataPlaneClient) Running(version uint64) error {
	if f := c.current(); f != nil {
		return f.Running(version)
	}
	return nil
}

// Close ends a call in progress (it fails with errs.ErrUnavailable) and
// releases the client and its fallback stream. Safe to call twice.
func (c *DataPlaneClient) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	if c.cancel != nil {
		c.cancel()
	}
	f := c.fallback
	c.mu.Unlock()
	if f != nil {
		f.Close()
	}
	// Wait for the call in progress, so nothing uses the bulk client after.
	c.callMu.Lock()
	defer c.callMu.Unlock()
	if c.ownBulk {
		c.bulk.Close()
	}
	return nil
}

func (c *DataPlaneClient) usable() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return fmt.Errorf("%w: wsync: data-plane client is closed", errs.ErrUnavailable)
	}
	return nil
}

// noDataPlane reports whether err says the hub does not serve the method,
// so the client should fall back to the push stream. On a cluster a hub
// that hangs up on the handshake may be one that is dying (a SIGKILLed
// primary resets the connections it had not accepted): that is followed
// as unavailable, and only maxNoDataPlane such polls in a row, or an
// UNIMPLEMENTED answer, mean the primary has no data plane. Called with
// callMu held.
func (c *DataPlaneClient) noDataPlane(err error) bool {
	if grpcerr.Code(err) == codes.Unimplemented {
		return true
	}
	if !errors.Is(err, bulk.ErrNotSupported) {
		c.noDP = 0
		return false
	}
	if c.follow == nil {
		return true
	}
	c.noDP++
	return c.noDP >= maxNoDataPlane
}

// maxNoDataPlane: on a cluster, this many polls in a row answered as if
// the hub did not speak the data plane make the client fall back.
const maxNoDataPlane = 3

// fallBack attaches to the gRPC push stream, for the client's whole life,
// following lives from life (the life of have) when the client does.
func (c *DataPlaneClient) fallBack(ctx context.Context, have, life uint64) error {
	if c.cfg.Conn == nil {
		return fmt.Errorf("%w: wsync: %s serves no data-plane watch and no fallback is configured", errs.ErrUnavailable, c.cfg.Addr)
	}
	cl, err := Attach(ctx, ClientConfig{Conn: c.cfg.Conn, CollectorID: c.cfg.CollectorID, Model: c.cfg.Model,
		Start: have, FollowLives: c.cfg.FollowLives, StartLife: life, Limits: c.cfg.Limits, ReuseBuffers: true, Logger: c.cfg.Logger})
	if err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		cl.Close()
		return fmt.Errorf("%w: wsync: data-plane client is closed", errs.ErrUnavailable)
	}
	c.cfg.Logger.Info("wsync: hub has no data-plane watch; following its push stream", "addr", c.cfg.Addr, "model", c.cfg.Model)
	c.fallback = cl
	return nil
}

// deliveredEpoch is the newest epoch delivered.
func (c *DataPlaneClient) deliveredEpoch() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.epoch
}

// freeBuffer is the index of a buffer holding neither of the last two
// snapshots taken. Called with callMu held.
func (c *DataPlaneClient) freeBuffer() int {
	for i := range c.bufs {
		if i != c.taken[0] && i != c.taken[1] {
			return i
		}
	}
	panic("unreachable: dpBuffers > 2")
}

// call makes one data-plane request whose answer is a version newer than
// after, or (life not 0) of another life than life, or "not modified"
// (nil, nil). Called with callMu held.
func (c *DataPlaneClient) call(ctx context.Context, method string, req proto.Message, after, life uint64) (*store.Snapshot, error) {
	cctx, cancel := context.WithTimeout(ctx, DataPlaneWait+c.cfg.PollSlack)
	defer cancel()
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, fmt.Errorf("%w: wsync: data-plane client is closed", errs.ErrUnavailable)
	}
	c.cancel = cancel
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		c.cancel = nil
		c.mu.Unlock()
	}()
	var (
		hdr  rlhubv1.StorePullHeader
		idx  = c.freeBuffer()
		blob []byte
	)
	addr, ok := hubdial.PlaneAddr(c.follow, c.cfg.Addr)
	if !ok {
		return nil, fmt.Errorf("%w: wsync: cluster %s: no primary known yet", errs.ErrUnavailable, errs.Quote(c.cfg.Addr))
	}
	pctx, planeDone := hubdial.PlaneContext(c.follow, cctx) // ended if the primary moves away
	err := c.bulk.CallRecv(pctx, addr, method, req, nil, func(hb []byte, n int64, body io.Reader) error {
		if err := proto.Unmarshal(hb, &hdr); err != nil {
			return fmt.Errorf("%w: wsync: watch header: %v", errs.ErrInvalid, err)
		}
		if hdr.NotModified {
			if n != 0 {
				return fmt.Errorf("%w: wsync: a not-modified answer with %d body bytes", errs.ErrInvalid, n)
			}
			return nil
		}
		b := hdr.GetBlob()
		switch {
		case b.GetModel() != c.cfg.Model:
			return fmt.Errorf("%w: wsync: hub sent model %s for %s", errs.ErrInvalid, errs.Quote(b.GetModel()), errs.Quote(c.cfg.Model))
		case uint64(n) != b.GetTotalBytes():
			return fmt.Errorf("%w: wsync: hub sent %d bytes for a %d-byte version", errs.ErrInvalid, n, b.GetTotalBytes())
		case n > c.cfg.Limits.MaxBytes:
			return fmt.Errorf("%w: wsync: version of %d bytes exceeds %d", errs.ErrFull, n, c.cfg.Limits.MaxBytes)
		case b.GetVersion() <= after && (life == 0 || b.GetLife() == 0 || b.GetLife() == life):
			return fmt.Errorf("%w: wsync: hub sent version %d after %d", errs.ErrInvalid, b.GetVersion(), after)
		case b.GetEpoch() < c.deliveredEpoch():
			return fmt.Errorf("%w: wsync: %s sent version %d of epoch %d, older than epoch %d already delivered (a deposed primary)",
				errs.ErrUnavailable, addr, b.GetVersion(), b.GetEpoch(), c.deliveredEpoch())
		}
		if int64(cap(c.bufs[idx])) < n {
			c.bufs[idx] = nil // the model grew: let the old one go first
			c.bufs[idx] = make([]byte, n)
		}
		blob = c.bufs[idx][:n]
		_, err := io.ReadFull(body, blob)
		return err
	}, nil)
	err = planeDone(err)
	if err != nil {
		if ctx.Err() == nil && cctx.Err() != nil {
			if c.usable() != nil {
				return nil, fmt.Errorf("%w: wsync: data-plane client is closed", errs.ErrUnavailable)
			}
			// The poll outlived its deadline: the hub hangs (stopped, or
			// cut off); as unavailable it is followed on a cluster.
			err = fmt.Errorf("%w: wsync: poll to %s timed out: %w", errs.ErrUnavailable, addr, err)
		}
		if c.follow != nil && errors.Is(err, errs.ErrUnavailable) {
			hubdial.PlaneFailed(c.follow, err)
			c.mu.Lock()
			c.follows++
			c.mu.Unlock()
		}
		return nil, err
	}
	if hdr.NotModified || blob == nil {
		return nil, nil
	}
	f, err := safetensors.Decode(blob)
	if err != nil {
		return nil, fmt.Errorf("wsync: version %d from %s: %w", hdr.GetBlob().GetVersion(), c.cfg.Addr, err)
	}
	c.taken[0], c.taken[1] = c.taken[1], idx
	b := hdr.GetBlob()
	c.mu.Lock()
	c.nskipped += hdr.Skipped
	c.epoch = max(c.epoch, b.GetEpoch())
	c.noDP = 0
	c.mu.Unlock()
	return store.WithLife(&store.Snapshot{Name: b.GetModel(), Version: b.GetVersion(), Epoch: b.GetEpoch(), Blob: blob,
		Tensors: f.Tensors, Metadata: f.Metadata, Created: time.Unix(0, hdr.CreatedUnixNano)}, b.GetLife()), nil
}

// DataPlaneDialer is a Dialer (for Failover) that follows a hub over the
// data plane, falling back to its push stream over conn (nil: none).
// Its snapshots live as PushDialer's. Its DialLives follows lives
// (DataPlaneConfig.FollowLives; the life comes with each WaitNewerLife).
func DataPlaneDialer(name, addr string, bc *bulk.Client, conn grpc.ClientConnInterface, collectorID, model string) Dialer {
	open := func(have uint64, lives bool) (Source, io.Closer, error) {
		c, err := NewDataPlaneClient(DataPlaneConfig{Addr: addr, Bulk: bc, Conn: conn, CollectorID: collectorID, Model: model, Start: have,
			FollowLives: lives})
		if err != nil {
			return nil, nil, err
		}
		return c, c, nil
	}
	return Dialer{Name: name,
		Dial:      func(_ context.Context, have uint64) (Source, io.Closer, error) { return open(have, false) },
		DialLives: func(_ context.Context, have, _ uint64) (Source, io.Closer, error) { return open(have, true) },
	}
}
