package reducer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/rlhub/rlhub/internal/dial"
	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/errs/grpcerr"
	"github.com/rlhub/rlhub/internal/optim/optimpb"
	"github.com/rlhub/rlhub/internal/reduce"
	"github.com/rlhub/rlhub/internal/wire/bulk"
	"github.com/rlhub/rlhub/internal/wire/chunkcodec"
	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// Config configures the reducer service a hub hosts: the primary (unless
// Primary names a remote one) and Secondaries secondaries.
type Config struct {
	// Primary is the address of a remote primary; "" hosts the primary
	// here (then Store is required).
	Primary string
	// Dial is how to connect to a remote Primary (TLS, token); the zero
	// value is plaintext.
	Dial dial.Config
	// ForwardTransport carries batch sums to a remote primary:
	// TransportAuto (its hub's data plane, gRPC if it has none) or
	// TransportGRPC.
	ForwardTransport string
	// Store is the model store the hosted primary reads and publishes to.
	Store ModelStore
	// Secondaries is how many secondaries are hosted here; 0 means 1 and
	// a negative number none (a primary-only hub). A remote primary needs
	// at least one.
	Secondaries int
	// Addr returns the address clients reach this hub at (for secondaries
	// of a remote primary); nil means "" (clients use the address they
	// asked the primary at).
	Addr func() string
	// BatchSize, MaxWait, MaxQueue, MaxGradBytes, CloseTimeout: see
	// SecondaryConfig. The secondaries close together, so CloseTimeout
	// bounds Close's wait for them all.
	BatchSize    int
	MaxWait      time.Duration
	MaxQueue     int
	MaxGradBytes int64
	CloseTimeout time.Duration
	// Clock; nil means the real clock.
	Clock Clock
	// Logger; nil means slog.Default().
	Logger *slog.Logger
	// OnApply: see PrimaryConfig.
	OnApply func(model string, version uint64, members []reduce.ID, weights []float32)
	// StateDir: where the hosted primary keeps registrations, its ledger
	// and optimizer state (PrimaryConfig.StateDir; the hub uses
	// <--data>/reducer). "" keeps them in memory only.
	StateDir string
	// JournalCompactBytes: see PrimaryConfig.
	JournalCompactBytes int64
	// StateChanged, StateAppended: see PrimaryConfig.
	StateChanged  func(path string)
	StateAppended func(path string, from int64)
}

func (c *Config) validate() error {
	if c.Secondaries == 0 {
		c.Secondaries = 1
	}
	if c.Secondaries < 0 {
		if c.Primary != "" {
			return fmt.Errorf("reducer: no secondaries: a remote primary needs at least one here")
		}
		c.Secondaries = 0
	}
	if c.Primary == "" && c.Store == nil {
		return errors.New("reducer: hosting the primary needs a Store")
	}
	if c.ForwardTransport != TransportAuto && c.ForwardTransport != TransportGRPC {
		return fmt.Errorf("%w: reducer: ForwardTransport %q (want %q or %q)", errs.ErrInvalid, c.ForwardTransport, TransportAuto, TransportGRPC)
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return nil
}

// Service is the reducer as a hub hosts it: the gRPC Reducer service (and
// ReducerPrimary when the primary is here) over a Primary and
// SecondaryNodes.
type Service struct {
	cfg         Config
	primary     *Primary // nil with a remote primary
	remoteConn  *grpc.ClientConn
	remote      *RemotePrimary // the Upstream over remoteConn
	secondaries []*SecondaryNode
	byID        map[string]*SecondaryNode
	closeOnce   sync.Once
	closeErr    error

	// peers are connections to other hubs' reducers (ClusterStats).
	peersMu sync.Mutex
	peers   map[string]*grpc.ClientConn

	// sessions ends Attach streams on Drain/Close.
	drainOnce sync.Once
	drained   chan struct{}
	// hosts tracks the optimizer hosts' receive loops (external.go).
	hosts sync.WaitGroup
}

// crashEnv (tests only) is the hosted primary's PrimaryConfig.CrashAt:
// a test SIGKILLs a real hub at a point of Register with it, as
// RLHUB_TEST_ARS_CRASH does the ARS state writes.
const crashEnv = "RLHUB_TEST_REDUCER_CRASH"

// New opens the reducer: the primary (if hosted) and the secondaries,
// which attach in the background.
func New(cfg Config) (*Service, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	s := &Service{cfg: cfg, byID: map[string]*SecondaryNode{}, drained: make(chan struct{}), peers: map[string]*grpc.ClientConn{}}
	var up Upstream
	if cfg.Primary == "" {
		p, err := NewPrimary(PrimaryConfig{Store: cfg.Store, Clock: cfg.Clock, Logger: cfg.Logger, OnApply: cfg.OnApply, StateDir: cfg.StateDir,
			JournalCompactBytes: cfg.JournalCompactBytes, StateChanged: cfg.StateChanged, StateAppended: cfg.StateAppended,
			CrashAt: os.Getenv(crashEnv)})
		if err != nil {
			return nil, err
		}
		s.primary, up = p, p
	} else {
		conn, err := cfg.Dial.GRPC(cfg.Primary)
		if err != nil {
			return nil, fmt.Errorf("reducer: dial primary %s: %w", cfg.Primary, err)
		}
		dataAddr := cfg.Primary
		if cfg.ForwardTransport == TransportGRPC {
			dataAddr = ""
		}
		s.remote = NewRemotePrimary(conn, dataAddr)
		if s.remote.bulk != nil {
			s.remote.bulk = cfg.Dial.Bulk()
		}
		s.remoteConn, up = conn, s.remote
	}
	for i := range cfg.Secondaries {
		id := "s" + strconv.Itoa(i)
		sec, err := NewSecondary(SecondaryConfig{ID: id, Addr: cfg.Addr, Upstream: up,
			BatchSize: cfg.BatchSize, MaxWait: cfg.MaxWait, MaxQueue: cfg.MaxQueue, MaxGradBytes: cfg.MaxGradBytes,
			CloseTimeout: cfg.CloseTimeout, Clock: cfg.Clock, Logger: cfg.Logger})
		if err != nil {
			_ = s.Close()
			return nil, err
		}
		s.secondaries = append(s.secondaries, sec)
		s.byID[id] = sec
	}
	return s, nil
}

// Primary returns the hosted primary, or nil.
func (s *Service) Primary() *Primary { return s.primary }

// SecondaryNodes returns the hosted secondaries.
func (s *Service) SecondaryNodes() []*SecondaryNode { return s.secondaries }

// Register implements hub.Service.
func (s *Service) Register(g *grpc.Server) {
	rlhubv1.RegisterReducerServer(g, &reducerServer{s: s})
	if s.primary != nil {
		rlhubv1.RegisterReducerPrimaryServer(g, &primaryServer{p: s.primary, drained: s.drained})
		registerHostServer(g, s.primary, s.drained, &s.hosts) // external.go
	}
}

// Drain ends the Attach streams so a graceful stop does not wait on them.
func (s *Service) Drain() { s.drainOnce.Do(func() { close(s.drained) }) }

// Close stops the secondaries (releasing what they hold), then the primary
// (closing its durable state). Safe to call twice.
func (s *Service) Close() error {
	s.closeOnce.Do(func() {
		s.Drain()
		out := make([]error, len(s.secondaries))
		var wg sync.WaitGroup
		for i, sec := range s.secondaries { // together: each within CloseTimeout
			wg.Go(func() { out[i] = sec.Close() })
		}
		wg.Wait()
		if s.primary != nil {
			out = append(out, s.primary.Close())
		}
		if s.remoteConn != nil {
			out = append(out, s.remote.Close(), s.remoteConn.Close())
		}
		s.peersMu.Lock()
		for _, c := range s.peers {
			out = append(out, c.Close())
		}
		s.peers = map[string]*grpc.ClientConn{}
		s.peersMu.Unlock()
		s.hosts.Wait() // their streams ended with the server
		s.closeErr = errors.Join(out...)
	})
	return s.closeErr
}

// Stats are the counters of everything a hub's reducer hosts, composed of
// the PrimaryStats and SecondaryStats of its parts. The Go API
// (Service.Stats, hub.Hub.Reducer().Stats()), the Stats RPC and `rlhub
// reducer stats` carry the same numbers: StatsToProto and StatsFromProto
// convert without loss.
type Stats struct {
	// Total sums Parts.
	Total reduce.Counters
	// Parts: "primary" and "secondary/<id>" for each one hosted here.
	Parts map[string]reduce.Counters
	// QueueDepth sums PartQueue: gradients held by the secondaries.
	QueueDepth int
	// PartQueue is each secondary's queue depth, keyed like Parts.
	PartQueue map[string]int
	// Models registered with the primary hosted here (PrimaryStats.Models).
	Models map[string]ModelStats
	// P50, P99: admitted → published latency at the primary.
	P50, P99 time.Duration
	// Unreachable: secondaries in other processes ClusterStats could not
	// read (address → error); nil from Stats.
	Unreachable map[string]string
}

// Stats returns the counters of the hosted primary and secondaries, each
// sampled once.
func (s *Service) Stats() Stats {
	st := Stats{Parts: map[string]reduce.Counters{}, PartQueue: map[string]int{}, Models: map[string]ModelStats{}}
	if s.primary != nil {
		ps := s.primary.Stats()
		st.Parts["primary"], st.Models, st.P50, st.P99 = ps.Counters, ps.Models, ps.P50, ps.P99
		st.PartQueue["primary"] = 0
		st.Total.Merge(ps.Counters)
	}
	for _, sec := range s.secondaries {
		ss := sec.Stats()
		name := "secondary/" + ss.ID
		st.Parts[name], st.PartQueue[name] = ss.Counters, ss.QueueDepth
		st.Total.Merge(ss.Counters)
		st.QueueDepth += ss.QueueDepth
	}
	return st
}

// ClusterStats is Stats plus, at the primary's hub, the counters of every
// attached secondary in another process (parts "secondary/<addr>/<id>",
// merged into Total and QueueDepth): the one place where, once nothing is
// in flight, Total.Pushed = Total.Applied + Total.DroppedTotal() holds for
// the whole reducer. Each remote hub is asked once (its local Stats), with
// a deadline; one that does not answer is listed in Unreachable.
func (s *Service) ClusterStats(ctx context.Context) Stats {
	st := s.Stats()
	if s.primary == nil {
		return st
	}
	self := ""
	if s.cfg.Addr != nil {
		self = s.cfg.Addr()
	}
	addrs := map[string]bool{}
	for _, sec := range s.primary.Secondaries() {
		if sec.Addr != "" && sec.Addr != self {
			addrs[sec.Addr] = true
		}
	}
	// Connections to hubs no longer attached are closed: secondaries that
	// restart at new addresses (pod IPs) must not pile them up.
	s.peersMu.Lock()
	for addr, conn := range s.peers {
		if !addrs[addr] {
			_ = conn.Close()
			delete(s.peers, addr)
		}
	}
	s.peersMu.Unlock()
	// Asked together: one stats call waits for the slowest hub's bound,
	// not for the sum of every unreachable one's.
	sorted := slices.Sorted(maps.Keys(addrs))
	answers := make([]Stats, len(sorted))
	failed := make([]error, len(sorted))
	var wg sync.WaitGroup
	for i, addr := range sorted {
		wg.Go(func() { answers[i], failed[i] = s.remoteStats(ctx, addr) })
	}
	wg.Wait()
	for i, addr := range sorted {
		rst, err := answers[i], failed[i]
		if err != nil {
			if st.Unreachable == nil {
				st.Unreachable = map[string]string{}
			}
			st.Unreachable[addr] = truncate(err.Error(), 256)
			continue
		}
		for name, c := range rst.Parts {
			id, ok := strings.CutPrefix(name, "secondary/")
			if !ok {
				continue
			}
			key := "secondary/" + addr + "/" + id
			st.Parts[key], st.PartQueue[key] = c, rst.PartQueue[name]
			st.Total.Merge(c)
			st.QueueDepth += rst.PartQueue[name]
		}
	}
	return st
}

// remoteStats asks the hub at addr for its local reducer stats.
func (s *Service) remoteStats(ctx context.Context, addr string) (Stats, error) {
	s.peersMu.Lock()
	conn, ok := s.peers[addr]
	if !ok {
		var err error
		conn, err = s.cfg.Dial.GRPC(addr) // the same seam as the link to the primary
		if err != nil {
			s.peersMu.Unlock()
			return Stats{}, err
		}
		s.peers[addr] = conn
	}
	s.peersMu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	resp, err := rlhubv1.NewReducerClient(conn).Stats(ctx, &rlhubv1.ReducerStatsRequest{Local: true})
	if err != nil {
		return Stats{}, grpcerr.FromStatus(err)
	}
	return StatsFromProto(resp), nil
}

func countersProto(c reduce.Counters, q int) *rlhubv1.ReducerCounters {
	d := map[string]uint64{}
	for r, n := range c.Dropped {
		d[string(r)] = n
	}
	return &rlhubv1.ReducerCounters{Pushed: c.Pushed, Attempts: c.Attempts, Reduced: c.Reduced, Applied: c.Applied, Steps: c.Steps, Dropped: d, QueueDepth: int64(q)}
}

func countersFromProto(p *rlhubv1.ReducerCounters) (reduce.Counters, int) {
	c := reduce.Counters{Pushed: p.GetPushed(), Attempts: p.GetAttempts(), Reduced: p.GetReduced(), Applied: p.GetApplied(), Steps: p.GetSteps()}
	for r, n := range p.GetDropped() {
		c.Drop(reduce.Reason(r), n)
	}
	return c, int(p.GetQueueDepth())
}

// StatsToProto is the Stats RPC's response for st (latencies in whole
// microseconds).
func StatsToProto(st Stats) *rlhubv1.ReducerStatsResponse {
	resp := &rlhubv1.ReducerStatsResponse{Total: countersProto(st.Total, st.QueueDepth), Parts: map[string]*rlhubv1.ReducerCounters{},
		PublishP50Us: float64(st.P50.Microseconds()), PublishP99Us: float64(st.P99.Microseconds()),
		Versions: map[string]uint64{}, BlobsReused: map[string]uint64{}, Models: map[string]*rlhubv1.ReducerModelStats{}}
	for name, c := range st.Parts {
		resp.Parts[name] = countersProto(c, st.PartQueue[name])
	}
	if len(st.Unreachable) > 0 {
		resp.Unreachable = maps.Clone(st.Unreachable)
	}
	for name, m := range st.Models {
		resp.Versions[name], resp.BlobsReused[name] = m.Version, m.BlobsReused
		resp.Models[name] = &rlhubv1.ReducerModelStats{Version: m.Version, Counters: countersProto(m.Counters, 0),
			BlobsReused: m.BlobsReused, OptimizerSteps: m.OptimizerSteps, StateError: m.StateError}
	}
	return resp
}

// StatsFromProto is the inverse of StatsToProto. A response of a hub that
// predates ReducerStatsResponse.models gives Models with only Version and
// BlobsReused.
func StatsFromProto(r *rlhubv1.ReducerStatsResponse) Stats {
	st := Stats{Parts: map[string]reduce.Counters{}, PartQueue: map[string]int{}, Models: map[string]ModelStats{},
		P50: time.Duration(r.GetPublishP50Us()) * time.Microsecond, P99: time.Duration(r.GetPublishP99Us()) * time.Microsecond}
	st.Total, st.QueueDepth = countersFromProto(r.GetTotal())
	if len(r.GetUnreachable()) > 0 {
		st.Unreachable = maps.Clone(r.GetUnreachable())
	}
	for name, c := range r.GetParts() {
		st.Parts[name], st.PartQueue[name] = countersFromProto(c)
	}
	for name, v := range r.GetVersions() {
		st.Models[name] = ModelStats{Version: v, BlobsReused: r.GetBlobsReused()[name]}
	}
	for name, m := range r.GetModels() {
		c, _ := countersFromProto(m.GetCounters())
		st.Models[name] = ModelStats{Version: m.GetVersion(), Counters: c, BlobsReused: m.GetBlobsReused(),
			OptimizerSteps: m.GetOptimizerSteps(), StateError: m.GetStateError()}
	}
	return st
}

// reducerServer is the gRPC face of a Service.
type reducerServer struct {
	rlhubv1.UnimplementedReducerServer
	s *Service
}

// Stats implements rlhubv1.ReducerServer: ClusterStats, or Stats when
// the request asks for this hub's parts only.
func (rs *reducerServer) Stats(ctx context.Context, r *rlhubv1.ReducerStatsRequest) (*rlhubv1.ReducerStatsResponse, error) {
	if r.GetLocal() {
		return StatsToProto(rs.s.Stats()), nil
	}
	return StatsToProto(rs.s.ClusterStats(ctx)), nil
}

// RegisterModel is the Go form of the Register RPC.
func (s *Service) RegisterModel(ctx context.Context, mc ModelConfig) (version, restored uint64, err error) {
	if s.primary == nil {
		return 0, 0, fmt.Errorf("%w: this hub's reducer primary is at %s", errs.ErrUnavailable, s.cfg.Primary)
	}
	return s.primary.Register(ctx, mc)
}

// ModelDeleted tells the reducer that model was deleted from its store (an
// administrator's `rlhub model rm`): the primary hosted here drops the
// model's registration (Primary.Deleted). A hub whose primary is remote
// has none to drop.
func (s *Service) ModelDeleted(ctx context.Context, model string) {
	if s.primary != nil {
		s.primary.Deleted(ctx, model)
	}
}

// GuardHostState is the primary hosted here's Primary.GuardHostState, for
// the hub's store pushes (storerpc Config.PushGuard). A hub whose primary
// is remote has no registration to check a push against: it lets every
// push through.
func (s *Service) GuardHostState(ctx context.Context, name string, life uint64) (release func(), err error) {
	if s.primary == nil {
		return func() {}, nil
	}
	return s.primary.GuardHostState(ctx, name, life)
}

// ModelConfigFromProto converts a Register request.
func ModelConfigFromProto(r *rlhubv1.ReducerRegisterRequest) ModelConfig {
	return ModelConfig{
		Model:           r.GetModel(),
		Optimizer:       optimpb.FromProto(r.GetOptimizer()),
		Reduction:       reduce.Reduction(r.GetReduction()),
		GradientMax:     r.GetGradientMax(),
		Staleness:       reduce.Staleness{Policy: reduce.Policy(r.GetStaleness()), MaxLag: r.GetMaxLag()},
		CheckpointEvery: r.GetCheckpointEvery(),
	}
}

// ModelConfigToProto is the inverse of ModelConfigFromProto.
func ModelConfigToProto(mc ModelConfig) *rlhubv1.ReducerRegisterRequest {
	return &rlhubv1.ReducerRegisterRequest{
		Model:     mc.Model,
		Optimizer: optimpb.ToProto(mc.Optimizer),
		Reduction: string(mc.Reduction), GradientMax: mc.GradientMax,
		Staleness: string(mc.Staleness.Policy), MaxLag: mc.Staleness.MaxLag, CheckpointEvery: mc.CheckpointEvery,
	}
}

// Register implements rlhubv1.ReducerServer.
func (rs *reducerServer) Register(ctx context.Context, r *rlhubv1.ReducerRegisterRequest) (*rlhubv1.ReducerRegisterResponse, error) {
	v, restored, err := rs.s.RegisterModel(ctx, ModelConfigFromProto(r))
	if err != nil {
		return nil, grpcerr.ToStatus(err)
	}
	return &rlhubv1.ReducerRegisterResponse{Version: v, RestoredSteps: restored}, nil
}

// Secondaries implements rlhubv1.ReducerServer.
func (rs *reducerServer) Secondaries(context.Context, *rlhubv1.ReducerSecondariesRequest) (*rlhubv1.ReducerSecondariesResponse, error) {
	p := rs.s.primary
	if p == nil {
		return nil, grpcerr.ToStatus(fmt.Errorf("%w: this hub's reducer primary is at %s", errs.ErrUnavailable, rs.s.cfg.Primary))
	}
	resp := &rlhubv1.ReducerSecondariesResponse{}
	for _, sec := range p.Secondaries() {
		resp.Secondaries = append(resp.Secondaries, &rlhubv1.ReducerSecondary{Addr: sec.Addr, Id: sec.ID})
	}
	return resp, nil
}

// Push implements rlhubv1.ReducerServer.
func (rs *reducerServer) Push(stream rlhubv1.Reducer_PushServer) error {
	// With the chunk codec (the Go client asks for it) a chunk stays in
	// gRPC's buffers until copied once into the pooled receive buffer.
	recvMsg := chunkcodec.Receiver[*rlhubv1.ReducerPushRequest](stream.RecvMsg, chunkcodec.Requested(stream.Context()))
	var m chunkcodec.Msg[*rlhubv1.ReducerPushRequest]
	defer m.Release()
	if err := recvMsg(&m); err != nil {
		return grpcerr.ToStatus(fmt.Errorf("%w: push: %v", errs.ErrInvalid, err))
	}
	resp, err := rs.s.push(stream.Context(), m.Msg.GetHeader(), chunks(streamRecv(recvMsg, &m, "push")))
	if err != nil {
		return grpcerr.ToStatus(err)
	}
	return stream.SendAndClose(resp)
}

// push hands a gradient pushed over gRPC or the data plane to the named
// (or a random) secondary.
func (s *Service) push(ctx context.Context, h *rlhubv1.ReducerPushHeader, body gradBody) (*rlhubv1.ReducerPushResponse, error) {
	if h == nil || h.GetBlob() == nil {
		return nil, fmt.Errorf("%w: push: %v", errs.ErrInvalid, errNoHeader)
	}
	sec, err := s.pick(h.GetSecondary())
	if err != nil {
		return nil, err
	}
	res, err := sec.Push(ctx, PushHeader{Model: h.GetBlob().GetModel(), BaseVersion: h.GetBlob().GetVersion(), BaseLife: h.GetBlob().GetLife(),
		ID: reduce.ID{Client: h.GetClientId(), Seq: h.GetSeq()}, TotalBytes: h.GetBlob().GetTotalBytes()}, body)
	if err != nil {
		return nil, err
	}
	return &rlhubv1.ReducerPushResponse{Version: res.Version, Weight: res.Weight}, nil
}

// Data-plane methods. BulkPushMethod, a gradient push: header
// ReducerPushHeader (blob.total_bytes announces the body), body the
// gradient's safetensors bytes, response ReducerPushResponse.
// BulkForwardMethod, a secondary's batch sum to the primary: header
// ReducerForwardHeader, body the sum's safetensors bytes, response
// ReducerForwardResponse.
const (
	BulkPushMethod    = "rlhub.v1.Reducer/Push"
	BulkForwardMethod = "rlhub.v1.ReducerPrimary/Forward"
)

// RegisterBulk serves pushes on the hub's data plane (package bulk) as
// well as over gRPC: the same secondaries, checks, counters and errors,
// with the gradient read from the socket straight into its buffer.
func (s *Service) RegisterBulk(b *bulk.Server) {
	b.Handle(BulkPushMethod, func(ctx context.Context, r *bulk.Request) (proto.Message, error) {
		h := &rlhubv1.ReducerPushHeader{}
		if err := proto.Unmarshal(r.Header, h); err != nil {
			return nil, fmt.Errorf("%w: push header: %v", errs.ErrInvalid, err)
		}
		return s.push(ctx, h, fromReader(r.Body))
	})
	if s.primary == nil {
		return
	}
	b.Handle(BulkForwardMethod, func(ctx context.Context, r *bulk.Request) (proto.Message, error) {
		h := &rlhubv1.ReducerForwardHeader{}
		if err := proto.Unmarshal(r.Header, h); err != nil {
			return nil, fmt.Errorf("%w: forward header: %v", errs.ErrInvalid, err)
		}
		v, err := forward(ctx, s.primary, h, fromReader(r.Body))
		if err != nil {
			return nil, err
		}
		return &rlhubv1.ReducerForwardResponse{Version: v}, nil
	})
}

// pick returns the named secondary, or a random attached one for "".
func (s *Service) pick(id string) (*SecondaryNode, error) {
	if id != "" {
		if sec, ok := s.byID[id]; ok {
			return sec, nil
		}
		return nil, fmt.Errorf("%w: no secondary %s here", errs.ErrUnavailable, errs.Quote(id))
	}
	var live []*SecondaryNode
	for _, sec := range s.secondaries {
		if sec.Attached() {
			live = append(live, sec)
		}
	}
	if len(live) == 0 {
		return nil, fmt.Errorf("%w: no attached secondary here", errs.ErrUnavailable)
	}
	return live[rand.IntN(len(live))], nil
}

// primaryServer is the gRPC face of a hosted Primary.
type primaryServer struct {
	rlhubv1.UnimplementedReducerPrimaryServer
	p       *Primary
	drained <-chan struct{}
}

// Attach implements rlhubv1.ReducerPrimaryServer: the session lives as long
// as the stream.
func (ps *primaryServer) Attach(req *rlhubv1.ReducerAttachRequest, stream rlhubv1.ReducerPrimary_AttachServer) error {
	if req.GetId() == "" {
		return grpcerr.ToStatus(fmt.Errorf("%w: attach without a secondary id", errs.ErrInvalid))
	}
	// Kept while the session lasts and listed to every client
	// (Secondaries): an address and an id, not megabytes.
	if len(req.GetId()) > MaxSecondaryIDBytes || len(req.GetAddr()) > MaxSecondaryAddrBytes {
		return grpcerr.ToStatus(fmt.Errorf("%w: secondary id %s / address %s: at most %d and %d bytes",
			errs.ErrInvalid, errs.Quote(req.GetId()), errs.Quote(req.GetAddr()), MaxSecondaryIDBytes, MaxSecondaryAddrBytes))
	}
	sess, _, err := ps.p.Attach(stream.Context(), Secondary{Addr: req.GetAddr(), ID: req.GetId()})
	if err != nil {
		return grpcerr.ToStatus(err)
	}
	defer ps.p.Detach(sess)
	if err := stream.Send(&rlhubv1.ReducerAttachEvent{Session: sess}); err != nil {
		return err
	}
	select {
	case <-stream.Context().Done():
		return nil
	case <-ps.drained:
		return grpcerr.ToStatus(fmt.Errorf("%w: reducer primary is stopping", errs.ErrUnavailable))
	}
}

// Bounds on a secondary's Attach (ReducerAttachRequest).
const (
	MaxSecondaryIDBytes   = 128
	MaxSecondaryAddrBytes = 512
)

// Describe implements rlhubv1.ReducerPrimaryServer.
func (ps *primaryServer) Describe(ctx context.Context, req *rlhubv1.ReducerDescribeRequest) (*rlhubv1.ReducerDescribeResponse, error) {
	l, err := ps.p.Describe(ctx, req.GetModel())
	if err != nil {
		return nil, grpcerr.ToStatus(err)
	}
	return &rlhubv1.ReducerDescribeResponse{Tensors: layoutToProto(l.Tensors), Version: l.Version}, nil
}

// Admit implements rlhubv1.ReducerPrimaryServer.
func (ps *primaryServer) Admit(ctx context.Context, req *rlhubv1.ReducerAdmitRequest) (*rlhubv1.ReducerAdmitResponse, error) {
	w, v, err := ps.p.Admit(ctx, req.GetSession(), req.GetModel(), reduce.ID{Client: req.GetClientId(), Seq: req.GetSeq()}, req.GetBaseVersion(), req.GetBaseLife())
	if err != nil {
		return nil, grpcerr.ToStatus(err)
	}
	return &rlhubv1.ReducerAdmitResponse{Weight: w, Version: v}, nil
}

// Release implements rlhubv1.ReducerPrimaryServer.
func (ps *primaryServer) Release(ctx context.Context, req *rlhubv1.ReducerReleaseRequest) (*rlhubv1.ReducerReleaseResponse, error) {
	n, err := ps.p.Release(ctx, req.GetSession(), req.GetModel(), idsFromProto(req.GetIds()))
	if err != nil {
		return nil, grpcerr.ToStatus(err)
	}
	return &rlhubv1.ReducerReleaseResponse{Released: uint32(n)}, nil
}

// Forward implements rlhubv1.ReducerPrimaryServer.
func (ps *primaryServer) Forward(stream rlhubv1.ReducerPrimary_ForwardServer) error {
	recvMsg := chunkcodec.Receiver[*rlhubv1.ReducerForwardRequest](stream.RecvMsg, chunkcodec.Requested(stream.Context()))
	var m chunkcodec.Msg[*rlhubv1.ReducerForwardRequest]
	defer m.Release()
	if err := recvMsg(&m); err != nil {
		return grpcerr.ToStatus(fmt.Errorf("%w: forward: %v", errs.ErrInvalid, err))
	}
	v, err := forward(stream.Context(), ps.p, m.Msg.GetHeader(), chunks(streamRecv(recvMsg, &m, "forward")))
	if err != nil {
		return grpcerr.ToStatus(err)
	}
	return stream.SendAndClose(&rlhubv1.ReducerForwardResponse{Version: v})
}

// forward receives a batch sum a secondary forwards (over gRPC or the data
// plane) and hands it to the primary.
func forward(ctx context.Context, p *Primary, h *rlhubv1.ReducerForwardHeader, body gradBody) (uint64, error) {
	if h == nil || h.GetBlob() == nil {
		return 0, fmt.Errorf("%w: forward: %v", errs.ErrInvalid, errNoHeader)
	}
	l, err := p.Describe(ctx, h.GetBlob().GetModel())
	if err != nil {
		return 0, err
	}
	if err := checkGradSize(h.GetBlob().GetModel(), h.GetBlob().GetTotalBytes(), l.Tensors); err != nil {
		return 0, err
	}
	// No NaN/Inf scan here: Forward's norm pass over the sum is that check.
	sum, buf, _, err := receiveGradient(h.GetBlob().GetTotalBytes(), MaxGradBytesFor(l.Tensors), false, body)
	if err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) {
			err = fmt.Errorf("%w: forward stream broke: %v", errs.ErrAborted, err)
		}
		return 0, err
	}
	defer putBuf(buf) // Forward keeps no reference to the sum
	var first0 time.Time
	if ns := h.GetFirstAdmittedUnixNano(); ns != 0 {
		// A remote secondary's clock: one more than an hour off (skewed, or
		// a forged stamp) would skew the latency figures, and its sum could
		// overflow: the batch is applied, its latency not counted.
		if t := time.Unix(0, ns); t.Sub(p.cfg.Clock.Now()).Abs() < time.Hour {
			first0 = t
		}
	}
	return p.Forward(ctx, Batch{Session: h.GetSession(), Model: h.GetBlob().GetModel(),
		Members: idsFromProto(h.GetIds()), Weights: h.GetWeights(), Sum: sum, FirstAdmitted: first0})
}
