// Package relay is weight sync's per-host relay: it subscribes to an
// upstream hub once (its data-plane watch, or the WeightSync push stream)
// and serves the host's collectors from a shared-memory segment and its own
// WeightSync stream, so a version crosses the network once per host.
// Local collectors' version reports are forwarded upstream. Collectors
// fall back to the upstream when the relay dies (wsync.Failover).
package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/wire/bodylimit"
	"github.com/rlhub/rlhub/internal/wire/bulk"
	"github.com/rlhub/rlhub/internal/wire/connlimit"
	"github.com/rlhub/rlhub/internal/wire/streamcap"
	"github.com/rlhub/rlhub/internal/wsync"
	"github.com/rlhub/rlhub/internal/wsync/shm"
	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// Config configures a relay.
type Config struct {
	// Upstream reaches the hub (or another relay). Required.
	Upstream grpc.ClientConnInterface
	// Model to relay. Required.
	Model string
	// ID is the relay's collector id upstream; "" means "relay-<hostname>".
	ID string
	// Listen is where local collectors attach; "" means 127.0.0.1:0.
	Listen string
	// ShmPath is the shared-memory segment to publish into; "" means no
	// segment (stream only).
	ShmPath string
	// ShmSlots is the segment's slot count (shm.Config.Slots). 2 + n slots
	// let n local collectors lease versions (shm.ReaderConfig.Lease, the
	// default collector's reader) and copy them straight into their
	// weights; a collector beyond n copies the version out first, and says
	// why. 0 means automatic: as many slots as fit in AutoShmBytes of
	// /dev/shm, at least 2 (a double buffer, no leases) and at most
	// AutoShmSlots (autoSlots), sized again whenever the segment is.
	ShmSlots int
	// ShmGroup is the segment's group (shm.Config.Group): "" leaves it
	// 0600, readable by this user only; a group makes it 0660.
	ShmGroup string
	// ShmCapacity is the segment's slot size; 0 sizes it from the first
	// version (twice its size). A version that does not fit makes the relay
	// replace the segment with one twice as big: readers of the old one see
	// it closed and re-open (Failover does).
	ShmCapacity int64
	// ReportEvery is how often local collectors' versions are forwarded
	// upstream; 0 means 1s.
	ReportEvery time.Duration
	// Backoff is the pause before re-attaching to a failed upstream; 0
	// means 200ms.
	Backoff time.Duration
	// UpstreamAddr is Upstream's address ("host:port"). When set, the
	// relay follows the upstream store's data-plane watch (plain TCP on the
	// hub's port, docs/wire.md), receiving each version straight into its
	// next shared-memory slot (cut-through), and falls back to the
	// WeightSync push stream over Upstream when the hub does not serve it.
	// "" means the push stream only.
	UpstreamAddr string
	// UpstreamBulk makes the data-plane calls to UpstreamAddr, with the
	// upstream connection's TLS and token (dial.Config.Bulk); the caller
	// closes it after the relay. nil means a plaintext client without a
	// token, of the relay's own: against a hub that serves TLS or wants a
	// token, the watch then fails and the relay follows the push stream.
	UpstreamBulk *bulk.Client
	// PollTimeout bounds one data-plane poll beyond the hub's wait
	// (storerpc.BulkWatchWait); 0 means 30s.
	PollTimeout time.Duration
	// MaxModelBytes bounds a version received on the data plane; 0 means
	// 4 GiB.
	MaxModelBytes int64
	// BodyTimeout and BodyMinRate bound how long a local collector may
	// take to take a version on its stream (bodylimit: BodyTimeout +
	// size/BodyMinRate); one that does not is cut off, releasing the
	// version it held, and attaches again for the newest. 0 means the
	// hub's defaults (bulk.DefaultBodyTimeout, DefaultBodyMinRate).
	BodyTimeout time.Duration
	BodyMinRate int64
	// MaxStreamsPerPeer caps the streams one peer IP holds open on the
	// relay (streamcap); 0 means streamcap.DefaultPerPeer, negative no
	// cap.
	MaxStreamsPerPeer int
	// HandshakeTimeout bounds a local collector's connection handshake;
	// KeepaliveTime is how long a connection may be silent before the
	// relay pings it, and KeepaliveTimeout how long it then waits for the
	// answer before closing it (a collector's host gone without a word).
	// 0 means the hub's defaults (connlimit: 10s, 1m, 20s).
	HandshakeTimeout, KeepaliveTime, KeepaliveTimeout time.Duration
	// ServerOptions are added to the relay's gRPC server (metrics
	// interceptors); nil means none.
	ServerOptions []grpc.ServerOption
	// Logger; nil means slog.Default().
	Logger *slog.Logger
}

func (c *Config) validate() error {
	switch {
	case c.Upstream == nil:
		return fmt.Errorf("%w: relay: Config.Upstream is nil", errs.ErrInvalid)
	case c.Model == "":
		return fmt.Errorf("%w: relay: Config.Model is empty", errs.ErrInvalid)
	case c.ShmCapacity < 0 || c.ReportEvery < 0 || c.Backoff < 0 || c.PollTimeout < 0 || c.MaxModelBytes < 0 || c.BodyTimeout < 0 || c.BodyMinRate < 0,
		c.HandshakeTimeout < 0 || c.KeepaliveTime < 0 || c.KeepaliveTimeout < 0:
		return fmt.Errorf("%w: relay: negative Config duration or capacity", errs.ErrInvalid)
	case c.ShmSlots < 0 || c.ShmSlots == 1 || c.ShmSlots > 64:
		return fmt.Errorf("%w: relay: Config.ShmSlots %d outside [2, 64]", errs.ErrInvalid, c.ShmSlots)
	}
	if c.ID == "" {
		host, _ := os.Hostname()
		c.ID = "relay-" + host
	}
	if c.Listen == "" {
		c.Listen = "127.0.0.1:0"
	}
	if c.ReportEvery == 0 {
		c.ReportEvery = time.Second
	}
	if c.BodyTimeout == 0 {
		c.BodyTimeout = bulk.DefaultBodyTimeout
	}
	if c.BodyMinRate == 0 {
		c.BodyMinRate = bulk.DefaultBodyMinRate
	}
	if c.MaxStreamsPerPeer == 0 {
		c.MaxStreamsPerPeer = streamcap.DefaultPerPeer
	}
	if c.Backoff == 0 {
		c.Backoff = 200 * time.Millisecond
	}
	if c.PollTimeout == 0 {
		c.PollTimeout = 30 * time.Second
	}
	if c.MaxModelBytes == 0 {
		c.MaxModelBytes = 4 << 30
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return nil
}

// Relay subscribes to an upstream hub once and serves the collectors of
// its host from shared memory and its own WeightSync stream, so a version
// crosses the network once per host. Local collectors' version reports
// are forwarded upstream.
//
// Use: New, then Run(ctx) (it serves until ctx is done, then stops
// and removes the segment). Addr is valid after New.
type Relay struct {
	cfg    Config
	board  *wsync.Board
	svc    *wsync.Service
	srv    *grpc.Server
	health *health.Server     // SERVING while Run serves, as a hub's (`rlhub ping`, probes)
	bodies *bodylimit.Limiter // srv's streams' body deadlines
	lis    net.Listener

	shmMu sync.Mutex // guards shm
	shm   *shm.Writer

	// segHead is the newest version received on the data plane into the
	// segment; the board may lag it while no stream collector waits
	// (materialize copies it over on demand). nil before the first.
	segHead atomic.Pointer[segVersion]
	segGen  atomic.Uint64 // counts segments created, so materialize re-opens a replaced one
	waiting atomic.Int64  // stream collectors' calls waiting on the board

	matMu     sync.Mutex  // serialises materialize; guards seg, segOpened and segDone
	seg       *shm.Reader // copying reader of the relay's own segment (Fresh buffers); nil until needed
	segOpened uint64      // segGen when seg was opened
	segDone   bool        // Run has ended: materialize opens nothing more

	bulk    *bulk.Client  // data-plane client for UpstreamAddr; nil without it
	ownBulk bool          // bulk is the relay's own, closed with it
	noBulk  bool          // the upstream had no data-plane watch at this attach (follow's goroutine only)
	have    atomic.Uint64 // newest version followed on the data plane, reported upstream
	// haveMu is held by forwardReports from reading have until its report
	// is sent, and by follow to leave the data plane: a data-plane report
	// on its way is answered before the push stream reports for the relay,
	// never landing after them with an older version.
	haveMu sync.Mutex
	// epoch is the newest epoch of a version the relay republished (the
	// follow's goroutine only): one of an older epoch (a deposed
	// primary's, reached through a stale lookup) is refused and the
	// upstream looked up again, as the collectors' own clients do, never
	// republished as newer.
	epoch uint64
	// life is the life of the version the relay follows from upstream
	// (follow's goroutine only; 0: unknown): the push stream asks to follow
	// lives, so a model deleted and pushed again upstream is republished at
	// once (docs/weight-sync.md, "Lives").
	life uint64
	// skipTo is the version (and its life) the data-plane watch asks
	// after instead of the one the relay has, once it refused a version
	// over MaxModelBytes (follow's goroutine only).
	skipTo versionLife

	refusedMu sync.Mutex
	refused   Refusals // versions over MaxModelBytes (refusedMu)
}

// Refusals are the upstream versions the relay could not take on the data
// plane because they are over Config.MaxModelBytes: how many, and the
// newest of them and why. The relay does not ask for a refused version
// again: it keeps serving the one it has and waits for a newer one.
type Refusals struct {
	Count   uint64
	Version uint64
	Err     string
}

// Refusals reports the versions the relay could not take.
func (r *Relay) Refusals() Refusals {
	r.refusedMu.Lock()
	defer r.refusedMu.Unlock()
	return r.refused
}

// segVersion is a version committed to the segment.
type segVersion struct {
	version uint64
	created time.Time // as the upstream said, for the board's copy
	life    uint64    // as the upstream said (the segment's life)
}

// New listens and prepares the relay's service.
func New(cfg Config) (*Relay, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if cfg.ShmPath != "" {
		if err := shmInUse(cfg.ShmPath); err != nil {
			return nil, err
		}
	}
	r := &Relay{cfg: cfg, board: wsync.NewBoard(cfg.Model)}
	if cfg.UpstreamAddr != "" {
		r.bulk, r.ownBulk = cfg.UpstreamBulk, false
		if r.bulk == nil {
			r.bulk, r.ownBulk = bulk.NewClient(), true
		}
	}
	svc, err := wsync.NewService(wsync.ServiceConfig{Versions: boardStore{r: r, name: cfg.Model}, Logger: cfg.Logger})
	if err != nil {
		return nil, err
	}
	r.svc = svc
	lis, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("wsync: relay listen: %w", err)
	}
	r.lis = lis
	r.bodies = bodylimit.New(bodylimit.Config{Allowance: cfg.BodyTimeout, MinRate: cfg.BodyMinRate, Logger: cfg.Logger})
	// As the hub's: a bounded handshake, silent connections pinged, and
	// the pings every rlhub client sends accepted (gRPC's default policy
	// dropped local collectors' connections with GOAWAY too_many_pings).
	opts := append([]grpc.ServerOption{grpc.MaxRecvMsgSize(4 << 20), grpc.MaxSendMsgSize(4 << 20)},
		connlimit.ServerOptions(cfg.HandshakeTimeout, cfg.KeepaliveTime, cfg.KeepaliveTimeout)...)
	opts = append(opts, cfg.ServerOptions...)
	// After the caller's (metrics, tokens): the streams per peer, then,
	// innermost so the metrics interceptors see its cuts, the bodies'
	// deadlines.
	if cfg.MaxStreamsPerPeer > 0 {
		opts = append(opts, grpc.ChainStreamInterceptor(streamcap.New(cfg.MaxStreamsPerPeer).StreamInterceptor()))
	}
	opts = append(opts, grpc.ChainStreamInterceptor(r.bodies.StreamInterceptor()))
	r.srv = grpc.NewServer(opts...)
	svc.Register(r.srv)
	r.health = health.NewServer()
	r.health.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	healthpb.RegisterHealthServer(r.srv, r.health)
	return r, nil
}

// Addr is where local collectors attach.
func (r *Relay) Addr() string { return r.lis.Addr().String() }

// Board is the relay's in-process copy of the newest version its stream
// collectors asked for. Following the data plane into a segment, it is
// filled on demand: it may lag Newest while no stream collector waits.
func (r *Relay) Board() *wsync.Board { return r.board }

// Newest is the newest version the relay holds, in its segment or on its
// board (0: none yet).
func (r *Relay) Newest() uint64 {
	v := uint64(0)
	if h := r.segHead.Load(); h != nil {
		v = h.version
	}
	if s := r.board.Newest(); s != nil {
		v = max(v, s.Version)
	}
	return v
}

// BodyStats counts the local collectors' streams cut because a version
// was not taken within its deadline (Config.BodyTimeout, BodyMinRate).
func (r *Relay) BodyStats() bodylimit.Stats { return r.bodies.Stats() }

// Service is the relay's WeightSync service (its Lag shows local
// collectors).
func (r *Relay) Service() *wsync.Service { return r.svc }

// Run serves until ctx is done, re-attaching upstream after failures.
// On return the server is stopped, the segment closed and removed.
func (r *Relay) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	serveErr := make(chan error, 1)
	wg.Add(3)
	go func() { defer wg.Done(); serveErr <- r.srv.Serve(r.lis) }()
	go func() { defer wg.Done(); r.follow(ctx) }()
	go func() { defer wg.Done(); r.forwardReports(ctx) }()
	r.health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)

	var err error
	select {
	case <-ctx.Done():
	case err = <-serveErr:
		serveErr <- err
	}
	cancel()
	r.health.Shutdown()
	r.svc.Drain()
	r.srv.Stop()
	r.bodies.Wait()
	r.board.Close()
	wg.Wait()
	if e := <-serveErr; !errors.Is(e, grpc.ErrServerStopped) {
		err = errors.Join(err, e)
	}
	r.matMu.Lock()
	r.segDone = true
	if r.seg != nil {
		r.seg.Close()
		r.seg = nil
	}
	r.matMu.Unlock()
	r.shmMu.Lock()
	if r.shm != nil {
		err = errors.Join(err, r.shm.Close())
	}
	r.shmMu.Unlock()
	if r.ownBulk {
		r.bulk.Close()
	}
	return errors.Join(err, r.svc.Close())
}

// follow attaches upstream and applies every version to the board and the
// segment, re-attaching after failures, until ctx is done.
func (r *Relay) follow(ctx context.Context) {
	have := uint64(0)
	for ctx.Err() == nil {
		var err error
		if r.bulk != nil && !r.noBulk {
			if err = r.followBulk(ctx, &have); errors.Is(err, errNoBulk) {
				r.cfg.Logger.Info("wsync: upstream has no data-plane watch, following its push stream", "upstream", r.cfg.UpstreamAddr)
				r.noBulk = true
				r.haveMu.Lock()
				r.have.Store(0) // the push stream reports for the relay now: no stale data-plane version
				r.haveMu.Unlock()
				continue
			}
		} else {
			err = r.followOnce(ctx, &have)
			// The push stream ended: the next attach asks for the data
			// plane first again. The upstream may be a new primary or an
			// upgraded hub, and a hub that hung up mid-handshake (going
			// away) looked like one without a data plane.
			r.noBulk = false
		}
		if ctx.Err() != nil {
			return
		}
		r.cfg.Logger.Warn("wsync: relay lost its upstream, re-attaching", "err", err)
		t := time.NewTimer(r.cfg.Backoff)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
		}
	}
}

func (r *Relay) followOnce(ctx context.Context, have *uint64) error {
	cl, err := wsync.Attach(ctx, wsync.ClientConfig{Conn: r.cfg.Upstream, CollectorID: r.cfg.ID, Model: r.cfg.Model, Start: *have,
		FollowLives: true, StartLife: r.life, Logger: r.cfg.Logger})
	if err != nil {
		return err
	}
	defer cl.Close()
	var recv *wsync.Receiver
	recv, err = wsync.NewReceiver(wsync.ReceiverConfig{Source: cl, Start: *have, StartLife: r.life, FollowLives: true, Apply: r.apply, OnApplied: func(v uint64) {
		*have, r.life = v, recv.Life()
		cl.Running(v)
	}})
	if err != nil {
		return err
	}
	return recv.Run(ctx)
}

// apply publishes a version from upstream to local collectors: the board
// (stream collectors start at once) then the segment. A version the board
// already has (re-sent after a re-attach) is not an error, and a segment
// that cannot take a version is logged, not fatal: stream collectors still
// get it, and a segment too small for it that cannot be replaced by a
// bigger one is closed (ensureShm), so its shm collectors move on.
func (r *Relay) apply(snap *store.Snapshot) error {
	if snap.Epoch < r.epoch {
		return r.olderEpoch(snap.Version, snap.Epoch)
	}
	r.epoch = snap.Epoch
	if err := r.board.Publish(context.Background(), snap); err != nil && !errors.Is(err, errs.ErrStale) {
		return err
	}
	if r.cfg.ShmPath == "" {
		return nil
	}
	if err := r.publishShm(snap); err != nil {
		r.cfg.Logger.Warn("wsync: relay could not publish to shared memory", "path", r.cfg.ShmPath, "version", snap.Version, "err", err)
	}
	return nil
}

func (r *Relay) publishShm(snap *store.Snapshot) error {
	r.shmMu.Lock()
	defer r.shmMu.Unlock()
	if err := r.ensureShm(int64(len(snap.Blob)), snap.Life()); err != nil {
		return err
	}
	return r.shm.Publish(context.Background(), snap)
}

// The automatic segment size (Config.ShmSlots 0): up to AutoShmSlots
// slots, 8 of them leased by as many local collectors, within
// AutoShmBytes. A slot is twice the model (ensureShm), so a 4 MiB policy
// gets 10 slots (80 MiB) and a 128 MiB model 4 (1 GiB, two leases).
const (
	AutoShmBytes = 1 << 30
	AutoShmSlots = 10
)

// fitSlots is at most slots, and no fewer than 2 (a double buffer), so
// that the segment takes at most three quarters of room, the free space
// where it goes: a container's /dev/shm is 64 MiB by default, less than
// the 10 slots of a 4 MiB policy (80 MiB). Create fails, naming the
// space, when even 2 do not fit.
func fitSlots(slots int, capacity, room int64) int {
	for slots > 2 && shm.SegmentSize(capacity, slots) > room/4*3 {
		slots--
	}
	return slots
}

// autoSlots is the slot count for Config.ShmSlots 0 and a slot of
// capacity bytes.
func autoSlots(capacity int64) int {
	return int(min(max(AutoShmBytes/max(capacity, 1), 2), AutoShmSlots))
}

// ensureShm makes sure the segment exists, holds n bytes and is of life
// (0: unknown): the first one is sized from ShmCapacity or twice n, one
// too small is replaced by one twice n, and one of another life (the
// model deleted and pushed again upstream: its versions start afresh,
// below the segment's, which would refuse them) by a new one of that
// life, so that shm collectors re-open it and, following lives
// (shm.Reader.WaitNewerLife), take its versions at once. Called with
// shmMu held.
func (r *Relay) ensureShm(n int64, life uint64) error {
	newLife := r.shm != nil && life != 0 && life != r.shm.Life()
	if r.shm != nil && n <= r.shm.Capacity() && !newLife {
		return nil
	}
	capacity := r.cfg.ShmCapacity
	switch {
	case newLife && n <= r.shm.Capacity():
		capacity = r.shm.Capacity()
	case r.shm != nil || capacity < n:
		capacity = 2 * n
	}
	if r.shm == nil {
		// Made lazily, at the first version: another relay may have
		// made its segment at the path since New.
		if err := shmInUse(r.cfg.ShmPath); err != nil {
			return err
		}
	}
	// The new segment atomically takes the path; then the old one is
	// closed, so its readers re-open and find the new one.
	slots := r.cfg.ShmSlots
	if slots == 0 {
		slots = autoSlots(capacity)
		if room, err := shm.Room(r.cfg.ShmPath); err == nil {
			slots = fitSlots(slots, capacity, room)
		}
	}
	w, err := shm.Create(shm.Config{Path: r.cfg.ShmPath, Name: r.cfg.Model, Capacity: capacity, Slots: slots, Group: r.cfg.ShmGroup,
		Replace: true, Life: life})
	if err != nil {
		if r.shm != nil {
			// The old segment cannot hold this version: closed, so that
			// its readers see it closed and move on (to the relay's
			// stream, which has the version) instead of waiting on an old
			// version as if it were the newest. The next version tries
			// to make a segment again.
			err = fmt.Errorf("%w (its segment of %d-byte slots is closed)", err, r.shm.Capacity())
			r.shm.Close()
			r.shm = nil
		}
		return err
	}
	if r.shm != nil {
		r.shm.Close()
	}
	r.shm = w
	r.segGen.Add(1)
	return nil
}

// shmInUse is an errs.ErrExists error when the file at path is a segment
// whose writer lives (another relay's, of this model or another: models
// "a/b" and "a_b" share a default path): a relay never takes it from its
// readers. A dead writer's segment (a relay killed and started again) and
// a file that is no segment are not in use.
func shmInUse(path string) error {
	rd, err := shm.Open(shm.ReaderConfig{Path: path})
	if err != nil {
		return nil
	}
	defer rd.Close()
	if !rd.WriterAlive() {
		return nil
	}
	return fmt.Errorf("%w: relay: shm segment %s is in use by a live writer of model %s; give this relay another segment",
		errs.ErrExists, errs.Quote(path), errs.Quote(rd.Name()))
}

// materialize puts the segment's newest version on the board when the
// board lags it (an older version, or one of another life: the model
// deleted and pushed again, whose versions start afresh below the
// board's), copying it out of the segment with a copying reader of its
// own (the seqlock keeps the copy whole while the relay writes the next
// version into another slot). A version the board already has, or a
// segment newer meanwhile, is no error.
func (r *Relay) materialize(ctx context.Context) error {
	head := r.segHead.Load()
	behind := func() bool {
		cur := r.board.Newest()
		return head != nil && (cur == nil || cur.Version < head.version ||
			store.OtherLife(head.life, cur.Life()))
	}
	if !behind() {
		return nil
	}
	r.matMu.Lock()
	defer r.matMu.Unlock()
	if r.segDone || !behind() {
		return nil
	}
	if gen := r.segGen.Load(); r.seg == nil || r.segOpened != gen {
		if r.seg != nil {
			r.seg.Close()
			r.seg = nil
		}
		rd, err := shm.Open(shm.ReaderConfig{Path: r.cfg.ShmPath, Model: r.cfg.Model, Fresh: true})
		if err != nil {
			return err
		}
		r.seg, r.segOpened = rd, gen
	}
	than, life := uint64(0), uint64(0)
	if cur := r.board.Newest(); cur != nil {
		than, life = cur.Version, cur.Life()
	}
	// A segment of another life than the board's: its newest, whatever
	// its number.
	snap, err := r.seg.GetIfNewerLife(ctx, than, life)
	if err != nil || snap == nil {
		return err
	}
	if h := r.segHead.Load(); h != nil && h.version == snap.Version {
		snap.Created = h.created
		snap = store.WithLife(snap, h.life)
	}
	if err := r.board.Publish(ctx, snap); err != nil && !errors.Is(err, errs.ErrStale) {
		return err
	}
	return nil
}

// forwardReports sends local collectors' versions upstream every
// ReportEvery, until ctx is done.
//
// Only collectors attached here, or that reported since the last tick,
// are forwarded: one that left (to the hub directly, or for good) would
// otherwise have its last version here forwarded every tick, over what it
// reports elsewhere, until this relay forgets it. A report's via is kept
// within what the hub takes (relay/ prefixed), and a batch within its
// bound: one refused report refuses the whole batch, every collector of
// the host with it.
func (r *Relay) forwardReports(ctx context.Context) {
	t := time.NewTicker(r.cfg.ReportEvery)
	defer t.Stop()
	type seenAs struct {
		reported time.Time
		attached bool
	}
	forwarded := map[string]seenAs{} // each collector as last forwarded (or passed over)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		var reports []*rlhubv1.CollectorReport
		r.haveMu.Lock()
		if v := r.have.Load(); v != 0 { // following the data plane: no push stream reports for us
			reports = append(reports, &rlhubv1.CollectorReport{CollectorId: r.cfg.ID, Model: r.cfg.Model, Version: v, Via: "relay/data-plane"})
		}
		seen := map[string]bool{}
		for _, ms := range r.svc.Tracker().Status(r.cfg.Model) {
			for _, c := range ms.Collectors {
				seen[c.ID] = true
				last := forwarded[c.ID]
				forwarded[c.ID] = seenAs{c.Reported, c.Attached}
				// Not attached: forwarded only when it reported since (a
				// collector reading shm here); its stream's end, which
				// also stamps it, is not a report: it left.
				if !c.Attached && (!c.Reported.After(last.reported) || last.attached) {
					continue
				}
				via := "relay"
				if c.Via != "" {
					via = errs.Clip("relay/"+c.Via, wsync.MaxIDBytes)
				}
				reports = append(reports, &rlhubv1.CollectorReport{CollectorId: c.ID, Model: c.Model, Version: c.Version, Via: via})
			}
		}
		for id := range forwarded {
			if !seen[id] {
				delete(forwarded, id) // forgotten by the tracker
			}
		}
		for len(reports) > 0 {
			batch := reports[:min(len(reports), wsync.MaxReports)]
			reports = reports[len(batch):]
			rctx, cancel := context.WithTimeout(ctx, r.cfg.ReportEvery)
			if err := wsync.Report(rctx, r.cfg.Upstream, batch...); err != nil && ctx.Err() == nil {
				r.cfg.Logger.Debug("wsync: relay could not forward reports", "err", err)
			}
			cancel()
		}
		r.haveMu.Unlock()
	}
}

// boardStore serves the relay's board as a StoreReader for its Service,
// bringing the board up to the segment first (materialize).
type boardStore struct {
	r    *Relay
	name string // the board's model (NewBoard's name)
}

func (s boardStore) check(name string) error {
	if s.name != name {
		return fmt.Errorf("%w: this relay carries model %q, not %q", errs.ErrNotFound, s.name, name)
	}
	return nil
}

// catchUp materializes, logging a failure: the board then serves what it
// has, and later versions come as they land.
func (s boardStore) catchUp(ctx context.Context) {
	if err := s.r.materialize(ctx); err != nil && ctx.Err() == nil {
		s.r.cfg.Logger.Warn("wsync: relay could not copy a version out of its segment", "path", s.r.cfg.ShmPath, "err", err)
	}
}

func (s boardStore) GetIfNewer(ctx context.Context, name string, than uint64) (*store.Snapshot, error) {
	if err := s.check(name); err != nil {
		return nil, err
	}
	s.catchUp(ctx)
	return s.r.board.GetIfNewer(ctx, than)
}

// LendNewerLife implements store.LifeWaiter, so that the relay's own
// collectors that follow lives get a new life at once (the board holds
// the relay's one copy of each version: nothing to lend, release does
// nothing). It counts itself as waiting, as WaitNewer does.
func (s boardStore) LendNewerLife(ctx context.Context, name string, after, life uint64) (*store.Snapshot, func(), error) {
	if err := s.check(name); err != nil {
		return nil, nil, err
	}
	s.r.waiting.Add(1)
	defer s.r.waiting.Add(-1)
	s.catchUp(ctx)
	snap, err := s.r.board.WaitNewerLife(ctx, after, life)
	if err != nil {
		return nil, nil, err
	}
	return snap, func() {}, nil
}

// WaitNewer counts itself as waiting (so the relay copies versions that
// land meanwhile straight to the board) before it catches up.
func (s boardStore) WaitNewer(ctx context.Context, name string, after uint64) (*store.Snapshot, error) {
	if err := s.check(name); err != nil {
		return nil, err
	}
	s.r.waiting.Add(1)
	defer s.r.waiting.Add(-1)
	s.catchUp(ctx)
	return s.r.board.WaitNewer(ctx, after)
}

// olderEpoch is the error for version v of epoch e, older than one the
// relay delivered: Unavailable, so that the relay follows again from a
// fresh lookup of the primary.
func (r *Relay) olderEpoch(v, e uint64) error {
	return fmt.Errorf("%w: wsync: relay: upstream sent version %d of epoch %d after epoch %d (a deposed primary's): refused", errs.ErrUnavailable, v, e, r.epoch)
}
