package store

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/safetensors"
)

// Prechecker is implemented by stores that can reject a push from its name
// and announced size alone, before any of its bytes are received. The gRPC
// service calls it before allocating a receive buffer.
type Prechecker interface {
	// Precheck returns the error Push would return for a bad name
	// (errs.ErrInvalid) or an oversize blob (errs.ErrFull).
	Precheck(name string, totalBytes uint64) error
}

// errClosed is returned by every operation on a closed store.
var errClosed = fmt.Errorf("%w: store is closed", errs.ErrUnavailable)

// core holds the models and enforces the version rules. Memory is core
// alone; File adds a persist hook that runs between the checks and the
// publish.
//
// Lock order: model.wsem (one pusher per model) before core.mu. core.mu is
// held only for short, non-blocking sections, so readers and watchers never
// wait behind a checkpoint write.
type core struct {
	cfg  Config
	done chan struct{} // closed by close
	once sync.Once

	mu sync.Mutex
	// models is guarded by mu. An entry with no version and no owner is
	// removed once no call uses it (model.users): waits on names never
	// pushed, and pushes refused on them, grew the map without bound.
	models map[string]*model
	// unlisted counts pushes refused on names holding no version (the
	// model is not in Stats.Models, which lists models with a version);
	// guarded by mu.
	unlisted modelCounters
}

// lives numbers the models' lives (model.life) of every store in the
// process: one counter, started at the clock, so that a new life is told
// apart from the lives of other stores and of other processes, not only
// from the model's earlier lives (a follower of a hub compares the lives
// it is sent, docs/weight-sync.md), and later lives of a model are
// greater, as the sync tracker wants. A File store keeps a model's life
// in its manifest and restores it at open (restoreLife), so a restart or
// a cluster failover, whose history is the same, names the same life.
// The clock is only a starting point: nothing depends on its value.
var lives atomic.Uint64

func init() { lives.Store(uint64(time.Now().UnixNano()) & (MaxVersion - 1)) }

// restoreLife sets m's life to life, one recorded before this process
// (a File store's manifest), and moves the counter past it, so that the
// model's next life is greater whatever the clock said at start. c.mu
// must be held.
func restoreLife(m *model, life uint64) {
	m.life = life
	for {
		cur := lives.Load()
		if cur >= life || lives.CompareAndSwap(cur, life) {
			return
		}
	}
}

// model is one named model. versions, epoch and changed are guarded by
// core.mu and written only by the holder of wsem.
type model struct {
	wsem     chan struct{} // capacity 1: held by the one push in progress
	versions []*Snapshot   // retained, ascending by version; empty until the first push
	epoch    uint64        // highest epoch that has landed
	owner    string        // the only writer whose pushes land; "" for any (rule 6)
	changed  chan struct{} // closed and replaced when a version lands
	count    modelCounters // see Stats
	users    int           // calls holding the entry (acquireLocked); guarded by core.mu
	life     uint64        // this life of the model, new at Delete (Snapshot.life); guarded by core.mu
}

func newCore(cfg Config) *core {
	return &core{cfg: cfg, done: make(chan struct{}), models: make(map[string]*model)}
}

func (c *core) close() { c.once.Do(func() { close(c.done) }) }

func (c *core) closed() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// modelLocked returns the model entry for name, creating an empty one.
// c.mu must be held.
func (c *core) modelLocked(name string) *model {
	m := c.models[name]
	if m == nil {
		m = &model{wsem: make(chan struct{}, 1), changed: make(chan struct{}), life: lives.Add(1)}
		c.models[name] = m
	}
	return m
}

// acquireLocked returns name's entry, made if need be, held until
// releaseLocked: a call that waits on it or writes it keeps it (and its
// changed channel) while it does. c.mu must be held.
func (c *core) acquireLocked(name string) *model {
	m := c.modelLocked(name)
	m.users++
	return m
}

// releaseLocked gives back an entry acquireLocked took, and removes it
// when no call holds it and it has no version and no owner. c.mu must be
// held.
func (c *core) releaseLocked(name string, m *model) {
	m.users--
	if m.users == 0 && len(m.versions) == 0 && m.owner == "" && c.models[name] == m {
		delete(c.models, name)
	}
}

// release is releaseLocked, taking c.mu.
func (c *core) release(name string, m *model) {
	c.mu.Lock()
	c.releaseLocked(name, m)
	c.mu.Unlock()
}

// checkName applies the configured name rules (Config.MaxNameBytes,
// NamePattern) to name, except to a model the store holds (a version or
// an owner): one recovered from before the rules were tightened stays
// readable, writable and deletable. The rules bound new models' names.
func (c *core) checkName(name string) error {
	err := c.cfg.checkName(name)
	if err == nil || name == "" {
		return err
	}
	c.mu.Lock()
	m := c.models[name]
	held := m != nil && (len(m.versions) > 0 || m.owner != "")
	c.mu.Unlock()
	if held {
		return nil
	}
	return err
}

// newest returns the newest snapshot or nil. c.mu must be held.
func (m *model) newest() *Snapshot {
	if len(m.versions) == 0 {
		return nil
	}
	return m.versions[len(m.versions)-1]
}

// Precheck implements Prechecker.
func (c *core) Precheck(name string, totalBytes uint64) error {
	if err := c.checkName(name); err != nil {
		return err
	}
	if totalBytes > uint64(c.cfg.MaxModelBytes) {
		return fmt.Errorf("%w: model %q: blob of %d bytes exceeds the limit of %d", errs.ErrFull, name, totalBytes, c.cfg.MaxModelBytes)
	}
	return nil
}

// decide applies the version, epoch and owner rules to req against the
// current state and returns nil when the push may land. It is pure: cur is
// the newest snapshot (nil for a model with no versions), epoch the highest
// landed and owner the model's owner ("" for none).
func decide(req *PushRequest, cur *Snapshot, epoch uint64, owner string) error {
	var curV uint64
	if cur != nil {
		curV = cur.Version
	}
	stale := func(format string, args ...any) error {
		return &errs.StaleError{Model: req.Name, CurrentVersion: curV, CurrentEpoch: epoch, Reason: fmt.Sprintf(format, args...)}
	}
	switch {
	case req.Version > MaxVersion || req.Epoch > MaxVersion:
		return fmt.Errorf("%w: model %q: version %d epoch %d: versions and epochs are at most 2^62", errs.ErrInvalid, req.Name, req.Version, req.Epoch)
	case req.Version > curV && req.Version-curV > MaxStep:
		return fmt.Errorf("%w: model %q: version %d is more than 2^32 past the current version %d", errs.ErrInvalid, req.Name, req.Version, curV)
	case req.Epoch > epoch && req.Epoch-epoch > MaxStep:
		return fmt.Errorf("%w: model %q: epoch %d is more than 2^32 past the highest landed epoch %d", errs.ErrInvalid, req.Name, req.Epoch, epoch)
	case req.Owned && req.Owner != "" && owner != req.Owner:
		return fmt.Errorf("%w: model %q is no longer %s's (deleted since %s claimed it, and pushed again?): it does not write it", errs.ErrPermission, req.Name, req.Owner, req.Owner)
	case owner != "" && req.Owner != owner && !(req.Admin && strings.HasPrefix(owner, TokenOwnerPrefix)):
		return fmt.Errorf("%w: model %q is managed by %s; only it may write the model (delete the model to take it back)", errs.ErrPermission, req.Name, owner)
	case req.Epoch < epoch:
		return stale("push of version %d with epoch %d is fenced off by epoch %d", req.Version, req.Epoch, epoch)
	case req.Expect != ExpectAny && req.Expect != curV:
		return stale("push of version %d expected version %d", req.Version, req.Expect)
	case req.Version <= curV:
		return stale("push of version %d does not move past version %d", req.Version, curV)
	}
	return nil
}

// push validates req, applies the rules and publishes the new version.
// persist, when non-nil, runs after the checks pass and before the version
// becomes visible, with the model's write slot held, and is told the
// model's owner once the push lands; if it fails nothing changes.
func (c *core) push(ctx context.Context, req PushRequest, persist func(snap *Snapshot, owner string) error) (Info, error) {
	if c.closed() {
		return Info{}, errClosed
	}
	if err := c.Precheck(req.Name, uint64(len(req.Blob))); err != nil {
		return Info{}, err
	}
	if req.Version == 0 {
		return Info{}, fmt.Errorf("%w: model %q: version 0 is reserved (it means \"newest\" in reads)", errs.ErrInvalid, req.Name)
	}
	f, err := safetensors.DecodeOptions(req.Blob, safetensors.Options{MaxHeaderBytes: c.cfg.MaxHeaderBytes})
	if err != nil {
		return Info{}, fmt.Errorf("model %q version %d: %w", req.Name, req.Version, err)
	}
	if n := metadataBytes(f.Metadata); n > MaxMetadataBytes {
		return Info{}, fmt.Errorf("%w: model %q version %d: safetensors metadata of %d bytes; at most %d (a pull carries it in its reply's header)",
			errs.ErrInvalid, req.Name, req.Version, n, MaxMetadataBytes)
	}

	c.mu.Lock()
	m := c.acquireLocked(req.Name)
	c.mu.Unlock()
	defer c.release(req.Name, m) // after the write slot is given back
	select {
	case m.wsem <- struct{}{}:
	case <-ctx.Done():
		return Info{}, ctx.Err()
	case <-c.done:
		return Info{}, errClosed
	}
	defer func() { <-m.wsem }()

	c.mu.Lock()
	cur, epoch, owner, life := m.newest(), m.epoch, m.owner, m.life
	c.mu.Unlock()
	if err := decide(&req, cur, epoch, owner); err != nil {
		c.mu.Lock()
		if cur == nil {
			c.unlisted.refused++ // a name Stats does not list
		} else {
			m.count.refused++
		}
		c.mu.Unlock()
		return Info{}, err
	}
	if owner == "" && req.Claim && req.Owner != "" {
		owner = req.Owner
	}
	if err := ctx.Err(); err != nil {
		return Info{}, err
	}
	snap := &Snapshot{
		Name:     req.Name,
		Version:  req.Version,
		Epoch:    req.Epoch,
		Seq:      1,
		Blob:     req.Blob,
		Tensors:  f.Tensors,
		Metadata: f.Metadata,
		Created:  c.cfg.Now().Round(0), // wall clock only: it is persisted and compared
		recycle:  req.Recycle,
		life:     life, // persist records it; only a Delete, holding wsem, changes it
	}
	if cur != nil {
		snap.Seq = cur.Seq + 1
	}
	if persist != nil {
		if err := persist(snap, owner); err != nil {
			return Info{}, err
		}
	}
	c.mu.Lock()
	m.owner = owner
	back := c.publishLocked(m, snap)
	m.count.pushes++
	info := m.infoLocked()
	c.mu.Unlock()
	giveBack(back)
	return info, nil
}

// publishLocked appends snap as the newest version, trims retention and
// wakes watchers. It returns the dropped versions that go back to their
// writers (rule 5), for giveBack once c.mu is released. c.mu must be held.
func (c *core) publishLocked(m *model, snap *Snapshot) (back []*Snapshot) {
	snap.life = m.life
	m.versions = append(m.versions, snap)
	if over := len(m.versions) - c.cfg.Retain; over > 0 {
		for _, old := range m.versions[:over] {
			switch {
			case old.recycle == nil || old.taken:
			case old.lent > 0:
				old.dropped = true // goes back with its last loan
			default:
				back = append(back, old)
			}
		}
		clear(m.versions[:over]) // drop references so old blobs can be freed
		m.versions = slices.Clone(m.versions[over:])
	}
	m.epoch = max(m.epoch, snap.Epoch)
	close(m.changed)
	m.changed = make(chan struct{})
	return back
}

// giveBack hands each snapshot's blob back to its writer. Nothing else
// references them: they left the store untaken.
func giveBack(snaps []*Snapshot) {
	for _, s := range snaps {
		s.recycle(s.Blob)
	}
}

// take marks s as handed to a reader, which may keep it for good: its blob
// never goes back to the writer. c.mu must be held. It returns s.
func take(s *Snapshot) *Snapshot {
	if s != nil {
		s.taken = true
	}
	return s
}

// infoLocked describes m. core.mu must be held and m must have a version.
func (m *model) infoLocked() Info {
	n := m.newest()
	info := Info{Name: n.Name, Version: n.Version, Epoch: m.epoch, Bytes: int64(len(n.Blob)), Created: n.Created, Owner: m.owner}
	for _, s := range m.versions {
		info.Retained = append(info.Retained, s.Version)
	}
	return info
}

func notFound(name string) error {
	return fmt.Errorf("%w: model %s", errs.ErrNotFound, errs.Quote(name))
}

func (c *core) get(name string, version uint64) (*Snapshot, error) {
	if c.closed() {
		return nil, errClosed
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	s, err := c.findLocked(name, version)
	c.countReadLocked(s)
	return take(s), err
}

// findLocked returns version of name (0: the newest). c.mu must be held.
func (c *core) findLocked(name string, version uint64) (*Snapshot, error) {
	m := c.models[name]
	if m == nil || len(m.versions) == 0 {
		return nil, notFound(name)
	}
	if version == 0 {
		return m.newest(), nil
	}
	i, ok := slices.BinarySearchFunc(m.versions, version, func(s *Snapshot, v uint64) int {
		switch {
		case s.Version < v:
			return -1
		case s.Version > v:
			return 1
		}
		return 0
	})
	if !ok {
		return nil, fmt.Errorf("%w: model %s version %d (retained: %v)", errs.ErrNotFound, errs.Quote(name), version, m.infoLocked().Retained)
	}
	return m.versions[i], nil
}

// lendLocked lends s (see Lender) and returns its release. c.mu must be
// held.
func (c *core) lendLocked(s *Snapshot) func() {
	s.lent++
	var once sync.Once
	return func() {
		once.Do(func() {
			c.mu.Lock()
			s.lent--
			back := s.lent == 0 && s.dropped
			if back {
				s.dropped = false
			}
			c.mu.Unlock()
			if back {
				giveBack([]*Snapshot{s})
			}
		})
	}
}

func (c *core) lend(name string, version uint64) (*Snapshot, func(), error) {
	if c.closed() {
		return nil, nil, errClosed
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	s, err := c.findLocked(name, version)
	if err != nil {
		return nil, nil, err
	}
	c.countReadLocked(s)
	return s, c.lendLocked(s), nil
}

// newestLife implements LifeReader.
func (c *core) newestLife(name string) (version, life uint64, err error) {
	if c.closed() {
		return 0, 0, errClosed
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	m := c.models[name]
	if m == nil || len(m.versions) == 0 {
		return 0, 0, notFound(name)
	}
	return m.newest().Version, m.life, nil
}

func (c *core) getIfNewer(name string, than uint64) (*Snapshot, error) {
	if c.closed() {
		return nil, errClosed
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	m := c.models[name]
	if m == nil || len(m.versions) == 0 {
		return nil, notFound(name)
	}
	if n := m.newest(); n.Version > than {
		c.countReadLocked(n)
		return take(n), nil // only a version handed out is taken
	}
	return nil, nil
}

func (c *core) waitNewer(ctx context.Context, name string, after uint64) (*Snapshot, error) {
	s, _, err := c.awaitNewer(ctx, name, after, 0, false)
	return s, err
}

func (c *core) lendNewer(ctx context.Context, name string, after uint64) (*Snapshot, func(), error) {
	return c.awaitNewer(ctx, name, after, 0, true)
}

// lendNewerLife implements LifeWaiter.
func (c *core) lendNewerLife(ctx context.Context, name string, after, life uint64) (*Snapshot, func(), error) {
	return c.awaitNewer(ctx, name, after, life, true)
}

// awaitNewer waits for a version newer than after, or (life not 0) for a
// version of another life than life, and returns the newest, taken, or
// lent with its release.
func (c *core) awaitNewer(ctx context.Context, name string, after, life uint64, lend bool) (*Snapshot, func(), error) {
	if err := c.checkName(name); err != nil {
		return nil, nil, err
	}
	c.mu.Lock()
	m := c.acquireLocked(name)
	c.mu.Unlock()
	defer c.release(name, m)
	for {
		if c.closed() {
			return nil, nil, errClosed
		}
		c.mu.Lock()
		n, changed := m.newest(), m.changed
		if n != nil && (n.Version > after || life != 0 && n.life != life) {
			c.countReadLocked(n)
			var release func()
			if lend {
				release = c.lendLocked(n)
			} else {
				take(n)
			}
			c.mu.Unlock()
			return n, release, nil
		}
		c.mu.Unlock()
		select {
		case <-changed:
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		case <-c.done:
			return nil, nil, errClosed
		}
	}
}

func (c *core) list() ([]Info, error) {
	if c.closed() {
		return nil, errClosed
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]Info, 0, len(c.models))
	for _, m := range c.models {
		if len(m.versions) > 0 {
			out = append(out, m.infoLocked())
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// ownerUsage implements UsageReader: one pass over the models under mu,
// allocating nothing.
func (c *core) ownerUsage(owner, name string) (models int, bytes int64, owns bool, nameBytes int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for n, m := range c.models {
		if m.owner != owner || len(m.versions) == 0 {
			continue
		}
		b := int64(len(m.newest().Blob))
		models++
		bytes += b
		if n == name {
			owns, nameBytes = true, b
		}
	}
	return models, bytes, owns, nameBytes
}

// holdWrite takes name's write slot (waiting behind a push in progress)
// and returns the model with a function that gives the slot back.
func (c *core) holdWrite(ctx context.Context, name string) (*model, func(), error) {
	if c.closed() {
		return nil, nil, errClosed
	}
	if err := c.checkName(name); err != nil {
		return nil, nil, err
	}
	c.mu.Lock()
	m := c.acquireLocked(name)
	c.mu.Unlock()
	select {
	case m.wsem <- struct{}{}:
	case <-ctx.Done():
		c.release(name, m)
		return nil, nil, ctx.Err()
	case <-c.done:
		c.release(name, m)
		return nil, nil, errClosed
	}
	return m, func() { <-m.wsem; c.release(name, m) }, nil
}

// setOwner implements Claimer.Claim (claim) and Claimer.Release (!claim).
// persist, when non-nil, records the new owner durably (with the model's
// write slot held) before it takes effect.
func (c *core) setOwner(ctx context.Context, name, owner string, claim bool, persist func(name, owner string, life uint64) error) error {
	if owner == "" {
		return fmt.Errorf("%w: an owner must be named", errs.ErrInvalid)
	}
	m, done, err := c.holdWrite(ctx, name)
	if err != nil {
		return err
	}
	defer done()
	c.mu.Lock()
	cur, life := m.owner, m.life
	c.mu.Unlock()
	next := owner
	switch {
	case claim && cur == owner, !claim && cur == "":
		return nil
	case claim && strings.HasPrefix(cur, TokenOwnerPrefix) && !strings.HasPrefix(owner, TokenOwnerPrefix):
		// An in-process owner takes a token's model (an admin registered
		// it with the reducer): next = owner.
	case cur != "" && cur != owner:
		return fmt.Errorf("%w: model %q is managed by %s", errs.ErrPermission, name, cur)
	case !claim:
		next = ""
	}
	if persist != nil {
		if err := persist(name, next, life); err != nil {
			return err
		}
	}
	c.mu.Lock()
	m.owner = next
	c.mu.Unlock()
	return nil
}

// delete implements Deleter.Delete. persist, when non-nil, removes the
// model durably (with its write slot held) before it goes from memory.
func (c *core) delete(ctx context.Context, name string, persist func(name string) error) error {
	m, done, err := c.holdWrite(ctx, name)
	if err != nil {
		return err
	}
	defer done()
	c.mu.Lock()
	empty := len(m.versions) == 0 && m.owner == ""
	c.mu.Unlock()
	if empty {
		return notFound(name)
	}
	if persist != nil {
		if err := persist(name); err != nil {
			return err
		}
	}
	c.mu.Lock()
	for _, s := range m.versions {
		// A deleted version never goes back to its writer: the writer
		// may still believe the model exists, and a loan still out
		// returns into nothing.
		s.recycle, s.dropped = nil, false
	}
	// The entry stays (watchers hold its channel, a pusher may be queued
	// on wsem), emptied: the next push starts the model afresh.
	m.versions, m.epoch, m.owner = nil, 0, ""
	m.life = lives.Add(1) // Seq starts again
	c.mu.Unlock()
	return nil
}

// MaxMetadataBytes bounds a version's safetensors __metadata__ (its keys'
// and values' bytes): every pull of the version carries it in its reply's
// header, which the data plane bounds at 1 MiB and gRPC at its message
// size. Larger, a push was acknowledged that no pull could read.
const MaxMetadataBytes = 256 << 10

// metadataBytes is the bytes of md's keys and values.
func metadataBytes(md map[string]string) int {
	n := 0
	for k, v := range md {
		n += len(k) + len(v)
	}
	return n
}
