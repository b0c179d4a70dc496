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
	"github.com/rlhub/rlhub/internal/errs/grpcerr"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/wire"
	"github.com/rlhub/rlhub/internal/wire/chunkcodec"
	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// ServiceConfig configures the push fan-out service.
type ServiceConfig struct {
	// Versions is where versions come from: the hub's store, or a relay's
	// board. Required.
	Versions StoreReader
	// ChunkBytes is the largest chunk sent; 0 means wire.DefaultChunkBytes
	// (a collector may ask for less).
	ChunkBytes int
	// Forget drops detached collectors that have not reported for this
	// long from status; 0 means 10 minutes.
	Forget time.Duration
	// MaxCollectors caps the collectors tracked (attached, or reported
	// within Forget): past it a new collector's report or attach fails
	// ResourceExhausted; 0 means DefaultMaxCollectors, negative no cap.
	MaxCollectors int
	// NoDataPlane leaves the data-plane watch (DataPlaneWatchMethod)
	// unregistered: collectors then use the push stream, as against a hub
	// that predates it.
	NoDataPlane bool
	// Now is the clock for report times; nil means time.Now.
	Now func() time.Time
	// Logger; nil means slog.Default().
	Logger *slog.Logger
}

func (c *ServiceConfig) validate() error {
	if c.Versions == nil {
		return errors.New("wsync: ServiceConfig.Versions is nil")
	}
	if c.ChunkBytes < 0 || c.Forget < 0 {
		return errors.New("wsync: negative ServiceConfig.ChunkBytes or Forget")
	}
	if c.ChunkBytes == 0 {
		c.ChunkBytes = wire.DefaultChunkBytes
	}
	if c.Forget == 0 {
		c.Forget = 10 * time.Minute
	}
	if c.MaxCollectors == 0 {
		c.MaxCollectors = DefaultMaxCollectors
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return nil
}

// Service is the WeightSync gRPC service: push fan-out to attached
// collectors, version reports and lag status.
//
// Each Attach stream is served by its own handler goroutine that waits for
// a version newer than the one it last sent and sends the newest whole
// version; the version's bytes are the store's shared snapshot, sliced into
// chunks without copying (gRPC copies once into its frames per collector).
// A collector whose stream is slow blocks only its own handler, which then
// sends whatever is newest: it skips versions and never delays the others.
type Service struct {
	rlhubv1.UnimplementedWeightSyncServer
	cfg     ServiceConfig
	tracker *Tracker
	count   serviceCounters // see Stats

	ctx    context.Context // canceled by Drain/Close: ends every stream
	cancel context.CancelFunc

	mu     sync.Mutex     // orders wg.Add against Close's wg.Wait
	closed bool           // guarded by mu
	wg     sync.WaitGroup // report readers of Attach streams
}

// DefaultMaxCollectors is ServiceConfig.MaxCollectors' default: far above
// the collectors of a real run, and at most some 64 MiB of ids even when
// a client reports the longest ones.
const DefaultMaxCollectors = 1 << 16

// NewService builds the service.
func NewService(cfg ServiceConfig) (*Service, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Service{cfg: cfg, tracker: NewTracker(cfg.Now, cfg.Forget, max(cfg.MaxCollectors, 0)), ctx: ctx, cancel: cancel}, nil
}

// Register implements hub.Service.
func (s *Service) Register(srv *grpc.Server) { rlhubv1.RegisterWeightSyncServer(srv, s) }

// Drain ends every Attach stream with UNAVAILABLE so a graceful stop need
// not wait for them; later Attach calls fail the same way.
func (s *Service) Drain() { s.cancel() }

// Close drains and waits for the service's goroutines. Safe to call twice.
func (s *Service) Close() error {
	s.cancel()
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.wg.Wait()
	return nil
}

// maxIDBytes bounds collector ids, model names and via strings.
const maxIDBytes = MaxIDBytes

// MaxIDBytes bounds a collector id, a model name and a via in reports and
// hellos (a relay clips the vias it forwards to it).
const MaxIDBytes = 256

func checkIDs(id, model, via string) error {
	if id == "" || model == "" {
		return fmt.Errorf("%w: collector_id and model are required", errs.ErrInvalid)
	}
	// Printable only: they are shown in `rlhub sync status`'s table, the
	// dashboard and logs, where a control character (a terminal escape
	// sequence) would forge lines or drive the operator's terminal.
	if err := errs.CheckName("collector_id", id, maxIDBytes); err != nil {
		return err
	}
	if err := errs.CheckName("model", model, maxIDBytes); err != nil {
		return err
	}
	if via != "" {
		return errs.CheckName("via", via, maxIDBytes)
	}
	return nil
}

// Tracker is the service's lag accounting.
func (s *Service) Tracker() *Tracker { return s.tracker }

// Lag returns the lag picture for model ("" for all), refreshing the
// newest version of each model from Versions first. It is the Go API
// behind the Status RPC.
func (s *Service) Lag(ctx context.Context, model string) []ModelStatus {
	models := []string{model}
	if model == "" {
		models = s.tracker.Models()
	}
	lr, lives := s.cfg.Versions.(store.LifeReader)
	for _, m := range models {
		if lives {
			// The newest and its life, read from no version: a model
			// deleted and pushed again shows its new newest at once.
			if v, life, err := lr.NewestLife(m); err == nil {
				s.tracker.SawLife(m, v, life)
			}
			continue
		}
		if snap, err := s.cfg.Versions.GetIfNewer(ctx, m, s.tracker.Newest(m)); err == nil && snap != nil {
			s.tracker.SawVersion(m, snap.Version)
		}
	}
	return s.tracker.Status(model)
}

// Attach implements rlhubv1.WeightSyncServer.
func (s *Service) Attach(stream rlhubv1.WeightSync_AttachServer) error {
	first, err := s.recvHello(stream)
	if err != nil {
		return err
	}
	hello := first.GetHello()
	switch {
	case hello == nil:
		return grpcerr.ToStatus(fmt.Errorf("%w: first Attach message must be a hello", errs.ErrInvalid))
	}
	if err := checkIDs(hello.CollectorId, hello.Model, ""); err != nil {
		return grpcerr.ToStatus(fmt.Errorf("hello: %w", err))
	}
	id, model := hello.CollectorId, hello.Model
	chunk := s.cfg.ChunkBytes
	if hello.ChunkBytes > 0 && int(hello.ChunkBytes) < chunk {
		chunk = int(hello.ChunkBytes)
	}
	if hello.ChunkBytes > 0 && hello.ChunkBytes < 4<<10 {
		return grpcerr.ToStatus(fmt.Errorf("%w: chunk_bytes %d below 4 KiB", errs.ErrInvalid, hello.ChunkBytes))
	}

	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	stop := context.AfterFunc(s.ctx, cancel)
	defer stop()
	if s.ctx.Err() != nil {
		return grpcerr.ToStatus(fmt.Errorf("%w: weight sync is shutting down", errs.ErrUnavailable))
	}

	if err := s.tracker.Report(id, model, "push", hello.Version); err != nil {
		return grpcerr.ToStatus(err) // over the cap of collectors
	}
	// The collector's reports arrive on the same stream; a reader goroutine
	// owned by the service records them. It ends when the stream does (the
	// handler returning cancels the stream's context).
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return grpcerr.ToStatus(fmt.Errorf("%w: weight sync is shutting down", errs.ErrUnavailable))
	}
	s.wg.Add(1)
	s.mu.Unlock()
	s.tracker.SetAttached(id, model, true)
	defer s.tracker.SetAttached(id, model, false)
	s.count.streams.Add(1)
	defer s.count.streams.Add(-1)
	go func() {
		defer s.wg.Done()
		for {
			m, err := stream.Recv()
			if err != nil {
				return
			}
			if r := m.GetRunning(); r != nil {
				s.count.reports.Add(1)
				_ = s.tracker.Report(id, model, "", r.Version) // attached: held, never refused
			}
		}
	}()

	// The versions are sent by a goroutine of their own, so that Drain can
	// end the stream even while a Send is blocked on the flow control of a
	// collector that stopped reading: the handler returning ends the stream
	// (gRPC then cancels its context), which unblocks that Send. The
	// service waits for the goroutine (Close).
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return grpcerr.ToStatus(fmt.Errorf("%w: weight sync is shutting down", errs.ErrUnavailable))
	}
	s.wg.Add(1)
	s.mu.Unlock()
	sendDone := make(chan error, 1)
	go func() {
		defer s.wg.Done()
		life := uint64(0) // versions only grow, unless the collector follows lives
		if hello.FollowLives {
			life = hello.Life
		}
		sendDone <- s.sendLoop(ctx, stream, model, hello.Version, life, hello.FollowLives, chunk)
	}()
	select {
	case err := <-sendDone:
		return err
	case <-s.ctx.Done():
		return grpcerr.ToStatus(fmt.Errorf("%w: weight sync is shutting down", errs.ErrUnavailable))
	}
}

// sendLoop sends every newest version of model after sent on stream until
// ctx ends or a send fails (Attach). With follow, a version of another
// life than life (the life of sent; 0: unknown) is sent at once too.
func (s *Service) sendLoop(ctx context.Context, stream rlhubv1.WeightSync_AttachServer, model string, sent, life uint64, follow bool, chunk int) error {
	for {
		// Borrowed, and lent on to the chunk codec: from a hub's store the
		// version then goes back to the reducer once dropped and written
		// to every collector (docs/store.md, "Lending").
		snap, release, err := store.BorrowNewerLife(ctx, s.cfg.Versions, model, sent, life)
		if err != nil {
			if s.ctx.Err() != nil {
				return grpcerr.ToStatus(fmt.Errorf("%w: weight sync is shutting down", errs.ErrUnavailable))
			}
			if stream.Context().Err() != nil {
				return nil // the collector left
			}
			return grpcerr.ToStatus(err)
		}
		s.tracker.SawLife(model, snap.Version, snap.Life())
		done := chunkcodec.Lend(snap.Blob, release)
		err = sendVersion(stream, snap, chunk)
		done()
		if err != nil {
			if s.ctx.Err() != nil {
				return grpcerr.ToStatus(fmt.Errorf("%w: weight sync is shutting down", errs.ErrUnavailable))
			}
			return err
		}
		sent = snap.Version
		if follow {
			life = snap.Life()
		}
		s.count.versionsSent.Add(1)
		s.count.bytesSent.Add(uint64(len(snap.Blob)))
	}
}

// helloTimeout bounds how long an Attach stream may take to send its hello.
const helloTimeout = 30 * time.Second

// recvHello receives an Attach stream's first message, within helloTimeout
// and unless Drain ends the wait. The receiving goroutine ends when the
// handler returns (gRPC then cancels the stream).
func (s *Service) recvHello(stream rlhubv1.WeightSync_AttachServer) (*rlhubv1.SyncClientMessage, error) {
	type recvd struct {
		m   *rlhubv1.SyncClientMessage
		err error
	}
	ch := make(chan recvd, 1)
	go func() {
		m, err := stream.Recv()
		ch <- recvd{m, err}
	}()
	t := time.NewTimer(helloTimeout)
	defer t.Stop()
	select {
	case r := <-ch:
		return r.m, r.err
	case <-s.ctx.Done():
		return nil, grpcerr.ToStatus(fmt.Errorf("%w: weight sync is shutting down", errs.ErrUnavailable))
	case <-t.C:
		return nil, grpcerr.ToStatus(fmt.Errorf("%w: no hello within %v", errs.ErrUnavailable, helloTimeout))
	}
}

func sendVersion(stream rlhubv1.WeightSync_AttachServer, snap *store.Snapshot, chunk int) error {
	blob := snap.Blob
	err := stream.Send(&rlhubv1.SyncServerMessage{Body: &rlhubv1.SyncServerMessage_Info{Info: &rlhubv1.BlobInfo{
		Model: snap.Name, Version: snap.Version, Epoch: snap.Epoch, TotalBytes: uint64(len(blob)), ChunkBytes: uint32(chunk),
		Life: snap.Life(),
	}}})
	if err != nil {
		return err
	}
	// One message value reused: Send marshals before returning.
	msg := &rlhubv1.Chunk{}
	out := &rlhubv1.SyncServerMessage{Body: &rlhubv1.SyncServerMessage_Chunk{Chunk: msg}}
	return wire.ChunksOf(blob, chunk, func(b []byte) error {
		msg.Data = b
		return stream.Send(out)
	})
}

// maxReports bounds one Report call.
const maxReports = MaxReports

// MaxReports bounds the reports of one Report call (a relay forwarding
// its collectors' splits them into batches of at most this many).
const MaxReports = 10000

// Report implements rlhubv1.WeightSyncServer. A batch with any bad report
// is refused whole.
func (s *Service) Report(_ context.Context, req *rlhubv1.SyncReportRequest) (*rlhubv1.SyncReportResponse, error) {
	if len(req.Reports) > maxReports {
		return nil, grpcerr.ToStatus(fmt.Errorf("%w: %d reports in one call, at most %d", errs.ErrInvalid, len(req.Reports), maxReports))
	}
	for i, r := range req.Reports {
		if err := checkIDs(r.CollectorId, r.Model, r.Via); err != nil {
			return nil, grpcerr.ToStatus(fmt.Errorf("report %d: %w", i, err))
		}
	}
	rs := make([]CollectorReport, len(req.Reports))
	for i, r := range req.Reports {
		rs[i] = CollectorReport{ID: r.CollectorId, Model: r.Model, Via: r.Via, Version: r.Version}
	}
	if err := s.tracker.ReportAll(rs); err != nil {
		return nil, grpcerr.ToStatus(err)
	}
	s.count.reports.Add(uint64(len(req.Reports)))
	return &rlhubv1.SyncReportResponse{}, nil
}

// Status implements rlhubv1.WeightSyncServer.
func (s *Service) Status(ctx context.Context, req *rlhubv1.SyncStatusRequest) (*rlhubv1.SyncStatusResponse, error) {
	return statusToProto(s.Lag(ctx, req.Model)), nil
}

func statusToProto(st []ModelStatus) *rlhubv1.SyncStatusResponse {
	resp := &rlhubv1.SyncStatusResponse{}
	for _, ms := range st {
		m := &rlhubv1.ModelSyncStatus{Model: ms.Model, Newest: ms.Newest}
		for _, c := range ms.Collectors {
			m.Collectors = append(m.Collectors, &rlhubv1.CollectorLag{
				CollectorId: c.ID, Version: c.Version, Lag: c.Lag, Via: c.Via,
				Attached: c.Attached, ReportedUnixNanos: c.Reported.UnixNano(),
			})
		}
		for _, b := range ms.Histogram {
			m.Histogram = append(m.Histogram, &rlhubv1.LagBucket{MaxLag: b.Max, Count: b.Count})
		}
		resp.Models = append(resp.Models, m)
	}
	return resp
}

// StatusFromProto converts a Status reply back to the Go API's types.
func StatusFromProto(resp *rlhubv1.SyncStatusResponse) []ModelStatus {
	var out []ModelStatus
	for _, m := range resp.Models {
		ms := ModelStatus{Model: m.Model, Newest: m.Newest}
		for _, c := range m.Collectors {
			ms.Collectors = append(ms.Collectors, CollectorLag{
				ID: c.CollectorId, Model: m.Model, Version: c.Version, Lag: c.Lag, Via: c.Via,
				Attached: c.Attached, Reported: time.Unix(0, c.ReportedUnixNanos),
			})
		}
		for _, b := range m.Histogram {
			ms.Histogram = append(ms.Histogram, LagBucket{Max: b.MaxLag, Count: b.Count})
		}
		out = append(out, ms)
	}
	return out
}

var _ io.Closer = (*Service)(nil)
