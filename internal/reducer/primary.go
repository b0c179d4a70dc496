package reducer

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/rlhub/rlhub/internal/crashpoint"
	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/kernels"
	"github.com/rlhub/rlhub/internal/optim"
	"github.com/rlhub/rlhub/internal/reduce"
	"github.com/rlhub/rlhub/internal/safetensors"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/tensor"
)

// ModelStore is what the primary needs of the model store: read the
// initial weights and checkpoints, publish new versions.
type ModelStore interface {
	Get(ctx context.Context, name string, version uint64) (*store.Snapshot, error)
	Push(ctx context.Context, req store.PushRequest) (store.Info, error)
}

var _ ModelStore = store.Store(nil)

// modelClaimer is implemented by a ModelStore that records owners
// (store.Owned, the view the hub gives its reducer): Register claims each
// model it reduces, so that no other writer's push can land on it and
// stop the reducer's steps, and releases the claim when it fails after it.
type modelClaimer interface {
	Claim(ctx context.Context, name string) error
	Release(ctx context.Context, name string) error
}

var _ modelClaimer = store.Owned{}

// ModelConfig is what Register needs to reduce gradients for one model.
type ModelConfig struct {
	// Model name; the model must be in the store.
	Model string
	// Optimizer run by the primary.
	Optimizer optim.Config
	// Reduction of each step's gradients; "" means reduce.Mean.
	Reduction reduce.Reduction
	// GradientMax clips the reduced gradient's global L2 norm; 0 disables.
	GradientMax float64
	// Staleness rule applied at admission.
	Staleness reduce.Staleness
	// CheckpointEvery is kept for compatibility with older clients and
	// ignored: with a PrimaryConfig.StateDir the optimizer state is written
	// with every version (docs/durability.md); without one it is kept in
	// memory only. 0 means 100.
	CheckpointEvery uint64
}

func (c *ModelConfig) validate() error {
	if c.Model == "" {
		return fmt.Errorf("%w: reducer: empty model name", errs.ErrInvalid)
	}
	if c.Optimizer.Kind == External { // stepped by an attached host (external.go)
		if err := validateExternal(c.Optimizer); err != nil {
			return err
		}
	} else if err := c.Optimizer.Validate(); err != nil {
		return err
	}
	switch c.Reduction {
	case "":
		c.Reduction = reduce.Mean
	case reduce.Mean, reduce.Sum:
	default:
		return fmt.Errorf("%w: reducer: reduction %q (want sum or mean)", errs.ErrInvalid, c.Reduction)
	}
	if c.GradientMax < 0 || c.GradientMax != c.GradientMax {
		return fmt.Errorf("%w: reducer: gradient_max %v must be ≥ 0", errs.ErrInvalid, c.GradientMax)
	}
	if c.CheckpointEvery == 0 {
		c.CheckpointEvery = 100
	}
	return c.Staleness.Validate()
}

// PrimaryConfig configures the primary reducer.
type PrimaryConfig struct {
	// Store holds the models; required.
	Store ModelStore
	// Epoch is the writer epoch (fencing token) of published versions; 0
	// means the epoch of the version the model was registered at.
	Epoch uint64
	// LedgerWindow: (client, seq) ids remembered per client; 0 means 4096.
	LedgerWindow int
	// LedgerForgetAfter: a client with no claim and no applied gradient for
	// this long, and none pending, is forgotten (reduce.Ledger.ForgetIdle),
	// so that the ledger does not grow with every client id ever seen (a
	// restarted learner takes a new one); 0 means DefaultLedgerForgetAfter,
	// negative never. A retry sent after it would be applied again: the
	// bound is far longer than any client's retry deadline (120 s).
	LedgerForgetAfter time.Duration
	// Clock; nil means the real clock.
	Clock Clock
	// Logger; nil means slog.Default().
	Logger *slog.Logger
	// OnApply, when set, is called after each published step with the
	// model, the new version and the members in reduction order (tests
	// use it to replay the run), once per step, in order. It runs with the
	// model's step lock held, or, on a replicated store (commitStep), in
	// the goroutine that settles the step: it must not call Forward.
	OnApply func(model string, version uint64, members []reduce.ID, weights []float32)
	// StateDir, when set, makes registrations, the exactly-once ledger
	// and optimizer state durable there (docs/durability.md): each step is
	// journaled and its optimizer state written before its version is
	// published, and NewPrimary restores every registration at the
	// store's newest version. "" keeps them in memory only.
	StateDir string
	// JournalCompactBytes: a model's journal is rewritten as one snapshot
	// of the ledger once it grows past this and past twice that snapshot's
	// size when last written; 0 means DefaultJournalCompactBytes, negative
	// never. A cluster standby copies the journal at every step before
	// appending its record, and a full sync and a restart read it whole
	// (docs/cluster.md): this bounds those.
	JournalCompactBytes int64
	// StateChanged, when set, is told every file (or directory) under
	// StateDir that the primary wrote or removed, once it is done and
	// before the push of the version it belongs to (durable.go): a
	// cluster primary's replication ships what is named instead of
	// walking StateDir (replica.Source.Changed). It must not block; nil
	// tells no one.
	StateChanged func(path string)
	// StateAppended, when set, is told instead of StateChanged when a
	// step only appended to the journal: its first from bytes are as they
	// were when last named, so a cluster primary ships the new bytes only
	// (replica.Source.Appended). It must not block; nil: StateChanged.
	StateAppended func(path string, from int64)
	// CrashAt (tests only) SIGKILLs the process at a named point of
	// Register (internal/crashpoint; reducer.New reads
	// RLHUB_TEST_REDUCER_CRASH). Points: "register-claimed", once the
	// model is claimed and before its registration is written.
	CrashAt string
}

// DefaultJournalCompactBytes is PrimaryConfig.JournalCompactBytes's
// default. It was 16 MiB, when a replicated step shipped the whole
// journal (BenchmarkJournalShipping).
const DefaultJournalCompactBytes = 1 << 20

func (c *PrimaryConfig) validate() error {
	if c.Store == nil {
		return errors.New("reducer: PrimaryConfig.Store is required")
	}
	if c.Clock == nil {
		c.Clock = realClock{}
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.JournalCompactBytes == 0 {
		c.JournalCompactBytes = DefaultJournalCompactBytes
	}
	if c.LedgerForgetAfter == 0 {
		c.LedgerForgetAfter = DefaultLedgerForgetAfter
	}
	return nil
}

// DefaultLedgerForgetAfter is PrimaryConfig.LedgerForgetAfter's default.
const DefaultLedgerForgetAfter = time.Hour

// newLedger is a model's exactly-once ledger, noting its clients' use on
// the primary's clock when they may be forgotten.
func (p *Primary) newLedger() *reduce.Ledger {
	l := reduce.NewLedger(p.cfg.LedgerWindow)
	if p.cfg.LedgerForgetAfter > 0 {
		l.SetClock(p.cfg.Clock.Now)
	}
	return l
}

// forgetIdle forgets m's idle clients, at most every eighth of the bound;
// m.mu held.
func (p *Primary) forgetIdle(m *pmodel) {
	if p.cfg.LedgerForgetAfter <= 0 {
		return
	}
	now := p.cfg.Clock.Now()
	if now.Sub(m.swept) < p.cfg.LedgerForgetAfter/8 {
		return
	}
	m.swept = now
	if n := m.ledger.ForgetIdle(now.Add(-p.cfg.LedgerForgetAfter)); n > 0 {
		p.cfg.Logger.Debug("reducer: idle clients forgotten", "model", m.cfg.Model, "clients", n, "left", m.ledger.Clients())
	}
}

// Primary owns each registered model's parameters and optimizer, applies
// forwarded batches and publishes new versions. Safe for concurrent use.
//
// Lock order: pmodel.stepMu, then pmodel.mu, then Primary.mu (Forward and
// Admit check the session while holding the model). Primary.mu guards
// sessions and the model map; pmodel.mu guards one model (its ledger,
// version, counters).
type Primary struct {
	cfg PrimaryConfig

	regMu sync.Mutex // serializes the durable part of Register
	// hostStateMu orders optimizer host states' pushes with their
	// deletes: GuardHostState holds it for reading from its check until
	// the push it let through has landed, dropHostState for writing, so a
	// state checked while its model's life went on lands before the
	// delete that follows the model's, and goes with it.
	hostStateMu sync.RWMutex

	mu       sync.Mutex
	models   map[string]*pmodel
	sessions map[uint64]Secondary // live sessions → who holds them
	// orphans are the claims that were pending, by session, in the
	// registrations dropped since (unregister): a secondary's forward of
	// them is refused, naming why, and its release of them releases them.
	// A session's go when it ends.
	orphans  map[uint64]map[orphan]struct{}
	closed   bool
	closing  chan struct{}  // closed when Close begins (ends publish's retries)
	settling sync.WaitGroup // commitStep's goroutines (settle)
	dropping sync.WaitGroup // unregister's removal of files, waited for by Close
	lat      latencies
	state    *stateDir // nil without StateDir
	crash    *crashpoint.Hook
}

// orphan is a claim pending in a dropped registration (Primary.orphans).
type orphan struct {
	model string
	id    reduce.ID
}

// Secondary names a secondary as clients reach it.
type Secondary struct {
	Addr string // "" for in-process secondaries without an address
	ID   string
}

type pmodel struct {
	cfg    ModelConfig
	layout *tensor.StateDict
	epoch  uint64
	// life is the store's life of the model it was registered in
	// (store.Snapshot.Life): a Delete starts another, and the registration
	// is then stale (dropStale).
	life uint64

	// stepMu serializes steps: it guards params and opt, and is held for a
	// whole step (optimizer, encode, publish) so that admissions, which
	// only need mu, never wait for a step.
	stepMu sync.Mutex
	// params are the newest version's weights, read-only: after the first
	// step they alias the blob last published (owned by the store). Each
	// step writes the next version straight into a blob: a spare one the
	// store gave back, else a fresh one.
	params *tensor.StateDict
	opt    *optim.Optimizer    // nil for an External model
	ext    *extModel           // its host; nil unless External
	plan   *safetensors.Layout // header and tensor order of every blob
	// paramsBlob is the blob params view once a step has published one
	// (guarded by stepMu).
	paramsBlob []byte

	// spare holds version blobs the store gave back (PushRequest.Recycle:
	// dropped from retention, never taken by a reader), newest last; the
	// next steps write into them instead of fresh memory, which costs more
	// than the step itself (docs/benchlog/2026-11-30-sessions-1-4.md, issue 4, session 4).
	// Guarded by spareMu: Recycle runs in whichever push drops a version.
	spareMu sync.Mutex
	spare   [][]byte
	reused  atomic.Uint64 // steps written into a spare blob

	// mu guards the fields below; version is written with stepMu held
	// too, so holding either is enough to read it.
	mu      sync.Mutex
	ledger  *reduce.Ledger
	swept   time.Time // the ledger's last ForgetIdle (forgetIdle)
	version uint64
	// stepped is the newest version committed to the store: version, or
	// on a replicated store (store.Committer) up to maxUnacked versions
	// beyond it whose acknowledgement is awaited (settle). The next step
	// builds on it. Written with stepMu held too.
	stepped uint64
	// publishing is true while stepped+1 is being published: it may
	// already be visible in the store, so admissions accept it as a base.
	publishing bool
	// acks close, oldest first, as the steps committed and not yet
	// settled are settled (at most maxUnacked); guarded by stepMu.
	acks []chan struct{}
	// due are the steps settled whose files.published is still to run
	// (under stepMu: by the next step, or Close).
	due      []dueStep
	counters reduce.Counters
	failed   error // a publish failed: the model refuses forwards
	// steps mirrors opt.Steps() for Stats (opt is guarded by stepMu).
	steps uint64
	// stateErr: why the optimizer state was not recovered ("" if it was).
	// Set before the model is visible, never changed.
	stateErr string
	// files are the model's durable state (nil without StateDir); used
	// with stepMu held.
	files *modelFiles
}

// NewPrimary returns a primary. With a StateDir it restores every
// registration found there at the store's newest version of its model
// (restoreAll); without one it starts with no models.
func NewPrimary(cfg PrimaryConfig) (*Primary, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	p := &Primary{cfg: cfg, models: map[string]*pmodel{}, sessions: map[uint64]Secondary{}, lat: newLatencies(4096),
		closing: make(chan struct{}), crash: crashpoint.Parse(cfg.CrashAt)}
	if cfg.StateDir != "" {
		d, err := openStateDir(cfg.StateDir, cfg.JournalCompactBytes, cfg.Logger, cfg.StateChanged, cfg.StateAppended)
		if err != nil {
			return nil, err
		}
		if cfg.LedgerForgetAfter > 0 {
			d.now, d.forgetAfter = cfg.Clock.Now, cfg.LedgerForgetAfter
		}
		p.state = d
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := p.restoreAll(ctx); err != nil {
			_ = p.Close()
			return nil, err
		}
	}
	return p, nil
}

// Register starts reducing for a model, from its newest version in the
// store, with a fresh optimizer. With a StateDir the registration is on
// disk before Register returns, and a restarted primary restores it by
// itself (NewPrimary). It returns the version it starts from and the
// optimizer's step count (0 for a new registration). A second Register
// with an equal config is a no-op returning the current version and step
// count (so a client re-registering after a hub restart carries on); with
// a different one it fails with errs.ErrExists. A registration whose model
// was deleted from the store since is neither: it is dropped (dropStale)
// and this one starts afresh. A Register that fails after claiming the
// model releases the claim.
//
// On a cluster (the store is a store.Acknowledger) Register returns once
// the registration is acknowledged as a publish is: every file it wrote
// is on the standbys a publish waits for, so a primary killed after it
// returned leaves a successor that has it. A repeated Register waits for
// that too (an earlier one may have failed after writing its files).
func (p *Primary) Register(ctx context.Context, mc ModelConfig) (version, steps uint64, err error) {
	version, steps, err = p.register(ctx, mc)
	if err != nil {
		return 0, 0, err
	}
	if ack, ok := store.AsAcknowledger(p.cfg.Store); ok {
		if err := p.reacknowledge(ctx, mc.Model, version, ack.Acknowledge(ctx, mc.Model, version)); err != nil {
			return 0, 0, fmt.Errorf("reducer: register %s: %w", errs.Quote(mc.Model), err)
		}
	}
	return version, steps, nil
}

func (p *Primary) register(ctx context.Context, mc ModelConfig) (version, steps uint64, err error) {
	if err := mc.validate(); err != nil {
		return 0, 0, err
	}
	// Registrations are serialized by regMu, from the check for one
	// already there to the model in the map: two racing ones cannot both
	// write the model's files, and one that fails after its claim can
	// release it, since no registration of the model holds it.
	p.regMu.Lock()
	defer p.regMu.Unlock()
	// A registration of the model deleted since (and maybe pushed again)
	// is not returned, nor does it refuse another config: it is dropped,
	// and this one starts afresh.
	p.dropStale(ctx, mc.Model)
	if m, ok, err := p.registered(mc); ok || err != nil {
		return m.version, m.steps, err
	}
	snap, err := p.cfg.Store.Get(ctx, mc.Model, 0)
	if err != nil {
		return 0, 0, fmt.Errorf("reducer: register %s: %w", errs.Quote(mc.Model), err)
	}
	m, err := p.newModel(mc, snap)
	if err != nil {
		return 0, 0, err
	}
	if c, ok := p.cfg.Store.(modelClaimer); ok {
		// Claimed only once the model is in the store and reducible: a
		// registration refused (not pushed yet, not F32) leaves its owner
		// as it was, else its writer's pushes would be refused for a
		// reducer that does not reduce it. On a cluster a claim committed
		// but not acknowledged is acknowledged again (as a step's publish
		// is) rather than failing the registration while a standby
		// catches up.
		if err := p.reacknowledge(ctx, mc.Model, 0, c.Claim(ctx, mc.Model)); err != nil {
			if errors.Is(err, store.ErrNotAcknowledged) { // committed here
				p.releaseClaim(ctx, c, mc.Model)
			}
			return 0, 0, fmt.Errorf("reducer: register %s: %w", errs.Quote(mc.Model), err)
		}
		// From here a registration that fails releases the claim: kept,
		// the model's writers' pushes would be refused for a reducer that
		// does not reduce it, until a restart (restoreAll) released it.
		defer func() {
			if err != nil {
				p.releaseClaim(ctx, c, mc.Model)
			}
		}()
		// Another writer's push may have landed before the claim: start
		// from the version the claim now keeps (a step's push expects it),
		// or the model deleted and pushed again from the same version.
		now, err := p.cfg.Store.Get(ctx, mc.Model, 0)
		if err != nil {
			return 0, 0, fmt.Errorf("reducer: register %s: %w", errs.Quote(mc.Model), err)
		}
		if now.Version != snap.Version || now.Life() != snap.Life() {
			if m, err = p.newModel(mc, now); err != nil {
				return 0, 0, err
			}
			snap = now
		}
		p.crash.At("register-claimed")
	}
	if p.state != nil { // an external model's optimizer state is its host's; its registration and journal are here
		reg := registration{Format: registrationFmt, Model: mc.Model, Config: mc, StartVersion: snap.Version, Registered: time.Now().UTC()}
		if m.files, err = p.state.create(reg, p.cfg.LedgerWindow); err != nil {
			return 0, 0, err
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		if m.files != nil {
			_ = m.files.close()
		}
		return 0, 0, fmt.Errorf("%w: reducer primary is closed", errs.ErrUnavailable)
	}
	p.models[mc.Model] = m
	return snap.Version, 0, nil
}

// registered returns the model registered as mc.Model (its version and
// steps), ok false when there is none; errs.ErrExists when its config
// differs.
func (p *Primary) registered(mc ModelConfig) (struct{ version, steps uint64 }, bool, error) {
	var out struct{ version, steps uint64 }
	p.mu.Lock()
	m, ok := p.models[mc.Model]
	p.mu.Unlock()
	if !ok {
		return out, false, nil
	}
	if m.cfg != mc {
		return out, true, fmt.Errorf("%w: model %q is registered with another config", errs.ErrExists, mc.Model)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	out.version, out.steps = m.version, m.steps
	return out, true, nil
}

// newModel builds a model's state at snap with a fresh optimizer.
func (p *Primary) newModel(mc ModelConfig, snap *store.Snapshot) (*pmodel, error) {
	params := snap.Tensors.Clone()
	for _, t := range params.Tensors() {
		if t.DType != tensor.F32 {
			return nil, fmt.Errorf("%w: reducer: model %q tensor %q is %v; only F32 models are reduced", errs.ErrInvalid, mc.Model, t.Name, t.DType)
		}
	}
	var opt *optim.Optimizer
	var ext *extModel
	if mc.Optimizer.Kind == External { // stepped by an attached host (external.go)
		ext = newExtModel()
	} else {
		var err error
		if opt, err = optim.New(mc.Optimizer, params); err != nil {
			return nil, err
		}
	}
	epoch := p.cfg.Epoch
	if epoch == 0 {
		epoch = snap.Epoch
	}
	plan, err := safetensors.Plan(params, nil)
	if err != nil {
		return nil, fmt.Errorf("reducer: register %q: %w", mc.Model, err)
	}
	return &pmodel{cfg: mc, layout: params, params: params, opt: opt, ext: ext, plan: plan,
		ledger: p.newLedger(), version: snap.Version, stepped: snap.Version, epoch: epoch, life: snap.Life()}, nil
}

// releaseClaim gives up the claim of a registration of name that failed
// after it (regMu held: no registration of name holds the claim). A
// release that fails is logged: the model's writers' pushes are refused
// until a restart releases it (restoreAll) or it is deleted.
func (p *Primary) releaseClaim(ctx context.Context, c modelClaimer, name string) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	err := c.Release(rctx, name)
	cancel()
	if err != nil && !errors.Is(err, store.ErrNotAcknowledged) { // not acknowledged: committed here, replicated with the next write
		p.cfg.Logger.Warn("reducer: a registration failed and cannot release its model's claim; the model's writers' pushes are refused until the hub restarts, or it is deleted",
			"model", name, "err", err)
	}
}

// Deleted drops the registration of model, which an administrator deleted
// from the store (the hub calls it once the Delete is done, through
// Service.ModelDeleted): see dropStale. A registration of the model
// registered again since the Delete is kept.
//
// Unless the model is registered again, its optimizer host's state (the
// companion model HostStateSuffix) is deleted with it (dropHostState). On
// a cluster (the store is a store.Acknowledger) Deleted returns once the
// drop is acknowledged as a registration is: a primary killed after the
// Delete returned leaves a successor without the registration (otherwise
// it came back there, until a restore or Register dropped it again).
func (p *Primary) Deleted(ctx context.Context, model string) {
	p.regMu.Lock()
	defer p.regMu.Unlock()
	dropped := p.dropStale(ctx, model)
	p.mu.Lock()
	_, registered := p.models[model]
	p.mu.Unlock()
	if !registered {
		p.dropHostState(ctx, model)
	}
	if ack, ok := store.AsAcknowledger(p.cfg.Store); ok && dropped {
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
		err := p.reacknowledge(actx, model, 0, ack.Acknowledge(actx, model, 0))
		cancel()
		if err != nil {
			p.cfg.Logger.Warn("reducer: the drop of a deleted model's registration is not acknowledged; a failover now may bring the registration back until its model is registered again",
				"model", model, "err", err)
		}
	}
}

// dropHostState deletes the optimizer host state of name (the companion
// model name+HostStateSuffix, docs/optimizer-host.md), whose model was
// deleted: kept, a host of the model pushed again found the deleted
// model's states at the new model's versions (refused as lost, their
// weights' digest another's, or resumed from), and its own checkpoints
// there were refused as stale. regMu held and name not registered: no
// host is sent a step of the model until the next Register, but one of
// the deleted model in the middle of a step may still checkpoint it;
// GuardHostState refuses that checkpoint from now on, and one it let
// through before has landed (hostStateMu), so it is deleted here. A
// store that cannot delete keeps it.
func (p *Primary) dropHostState(ctx context.Context, name string) {
	var s any = p.cfg.Store
	if o, ok := s.(store.Owned); ok {
		s = o.Store
	}
	d, ok := s.(store.Deleter)
	if !ok {
		return
	}
	companion := name + HostStateSuffix
	p.hostStateMu.Lock()
	defer p.hostStateMu.Unlock()
	if _, err := p.storeLife(ctx, companion); err != nil {
		return // none (never checkpointed, or no such name), or unreadable: left as it is
	}
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	err := d.Delete(dctx, companion)
	cancel()
	switch {
	case err == nil:
		p.cfg.Logger.Info("reducer: the optimizer host state of a deleted model is deleted with it", "model", name, "host_state", companion)
	case errors.Is(err, errs.ErrNotFound):
	default:
		p.cfg.Logger.Warn("reducer: cannot delete the optimizer host state of a deleted model; a host of the model pushed again may refuse it as lost (delete it: rlhub model rm)",
			"model", name, "host_state", companion, "err", err)
	}
}

// dropStale drops the registration of name when the store's model is not
// the one it was registered in: deleted since (store.Deleter; only a
// Delete takes the reducer's claim), and maybe pushed again by another
// writer. Its steps would be refused (they land only on a model the
// reducer still owns), a Register would return it, and one with another
// config would be refused, until a restart (restoreAll). When the store
// cannot tell, the registration is kept. An external model's host state
// goes with it (dropHostState). It reports whether it dropped one. regMu
// held.
func (p *Primary) dropStale(ctx context.Context, name string) bool {
	p.mu.Lock()
	m := p.models[name]
	p.mu.Unlock()
	if m == nil {
		return false
	}
	life, err := p.storeLife(ctx, name)
	switch {
	case errors.Is(err, errs.ErrNotFound): // deleted
	case err != nil:
		p.cfg.Logger.Warn("reducer: cannot tell whether a registered model was deleted; its registration is kept", "model", name, "err", err)
		return false
	case life == m.life:
		return false
	}
	if !p.unregister(m) {
		return false
	}
	if m.ext != nil {
		p.dropHostState(ctx, name)
	}
	return true
}

// storeLife returns the life of the store's model name
// (store.Snapshot.Life), without reading it when the store can tell
// (store.LifeReader).
func (p *Primary) storeLife(ctx context.Context, name string) (uint64, error) {
	var s any = p.cfg.Store
	if o, ok := s.(store.Owned); ok {
		s = o.Store
	}
	if lr, ok := s.(store.LifeReader); ok {
		_, life, err := lr.NewestLife(name)
		return life, err
	}
	snap, err := p.cfg.Store.Get(ctx, name, 0)
	if err != nil {
		return 0, err
	}
	return snap.Life(), nil
}

// unregister drops m's registration, stale (dropStale): it leaves the
// model map (admissions, forwards and Describe of the name answer
// NOT_FOUND, or reach a registration made since, whose ledger holds none
// of m's claims, so no gradient admitted for m is applied to it), stops
// taking gradients, detaches its optimizer host, ends a step waiting for
// one, and once its steps in progress have ended (refused: the store's
// model is not the reducer's) its files are removed from the state
// directory for good and named (PrimaryConfig.StateChanged), as restore
// drops a stale registration. It reports false when the primary is
// closing (the registration is left to the next restore). regMu held.
func (p *Primary) unregister(m *pmodel) bool {
	name := m.cfg.Model
	why := fmt.Errorf("%w: model %s was deleted from the store: its registration is dropped (register the model again to reduce it)", errs.ErrAborted, errs.Quote(name))
	p.mu.Lock()
	if p.closed || p.models[name] != m {
		// Closing: the registration stays on disk, and the next restore
		// drops it (its model is another, or not in the store).
		p.mu.Unlock()
		return false
	}
	delete(p.models, name) // out of the map, Close no longer closes m.ext.stop: closed below
	p.dropping.Add(1)
	sessions := slices.Collect(maps.Keys(p.sessions))
	p.mu.Unlock()
	defer p.dropping.Done()
	// Admissions stop (failed), and the claims pending become orphans: the
	// secondaries holding them learn why at their forward.
	m.mu.Lock()
	if m.failed == nil {
		m.failed = why
	}
	version := m.version
	pending := make(map[uint64][]reduce.ID, len(sessions))
	for _, sess := range sessions {
		if ids := m.ledger.EndSession(sess); len(ids) > 0 {
			pending[sess] = ids
		}
	}
	m.mu.Unlock()
	p.mu.Lock()
	for sess, ids := range pending {
		if _, live := p.sessions[sess]; !live {
			continue
		}
		if p.orphans == nil {
			p.orphans = map[uint64]map[orphan]struct{}{}
		}
		if p.orphans[sess] == nil {
			p.orphans[sess] = map[orphan]struct{}{}
		}
		for _, id := range ids {
			p.orphans[sess][orphan{name, id}] = struct{}{}
		}
	}
	p.mu.Unlock()
	if m.ext != nil {
		// The host learns why before its step's wait ends: woken first,
		// the step failed "primary closed" and the host was detached
		// with that instead of the delete.
		m.ext.end(why)
		close(m.ext.stop)
	}
	m.stepMu.Lock()
	m.awaitAcks(0)
	var err error
	if m.files != nil {
		err = errors.Join(m.files.close(), p.state.drop(m.files.dir))
	}
	m.stepMu.Unlock()
	if err != nil {
		p.cfg.Logger.Error("reducer: the registration of a deleted model is dropped, but its files cannot be removed; the next restart or registration of the model removes them",
			"model", name, "err", err)
	}
	p.cfg.Logger.Warn("reducer: registration dropped: its model was deleted from the store; register it again to reduce it", "model", name, "version", version)
	return true
}

// restoreAll restores every registration in the state directory. A
// registration that cannot be restored at all (its model is not in the
// store, its file is unreadable) is logged at ERROR and left on disk; the
// model answers NOT_FOUND until it is registered again. One whose
// optimizer state cannot be recovered is restored with a fresh optimizer
// and its StateError set (reducer stats, and the log at ERROR).
//
// On a store that records owners (the hub's store.Owned view) the owners
// are checked against the registrations: one whose model is no longer the
// reducer's (deleted since, and pushed again by another writer) is stale,
// and is dropped; a model the reducer owns with no registration (a
// Register killed between its claim and its registration) is released.
func (p *Primary) restoreAll(ctx context.Context) error {
	dirs, err := p.state.registrations()
	if err != nil {
		return err
	}
	owned, owners := p.modelOwners(ctx)
	for _, dir := range dirs {
		if err := p.restoreOne(ctx, dir, owned.Owner, owners); err != nil {
			p.cfg.Logger.Error("reducer: registration not restored; push its model again or register it again", "dir", dir, "err", err)
		}
	}
	for name, owner := range owners {
		if owner != owned.Owner || p.state.registered(name) {
			continue
		}
		// Register claims the model before it writes the registration: a
		// kill in between left a model no one reduces whose writer's
		// pushes are refused. No Register runs before NewPrimary returns,
		// so none is between the two now.
		rctx, cancel := context.WithTimeout(ctx, releaseTimeout)
		err := owned.Release(rctx, name)
		cancel()
		if err != nil && !errors.Is(err, store.ErrNotAcknowledged) { // not acknowledged: committed here, replicated with the next write
			p.cfg.Logger.Warn("reducer: cannot release a model the reducer owns with no registration; register it, or delete it", "model", name, "err", err)
			continue
		}
		p.cfg.Logger.Warn("reducer: released a model the reducer owned with no registration (a registration interrupted before it was written); its writers' pushes land again", "model", name)
	}
	return nil
}

// releaseTimeout bounds restore's release of a model (restoreAll): on a
// cluster it waits for the standbys, which may not follow this hub yet.
const releaseTimeout = 5 * time.Second

// modelOwners returns the owner view the primary writes through and each
// model's owner as the store records it. owners is nil when the store
// records no owners the primary can read (it is not an owner view of a
// store.Claimer, so Register claims nothing) or cannot list them: restore
// then checks no owner.
func (p *Primary) modelOwners(ctx context.Context) (owned store.Owned, owners map[string]string) {
	owned, ok := p.cfg.Store.(store.Owned)
	if !ok || owned.Owner == "" {
		return owned, nil
	}
	if _, ok := owned.Store.(store.Claimer); !ok {
		return owned, nil
	}
	infos, err := owned.List(ctx)
	if err != nil {
		p.cfg.Logger.Warn("reducer: cannot read the models' owners; registrations are restored unchecked", "err", err)
		return owned, nil
	}
	owners = make(map[string]string, len(infos))
	for _, in := range infos {
		owners[in.Name] = in.Owner
	}
	return owned, owners
}

// restoreOne restores the registration in dir. With owners (the models'
// owners, modelOwners) a registration of a model in the store that self
// does not own is dropped.
func (p *Primary) restoreOne(ctx context.Context, dir, self string, owners map[string]string) error {
	reg, err := readRegistration(dir)
	if err != nil {
		return err
	}
	mc := reg.Config
	if err := mc.validate(); err != nil {
		return fmt.Errorf("registration of %q: %w", reg.Model, err)
	}
	snap, err := p.cfg.Store.Get(ctx, mc.Model, 0)
	if err != nil {
		return fmt.Errorf("registration of %q: %w", reg.Model, err)
	}
	if owner := owners[mc.Model]; owners != nil && owner != self {
		// Only a Delete takes the reducer's claim: the model was deleted
		// since it was registered, and pushed again by another writer.
		// Its steps would be refused (they land only on a model the
		// reducer still owns), stopping the model at every restart; a
		// new Register starts afresh.
		if err := p.state.drop(dir); err != nil {
			return fmt.Errorf("registration of %q, whose model is not the reducer's (deleted since, and pushed again?): cannot remove it: %w", reg.Model, err)
		}
		p.cfg.Logger.Error("reducer: registration dropped: its model was deleted since it was registered, and pushed again by another writer; register it again to reduce it",
			"model", mc.Model, "owner", truncate(owner, 128), "version", snap.Version)
		if mc.Optimizer.Kind == External {
			p.dropHostState(ctx, mc.Model) // no Register runs before NewPrimary returns
		}
		return nil
	}
	m, err := p.newModel(mc, snap)
	if err != nil {
		return err
	}
	r, err := p.state.restore(dir, reg, snap.Version, p.cfg.LedgerWindow)
	if err != nil {
		return fmt.Errorf("registration of %q: %w", reg.Model, err)
	}
	m.files, m.ledger = r.files, r.ledger
	if p.cfg.LedgerForgetAfter > 0 {
		m.ledger.SetClock(p.cfg.Clock.Now) // the restored clients are idle from now
	}
	problems := r.problems
	switch {
	case m.ext != nil:
		// The host keeps its optimizer state in the store (external.go);
		// the journal has the host steps published so far.
		m.steps = r.steps
		if snap.Version != reg.StartVersion && m.steps == 0 {
			problems = append(problems, fmt.Sprintf("the journal has no host step for version %d", snap.Version))
		}
	case r.meta != nil:
		if err := m.opt.Restore(r.state, r.meta); err != nil {
			problems = append(problems, fmt.Sprintf("optimizer state of version %d cannot be restored (it does not fit the registration, or is damaged): %v", snap.Version, err))
			m.opt, _ = optim.New(mc.Optimizer, m.params)
		} else if prev := r.meta["reducer.state_error"]; prev != "" {
			problems = append(problems, "earlier: "+prev)
		}
	case snap.Version == reg.StartVersion && r.steps == 0:
		// No step since the registration: a fresh optimizer is exact.
	default:
		problems = append(problems, fmt.Sprintf("no optimizer state for version %d, the store's newest", snap.Version))
	}
	if m.opt != nil {
		m.steps = uint64(m.opt.Steps())
	}
	if len(problems) > 0 {
		m.stateErr = truncate(strings.Join(problems, "; "), 2048)
		if m.opt != nil && m.opt.Steps() == 0 && snap.Version != reg.StartVersion {
			m.stateErr += "; the optimizer restarted from step 0"
		}
		p.cfg.Logger.Error("reducer: optimizer state of a restored registration is not exact", "model", mc.Model,
			"version", snap.Version, "problem", m.stateErr)
	} else {
		p.cfg.Logger.Info("reducer: registration restored", "model", mc.Model, "version", snap.Version, "optimizer_steps", m.steps)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.models[mc.Model] = m
	return nil
}

func (p *Primary) model(name string) (*pmodel, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	m, ok := p.models[name]
	if !ok {
		return nil, fmt.Errorf("%w: model %s is not registered with the reducer", errs.ErrNotFound, errs.Quote(name))
	}
	return m, nil
}

// Attach opens a session for a secondary. In process a session is never
// lost on its own (done is nil); it ends with Detach.
func (p *Primary) Attach(_ context.Context, s Secondary) (session uint64, done <-chan struct{}, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return 0, nil, fmt.Errorf("%w: reducer primary is closed", errs.ErrUnavailable)
	}
	var id uint64
	for taken := true; id == 0 || taken; {
		id = newSession()
		_, taken = p.sessions[id]
	}
	p.sessions[id] = s
	return id, nil, nil
}

// newSession is a random session id. Not a counter: a counter restarts at
// 1 with the primary, and a secondary that has not yet noticed its old
// session ended would claim under another secondary's; and a session id is
// all that Admit, Release and Forward name, so it must not be guessable by
// another client holding the same role.
func newSession() uint64 {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return binary.LittleEndian.Uint64(b[:])
}

// Detach ends a session: its unapplied claims are released (and counted
// dropped as lost, since the secondary holding them is gone, unless they
// were counted lost once already), and its later forwards are refused.
// Lost is provisional: Forward takes a lost gradient back when a retry of
// it is applied. Safe to call for an ended session.
func (p *Primary) Detach(session uint64) {
	p.mu.Lock()
	_, live := p.sessions[session]
	delete(p.sessions, session)
	delete(p.orphans, session)
	models := slices.Collect(maps.Values(p.models))
	p.mu.Unlock()
	if !live {
		return
	}
	var n uint64
	for _, m := range models {
		m.mu.Lock()
		k := uint64(len(m.ledger.EndSession(session)))
		m.counters.Drop(reduce.ReasonLost, k)
		m.mu.Unlock()
		n += k
	}
	if n > 0 {
		p.cfg.Logger.Warn("reducer: secondary session ended with gradients in flight", "session", session, "lost", n)
	}
}

func (p *Primary) liveSession(session uint64) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.sessions[session]; !ok {
		return fmt.Errorf("%w: reducer session %d has ended", errs.ErrAborted, session)
	}
	return nil
}

// Secondaries lists the attached secondaries, sorted by address and id.
func (p *Primary) Secondaries() []Secondary {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := slices.Collect(maps.Values(p.sessions))
	sort.Slice(out, func(i, j int) bool {
		if out[i].Addr != out[j].Addr {
			return out[i].Addr < out[j].Addr
		}
		return out[i].ID < out[j].ID
	})
	return out
}

// Layout is a registered model's tensor layout and current version.
type Layout struct {
	Tensors *tensor.StateDict // names, dtypes, shapes; data must not be read
	Version uint64
}

// Describe returns a model's layout (errs.ErrNotFound when unregistered).
func (p *Primary) Describe(_ context.Context, model string) (Layout, error) {
	m, err := p.model(model)
	if err != nil {
		return Layout{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return Layout{Tensors: m.layout, Version: m.version}, nil
}

// Admit claims id for session and applies the staleness rule, returning the
// gradient's weight and the current version. life is the life of version
// base (store.Snapshot.Life; 0: unknown): a gradient of another life than
// the registered model's was computed on a model deleted since, and is
// refused (errs.StaleError) even when its version is current.
func (p *Primary) Admit(_ context.Context, session uint64, model string, id reduce.ID, base, life uint64) (float32, uint64, error) {
	if err := reduce.CheckClientID(id.Client); err != nil { // a remote secondary's Admit
		return 0, 0, err
	}
	m, err := p.model(model)
	if err != nil {
		return 0, 0, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	// Checked with m.mu held, like Forward: Detach releases claims under
	// m.mu after removing the session, so no claim outlives its session.
	if err := p.liveSession(session); err != nil {
		return 0, 0, err
	}
	if m.failed != nil {
		// The model takes no more steps (a publish failed): a gradient
		// admitted now would be acknowledged, then lost at its forward.
		return 0, m.version, fmt.Errorf("%w: model %s: %v", errs.ErrUnavailable, errs.Quote(model), m.failed)
	}
	if store.OtherLife(life, m.life) {
		// Lives change only when the model is deleted and pushed again
		// (not at a restart or a failover: docs/store.md), so the model
		// the gradient was computed on is gone: its version numbers say
		// nothing about this one's weights.
		return 0, m.version, &errs.StaleError{Model: model, CurrentVersion: m.version, CurrentEpoch: m.epoch,
			Reason: fmt.Sprintf("gradient on version %d of life %d, but the registered model is life %d: the model was deleted and pushed again since that version was pulled; pull again", base, life, m.life)}
	}
	cur := m.version
	if base > cur && (base <= m.stepped || m.publishing && base == m.stepped+1) {
		cur = base // a client already saw a version being published or acknowledged
	}
	w, err := m.cfg.Staleness.Weigh(model, base, cur, m.epoch)
	if err != nil {
		return 0, m.version, err
	}
	if err := m.ledger.Claim(id, session); err != nil {
		return 0, m.version, err
	}
	// The version the gradient was admitted at is the one it was weighed
	// against: a client that already saw the version being published
	// must not be told the one before (seen in CI as a push answered with
	// the version before the one its client had pulled).
	return w, cur, nil
}

// Release gives back session's claims on ids (gradients it will not
// forward) and returns how many it released: the secondary counts those as
// dropped; claims no longer pending under session were already released
// (and counted lost) when the session ended.
func (p *Primary) Release(_ context.Context, session uint64, model string, ids []reduce.ID) (int, error) {
	ids, n := p.releaseOrphans(session, model, ids)
	if len(ids) == 0 {
		return n, nil
	}
	m, err := p.model(model)
	if err != nil {
		// Not registered (its registration dropped): its pending claims
		// were orphans, released above, and the rest were settled. Nothing
		// is held; an error made the secondary retry for nothing.
		return n, nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, id := range ids {
		if m.ledger.Release(id, session) {
			n++
		}
	}
	return n, nil
}

// releaseOrphans releases session's orphans (claims of a dropped
// registration of model) among ids: it returns the other ids and how many
// it released.
func (p *Primary) releaseOrphans(session uint64, model string, ids []reduce.ID) (rest []reduce.ID, n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	o := p.orphans[session]
	if len(o) == 0 {
		return ids, 0
	}
	for _, id := range ids {
		k := orphan{model, id}
		if _, ok := o[k]; ok {
			delete(o, k)
			n++
		} else {
			rest = append(rest, id)
		}
	}
	if len(o) == 0 {
		delete(p.orphans, session)
	}
	return rest, n
}

// checkOrphans refuses a batch with a member admitted for a registration
// of model dropped since (its model deleted: unregister): its gradients
// were computed on the deleted model, and must not be applied to a model
// registered since.
func (p *Primary) checkOrphans(session uint64, model string, ids []reduce.ID) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	o := p.orphans[session]
	if len(o) == 0 {
		return nil
	}
	for _, id := range ids {
		if _, ok := o[orphan{model, id}]; ok {
			return fmt.Errorf("%w: gradient %v was admitted for the registration of model %s, dropped since when the model was deleted from the store; it is not applied", errs.ErrAborted, id, errs.Quote(model))
		}
	}
	return nil
}

// Batch is one reduced batch forwarded by a secondary.
type Batch struct {
	Session uint64
	Model   string
	Members []reduce.ID
	Weights []float32
	// Sum of the weighted gradients; the primary reads it during Forward
	// and modifies it in place (mean, clipping), keeping no reference.
	Sum *tensor.StateDict
	// FirstAdmitted is when its first member was admitted (latency).
	FirstAdmitted time.Time
	// SumFinite: the sender knows every element of Sum is finite (an
	// in-process secondary: it checked each member on receipt and its
	// batch's adds checked that no sum overflowed, reduce.Batch.SumFinite).
	// The primary then skips its own NaN/Inf pass unless it clips (the
	// clipping norm is that check anyway). Never set from the network.
	SumFinite bool
}

// Forward applies a batch as one optimizer step and publishes version+1.
// Before anything changes it checks that the sum matches the model and is
// finite, the session is live and every member is pending under it; on
// failure it returns an error and the model is unchanged (b.Sum may have
// been scaled by the reduction). The members are settled
// as applied before the step, so they can never be applied again even if
// the publish fails (then they count as dropped, publish_failed, and the
// model refuses further forwards until the reducer restarts). On a
// cluster a publish that is not acknowledged is carried through within
// the term instead (publish), and Forward returns once the step's version
// is committed on the primary: its acknowledgement is awaited apart
// (commitStep), while the next batch is stepped and committed, and the
// batch's gradients count as applied once it is acknowledged.
func (p *Primary) Forward(ctx context.Context, b Batch) (uint64, error) {
	if err := p.checkOrphans(b.Session, b.Model, b.Members); err != nil {
		return 0, err
	}
	m, err := p.model(b.Model)
	if err != nil {
		return 0, err
	}
	if len(b.Members) == 0 || len(b.Members) != len(b.Weights) {
		return 0, fmt.Errorf("%w: batch of %d members and %d weights", errs.ErrInvalid, len(b.Members), len(b.Weights))
	}
	if err := reduce.CheckLayout(m.layout, b.Sum); err != nil {
		return 0, err
	}
	// The reduction and the global norm need only the batch (its sum is
	// ours to modify), so they run before the model is touched. One pass
	// computes the norm for clipping and checks the sum is finite: the sum
	// of squares of finite float32s cannot overflow a float64, so a NaN or
	// Inf norm means a NaN or Inf element (an overflowing sum). Without
	// clipping, a sum its in-process sender vouches for needs no pass.
	m.cfg.Reduction.Finish(b.Sum, len(b.Members))
	var norm float64
	if m.cfg.GradientMax > 0 || !b.SumFinite {
		norm = reduce.GlobalNorm(b.Sum)
	}
	if math.IsNaN(norm) || math.IsInf(norm, 0) {
		_, err := reduce.CheckGradient(m.layout, b.Sum) // names the element
		if err == nil {
			err = fmt.Errorf("%w: reduced batch has norm %v", errs.ErrInvalid, norm)
		}
		return 0, err
	}
	m.mu.Lock()
	if m.failed != nil {
		m.mu.Unlock()
		return 0, fmt.Errorf("%w: model %q: %v", errs.ErrUnavailable, b.Model, m.failed)
	}
	// Session liveness and the ledger are checked with m.mu held, and
	// Detach takes m.mu to release claims: a batch is either settled here
	// or its claims are released, never both.
	if err := p.liveSession(b.Session); err != nil {
		m.mu.Unlock()
		return 0, err
	}
	if err := m.ledger.CheckPending(b.Members, b.Session); err != nil {
		m.mu.Unlock()
		return 0, err
	}
	// A retry of a gradient counted lost is applied: it is not lost.
	m.counters.Revive(reduce.ReasonLost, uint64(m.ledger.MarkApplied(b.Members)))
	p.forgetIdle(m)
	m.mu.Unlock()
	n := uint64(len(b.Members))

	// The members are settled: the step is committed to and must not be
	// abandoned because the forwarding secondary went away (its Forward
	// stream's context ends when its process dies), or the model would
	// stop taking gradients from every other secondary.
	ctx = context.WithoutCancel(ctx)
	m.stepMu.Lock()
	defer m.stepMu.Unlock()
	failAs := func(reason reduce.Reason, err error) (uint64, error) {
		m.mu.Lock()
		m.counters.Drop(reason, n)
		if m.failed == nil {
			m.failed = err
		}
		m.mu.Unlock()
		if m.ext != nil {
			m.ext.fail(b.Model, err)
		}
		p.mu.Lock()
		dropped := p.models[b.Model] != m
		p.mu.Unlock()
		if dropped { // its model deleted (unregister logs it): nothing more to stop
			p.cfg.Logger.Info("reducer: a step of a dropped registration ended unpublished", "model", b.Model, "gradients", n, "err", err)
		} else {
			p.cfg.Logger.Error("reducer: step failed; model stops taking gradients", "model", b.Model, "err", err)
		}
		return 0, fmt.Errorf("reducer: model %q: %w", b.Model, err)
	}
	fail := func(err error) (uint64, error) { return failAs(reduce.ReasonPublish, err) }
	m.mu.Lock()
	failed := m.failed
	m.mu.Unlock()
	if failed != nil { // an earlier step failed while this one waited
		return fail(failed)
	}
	p.publishDue(m)
	reduce.ClipNorm(b.Sum, m.cfg.GradientMax, norm)
	var blob []byte
	var dst *tensor.StateDict
	if m.ext != nil {
		if blob, dst, err = p.externalStep(ctx, m, m.stepped, m.steps, b.Sum); err != nil {
			return fail(err)
		}
	} else {
		blob, dst = m.newBlob()
		if err := m.opt.StepTo(dst, m.params, b.Sum); err != nil {
			return fail(err)
		}
		// Finite gradients can still overflow a step (SGD's p − lr·g past
		// float32's range, Adam's second moment, centered RMSprop's
		// Inf − Inf). Such weights are never published; the optimizer's
		// state changed in place, so the model stops, before anything of
		// the step is on disk: a restart resumes from this version.
		if what := nonFinite(dst, m.opt); what != "" {
			return failAs(reduce.ReasonStepNonFinite, fmt.Errorf("%w: the step from version %d made %s non-finite (gradients too large for the optimizer's settings: clip them with gradient_max); the model stops at version %d, which a restart of the hub resumes from", errs.ErrInvalid, m.stepped, what, m.stepped))
		}
	}
	next := m.stepped + 1
	committer, pipelined := store.AsCommitter(p.cfg.Store)
	pipelined = pipelined && m.ext == nil
	if pipelined {
		// At most maxUnacked steps await their acknowledgement: this one
		// commits once the oldest of them is settled.
		m.awaitAcks(maxUnacked - 1)
		m.mu.Lock()
		failed := m.failed
		m.mu.Unlock()
		if failed != nil { // a step before this one failed to settle
			return fail(failed)
		}
	}
	if m.files != nil {
		// Durable before it is published: a kill after the push finds
		// the state that produced next on disk.
		steps := m.steps + 1 // the host's step
		if m.opt != nil {
			steps = uint64(m.opt.Steps())
		}
		if err := m.files.commit(next, steps, b.Members, b.Weights, m.opt, m.stateErr); err != nil {
			return fail(fmt.Errorf("persisting step %d failed: %w", next, err))
		}
	}
	m.mu.Lock()
	m.publishing = true
	m.mu.Unlock()
	// Owned: the model claimed at its registration, deleted since and
	// pushed again from version 1 by someone else, is another model;
	// the step must not land on it as its next version.
	req := store.PushRequest{Name: b.Model, Version: next, Expect: m.stepped, Epoch: m.epoch, Owned: true, Blob: blob, Recycle: m.giveSpare}
	if pipelined {
		return p.commitStep(ctx, m, committer, req, b, dst, fail)
	}
	err = p.publish(ctx, req)
	if err != nil {
		m.mu.Lock()
		m.publishing = false
		m.mu.Unlock()
		return fail(fmt.Errorf("publishing version %d failed: %w", next, err))
	}
	m.params, m.paramsBlob = dst, blob
	m.mu.Lock()
	// publishing ends and version moves in one critical section: between
	// the two, a client that already pulled next would be admitted against
	// next-1 (seen in CI as a push answered with the version before).
	m.publishing = false
	m.version, m.stepped = next, next
	m.counters.Applied += n
	m.counters.Steps++
	if m.opt != nil {
		m.steps = uint64(m.opt.Steps())
	} else {
		m.steps++ // the host's step
	}
	m.mu.Unlock()
	if !b.FirstAdmitted.IsZero() {
		p.lat.add(p.cfg.Clock.Now().Sub(b.FirstAdmitted))
	}
	if m.files != nil {
		m.files.published(next, m.steps)
	}
	if p.cfg.OnApply != nil {
		p.cfg.OnApply(b.Model, next, slices.Clone(b.Members), slices.Clone(b.Weights))
	}
	return next, nil
}

// maxUnacked bounds the steps of a model committed to a replicated store
// and not yet acknowledged: the step awaiting its acknowledgement and the
// next one, so that one unit's round trip to the standbys can cover two
// steps while the reducer never runs further ahead of what is replicated.
const maxUnacked = 2

// dueStep is a settled step whose files.published is still to run.
type dueStep struct{ version, steps uint64 }

// commitStep publishes a step on a replicated store (store.Committer) in
// two halves: the commit, here with stepMu held, after which the model
// steps on from next; and the acknowledgement, awaited by settle in a
// goroutine of the primary's, so that the next step is taken and
// committed while this one's version awaits it. The version stays hidden
// from readers until acknowledged; the batch's gradients count as applied
// then, and its files are marked published by the step after (or Close).
// A failed acknowledgement stops the model as a failed publish does.
func (p *Primary) commitStep(ctx context.Context, m *pmodel, c store.Committer, req store.PushRequest, b Batch, dst *tensor.StateDict, fail func(error) (uint64, error)) (uint64, error) {
	_, ack, err := c.PushCommitted(ctx, req)
	for attempt := 1; errors.Is(err, errs.ErrUnavailable); attempt++ {
		// Refused before its commit (etcd could not confirm the term):
		// made again, unchanged (publish).
		p.cfg.Logger.Warn("reducer: publish refused before its commit; pushing it again", "model", req.Name, "version", req.Version,
			"attempt", attempt, "err", err)
		if !p.backoff(ctx, attempt) {
			break
		}
		_, ack, err = c.PushCommitted(ctx, req)
	}
	if err != nil {
		m.mu.Lock()
		m.publishing = false
		m.mu.Unlock()
		return fail(fmt.Errorf("publishing version %d failed: %w", req.Version, err))
	}
	m.params, m.paramsBlob = dst, req.Blob
	m.mu.Lock()
	m.publishing = false
	m.stepped = req.Version
	if m.opt != nil {
		m.steps = uint64(m.opt.Steps())
	}
	steps := m.steps
	m.mu.Unlock()
	var prev chan struct{}
	if len(m.acks) > 0 {
		prev = m.acks[len(m.acks)-1]
	}
	done := make(chan struct{})
	m.acks = append(m.acks, done)
	run := func() {
		defer close(done)
		if prev != nil {
			<-prev // settled in order
		}
		p.settle(ctx, m, req, ack, b, steps)
	}
	p.mu.Lock()
	closed := p.closed
	if !closed {
		p.settling.Add(1)
	}
	p.mu.Unlock()
	if closed { // no goroutine outlives Close: settled here
		run()
		return req.Version, nil
	}
	go func() { // the owner: Close waits for p.settling
		defer p.settling.Done()
		run()
	}()
	return req.Version, nil
}

// settle awaits a committed step's acknowledgement (acknowledging again
// while it is store.ErrNotAcknowledged, as publish does) and counts the
// step: applied, or dropped and the model stopped when it failed or a
// step before it did.
func (p *Primary) settle(ctx context.Context, m *pmodel, req store.PushRequest, ack func(context.Context) error, b Batch, steps uint64) {
	n := uint64(len(b.Members))
	m.mu.Lock()
	err := m.failed
	m.mu.Unlock()
	if err == nil {
		if err = p.reacknowledge(ctx, req.Name, req.Version, ack(ctx)); err == nil && !b.FirstAdmitted.IsZero() {
			p.lat.add(p.cfg.Clock.Now().Sub(b.FirstAdmitted))
		}
	}
	m.mu.Lock()
	if err != nil {
		m.counters.Drop(reduce.ReasonPublish, n)
		if m.failed == nil {
			m.failed = fmt.Errorf("publishing version %d failed: %w", req.Version, err)
			p.cfg.Logger.Error("reducer: step failed; model stops taking gradients", "model", req.Name, "err", m.failed)
		}
		failed := m.failed
		m.mu.Unlock()
		if m.ext != nil {
			m.ext.fail(req.Name, failed)
		}
		return
	}
	m.version = req.Version
	m.counters.Applied += n
	m.counters.Steps++
	if m.files != nil {
		m.due = append(m.due, dueStep{req.Version, steps})
	}
	m.mu.Unlock()
	if p.cfg.OnApply != nil {
		p.cfg.OnApply(req.Name, req.Version, slices.Clone(b.Members), slices.Clone(b.Weights))
	}
}

// awaitAcks waits, stepMu held, until at most limit of m's committed
// steps are still to be settled. settle always ends: acknowledged, failed,
// or cut short by the primary closing (reacknowledge).
func (m *pmodel) awaitAcks(limit int) {
	for len(m.acks) > 0 {
		select {
		case <-m.acks[0]:
			m.acks = m.acks[1:]
			continue
		default:
		}
		if len(m.acks) <= limit {
			return
		}
		<-m.acks[0]
	}
}

// publishDue marks m's settled steps published in its files, in order;
// stepMu is held.
func (p *Primary) publishDue(m *pmodel) {
	m.mu.Lock()
	due := m.due
	m.due = nil
	m.mu.Unlock()
	for _, d := range due {
		m.files.published(d.version, d.steps)
	}
}

// publish pushes a step's version. On a single hub one push decides: an
// error fails the step, and Forward then stops the model (fail-stop). A
// local store that refuses a commit has a local fault (disk full, an I/O
// error, the store closing) that retrying does not cure and the operator
// must see; the optimizer has stepped in memory and the step's state is
// on disk, and the one sound way back is the restart path (NewPrimary
// cuts the journal back to the store's newest version and reloads its
// optimizer state).
//
// On a cluster (the store is a store.Acknowledger: the primary's fenced,
// replicating store) a failure is the replication's or the term's, and
// the step is carried through instead, within the term: a push refused
// before its commit (Unavailable: etcd could not confirm the term) is
// made again, unchanged; a push committed here but not acknowledged
// (store.ErrNotAcknowledged: a standby did not apply it in time) is
// acknowledged again (store.Acknowledger.Acknowledge) rather than
// abandoned — its version exists on this hub and maybe on a standby, so
// the model must not step from the version before it, and the next
// version is only ever built on it. The model takes no other step
// meanwhile (the step lock is held). It ends when the version is
// acknowledged, when the term ends (the refusal: this hub closes its
// reducer and the next term restores the model from its replicated
// durable state, which holds the step or not), when the primary closes,
// or on any other error. (A refusal before the commit is Unavailable too:
// it is retried until the hub, which closes as soon as it is deposed,
// closes the primary.)
func (p *Primary) publish(ctx context.Context, req store.PushRequest) error {
	_, err := p.cfg.Store.Push(ctx, req)
	if _, replicated := store.AsAcknowledger(p.cfg.Store); err == nil || !replicated {
		return err
	}
	for attempt := 1; errors.Is(err, errs.ErrUnavailable) && !errors.Is(err, store.ErrNotAcknowledged); attempt++ {
		p.cfg.Logger.Warn("reducer: publish refused before its commit; pushing it again", "model", req.Name, "version", req.Version,
			"attempt", attempt, "err", err)
		if !p.backoff(ctx, attempt) {
			return err
		}
		_, err = p.cfg.Store.Push(ctx, req)
	}
	if err = p.reacknowledge(ctx, req.Name, req.Version, err); err == nil {
		p.cfg.Logger.Info("reducer: publish acknowledged after retrying", "model", req.Name, "version", req.Version)
	}
	return err
}

// reacknowledge carries a write that failed with store.ErrNotAcknowledged
// (err: committed here, not acknowledged) through: it acknowledges again
// (store.Acknowledger) until that holds, ctx ends or the primary closes.
// Any other err is returned as it is.
func (p *Primary) reacknowledge(ctx context.Context, name string, version uint64, err error) error {
	ack, ok := store.AsAcknowledger(p.cfg.Store)
	for attempt := 1; ok && errors.Is(err, store.ErrNotAcknowledged); attempt++ {
		p.cfg.Logger.Warn("reducer: write not acknowledged; acknowledging it again", "model", name, "version", version,
			"attempt", attempt, "err", err)
		if !p.backoff(ctx, attempt) {
			return err
		}
		err = ack.Acknowledge(ctx, name, version)
	}
	return err
}

// backoff waits before retry attempt (100 ms more each time, at most 1 s);
// false when ctx ended or the primary is closing.
func (p *Primary) backoff(ctx context.Context, attempt int) bool {
	select {
	case <-p.closing:
		return false
	case <-ctx.Done():
		return false
	case <-time.After(min(time.Duration(attempt)*100*time.Millisecond, time.Second)):
		return true
	}
}

// newBlob allocates the next version's safetensors blob with its header
// written and returns it with a state dict of views of its tensor bytes.
// The tensor bytes are not zeroed (see blobBytes): the caller must write
// every one of them, as StepTo does, before the blob is published.
func (m *pmodel) newBlob() ([]byte, *tensor.StateDict) {
	blob := m.takeSpare()
	if blob == nil {
		blob = blobBytes(int(m.plan.Size), m.plan.Header)
	}
	off := len(m.plan.Header)
	dst := &tensor.StateDict{}
	for _, t := range m.plan.Order {
		n := len(t.Data)
		if err := dst.Add(&tensor.Tensor{Name: t.Name, DType: t.DType, Shape: t.Shape, Data: blob[off : off+n : off+n]}); err != nil {
			panic(err) // the plan was valid
		}
		off += n
	}
	if off != len(blob) {
		// Every byte past the header must belong to a tensor, or
		// uninitialized memory would be published.
		panic(fmt.Sprintf("reducer: blob plan covers %d of %d bytes", off, len(blob)))
	}
	return blob, dst
}

// maxSpare bounds the blobs a model keeps for reuse: the store gives back
// at most one per step, and the step takes one.
const maxSpare = 4

// giveSpare is the PushRequest.Recycle of the model's versions: blob left
// the store untaken and is the model's again.
func (m *pmodel) giveSpare(blob []byte) {
	m.spareMu.Lock()
	defer m.spareMu.Unlock()
	if int64(len(blob)) == m.plan.Size && len(m.spare) < maxSpare {
		m.spare = append(m.spare, blob)
	}
}

// takeSpare returns the most recently given back blob (warmest in cache)
// with the plan's header rewritten, or nil. It never returns the blob
// params view: a push from another writer could have dropped that one
// from the store. m.stepMu must be held.
func (m *pmodel) takeSpare() []byte {
	m.spareMu.Lock()
	defer m.spareMu.Unlock()
	for i := len(m.spare) - 1; i >= 0; i-- {
		b := m.spare[i]
		if len(m.paramsBlob) > 0 && &b[0] == &m.paramsBlob[0] {
			continue
		}
		m.spare = slices.Delete(m.spare, i, i+1)
		copy(b, m.plan.Header)
		m.reused.Add(1)
		return b
	}
	return nil
}

// blobBytes returns n bytes, 8-byte aligned, starting with header (len(header)
// ≤ n) and NOT zeroed past it: a new version's tensor bytes are all written by
// the optimizer step, so zeroing them first (tensor.AlignedBytes) would be a
// wasted write pass over the whole model, about 0.2 ms per 4 MiB.
//
// Go has no public way to allocate uninitialized memory; strings.Builder.Grow
// does so internally (bytealg.MakeNoZero). The builder's buffer is reached
// through String's data pointer, which is checked to be the builder's own
// buffer (two String calls around a write return the same pointer) with room
// for n bytes; on any doubt, or for small blobs, it falls back to zeroed
// memory, which is always correct.
func blobBytes(n int, header []byte) []byte {
	if n >= 64<<10 && len(header) > 0 && len(header) < n {
		var sb strings.Builder
		sb.Grow(n)
		sb.Write(header)
		s := sb.String()
		p := unsafe.StringData(s)
		sb.WriteByte(0) // overwritten by the step
		if unsafe.StringData(sb.String()) == p && sb.Cap() >= n {
			if b := unsafe.Slice(p, n); tensor.Aligned(b) {
				return b
			}
		}
	}
	blob := tensor.AlignedBytes(n)
	copy(blob, header)
	return blob
}

// ModelStats is one model registered with the primary.
type ModelStats struct {
	// Version is the newest version the primary published (or started
	// from).
	Version uint64
	// Counters the primary keeps for this model: applied, steps, and the
	// drops it decided (lost, publish_failed).
	Counters reduce.Counters
	// BlobsReused: steps written into the blob of an old version the store
	// gave back instead of fresh memory (Primary.BlobsReused).
	BlobsReused uint64
	// OptimizerSteps is the optimizer's step count (schedule position).
	OptimizerSteps uint64
	// StateError says why the optimizer state could not be recovered when
	// the registration was restored ("" when it was, or was new).
	StateError string
}

// PrimaryStats is what Primary.Stats reports.
type PrimaryStats struct {
	// Counters sums Models' counters.
	Counters reduce.Counters
	// Models by name.
	Models map[string]ModelStats
	// P50, P99: admitted → published latency over the recent window.
	P50, P99 time.Duration
}

// Stats returns the primary's counters, per model and summed, and the
// admitted→published latency p50/p99. Each model is sampled once.
func (p *Primary) Stats() PrimaryStats {
	p.mu.Lock()
	models := slices.Collect(maps.Values(p.models))
	p.mu.Unlock()
	st := PrimaryStats{Models: make(map[string]ModelStats, len(models))}
	st.P50, st.P99 = p.lat.quantiles()
	for _, m := range models {
		ms := ModelStats{BlobsReused: m.reused.Load()}
		m.mu.Lock()
		ms.Version, ms.Counters, ms.OptimizerSteps = m.version, m.counters.Clone(), m.steps
		ms.StateError = m.stateErr
		m.mu.Unlock()
		st.Counters.Merge(ms.Counters)
		st.Models[m.cfg.Model] = ms
	}
	return st
}

// BlobsReused returns how many of model's steps wrote the new version into
// a blob the store gave back (a version no reader took) instead of fresh
// memory. Unknown models have 0.
func (p *Primary) BlobsReused(model string) uint64 {
	p.mu.Lock()
	m := p.models[model]
	p.mu.Unlock()
	if m == nil {
		return 0
	}
	return m.reused.Load()
}

// Close refuses further sessions and registrations and closes the
// durable state (everything acknowledged is on disk already). Steps in
// progress finish first. Safe to call twice.
func (p *Primary) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	close(p.closing)
	models := slices.Collect(maps.Values(p.models))
	p.stopExternalLocked()
	p.mu.Unlock()
	var out []error
	for _, m := range models {
		m.stepMu.Lock()
		m.awaitAcks(0) // every step committed is settled
		if m.files != nil {
			p.publishDue(m)
			out = append(out, m.files.close())
		}
		m.stepMu.Unlock()
	}
	p.settling.Wait()
	p.dropping.Wait()
	if p.state != nil {
		out = append(out, p.state.close())
	}
	return errors.Join(out...)
}

// latencies keeps the last n samples for quantiles; its own mutex guards
// it.
type latencies struct {
	mu   sync.Mutex
	buf  []time.Duration
	next int
	full bool
	hist latencyHist // every sample since start (PublishLatency)
}

func newLatencies(n int) latencies { return latencies{buf: make([]time.Duration, n)} }

func (l *latencies) add(d time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.hist.observe(d)
	l.buf[l.next] = d
	l.next++
	if l.next == len(l.buf) {
		l.next, l.full = 0, true
	}
}

func (l *latencies) quantiles() (p50, p99 time.Duration) {
	l.mu.Lock()
	n := l.next
	if l.full {
		n = len(l.buf)
	}
	s := slices.Clone(l.buf[:n])
	l.mu.Unlock()
	if len(s) == 0 {
		return 0, 0
	}
	slices.Sort(s)
	return s[len(s)*50/100], s[min(len(s)-1, len(s)*99/100)]
}

// nonFinite names the first NaN or ±Inf in a step's new weights or its
// optimizer's state ("" when all are finite): one pass over each.
func nonFinite(weights *tensor.StateDict, opt *optim.Optimizer) string {
	for _, t := range weights.Tensors() {
		if t.DType != tensor.F32 {
			continue
		}
		f, err := t.Float32s()
		if err != nil {
			continue
		}
		if i := kernels.FirstNonFinite(f); i >= 0 {
			return fmt.Sprintf("weight %s[%d]", errs.Quote(t.Name), i)
		}
	}
	if what := opt.NonFinite(); what != "" {
		return "optimizer state " + what
	}
	return ""
}
