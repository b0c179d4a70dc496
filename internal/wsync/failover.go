package wsync

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/store"
)

// Dialer opens one way of getting versions. have is the version the
// collector runs, for transports that send only newer ones.
type Dialer struct {
	// Name shows in logs and Failover.Current ("relay-shm", "upstream").
	Name string
	Dial func(ctx context.Context, have uint64) (Source, io.Closer, error)
	// DialLives, if set, is what a Failover that follows lives
	// (FailoverConfig.FollowLives) dials instead of Dial: a source that
	// follows the model's lives from version have of life life (0:
	// unknown), a LifeSource whose WaitNewerLife returns a version of
	// another life at once (docs/weight-sync.md, "Lives"). nil: such a
	// Failover dials Dial, and that source's versions only grow.
	DialLives func(ctx context.Context, have, life uint64) (Source, io.Closer, error)
}

// FailoverConfig configures a Failover.
type FailoverConfig struct {
	// Dialers in order of preference (e.g. the relay's shared memory, the
	// relay's stream, the upstream hub). Required.
	Dialers []Dialer
	// Backoff is the pause after every dialer failed, before trying them
	// all again; 0 means 100ms.
	Backoff time.Duration
	// ProbeEvery is how often, while on a less preferred source, the more
	// preferred ones are tried again (a relay that was restarted); 0 means
	// 1 s, negative never (a source is then kept until it fails).
	ProbeEvery time.Duration
	// ProbeTimeout bounds one probe: the dial and the wait for a first
	// version at least as new as the one the collector runs; 0 means
	// 500 ms.
	ProbeTimeout time.Duration
	// FollowLives follows the model's lives (docs/weight-sync.md,
	// "Lives"): sources are dialed with their DialLives, and
	// WaitNewerLife returns a version of another life than the one the
	// collector runs at once, though it is not newer (the model was
	// deleted and pushed again); use it with ReceiverConfig.FollowLives.
	// The epoch rule holds across lives. false: versions delivered only
	// grow, and WaitNewerLife is WaitNewer.
	FollowLives bool
	// Logger; nil means slog.Default().
	Logger *slog.Logger
}

func (c *FailoverConfig) validate() error {
	if len(c.Dialers) == 0 {
		return fmt.Errorf("%w: wsync: FailoverConfig.Dialers is empty", errs.ErrInvalid)
	}
	for i, d := range c.Dialers {
		if d.Dial == nil {
			return fmt.Errorf("%w: wsync: dialer %d (%q) has no Dial", errs.ErrInvalid, i, d.Name)
		}
	}
	if c.Backoff < 0 {
		return fmt.Errorf("%w: wsync: negative Backoff", errs.ErrInvalid)
	}
	if c.Backoff == 0 {
		c.Backoff = 100 * time.Millisecond
	}
	if c.ProbeEvery == 0 {
		c.ProbeEvery = time.Second
	}
	if c.ProbeTimeout <= 0 {
		c.ProbeTimeout = 500 * time.Millisecond
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return nil
}

// Failover is a Source that uses the first dialer that works and, when its
// source fails (the relay died, the stream ended), closes it and dials
// again from the most preferred, so collectors of a dead relay fall back
// to the upstream without missing the newest version. While it holds a
// less preferred source it probes the more preferred ones every
// ProbeEvery (from inside GetIfNewer and WaitNewer) and goes back to the
// first that serves a version at least as new as the one the collector
// runs, with an epoch no older than any delivered: a relay that was
// restarted gets its collectors back.
//
// It is meant for one Receiver: calls are serialized. Its snapshots stay
// valid as long as its current source's do; for ShmDialer and PushDialer
// sources, until two newer versions have been taken; for a leasing shm
// reader (ShmReaderDialer with shm.ReaderConfig.Lease), until a newer
// version has been taken. A source that fails after serving a version is
// closed only once a newer version has been taken from its successor (or
// at Close), so the version the Receiver holds outlives the failure even
// when it is a view of a leased segment, which Close unmaps.
//
// A permanent refusal (errs.Permanent: a bad request, missing or
// insufficient credentials) fails over like any other failure, since
// another source may accept the collector. Once every dialer has refused
// permanently (at its dial or from its source), with no version served
// and no other kind of failure in between, GetIfNewer and WaitNewer
// return those refusals (errs.Permanent is true of the error) instead of
// retrying: a collector with a wrong token or model name stops with the
// reason instead of waiting for ever on weights that cannot come. A
// source that is only unreachable keeps it trying.
// On a cluster (its dialers' connections from dial.Config.GRPC on a
// cluster target: PushDialer, DataPlaneDialer) a source that fails when
// the primary dies is dialed again on the connection, which by then
// follows the new primary. Versions it delivers only grow (each is asked
// for after the one the Receiver runs); a version whose epoch is older
// than one it delivered before (a deposed primary's, a stale relay's) is
// never delivered: its source is dropped as failed. Skipped counts the
// version numbers between consecutive deliveries, so a version the new
// primary never had shows as a skip.
//
// With FailoverConfig.FollowLives, WaitNewerLife also delivers a version
// of another life than the one the collector runs (store.Snapshot.Life),
// though not newer, from a source that follows lives; a source dialed
// after a failure starts from the collector's version and its life. A
// probe goes back to a preferred source only when its version is of the
// collector's life (or of an unknown one: a source that names no lives):
// one on another life may be a stale one still on a deleted model's
// weights, which the collector has left.
type Failover struct {
	cfg FailoverConfig

	callMu sync.Mutex // serializes calls (and Close)

	mu     sync.Mutex // guards the fields below; held only briefly
	cur    Source
	closer io.Closer
	name   string
	idx    int  // index of cur's dialer
	served bool // cur has returned a version since it was dialed
	// refused holds, by dialer index, the permanent refusals since a
	// version was last served or a dialer failed otherwise.
	refused map[int]error
	failed  int // index of a dialer whose source failed before serving anything, -1: none
	closed  bool
	// retired is the last source that failed after serving a version; it
	// stays open until a newer version has been taken (or Close), since
	// the Receiver may still hold its snapshot.
	retired io.Closer
	epoch   uint64 // the newest epoch delivered
	life    uint64 // the life of the version delivered last (0: unknown)
	skipped uint64 // version numbers between deliveries, for Skipped
	// nextProbe is when the more preferred dialers are tried again
	// (guarded by callMu).
	nextProbe time.Time
	switches  uint64 // sources taken after the first, for Switches
	dialed    bool   // a source was taken before
	// since is when cur was taken or, with none, when the last one was
	// lost or the first dial failed; lastErr is why none is held (nil
	// while one is); for State.
	since   time.Time
	lastErr error
	// warned is, by dialer index, when its failed dial was last logged at
	// warn level, and suppressed how many failures went unlogged since
	// (guarded by callMu): a hub down for hours logs every
	// dialWarnEvery, not at every backoff.
	warned     map[int]time.Time
	suppressed map[int]int
}

// dialWarnEvery is how often, at most, a dialer's failed dials are logged
// at warn level while they keep failing; the first is logged at once.
const dialWarnEvery = 30 * time.Second

// FailoverState is what a Failover knows of its sources' health, as of its
// last call (GetIfNewer, WaitNewer): it dials only within calls.
type FailoverState struct {
	// Source names the dialer in use; "" when none is held (never dialed
	// yet, or lost and not dialed again).
	Source string
	// Since is when Source was taken or, with none, when the last source
	// was lost (or the first dial failed); zero before any dial.
	Since time.Time
	// Err is why no source is held: the latest failed dial or the error
	// that ended the source; nil while one is held.
	Err error
}

// State reports the Failover's sources' health (FailoverState).
func (f *Failover) State() FailoverState {
	f.mu.Lock()
	defer f.mu.Unlock()
	return FailoverState{Source: f.name, Since: f.since, Err: f.lastErr}
}

var (
	_ Source     = (*Failover)(nil)
	_ LifeSource = (*Failover)(nil)
)

// NewFailover returns a failover source; it dials on first use.
func NewFailover(cfg FailoverConfig) (*Failover, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &Failover{cfg: cfg, failed: -1, refused: map[int]error{}, warned: map[int]time.Time{}, suppressed: map[int]int{}}, nil
}

// Current names the dialer in use ("" when none).
func (f *Failover) Current() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.name
}

// GetIfNewer implements Source, trying each dialer once at most.
func (f *Failover) GetIfNewer(ctx context.Context, than uint64) (*store.Snapshot, error) {
	return f.getIfNewer(ctx, than, f.deliveredLife(), false)
}

// GetIfNewerLife implements LifeSource: with FailoverConfig.FollowLives it
// also returns a version of another life than life (the life of version
// than; 0: unknown) from a source that follows lives, as WaitNewerLife
// does; without, it is GetIfNewer.
func (f *Failover) GetIfNewerLife(ctx context.Context, than, life uint64) (*store.Snapshot, error) {
	if !f.cfg.FollowLives {
		return f.GetIfNewer(ctx, than)
	}
	return f.getIfNewer(ctx, than, life, true)
}

// getIfNewer is GetIfNewer; lives asks the current source with
// GetIfNewerLife (get).
func (f *Failover) getIfNewer(ctx context.Context, than, life uint64, lives bool) (*store.Snapshot, error) {
	f.callMu.Lock()
	defer f.callMu.Unlock()
	var tried []error
	for attempt := 0; attempt <= len(f.cfg.Dialers); attempt++ {
		if err := f.ensure(ctx, than, life); err != nil {
			return nil, err
		}
		if snap := f.probe(ctx, than, life); snap != nil {
			return snap, nil
		}
		snap, err := f.get(ctx, f.current(), than, life, lives)
		if snap != nil {
			if err = f.admit(snap, than); err != nil {
				snap = nil
			}
		}
		if err == nil || ctx.Err() != nil {
			return snap, err
		}
		tried = append(tried, err)
		f.drop(err)
		if err := f.allRefused(); err != nil {
			return nil, err
		}
	}
	return nil, fmt.Errorf("%w: wsync: every source failed: %w", errs.ErrUnavailable, errors.Join(tried...))
}

// WaitNewer implements Source; it keeps failing over until ctx is done.
func (f *Failover) WaitNewer(ctx context.Context, after uint64) (*store.Snapshot, error) {
	return f.WaitNewerLife(ctx, after, 0)
}

// WaitNewerLife implements LifeSource: with FailoverConfig.FollowLives it
// also returns a version of another life than life (the life of version
// after; 0: unknown) at once; without, it is WaitNewer.
func (f *Failover) WaitNewerLife(ctx context.Context, after, life uint64) (*store.Snapshot, error) {
	if !f.cfg.FollowLives {
		life = 0
	}
	f.callMu.Lock()
	defer f.callMu.Unlock()
	for {
		if err := f.ensure(ctx, after, life); err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err() // the contract, even when ctx ended inside a dial
			}
			if errors.Is(err, errFailoverClosed) || errs.Permanent(err) {
				return nil, err
			}
			t := time.NewTimer(f.cfg.Backoff)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return nil, ctx.Err()
			}
			continue
		}
		if snap := f.probe(ctx, after, life); snap != nil {
			return snap, nil
		}
		// On a less preferred source the wait ends at the next probe.
		wctx, wcancel := ctx, context.CancelFunc(func() {})
		if f.probing() {
			wctx, wcancel = context.WithDeadline(ctx, f.nextProbe)
		}
		snap, err := f.wait(wctx, f.current(), after, life)
		probeDue := wctx.Err() != nil && ctx.Err() == nil
		wcancel()
		if snap != nil {
			if err = f.admit(snap, after); err != nil {
				snap = nil
			}
		}
		if err == nil {
			return snap, nil
		}
		if probeDue && snap == nil {
			continue // the probe's deadline, whatever the source made of it
		}
		if ctx.Err() != nil {
			// The contract: ctx's error, not the one the source gave
			// while ctx ended (a push source reports its closed board).
			return nil, ctx.Err()
		}
		served := f.drop(err)
		if err := f.allRefused(); err != nil {
			return nil, err
		}
		if !served {
			// It failed before serving anything (a hub down behind a lazy
			// dial, one that takes the hello and ends the stream): dialing
			// again at once would spin. One that served is left at once.
			t := time.NewTimer(f.cfg.Backoff)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return nil, ctx.Err()
			}
		}
	}
}

var errFailoverClosed = errClosed("failover")

// probing reports whether a more preferred dialer is to be probed (the
// current source is not the first). Called with callMu held.
func (f *Failover) probing() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.cfg.ProbeEvery > 0 && f.cur != nil && f.idx > 0
}

// dial opens d's source for a collector at version have of life life:
// with DialLives when following lives.
func (f *Failover) dial(ctx context.Context, d Dialer, have, life uint64) (Source, io.Closer, error) {
	if f.cfg.FollowLives && d.DialLives != nil {
		return d.DialLives(ctx, have, life)
	}
	return d.Dial(ctx, have)
}

// wait is src's WaitNewer, or its WaitNewerLife when following lives.
func (f *Failover) wait(ctx context.Context, src Source, after, life uint64) (*store.Snapshot, error) {
	if ls, ok := src.(LifeSource); ok && f.cfg.FollowLives {
		return ls.WaitNewerLife(ctx, after, life)
	}
	return src.WaitNewer(ctx, after)
}

// get is src's GetIfNewer, or its GetIfNewerLife when lives and
// following lives.
func (f *Failover) get(ctx context.Context, src Source, than, life uint64, lives bool) (*store.Snapshot, error) {
	if ls, ok := src.(LifeSource); ok && lives && f.cfg.FollowLives {
		return ls.GetIfNewerLife(ctx, than, life)
	}
	return src.GetIfNewer(ctx, than)
}

// deliveredLife is the life of the version delivered last (0: unknown).
func (f *Failover) deliveredLife() uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.life
}

// probe, when due, tries the dialers preferred to the current one and
// goes back to the first that serves, within ProbeTimeout, a version at
// least as new as than (following lives: of life, the collector's, or of
// an unknown one) with an epoch no older than any delivered; the
// source it leaves is retired as a failed one is. It returns that
// version when it is newer than than (delivered now), else nil. A
// probe's failures are not failures of the Failover: they are logged
// at debug level only. Called with callMu held.
func (f *Failover) probe(ctx context.Context, than, life uint64) *store.Snapshot {
	if !f.probing() || time.Now().Before(f.nextProbe) {
		return nil
	}
	f.nextProbe = time.Now().Add(f.cfg.ProbeEvery)
	f.mu.Lock()
	idx, epoch := f.idx, f.epoch
	f.mu.Unlock()
	from := uint64(0) // versions newer than from: at least than
	if than > 0 {
		from = than - 1
	}
	for i := range idx {
		d := f.cfg.Dialers[i]
		pctx, cancel := context.WithTimeout(ctx, f.cfg.ProbeTimeout)
		src, closer, err := f.dial(pctx, d, from, life)
		var snap *store.Snapshot
		if err == nil {
			snap, err = f.wait(pctx, src, from, life)
			switch {
			case err != nil:
			case snap.Epoch < epoch:
				err = fmt.Errorf("%w: version %d has epoch %d, older than epoch %d delivered", errs.ErrUnavailable, snap.Version, snap.Epoch, epoch)
			case newLife(snap, life):
				err = fmt.Errorf("%w: version %d is of another life than the collector's", errs.ErrUnavailable, snap.Version)
			}
		}
		cancel()
		if err != nil {
			if closer != nil {
				closer.Close()
			}
			f.cfg.Logger.Debug("wsync: probe of a preferred source failed", "source", d.Name, "err", err)
			continue
		}
		f.mu.Lock()
		oldName := f.name
		old := f.letGoLocked()
		f.cur, f.closer, f.name, f.idx, f.served, f.failed = src, closer, d.Name, i, false, -1
		f.switches++
		f.since, f.lastErr = time.Now(), nil
		f.mu.Unlock()
		if old != nil {
			old.Close()
		}
		f.cfg.Logger.Info("wsync: back on a preferred source", "source", d.Name, "from", oldName, "version", snap.Version)
		if snap.Version > than && f.admit(snap, than) == nil {
			return snap
		}
		return nil
	}
	return nil
}

// Switches counts the sources the Failover took after its first one
// (failing over, and going back to a preferred one).
func (f *Failover) Switches() uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.switches
}

// admit delivers snap, taken after version after, unless its epoch is
// older than one delivered before; it counts the versions skipped (none
// when snap is of another life than the one delivered last).
func (f *Failover) admit(snap *store.Snapshot, after uint64) error {
	f.mu.Lock()
	if snap.Epoch < f.epoch {
		ep := f.epoch
		f.mu.Unlock()
		return fmt.Errorf("%w: wsync: version %d of %s has epoch %d, older than epoch %d already delivered",
			errs.ErrUnavailable, snap.Version, errs.Quote(snap.Name), snap.Epoch, ep)
	}
	// Another life's versions are numbered afresh: the numbers between
	// after and snap name no version skipped (as the hub counts them).
	if after > 0 && snap.Version > after+1 && !newLife(snap, f.life) {
		f.skipped += snap.Version - after - 1
	}
	f.epoch, f.life = snap.Epoch, snap.Life()
	f.mu.Unlock()
	f.markServed()
	return nil
}

// Skipped counts the version numbers that lay between two versions
// delivered (newer ones landed meanwhile, or a failover lost them).
func (f *Failover) Skipped() uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.skipped
}

// markServed records that the current source returned a version: the
// Receiver moves past any retired source's snapshot, which is closed now.
func (f *Failover) markServed() {
	f.mu.Lock()
	f.served = true
	clear(f.refused)
	retired := f.retired
	f.retired = nil
	f.mu.Unlock()
	if retired != nil {
		retired.Close()
	}
}

func (f *Failover) current() Source {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.cur
}

// ensure dials, most preferred first, when no source is held. A dialer
// whose source failed before serving any version is tried last, so a
// source that opens but fails at once cannot starve the others. Called
// with callMu held.
func (f *Failover) ensure(ctx context.Context, have, life uint64) error {
	f.mu.Lock()
	closed, cur := f.closed, f.cur
	f.mu.Unlock()
	if closed {
		return errFailoverClosed
	}
	if cur != nil {
		return nil
	}
	order := make([]int, 0, len(f.cfg.Dialers))
	for i := range f.cfg.Dialers {
		if i != f.failed {
			order = append(order, i)
		}
	}
	if f.failed >= 0 {
		order = append(order, f.failed)
	}
	var failed []error
	for _, i := range order {
		d := f.cfg.Dialers[i]
		src, closer, err := f.dial(ctx, d, have, life)
		if err != nil {
			err = fmt.Errorf("%s: %w", d.Name, err)
			failed = append(failed, err)
			f.noteFailure(i, err)
			f.dialFailed(ctx, i, err)
			continue
		}
		f.mu.Lock()
		if f.dialed {
			f.switches++
		}
		f.cur, f.closer, f.name, f.idx, f.served, f.failed, f.dialed = src, closer, d.Name, i, false, -1, true
		f.since, f.lastErr = time.Now(), nil
		f.mu.Unlock()
		if n := f.suppressed[i]; n > 0 || !f.warned[i].IsZero() {
			f.cfg.Logger.Info("wsync: source reachable again", "source", d.Name, "failed_dials_not_logged", n)
		}
		delete(f.warned, i)
		delete(f.suppressed, i)
		f.nextProbe = time.Now().Add(f.cfg.ProbeEvery)
		f.cfg.Logger.Debug("wsync: using source", "source", d.Name)
		if c, ok := src.(interface{ CopyReason() string }); ok && c.CopyReason() != "" {
			f.cfg.Logger.Info("wsync: shm source copies versions instead of leasing them", "source", d.Name, "reason", c.CopyReason())
		}
		return nil
	}
	if err := f.allRefused(); err != nil {
		return err
	}
	return fmt.Errorf("%w: wsync: no source reachable: %w", errs.ErrUnavailable, errors.Join(failed...))
}

// dialFailed records dialer i's failed dial for State and logs it at warn
// level: the first of a run of failures at once, then at most every
// dialWarnEvery, with the count of those not logged. A dial that failed
// because ctx ended (Close, the caller's deadline) is not a failure of
// the source. Called with callMu held.
func (f *Failover) dialFailed(ctx context.Context, i int, err error) {
	if ctx.Err() != nil {
		return
	}
	f.mu.Lock()
	if f.since.IsZero() || f.lastErr == nil {
		f.since = time.Now()
	}
	f.lastErr = err
	f.mu.Unlock()
	if last := f.warned[i]; !last.IsZero() && time.Since(last) < dialWarnEvery {
		f.suppressed[i]++
		return
	}
	f.cfg.Logger.Warn("wsync: dial failed; retrying", "source", f.cfg.Dialers[i].Name, "err", err,
		"failed_dials_not_logged", f.suppressed[i])
	f.warned[i], f.suppressed[i] = time.Now(), 0
}

// noteFailure records dialer i's failure: a permanent refusal is kept
// for allRefused, any other failure clears the record (the sources are
// not all refusing).
func (f *Failover) noteFailure(i int, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if errs.Permanent(err) {
		f.refused[i] = err
	} else {
		clear(f.refused)
	}
}

// allRefused returns the dialers' permanent refusals once every dialer
// has refused, else nil.
func (f *Failover) allRefused() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.refused) < len(f.cfg.Dialers) {
		return nil
	}
	errl := make([]error, 0, len(f.refused))
	for i := range f.cfg.Dialers {
		errl = append(errl, f.refused[i])
	}
	return fmt.Errorf("wsync: every source refused for good: %w", errors.Join(errl...))
}

// drop lets go of the failed source: it closes it at once if it never
// served a version, else retires it (closing the source retired before,
// whose snapshots it superseded). It reports whether the source had
// served. Called with callMu held.
func (f *Failover) drop(err error) (served bool) {
	f.mu.Lock()
	name, idx, served := f.name, f.idx, f.served
	if !f.served {
		f.failed = f.idx
	}
	closer := f.letGoLocked()
	f.since, f.lastErr = time.Now(), fmt.Errorf("%s: %w", name, err)
	f.mu.Unlock()
	f.noteFailure(idx, fmt.Errorf("%s: %w", name, err))
	f.cfg.Logger.Info("wsync: source failed, failing over", "source", name, "err", err)
	if closer != nil {
		closer.Close()
	}
	return served
}

// letGoLocked detaches the current source and returns what to close now:
// a source that served a version is retired instead (the Receiver may
// hold a snapshot that lives in it), and the one retired before it is
// returned. Called with mu held.
func (f *Failover) letGoLocked() io.Closer {
	closer := f.closer
	if f.served {
		closer, f.retired = f.retired, closer
	}
	f.cur, f.closer, f.name = nil, nil, ""
	return closer
}

// Close releases the current source. It waits for a call in progress to
// return; cancel its context first. Safe to call twice.
func (f *Failover) Close() error {
	f.callMu.Lock()
	defer f.callMu.Unlock()
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed = true
	if f.cur != nil {
		f.since = time.Now()
	}
	f.lastErr = errFailoverClosed
	for _, c := range []io.Closer{f.closer, f.retired} {
		if c != nil {
			c.Close()
		}
	}
	f.cur, f.closer, f.retired, f.name = nil, nil, nil, ""
	return nil
}

// Release forwards to the current source when it is a Releaser (a
// leasing shm reader), so a Receiver that copies into its weights gives
// the leased slot back at once; otherwise it does nothing.
func (f *Failover) Release() {
	f.mu.Lock()
	cur := f.cur
	f.mu.Unlock()
	if r, ok := cur.(Releaser); ok {
		r.Release()
	}
}

var _ Releaser = (*Failover)(nil)

// Running forwards a version report to the current source when it takes
// reports on its stream (a Client); otherwise it does nothing. Use it as
// ReceiverConfig.OnApplied.
func (f *Failover) Running(version uint64) {
	f.mu.Lock()
	cur := f.cur
	f.mu.Unlock()
	if r, ok := cur.(interface{ Running(uint64) error }); ok {
		r.Running(version)
	}
}
