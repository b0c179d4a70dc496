package replica

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/rlhub/rlhub/internal/atomicfile"
	"github.com/rlhub/rlhub/internal/cluster"
	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/store"
	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// AcksAll, as SourceConfig.Acks, waits for every standby registered in the
// cluster.
const AcksAll = -1

// SourceConfig configures the primary's side of replication.
type SourceConfig struct {
	// DataDir is the primary's --data; required.
	DataDir string
	// Epoch is the primary's term; a follower that names another is
	// refused.
	Epoch uint64
	// Lineage is the newest term this primary's copy descended from as
	// its term began (Follower.Lead). A full sync keeps a file by size,
	// for a follower that took no unit of this term, only when the
	// follower's copy is of the same lineage; 0 for a copy that descends
	// from no term (a hub's first term, or a test's).
	Lineage uint64
	// Acks is how many standbys must have applied a publish before it is
	// acknowledged: AcksAll (every standby registered in the cluster when
	// the publish is made; the default), 0 (none: asynchronous), or N
	// (at most N; fewer when fewer are registered).
	Acks int
	// Standbys lists the member ids of the standbys registered now (the
	// cluster's members but this one); nil means none. It is read from
	// etcd by RefreshStandbys (the node calls it at the start of the term
	// and every quarter lease), not per publish: a publish waits for the
	// standbys of the newest refresh. An error (etcd unreachable,
	// cluster.ErrDeposed) is RefreshStandbys'; the list kept is unchanged.
	Standbys func(ctx context.Context) ([]string, error)
	// AckTimeout bounds a publish's wait for acknowledgements; 0 means 10s.
	// A publish that times out fails with Unavailable (the version is in
	// the primary's store, not acknowledged).
	AckTimeout time.Duration
	// InSync, when set with Acks AcksAll, records in etcd the standbys
	// whose copies hold every publish acknowledged so far (the node's
	// cluster.Term.RecordInSync, which adds the primary itself). It is
	// called, one call at a time, when that set changes: before a publish
	// is acknowledged when a standby recorded does not hold it (an error
	// fails the publish: not acknowledged), and after one when standbys
	// that hold everything are not recorded yet (an error is logged; the
	// record stays smaller, which only narrows who may take over). The
	// node writes the record's start (InSyncStandbys) before its term
	// serves.
	InSync func(ctx context.Context, standbys []string) error
	// InSyncStandbys are the standbys the record lists when the Source
	// starts (the node wrote them with the primary at the term's start).
	InSyncStandbys []string
	// Interval is how often the scan looks (once for every follower) for
	// changes that no publish announced (ARS reports, registrations:
	// the files their writers named, Changed), when no publish's
	// snapshot was taken in that time; 0 means 100ms. Every
	// fullWalkEvery intervals a snapshot walks the whole tree.
	Interval time.Duration
	// Logger; nil means slog.Default().
	Logger *slog.Logger
	// Shipped, when set, counts what streams sent (the node's, kept
	// across its terms for the metrics); nil means the Source's own.
	Shipped *ShipStats
}

// ShipStats counts the file bytes a primary's streams sent to standbys
// (each standby's counted): whole (a file sent whole from a snapshot),
// appended (only the bytes past a standby's copy: G frames) and cut (a
// standby's own cut: its full sync, or a unit after the snapshots it
// needed were gone), and the units sent from own cuts.
type ShipStats struct {
	Whole, Appended, Cut atomic.Uint64
	Cuts                 atomic.Uint64
}

func (c *SourceConfig) validate() error {
	if c.DataDir == "" {
		return fmt.Errorf("%w: replica: a primary needs its data directory", errs.ErrInvalid)
	}
	if c.Acks < AcksAll {
		return fmt.Errorf("%w: replica: acks %d", errs.ErrInvalid, c.Acks)
	}
	if c.Standbys == nil {
		c.Standbys = func(context.Context) ([]string, error) { return nil, nil }
	}
	if c.AckTimeout == 0 {
		c.AckTimeout = 10 * time.Second
	}
	if c.Interval == 0 {
		c.Interval = 100 * time.Millisecond
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return nil
}

// Source is the primary's side: it serves the replication stream to each
// standby and makes publishes wait for their acknowledgements.
//
// Consistency: a unit is a cut of the primary's data directory taken with
// store commits held off (Freeze): the store's files are read first, then
// the reducer's and ARS's, with no version committed in between. Their
// state is written before the version it produced is published, so the
// cut is a state the primary's own disk passed through (or one with one
// step's state written and not yet published, which issue 14's restart
// path recovers from).
type Source struct {
	rlhubv1.UnimplementedReplicaServer
	cfg SourceConfig

	freeze sync.RWMutex // store commits hold it shared, scans exclusively
	snapMu sync.Mutex   // serialises taking snapshots (held before freeze)
	fullAt time.Time    // when a snapshot last walked the whole store (snapMu held)

	// What commits changed since the last snapshot's walk, taken (and
	// reset) by that walk under the freeze; commits add to it holding the
	// freeze shared. Guarded by dirtyMu.
	dirtyMu sync.Mutex
	// dirty are the store's files (named by the store, Changed) or model
	// directories (CommitModel) a commit touched, relative to DataDir;
	// dirtyAll: a commit that did not say which (Commit), more than
	// maxNamed, or a failed walk, so the next snapshot walks the whole
	// store.
	dirty    map[string]bool
	dirtyAll bool
	// mem holds the bytes of the version files committed since, lent by
	// the store (offerVersion), by path: the snapshot ships them from
	// memory instead of reading them back.
	mem map[string]*memFile
	// named are the paths under ars/ and reducer/ (relative to DataDir,
	// files or directories) their writers changed (Changed); namedAll: a
	// writer named more than maxNamed, or a walk failed, so the next
	// snapshot walks ars/ and reducer/ whole.
	named    map[string]bool
	namedAll bool
	// appended are the files writers extended (Appended), by path, with
	// the offset of the first new byte since the last snapshot.
	appended map[string]int64
	// fromMemory counts the files snapshots took from the store's memory.
	fromMemory atomic.Uint64
	// appendsSent counts the files streams sent as appends (G frames).
	appendsSent atomic.Uint64
	// mutableRead counts the bytes snapshots read of mutable files.
	mutableRead atomic.Uint64

	// before is the immutable files present when the term's Source
	// started, by their stamps: a full sync keeps by size, from a standby
	// that took no unit of this term, only a file still at its stamp here
	// (cut). nil when that walk failed: every such file is sent.
	before map[string]stamp
	// deleted are the store's model directories (relative to DataDir)
	// deleted in this term (Deleted): a name under one may have been
	// written twice in the term, so a full sync to a standby of this
	// term keeps none of its files by size alone; guarded by mu.
	deleted   map[string]bool
	root      string        // DataDir made absolute (what Changed's paths are relative to)
	fullEvery time.Duration // how old the last whole walk may be (fullWalkEvery intervals; tests change it)
	stateAt   time.Time     // when a snapshot last walked ars/ and reducer/ whole (snapMu held)
	tree      fileTree      // the mirrored files as of the newest snapshot (snapMu held)
	// tails holds, of each file writers append to (Appended), the newest
	// content a snapshot read, up to maxTails bytes in all (tailBytes):
	// the next snapshot reads only the bytes appended since, whether or
	// not the snapshots that held it were dropped (snapMu held).
	tails     map[string]*content
	tailBytes int64
	tailsMax  int64 // maxTails (tests change it)
	// stateWalks counts the snapshots' whole walks of ars/ and reducer/,
	// namedWalks the named paths walked instead, modelDirWalks the
	// store's model directories walked whole for a commit (CommitModel)
	// (tests read them).
	stateWalks, namedWalks, modelDirWalks atomic.Uint64

	// inSyncMu serialises InSync calls; inSync is what the last one that
	// succeeded recorded (sorted).
	inSyncMu sync.Mutex
	inSync   []string

	mu        sync.Mutex
	acked     uint64        // the newest unit a publish was acknowledged at
	standbys  []string      // the newest RefreshStandbys
	refreshed bool          // RefreshStandbys succeeded at least once
	changed   chan struct{} // closed and replaced when an ack arrives, a follower leaves, or on close (Sync waits on it)
	work      chan struct{} // closed and replaced when a unit is asked for, a snapshot taken, or on close (ship waits on it)
	done      chan struct{} // closed on close (the scan waits on it)
	unit      uint64        // the newest unit a publish asked for
	followers map[*peer]struct{}
	closed    bool
	seq       uint64      // the newest snapshot's number; a follower's own cut, taken after it, ranks with it
	latest    *snapshot   // the newest snapshot
	live      []*snapshot // snapshots whose files are held (dropPassed releases them)
	scanning  bool        // scanLoop runs
	streams   sync.WaitGroup
}

// peer is one follower's stream.
type peer struct {
	member string
	acked  uint64 // guarded by Source.mu
	// ended is the newest unit whose End frame was sent (or is being
	// sent) on the stream; ends: one was. The follower may acknowledge
	// no unit past it, nor any before the first (readAcks); guarded by
	// Source.mu.
	ended uint64
	ends  bool
	// synced: the follower acknowledged a unit (its first is the full
	// sync: it holds the primary's state); guarded by Source.mu.
	synced bool
	// seen is the sequence number of the newest cut the follower holds
	// (shipped from a snapshot, or its own cut); guarded by Source.mu.
	seen uint64
	// codec: the stream asked for the replication codec (codecName), or
	// is on the data plane (data frames sent from where they lie).
	codec bool
	// appends: the follower takes G frames (hello.Appends).
	appends bool
	// term: the epoch of the follower's newest unit (hello.Term); led:
	// the newest term it led (hello.Led).
	term, led uint64
	// ping: how long the stream may stay silent before the primary pings
	// (the data plane's streams: bulkstream.go); 0 never.
	ping time.Duration
	// since: when the stream was opened (its standby registered before).
	since time.Time
	// lapsed: a refresh read after since did not list the member: its
	// lease lapsed (it died, stopped past its TTL, or its machine was cut
	// off, which leaves the stream open but silent). No publish waits for
	// the stream any more, and its context is cancelled (cancel). Guarded
	// by Source.mu.
	lapsed bool
	cancel context.CancelFunc
}

// NewSource builds the primary's side; Register it on the hub's gRPC
// server.
func NewSource(cfg SourceConfig) (*Source, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	root, err := filepath.Abs(cfg.DataDir)
	if err != nil {
		return nil, fmt.Errorf("replica: data directory: %w", err)
	}
	inSync := slices.Clone(cfg.InSyncStandbys)
	slices.Sort(inSync)
	if cfg.Shipped == nil {
		cfg.Shipped = new(ShipStats)
	}
	return &Source{cfg: cfg, before: immutableStamps(cfg.DataDir, cfg.Logger), root: root, fullEvery: fullWalkEvery * cfg.Interval, tailsMax: maxTails, inSync: inSync,
		changed: make(chan struct{}), work: make(chan struct{}), done: make(chan struct{}), followers: map[*peer]struct{}{}}, nil
}

// immutableStamps is the stamps of the immutable files under dir's
// mirrored directories (Source.before); nil, logged, when the walk
// fails. A file written after it has another stamp: a new name, or a new
// inode renamed in (or a reused one, written at another mtime).
func immutableStamps(dir string, logger *slog.Logger) map[string]stamp {
	es, err := walk(dir, mirroredDirs)
	if err != nil {
		logger.Warn("replica: the files present at the term's start could not be listed; full syncs to standbys new to the term send every version and optimizer state", "err", err)
		return nil
	}
	out := make(map[string]stamp, len(es))
	for _, e := range es {
		if immutable(e.rel) {
			out[e.rel] = e.st
		}
	}
	return out
}

// Register attaches the replication stream to s (hub.Service).
func (s *Source) Register(g *grpc.Server) { rlhubv1.RegisterReplicaServer(g, s) }

// Follow implements rlhubv1.ReplicaServer.
func (s *Source) Follow(ss grpc.BidiStreamingServer[wrapperspb.BytesValue, wrapperspb.BytesValue]) error {
	return s.serve(ss, codecRequested(ss.Context()), 0)
}

// Close ends every follower's stream and waits for them (hub.Service:
// called after the gRPC server stopped).
func (s *Source) Close() error {
	s.mu.Lock()
	s.close()
	s.mu.Unlock()
	s.streams.Wait()
	// Every stream has ended: no snapshot is shipped again.
	s.mu.Lock()
	frees := s.dropPassed()
	s.mu.Unlock()
	s.dirtyMu.Lock()
	for _, m := range s.mem {
		frees = append(frees, m)
	}
	s.mem = nil
	s.dirtyMu.Unlock()
	for _, m := range frees {
		m.free()
	}
	return nil
}

// Stop makes every publish waiting in Sync, and every later one, fail at
// once (a primary that learnt it is deposed); the streams end too. Close
// still waits for them.
func (s *Source) Stop() {
	s.mu.Lock()
	s.close()
	s.mu.Unlock()
}

// close marks the Source closed and wakes everyone; s.mu is held.
func (s *Source) close() {
	if !s.closed {
		close(s.done)
	}
	s.closed = true
	s.bump()
	s.bumpWork()
}

// bump wakes the publishes waiting in Sync; s.mu is held.
func (s *Source) bump() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// bumpWork wakes the followers' streams; s.mu is held.
func (s *Source) bumpWork() {
	close(s.work)
	s.work = make(chan struct{})
}

// Commit runs one store commit with scans held off (the push's local
// write). The next snapshot walks the whole store: CommitModel, which
// names the model the commit touches, spares it that.
func (s *Source) Commit(f func() error) error {
	s.freeze.RLock()
	defer s.freeze.RUnlock()
	s.dirtyMu.Lock()
	s.dirtyAll = true
	s.dirtyMu.Unlock()
	return f()
}

// CommitModel runs one store commit that changes nothing in the store's
// directory but model name's (store.ModelDir) with scans held off; the
// store wrapper (Fenced) calls it. The snapshot that follows walks that
// directory again and takes every other one from the snapshot before it
// (the whole store is walked at least every fullWalkEvery intervals).
func (s *Source) CommitModel(name string, f func() error) error {
	s.freeze.RLock()
	defer s.freeze.RUnlock()
	s.dirtyMu.Lock()
	if s.dirty == nil {
		s.dirty = map[string]bool{}
	}
	s.dirty[filepath.Join("store", store.ModelDir(name))] = true
	s.dirtyMu.Unlock()
	return f()
}

// CommitNamed runs one store commit with scans held off, for a store
// that names every file it changes (store.Namer: FileConfig.Changed set
// to Changed): the snapshot that follows stats those files alone.
func (s *Source) CommitNamed(f func() error) error {
	s.freeze.RLock()
	defer s.freeze.RUnlock()
	return f()
}

// Deleted notes, before the deletion commits (Fenced.Delete), that
// model is being deleted in this term: pushed again, its version files
// come back at the names its old ones had (same version, maybe the same
// size), which a standby of this term holding the old ones must be sent
// again (cut, keepHeld).
func (s *Source) Deleted(model string) {
	dir := filepath.Join("store", store.ModelDir(model))
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.deleted == nil {
		s.deleted = map[string]bool{}
	}
	s.deleted[dir] = true
}

// fullWalkEvery is how many SourceConfig.Intervals a snapshot may take
// the files no commit and no writer named (CommitModel, Changed) from
// the snapshot before it: a change made outside the store wrapper or by
// a writer that does not name its files (none, today; a file edited by
// hand) reaches the standbys within that time all the same. That walk
// is the safety net; what a publish acknowledges never waits for it.
const fullWalkEvery = 10

// maxNamed bounds the paths Changed keeps between snapshots (with no
// follower connected nothing takes them); past it the next snapshot
// walks ars/ and reducer/ whole.
const maxNamed = 4096

// Changed names a file or directory under the data directory's ars/,
// reducer/ or store/ that its writer created, replaced, appended to or
// removed (path absolute, or relative to the working directory; a
// directory stands for everything under it): the next snapshot stats it
// (walks it) instead of walking ars/ and reducer/ whole, or the model's
// store directory. Paths elsewhere are ignored. Safe for concurrent use;
// it does no file I/O.
//
// The contract with the writer: name a path after the write and before
// the store commit whose acknowledgement must carry it (the reducer's
// step state before its version's push; an ARS iteration's state before
// its policy's push). A unit covering a commit is cut after that commit
// (commits hold the freeze shared, a cut exclusively), so after the
// name.
func (s *Source) Changed(path string) {
	rel, top, ok := s.relOf(path)
	if !ok {
		return
	}
	s.dirtyMu.Lock()
	defer s.dirtyMu.Unlock()
	if top == "store" && rel != top {
		// The store's (store.FileConfig.Changed): walked with the store.
		s.dirty, s.dirtyAll = addNamed(s.dirty, s.dirtyAll, rel)
		return
	}
	if !slices.Contains(stateDirs, top) {
		return // not under a state directory (nor one of them: ".." and "." are not)
	}
	s.named, s.namedAll = addNamed(s.named, s.namedAll, rel)
}

// Appended names a mutable file under ars/, reducer/ or aggregator/
// that its writer appended to: from is the file's size when the append
// began (an append-only log: the reducer's step journal; bytes below
// the size are never written again). The next snapshot then holds the
// file as an append of the bytes past what the snapshot before read: a
// follower that holds those is sent only the new ones (a G frame), any
// other the whole file. A file also named by Changed since the last
// snapshot, of another inode than that snapshot saw, or appended to from
// past what it read, is whole. Same contract and bounds as Changed.
func (s *Source) Appended(path string, from int64) {
	rel, top, ok := s.relOf(path)
	if !ok || !slices.Contains(stateDirs, top) || rel == top || from <= 0 {
		s.Changed(path)
		return
	}
	s.dirtyMu.Lock()
	defer s.dirtyMu.Unlock()
	if old, ok := s.appended[rel]; ok {
		s.appended[rel] = min(old, from)
		return
	}
	if s.namedAll || len(s.appended) >= maxNamed {
		s.named, s.namedAll = addNamed(s.named, s.namedAll, rel)
		return
	}
	if s.appended == nil {
		s.appended = map[string]int64{}
	}
	s.appended[rel] = from
}

// relOf is path relative to the data directory, and its first element.
func (s *Source) relOf(path string) (rel, top string, ok bool) {
	dir := s.cfg.DataDir
	if filepath.IsAbs(path) != filepath.IsAbs(dir) {
		// One absolute, one not (the hub's paths are DataDir joined
		// with theirs, so not from the hub): compare absolute paths.
		abs, err := filepath.Abs(path)
		if err != nil {
			return "", "", false
		}
		path, dir = abs, s.root
	}
	rel, err := filepath.Rel(dir, path)
	if err != nil {
		return "", "", false
	}
	top, _, _ = strings.Cut(rel, string(filepath.Separator))
	return rel, top, true
}

// addNamed adds rel to a set of named paths bounded at maxNamed: past
// the bound the set is dropped for a whole walk (all); once all, nothing
// is added.
func addNamed(set map[string]bool, all bool, rel string) (map[string]bool, bool) {
	switch {
	case all:
		return set, true
	case len(set) >= maxNamed:
		return nil, true
	case set == nil:
		set = map[string]bool{}
	}
	set[rel] = true
	return set, false
}

// memFile is a committed version file's bytes, lent by the store (the
// loan keeps them from being recycled: PushRequest.Recycle), with the
// file's stamp when it was offered. The loan is returned once the
// replication is through with them (free) and gRPC has freed every
// buffer it was handed over them (the codec's data frames: hold, Put).
type memFile struct {
	st      stamp
	blob    []byte
	n       atomic.Int64 // 1 until free, plus the buffers gRPC holds
	once    sync.Once
	release func() // the store's loan
}

func newMemFile(st stamp, blob []byte, release func()) *memFile {
	m := &memFile{st: st, blob: blob, release: release}
	m.n.Store(1)
	return m
}

// free says the replication sends nothing more from m; safe to call
// twice.
func (m *memFile) free() { m.once.Do(m.dec) }

func (m *memFile) hold() { m.n.Add(1) }

func (m *memFile) dec() {
	if m.n.Add(-1) == 0 {
		m.release()
	}
}

// Put implements mem.BufferPool: gRPC freed a buffer over m's bytes.
func (m *memFile) Put(*[]byte) { m.dec() }

// Get implements mem.BufferPool; gRPC never calls it (the buffers are
// made with mem.NewBuffer).
func (m *memFile) Get(n int) *[]byte { b := make([]byte, n); return &b }

// offerVersion lends the bytes of model name's version, just committed
// by the caller (with the freeze held shared, in CommitModel's f), to
// the next snapshot: what it ships of that file it ships from memory.
// Nothing is offered when no follower is connected or the store cannot
// lend; the snapshot then reads the file as every other one.
func (s *Source) offerVersion(ctx context.Context, st store.Store, name string, version uint64) {
	l, ok := st.(store.Lender)
	if !ok {
		return
	}
	s.mu.Lock()
	none := len(s.followers) == 0
	s.mu.Unlock()
	if none {
		return
	}
	rel := filepath.Join("store", store.VersionFile(name, version))
	fi, err := os.Stat(filepath.Join(s.cfg.DataDir, rel))
	if err != nil {
		return // not a File store under DataDir: the walk has nothing to match
	}
	snap, release, err := l.Lend(ctx, name, version)
	if err != nil {
		return
	}
	if snap.Version != version || int64(len(snap.Blob)) != fi.Size() {
		release()
		return
	}
	m := newMemFile(stampOf(fi), snap.Blob, release)
	s.dirtyMu.Lock()
	if s.mem == nil {
		s.mem = map[string]*memFile{}
	}
	old := s.mem[rel]
	s.mem[rel] = m
	s.dirtyMu.Unlock()
	if old != nil {
		old.free()
	}
}

// RefreshStandbys reads the registered standbys (SourceConfig.Standbys)
// and keeps them for the publishes that follow.
//
// A follower whose stream was open before the read and whose member the
// read does not list has lost its lease (a standby registers before it
// follows): its stream is marked lapsed and cancelled. A standby cut off
// by a partition leaves its stream open but silent — nothing resets it —
// so without this every publish would wait AckTimeout for it as a
// connected follower (Sync) for as long as the stream seemed alive
// (TestPartitionedStandbyDropsOutAndCatchesUp).
func (s *Source) RefreshStandbys(ctx context.Context) error {
	asked := time.Now()
	standbys, err := s.cfg.Standbys(ctx)
	if err != nil {
		return err
	}
	var lapsed []string
	s.mu.Lock()
	changed := !slices.Equal(s.standbys, standbys)
	listed := changed && (s.refreshed || len(standbys) > 0)
	s.standbys, s.refreshed = standbys, true
	for p := range s.followers {
		if !p.lapsed && p.since.Before(asked) && !slices.Contains(standbys, p.member) {
			p.lapsed, changed = true, true
			p.cancel()
			lapsed = append(lapsed, p.member)
		}
	}
	if changed {
		s.bump() // a publish waiting for a standby that left stops waiting (Sync)
	}
	s.mu.Unlock()
	if listed {
		// Who every publish waits for (acks all): an operator sees a
		// standby join the set, or leave it (dead, or out for a fault).
		s.cfg.Logger.Info("replica: registered standbys", "members", strings.Join(standbys, ","))
	}
	for _, m := range lapsed {
		s.cfg.Logger.Warn("replica: a follower's lease lapsed; its stream is dropped and no publish waits for it", "member", m)
	}
	return nil
}

// Prepare returns, before a commit, which standbys the publish will wait
// for: those of the newest RefreshStandbys. Before the first refresh
// succeeded it reads them itself (one etcd read, failing the publish
// before it changes anything when etcd cannot answer).
func (s *Source) Prepare(ctx context.Context) ([]string, error) {
	s.mu.Lock()
	standbys, ok := s.standbys, s.refreshed
	s.mu.Unlock()
	if ok {
		return standbys, nil
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.AckTimeout)
	defer cancel()
	if err := s.RefreshStandbys(ctx); err != nil {
		return nil, err
	}
	return s.Prepare(ctx)
}

// Sync asks for a unit covering everything committed so far and waits
// until enough of standbys (from Prepare) applied it (SourceConfig.Acks).
// With no standby to wait for it returns at once.
func (s *Source) Sync(ctx context.Context, standbys []string) error {
	return s.syncUntil(ctx, standbys, nil)
}

// errTermUnconfirmed is syncUntil's error when its stop channel closed:
// the term proof ended (a renewal failed) while the publish waited.
var errTermUnconfirmed = errors.New("replica: the term proof ended while the standbys' acknowledgements were awaited")

// syncUntil is Sync, which also stops waiting, with errTermUnconfirmed,
// once stop is closed (nil: never; Fenced passes cluster.Term.ProofEnded).
// A primary whose machine is cut off from etcd and its standbys then
// answers its publishes when its term proof ends, not after AckTimeout or
// once its lease is given up (TestPublishWaitEndsWithTheTermProof).
func (s *Source) syncUntil(ctx context.Context, standbys []string, stop <-chan struct{}) error {
	if s.cfg.Acks == 0 {
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return fmt.Errorf("%w: replica: primary closing", errs.ErrUnavailable)
		}
		s.unit++
		s.bumpWork()
		s.mu.Unlock()
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.AckTimeout)
	defer cancel()
	s.mu.Lock()
	s.unit++
	want := s.unit
	s.bumpWork()
	// Besides the registered standbys (as of the last refresh), wait for
	// every follower connected now: one that registered since the refresh
	// may have taken its full sync before this commit and campaign next.
	// One that connects later takes its full sync after the commit; one
	// of these extras that leaves is not waited for (its next full sync
	// carries the commit).
	registered := map[string]bool{}
	for _, id := range standbys {
		registered[id] = true
	}
	extra := map[string]bool{}
	for p := range s.followers {
		if !registered[p.member] && !p.lapsed {
			extra[p.member] = true
		}
	}
	var need int
	var ids []string
	for {
		if s.closed {
			s.mu.Unlock()
			return fmt.Errorf("%w: replica: primary closing", errs.ErrUnavailable)
		}
		// A standby that a refresh since found gone (its lease lapsed: it
		// died, or stopped past its TTL) is not waited for, as a publish
		// made after that refresh would not wait for it: a publish in
		// flight when a standby is killed does not wait out AckTimeout.
		ids = ids[:0]
		for _, id := range standbys {
			if slices.Contains(s.standbys, id) {
				ids = append(ids, id)
			}
		}
		for id := range extra {
			if s.connected(id) {
				ids = append(ids, id)
			}
		}
		need = len(ids)
		if s.cfg.Acks > 0 {
			need = min(need, s.cfg.Acks)
		}
		if s.ackedBy(ids, want) >= need {
			return s.acknowledged(ctx, want)
		}
		ch := s.changed
		s.mu.Unlock()
		select {
		case <-ch:
		case <-stop:
			return errTermUnconfirmed
		case <-ctx.Done():
			s.mu.Lock()
			got := s.ackedBy(ids, want)
			s.mu.Unlock()
			return fmt.Errorf("%w: replica: %d of %d standbys acknowledged the publish within %v (it is not acknowledged)",
				errs.ErrUnavailable, got, need, s.cfg.AckTimeout)
		}
		s.mu.Lock()
	}
}

// acknowledged ends a publish at unit want whose standbys applied it:
// with SourceConfig.InSync, the in-sync record then lists exactly the
// members that hold every publish acknowledged so far (those whose streams
// applied the newest acknowledged unit), written before the publish is
// acknowledged when it drops one. s.mu is held on entry and released.
func (s *Source) acknowledged(ctx context.Context, want uint64) error {
	s.acked = max(s.acked, want)
	s.mu.Unlock()
	dropped, err := s.recordInSync(ctx, true)
	if err == nil {
		return nil
	}
	if dropped {
		return fmt.Errorf("%w: replica: cannot record in etcd that a standby lacks the publish (it is not acknowledged): %v", errs.ErrUnavailable, err)
	}
	s.cfg.Logger.Warn("replica: cannot record the standbys that caught up as in sync; they cannot take over yet", "err", err)
	return nil
}

// UpdateInSync adds to the in-sync record the members whose streams
// applied every acknowledged publish: the node calls it every quarter
// lease, so a standby that caught up may take over without waiting for
// the next publish. Members recorded that fell behind stay until a
// publish they lack is acknowledged (acknowledged drops them first).
func (s *Source) UpdateInSync(ctx context.Context) error {
	_, err := s.recordInSync(ctx, false)
	return err
}

// InSyncMembers are the member ids of the standbys the in-sync record
// lists as this Source last wrote it, sorted, and whether it keeps the
// record at all (false: SourceConfig.InSync unset, or acks other than
// all; ids is then nil). The caller owns ids.
func (s *Source) InSyncMembers() (ids []string, keeps bool) {
	if !s.keepsInSync() {
		return nil, false
	}
	s.inSyncMu.Lock()
	defer s.inSyncMu.Unlock()
	return slices.Clone(s.inSync), true
}

// keepsInSync reports whether this Source keeps the in-sync record.
func (s *Source) keepsInSync() bool { return s.cfg.InSync != nil && s.cfg.Acks == AcksAll }

// recordInSync writes the in-sync record (SourceConfig.InSync) if it
// should change: the holders of every acknowledged publish (exact), or
// those and the members recorded now; it reports whether the record it
// asked for drops a member.
func (s *Source) recordInSync(ctx context.Context, exact bool) (bool, error) {
	if !s.keepsInSync() {
		return false, nil
	}
	s.inSyncMu.Lock()
	defer s.inSyncMu.Unlock()
	var want []string
	if !exact {
		want = slices.Clone(s.inSync)
	}
	s.mu.Lock()
	for p := range s.followers {
		if !p.lapsed && p.synced && p.acked >= s.acked && !slices.Contains(want, p.member) {
			want = append(want, p.member)
		}
	}
	s.mu.Unlock()
	slices.Sort(want)
	if slices.Equal(want, s.inSync) {
		return false, nil
	}
	dropped := slices.ContainsFunc(s.inSync, func(id string) bool { return !slices.Contains(want, id) })
	if err := s.cfg.InSync(ctx, want); err != nil {
		return dropped, err
	}
	s.inSync = want
	s.cfg.Logger.Info("replica: in-sync standbys recorded (only they and this primary may take over)", "standbys", strings.Join(want, ","))
	return dropped, nil
}

// Followed reports whether a registered standby follows this term: its
// stream open and past its full sync (it acknowledged a unit), so it may
// be elected in this hub's place.
func (s *Source) Followed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for p := range s.followers {
		if !p.lapsed && p.acked > 0 && slices.Contains(s.standbys, p.member) {
			return true
		}
	}
	return false
}

// connected reports whether member has a stream open that has not
// lapsed; s.mu is held.
func (s *Source) connected(member string) bool {
	for p := range s.followers {
		if p.member == member && !p.lapsed {
			return true
		}
	}
	return false
}

// ackedBy counts the registered standbys whose stream applied unit u;
// s.mu is held.
func (s *Source) ackedBy(standbys []string, u uint64) int {
	seen := map[string]bool{}
	for p := range s.followers {
		if p.acked >= u {
			seen[p.member] = true
		}
	}
	n := 0
	for _, id := range standbys {
		if seen[id] {
			n++
		}
	}
	return n
}

// Followers reports each connected follower's member id and newest
// acknowledged unit, and the newest unit asked for.
func (s *Source) Followers() (acked map[string]uint64, unit uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	acked = map[string]uint64{}
	for p := range s.followers {
		acked[p.member] = max(acked[p.member], p.acked)
	}
	return acked, s.unit
}

// serve runs one follower's stream: codec and ping as in peer.
func (s *Source) serve(ss frameStream, codec bool, ping time.Duration) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return status.Error(codes.Unavailable, "replica: primary closing")
	}
	s.streams.Add(1)
	s.mu.Unlock()
	defer s.streams.Done()
	var m wrapperspb.BytesValue
	if err := ss.RecvMsg(&m); err != nil {
		return err
	}
	b := m.GetValue()
	var h hello
	if len(b) == 0 || b[0] != kindHello {
		return status.Error(codes.InvalidArgument, "replica: stream must open with a hello")
	}
	if err := parseJSON(b[1:], &h); err != nil {
		return status.Error(codes.InvalidArgument, err.Error())
	}
	if h.Query {
		return status.Error(codes.FailedPrecondition, "replica: this hub is the primary, not a standby with a position")
	}
	if !cluster.ValidID(h.Member) { // logged, and acknowledgements counted by it: bounded, never echoed
		return status.Error(codes.InvalidArgument, "replica: the hello's member id is not one (1 to 64 of A-Z a-z 0-9 . _ -)")
	}
	if h.Epoch != s.cfg.Epoch {
		return status.Errorf(codes.FailedPrecondition, "replica: this primary holds epoch %d, the follower expects %d", s.cfg.Epoch, h.Epoch)
	}
	ctx, cancel := context.WithCancel(ss.Context())
	defer cancel()
	p := &peer{member: h.Member, codec: codec, appends: h.Appends, term: h.Term, led: h.Led, ping: ping, since: time.Now(), cancel: cancel}
	s.mu.Lock()
	s.followers[p] = struct{}{}
	if !s.scanning {
		s.scanning = true
		s.streams.Add(1)
		go s.scanLoop() // the owner: Close waits for s.streams
	}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.followers, p)
		s.bump()
		frees := s.dropPassed() // what only p still had to ship
		s.mu.Unlock()
		for _, m := range frees {
			m.free()
		}
	}()
	s.cfg.Logger.Info("replica: standby following", "member", h.Member, "epoch", h.Epoch)

	ackErr := make(chan error, 1)
	// The owner of the read: Close, which waits for s.streams (above 0
	// here: serve's own).
	s.streams.Add(1)
	go func() {
		defer s.streams.Done()
		ackErr <- s.readAcks(ss, p)
		cancel()
	}()
	fs := ss
	if len(h.Dirs) == 0 {
		fs = &legacyFilter{frameStream: ss}
	}
	fs = &endingStream{frameStream: fs, s: s, p: p}
	err := s.ship(ctx, fs, p, h.Have)
	cancel()
	var aerr error
	if a, ok := ss.(interface{ abort() }); ok {
		a.abort() // a data-plane stream's read ends with serve
		aerr = <-ackErr
	} else {
		// A gRPC stream's read ends only once the handler has returned
		// (or the follower sends): waiting for it here held a stream whose
		// shipping failed (a snapshot's walk, a cut) or that a lapse
		// cancelled open for good, an idle follower sending nothing —
		// every publish waited for it, and its snapshots stayed live.
		// The follower's reason, when its read ended first.
		select {
		case aerr = <-ackErr:
		default:
		}
	}
	if err == nil || errors.Is(err, context.Canceled) {
		err = aerr // the follower went away (or broke the stream): its reason
	}
	s.cfg.Logger.Info("replica: standby left", "member", h.Member, "err", err)
	return err
}

func (s *Source) readAcks(ss frameStream, p *peer) error {
	for {
		var m wrapperspb.BytesValue
		if err := ss.RecvMsg(&m); err != nil {
			return err
		}
		b := m.GetValue()
		if len(b) == 0 || b[0] != kindAck {
			return status.Error(codes.InvalidArgument, "replica: follower sent a frame that is not an ack")
		}
		u, _, err := parseUvarint(b[1:])
		if err != nil {
			return status.Error(codes.InvalidArgument, err.Error())
		}
		s.mu.Lock()
		if !p.ends || u > p.ended {
			// A follower acknowledges the units it applied: one past the
			// newest sent (a buggy or stale standby, or a unit of another
			// stream) would count for publishes it never received.
			ended, ends := p.ended, p.ends
			s.mu.Unlock()
			if !ends {
				return status.Errorf(codes.InvalidArgument, "replica: follower acknowledged unit %d before any unit was sent on its stream", u)
			}
			return status.Errorf(codes.InvalidArgument, "replica: follower acknowledged unit %d, past the newest unit sent on its stream (%d)", u, ended)
		}
		first := !p.synced
		p.synced = true
		if u > p.acked {
			p.acked = u
			s.bump()
		}
		s.mu.Unlock()
		if first && s.keepsInSync() {
			// Its full sync applied, the standby holds every acknowledged
			// publish: recorded at once, it may take over from now on, not
			// only after the next publish or quarter-lease update (a
			// primary killed in between left no standby to take over).
			ctx, cancel := context.WithTimeout(ss.Context(), inSyncWriteTimeout)
			if err := s.UpdateInSync(ctx); err != nil {
				s.cfg.Logger.Warn("replica: cannot record a standby that caught up as in sync; it cannot take over yet", "member", p.member, "err", err)
			}
			cancel()
		}
	}
}

// inSyncWriteTimeout bounds a follower's stream's write of the in-sync
// record when its full sync is acknowledged.
const inSyncWriteTimeout = 5 * time.Second

// ship sends a full sync (its own cut), then, whenever a publish asks
// for a unit or the scan found a change, what the newest snapshot holds
// that the follower does not: the snapshot every follower shares, or its
// own cut when it fell behind what the snapshot holds.
func (s *Source) ship(ctx context.Context, ss frameStream, p *peer, have map[string]int64) error {
	shipped := map[string]stamp{}
	s.mu.Lock()
	sent := s.unit
	s.mu.Unlock()
	seen, err := s.sendCut(ss, p, sent, true, shipped, have, true)
	if err != nil {
		return err
	}
	for {
		if err := ctx.Err(); err != nil {
			return err // dropped (a lapse) or the follower went away
		}
		s.mu.Lock()
		u, ch, closed, latest := s.unit, s.work, s.closed, s.latest
		s.mu.Unlock()
		if closed {
			return status.Error(codes.Unavailable, "replica: primary closing")
		}
		var snap *snapshot
		switch {
		case u > sent:
			// A publish waits: a snapshot taken after its commit.
			if snap, err = s.snapshotFor(u, seen); err != nil {
				return status.Error(codes.Internal, err.Error())
			}
		case latest != nil && latest.seq > seen:
			snap = latest // the scan found a change no publish announced
		default:
			if err := s.idle(ctx, ss, p, ch); err != nil {
				return err
			}
			continue
		}
		unit := max(snap.unit, sent) // units only grow on a stream
		ok, err := s.sendSnapshot(ss, snap, seen, unit, u > sent, shipped, p.codec, p.appends)
		if err != nil {
			return err
		}
		cutSeq := uint64(0)
		if !ok { // the snapshot lacks a file this follower needs: its own cut
			if cutSeq, err = s.sendCut(ss, p, unit, false, shipped, nil, u > sent); err != nil {
				return err
			}
		}
		sent, seen = unit, max(snap.seq, cutSeq)
		s.passed(p, snap)
	}
}

// idle waits for work (ch) or ctx's end, pinging the follower every
// p.ping meanwhile (between units only: never where a frame of a unit is
// due).
func (s *Source) idle(ctx context.Context, ss frameStream, p *peer, ch <-chan struct{}) error {
	var tick <-chan time.Time
	if p.ping > 0 {
		t := time.NewTimer(p.ping)
		defer t.Stop()
		tick = t.C
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-ch:
	case <-tick:
		return ss.SendMsg(&wrapperspb.BytesValue{Value: []byte{kindPing}})
	}
	return nil
}

// snapshot is one cut of the mirrored tree, taken with commits held off
// and shared by every follower: the walk, and the content of every file
// that changed since the snapshot before it, read once and kept as the
// data frames each follower sends (mutable files read under the freeze,
// immutable ones opened under it and read after). Everything but files
// is immutable once published as Source.latest.
type snapshot struct {
	seq  uint64 // its place among cuts (Source.seq, taken under the freeze)
	unit uint64 // Source.unit under the freeze: it covers every publish that asked for a unit ≤ unit
	at   time.Time
	// delta is every file whose state differs from the snapshot before
	// it (seq-1; for the first of a term, every file), by path.
	delta map[string]change
	// full, when set, is every mirrored file as of this snapshot: the
	// first of a term and those that walked a directory whole (the safety
	// net). A stream sending a snapshot compares what its follower holds
	// with the newest full at or after the follower's cut and the deltas
	// after it (sendSnapshot), not with the whole tree.
	full map[string]stamp
	// files holds the content of the files that changed since the
	// snapshot before (and of some unchanged ones, carried from it);
	// guarded by Source.mu, nil once every follower has shipped the
	// snapshot (dropPassed).
	files map[string]*content
}

// content is one file's content at one stamp, as data frames. Its bytes
// may be a version's, lent by the store (memFile): they stay untouched
// while a snapshot holds the content (holders) and are given back
// (free) once none does.
type content struct {
	st      stamp
	size    int64
	frames  []*dataOut // data frames, read-only
	holders int        // snapshots whose files hold it; guarded by Source.mu
	freed   bool       // holders fell to 0: never carried again; guarded by Source.mu
	mem     *memFile   // the lent bytes the frames are views of; nil when read from disk
	raw     []byte     // a mutable file's bytes, read from disk (the frames are views of them)
	// extended: a later snapshot's content of an append-only file took
	// raw's spare capacity for the bytes appended since (readAsWalked);
	// guarded by Source.snapMu.
	extended bool
}

// dataFrames cuts b into data frames, views of b (no copy); lent, when
// set, holds b (the codec counts what gRPC holds of it). Bytes not lent
// must never change once framed: gRPC may read them after SendMsg.
func dataFrames(b []byte, lent *memFile) []*dataOut {
	var out []*dataOut
	for off := 0; off < len(b); off += chunkBytes {
		out = append(out, &dataOut{b: b[off:min(off+chunkBytes, len(b))], lent: lent})
	}
	return out
}

// sendData sends one data frame: through the replication codec when the
// follower asked for it (codec), else as a BytesValue the stock codec
// copies during SendMsg.
func sendData(ss frameStream, d *dataOut, codec bool) error {
	if codec {
		return ss.SendMsg(d)
	}
	return ss.SendMsg(&wrapperspb.BytesValue{Value: d.b})
}

// codecRequested reports whether the stream in ctx asked for the
// replication codec (codecName).
func codecRequested(ctx context.Context) bool {
	md, _ := metadata.FromIncomingContext(ctx)
	for _, ct := range md.Get("content-type") {
		if strings.HasSuffix(strings.ToLower(ct), "+"+codecName) {
			return true
		}
	}
	return false
}

// memContent is the content of a version file from the bytes the store
// lent (m). The loan is returned when the last snapshot holding the
// content drops it; should a path miss that, when the content is
// collected.
func memContent(m *memFile) *content {
	c := &content{st: m.st, size: int64(len(m.blob)), frames: dataFrames(m.blob, m), mem: m}
	runtime.AddCleanup(c, (*memFile).free, m)
	return c
}

// readFrames reads f whole into data frames.
func readFrames(f *os.File, rel string) (*content, error) {
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	b := make([]byte, fi.Size())
	if _, err := io.ReadFull(f, b); err != nil {
		return nil, fmt.Errorf("replica: read %s: %w", rel, err)
	}
	return &content{size: fi.Size(), frames: dataFrames(b, nil)}, nil
}

// snapshotFor returns a snapshot covering unit u and newer than the
// follower's cut seen: the newest one when it is, else a new one.
func (s *Source) snapshotFor(u, seen uint64) (*snapshot, error) {
	s.snapMu.Lock()
	defer s.snapMu.Unlock()
	s.mu.Lock()
	latest := s.latest
	s.mu.Unlock()
	if latest != nil && latest.unit >= u && latest.seq > seen {
		return latest, nil
	}
	return s.takeSnapshot(latest, true)
}

// maxCarried bounds the content a snapshot keeps from the one before
// for a follower that has not shipped that one yet (acks 0 lets the
// publishes run ahead of a slow standby); past it, such a follower
// takes its own cut.
const maxCarried = 64 << 20

// takeSnapshot looks, under the freeze, at what changed since the
// snapshot before (prev; s.tree is its files) and reads it (the first
// snapshot of a term walks everything and reads nothing: it is the base
// the next one compares with); s.snapMu is held. Of the store it walks
// only the model directories commits named since (CommitModel), of ars/
// and reducer/ only the paths their writers named (Changed), and
// compares what it found with s.tree under those paths alone; it walks a
// part whole when prev is nil, a commit did not name its model, a writer
// named too much, a walk failed, or the last whole walk is
// fullWalkEvery intervals old. A version file committed since is shipped
// from the bytes the store lent (offerVersion) when the file is as
// offered. When something changed, or force, the snapshot becomes
// s.latest and the followers are woken; otherwise prev is returned (at
// once, without the freeze, when nothing was named and no whole walk is
// due).
func (s *Source) takeSnapshot(prev *snapshot, force bool) (*snapshot, error) {
	if !force && prev != nil && !s.pending() {
		return prev, nil
	}
	var prevFiles map[string]*content
	if prev != nil {
		s.mu.Lock()
		prevFiles = prev.files
		s.mu.Unlock()
	}
	snap := &snapshot{files: map[string]*content{}}
	type toRead struct {
		rel string
		st  stamp
		f   *os.File
	}
	var later []toRead
	var mem map[string]*memFile
	defer func() {
		for _, r := range later {
			r.f.Close()
		}
		for _, m := range mem { // offered and not used
			m.free()
		}
	}()
	var carriedFrom []*content     // prev's contents this one holds too
	tails := map[string]*content{} // appended files' contents read, for s.tails
	var made []*memFile            // the lent bytes this one ships from
	first := s.tree.files == nil
	var found []entry // the first snapshot's walk: the tree
	whole := first    // a part was walked whole: snap.full is set
	fail := func() {  // what this snapshot took is walked next time, its mutable files sent
		s.dirtyMu.Lock()
		s.dirtyAll, s.namedAll = true, true
		s.dirtyMu.Unlock()
		for _, m := range made {
			m.free()
		}
	}
	err := func() (err error) {
		s.freeze.Lock()
		defer s.freeze.Unlock()
		s.dirtyMu.Lock()
		dirty, all, named, namedAll, appended := s.dirty, s.dirtyAll, s.named, s.namedAll, s.appended
		mem = s.mem
		s.dirty, s.dirtyAll, s.mem, s.named, s.namedAll, s.appended = nil, false, nil, nil, false, nil
		s.dirtyMu.Unlock()
		stored, storeScopes, storeWhole, err := s.walkStore(dirty, all || first)
		if err != nil {
			return err
		}
		walked := named // what the state walk stats: the named paths and the appended files
		if len(appended) > 0 {
			walked = maps.Clone(named)
			if walked == nil {
				walked = map[string]bool{}
			}
			for rel := range appended {
				walked[rel] = true
			}
		}
		state, stateScopes, stateWhole, err := s.walkState(walked, namedAll || first)
		if err != nil {
			return err
		}
		whole = first || storeWhole || stateWhole
		if first {
			found = append(stored, state...)
		} else {
			snap.delta = s.tree.diff(append(stored, state...), append(storeScopes, stateScopes...))
			// A mutable file its writer named is sent whatever its stamp
			// says: a name written again and again (a manifest, a state
			// record) can come back at an inode it had, at the same size
			// and, within one tick of the file system's clock, the same
			// mtime — unchanged to the stamp, and the standby would keep
			// the old bytes (a manifest without the version it ships).
			// When the names were lost (more than maxNamed, or a snapshot
			// that took them failed: all), every mutable file of the part
			// is, as in a standby's own cut.
			for _, part := range []struct {
				found []entry
				named map[string]bool
				all   bool
			}{{stored, dirty, all}, {state, named, namedAll}} {
				for _, e := range part.found {
					if !immutable(e.rel) && (part.all || within(e.rel, part.named)) {
						snap.delta[e.rel] = change{st: e.st, named: true}
					}
				}
			}
			// A file only appended to since the snapshot before (the same
			// inode, the appends starting at or before what that snapshot
			// read) is an append of the bytes past it: a follower holding
			// those is sent the rest (sendSnapshot). Writers append
			// outside the freeze, so an append named now may lie partly
			// or wholly in what the snapshot before read. Anything else
			// about the file: whole.
			for _, e := range state {
				from, ok := appended[e.rel]
				if !ok || immutable(e.rel) || namedAll || within(e.rel, named) {
					continue
				}
				was, had := s.tree.files[e.rel]
				switch {
				case had && e.st == was:
					// Every byte named was read before: unchanged, and
					// not in the delta (diff left it out).
				case had && was.ino == e.st.ino && from <= was.size && e.st.size > was.size:
					snap.delta[e.rel] = change{st: e.st, named: true, appendFrom: was.size}
				default:
					snap.delta[e.rel] = change{st: e.st, named: true}
				}
			}
		}
		for rel, ch := range snap.delta {
			if ch.gone {
				continue
			}
			path := filepath.Join(s.cfg.DataDir, rel)
			var gone bool
			if m := mem[rel]; m != nil && m.st == ch.st {
				snap.files[rel] = memContent(m)
				made = append(made, m)
				s.fromMemory.Add(1)
				delete(mem, rel)
			} else if immutable(rel) {
				f, err := openImmutable(path, ch.st)
				if gone = errors.Is(err, os.ErrNotExist); err != nil && !gone {
					return fmt.Errorf("replica: read %s: %w", rel, err)
				}
				if !gone {
					later = append(later, toRead{rel: rel, st: ch.st, f: f})
				}
			} else {
				var data []byte
				var err error
				if ch.appendFrom > 0 {
					// Writers append outside the freeze: what the walk
					// saw, exactly, as the stamp says (or whole). The
					// bytes before the append are the snapshot before's
					// when it read them all (the file's stamp in the
					// tree): only the new ones are read.
					base := s.tails[rel]
					if base != nil && (base.st != s.tree.files[rel] || int64(len(base.raw)) != ch.appendFrom) {
						base = nil
					}
					var n int
					data, n, err = readAsWalked(path, ch.st, base)
					s.mutableRead.Add(uint64(n))
					if err == nil && data == nil {
						ch.appendFrom = 0
						snap.delta[rel] = ch
					}
				}
				if data == nil && err == nil {
					data, err = os.ReadFile(path)
					s.mutableRead.Add(uint64(len(data)))
				}
				if gone = errors.Is(err, os.ErrNotExist); err != nil && !gone {
					return fmt.Errorf("replica: read %s: %w", rel, err)
				}
				if !gone {
					c := &content{st: ch.st, size: int64(len(data)), frames: dataFrames(data, nil), raw: data}
					snap.files[rel] = c
					if _, ok := appended[rel]; ok || s.tails[rel] != nil {
						tails[rel] = c
					}
				}
			}
			if gone { // removed since the walk: absent from this snapshot
				if _, ok := s.tree.files[rel]; ok {
					snap.delta[rel] = change{gone: true}
				} else {
					delete(snap.delta, rel)
				}
			}
		}
		if !force && !first && len(snap.delta) == 0 {
			return nil // as prev left it
		}
		// prev's content of a file this one did not change is carried for
		// a follower that has not shipped prev yet.
		carried := int64(0)
		for rel, c := range prevFiles {
			if _, changed := snap.delta[rel]; !changed && s.tree.files[rel] == c.st && carried+c.size <= maxCarried {
				snap.files[rel] = c
				carriedFrom = append(carriedFrom, c)
				carried += c.size
			}
		}
		s.mu.Lock()
		s.seq++
		snap.seq, snap.unit = s.seq, s.unit
		s.mu.Unlock()
		return nil
	}()
	if err != nil {
		fail()
		return nil, err
	}
	if snap.seq == 0 {
		return prev, nil // nothing changed: no content was made from memory
	}
	for _, r := range later { // immutable: read after the freeze
		c, err := readFrames(r.f, r.rel)
		if err != nil {
			fail()
			return nil, err
		}
		c.st = r.st
		snap.files[r.rel] = c
	}
	if first {
		// Every mutable file is named, as in a standby's own cut: what
		// writers named before the term's first snapshot is not kept
		// apart from the rest, and a follower whose full sync came before
		// it may hold a manifest rewritten since at a recurring stamp.
		snap.delta = make(map[string]change, len(found))
		for _, e := range found {
			snap.delta[e.rel] = change{st: e.st, named: !immutable(e.rel)}
		}
		s.tree.start() // known from now on, even when empty
	}
	for rel, ch := range snap.delta {
		if ch.gone {
			s.tree.remove(rel)
			s.keepTail(rel, nil)
		} else {
			s.tree.set(rel, ch.st)
		}
	}
	for rel, c := range tails {
		s.keepTail(rel, c)
	}
	if whole {
		snap.full = maps.Clone(s.tree.files)
	}
	snap.at = time.Now()
	s.mu.Lock()
	// A carried content whose every holder was dropped meanwhile may have
	// given its bytes back: it is not carried (a follower that needs it
	// takes its own cut).
	for _, c := range carriedFrom {
		if c.freed {
			for rel, h := range snap.files {
				if h == c {
					delete(snap.files, rel)
				}
			}
		}
	}
	for _, c := range snap.files {
		c.holders++
	}
	s.live = append(s.live, snap)
	if s.latest == nil || s.latest.seq < snap.seq {
		s.latest = snap
	}
	s.bumpWork()
	s.mu.Unlock()
	return snap, nil
}

// pending reports whether a snapshot would find anything prev does not
// hold: a commit or a writer named something since, or a whole walk is
// due. s.snapMu is held.
func (s *Source) pending() bool {
	s.dirtyMu.Lock()
	named := len(s.dirty) > 0 || s.dirtyAll || len(s.named) > 0 || s.namedAll || len(s.appended) > 0 || len(s.mem) > 0
	s.dirtyMu.Unlock()
	return named || time.Since(s.fullAt) >= s.fullEvery || time.Since(s.stateAt) >= s.fullEvery
}

// walkStore walks the store's mirrored files under the freeze: all of
// them when whole (or when the last whole walk is fullWalkEvery
// intervals old), else the dirty model directories. It returns what it
// found, the paths it walked (what the found files replace in s.tree)
// and whether that was the whole store. s.snapMu is held.
func (s *Source) walkStore(dirty map[string]bool, whole bool) ([]entry, []string, bool, error) {
	if whole || time.Since(s.fullAt) >= s.fullEvery {
		es, err := walk(s.cfg.DataDir, []string{"store"})
		if err == nil {
			s.fullAt = time.Now()
		}
		return es, []string{"store"}, true, err
	}
	dirs := make([]string, 0, len(dirty))
	for d := range dirty {
		if strings.Count(d, string(filepath.Separator)) == 1 {
			s.modelDirWalks.Add(1) // store/<model>, not a file in it
		}
		dirs = append(dirs, d)
	}
	es, err := walk(s.cfg.DataDir, dirs)
	return es, dirs, false, err
}

// walkState walks ars/ and reducer/ under the freeze: all of it when
// whole (a writer named too much, a walk failed, the first snapshot) or
// when the last whole walk is fullWalkEvery intervals old; else the
// paths named (Changed). It returns what it found, the paths it walked
// and whether that was all of ars/ and reducer/. A snapshot with nothing
// named stats nothing here. s.snapMu is held.
func (s *Source) walkState(named map[string]bool, whole bool) ([]entry, []string, bool, error) {
	if whole || time.Since(s.stateAt) >= s.fullEvery {
		s.stateWalks.Add(1)
		es, err := walk(s.cfg.DataDir, stateDirs)
		if err == nil {
			s.stateAt = time.Now()
		}
		return es, slices.Clone(stateDirs), true, err
	}
	// A path under another named one is walked with it.
	paths := make([]string, 0, len(named))
	for p := range named {
		if i := strings.LastIndexByte(p, filepath.Separator); i < 0 || !within(p[:i], named) {
			paths = append(paths, p)
		}
	}
	s.namedWalks.Add(uint64(len(paths)))
	es, err := walk(s.cfg.DataDir, paths)
	return es, paths, false, err
}

// within reports whether rel or a directory above it is in set.
func within(rel string, set map[string]bool) bool {
	for {
		if set[rel] {
			return true
		}
		i := strings.LastIndexByte(rel, filepath.Separator)
		if i < 0 {
			return false
		}
		rel = rel[:i]
	}
}

// passed records that p holds snap, and drops the content of every
// snapshot all followers hold (dropPassed).
func (s *Source) passed(p *peer, snap *snapshot) {
	s.mu.Lock()
	p.seen = max(p.seen, snap.seq)
	frees := s.dropPassed()
	s.mu.Unlock()
	for _, m := range frees {
		m.free()
	}
}

// dropPassed drops the content of every snapshot each connected
// follower holds (all of them when none is connected): a follower that
// needs it later takes its own cut. It returns the lent bytes no
// snapshot holds any more, for the caller to give back once s.mu is
// released; s.mu is held.
func (s *Source) dropPassed() []*memFile {
	low, any := uint64(0), false
	for q := range s.followers {
		if q.lapsed {
			// Dropped (its lease lapsed): a stream stalled in a send
			// (gRPC's flow control) stays here until its transport gives
			// up, and must not keep every later snapshot meanwhile.
			continue
		}
		if !any || q.seen < low {
			low, any = q.seen, true
		}
	}
	var frees []*memFile
	kept := s.live[:0]
	for _, snap := range s.live {
		if any && snap.seq > low {
			kept = append(kept, snap)
			continue
		}
		for _, c := range snap.files {
			if c.holders--; c.holders == 0 {
				c.freed = true
				if c.mem != nil {
					frees = append(frees, c.mem)
				}
			}
		}
		snap.files = nil
	}
	clear(s.live[len(kept):])
	s.live = kept
	return frees
}

// scanLoop takes a snapshot every SourceConfig.Interval when none was
// taken for a publish in that time, so that changes no publish announced
// (ARS reports, registrations: named by their writers, Changed) reach
// the followers, and the whole walk when due (fullWalkEvery); it ends
// once no follower is connected (serve starts it again) or the Source
// closes.
func (s *Source) scanLoop() {
	defer s.streams.Done()
	tick := time.NewTicker(s.cfg.Interval)
	defer tick.Stop()
	for {
		s.mu.Lock()
		if s.closed || len(s.followers) == 0 {
			s.scanning = false
			s.mu.Unlock()
			return
		}
		s.mu.Unlock()
		select {
		case <-s.done:
			continue
		case <-tick.C:
		}
		s.snapMu.Lock()
		s.mu.Lock()
		latest := s.latest
		s.mu.Unlock()
		if latest == nil || time.Since(latest.at) >= s.cfg.Interval {
			if _, err := s.takeSnapshot(latest, false); err != nil {
				s.cfg.Logger.Warn("replica: scan", "err", err)
			}
		}
		s.snapMu.Unlock()
	}
}

// sendSnapshot sends, as unit, what snap holds that shipped (what the
// follower holds: its cut or snapshot seen, and what changed on the
// primary since that it was sent) does not, and records it in shipped;
// an empty unit is sent only when force. What may differ is what the
// snapshots after seen up to snap changed (their deltas), or, from the
// newest of them that holds every file (full), everything: a unit costs
// what changed, not the tree. ok is false, with nothing sent, when snap
// lacks the content of a file the follower needs, or a snapshot between
// seen and snap is gone: the caller sends the follower's own cut.
func (s *Source) sendSnapshot(ss frameStream, snap *snapshot, seen, unit uint64, force bool, shipped map[string]stamp, codec, appends bool) (ok bool, err error) {
	type send struct {
		rel  string
		st   stamp
		c    *content
		from int64 // above 0: only the bytes from here (a G frame)
	}
	var files []send
	var gone []string
	s.mu.Lock()
	chain := s.chain(seen, snap)
	if chain == nil {
		s.mu.Unlock()
		return false, nil
	}
	// The state snap holds, of every path that may differ from shipped:
	// full's (when the chain starts at a full snapshot), then each delta
	// after it, newest last.
	full, fullSeq := chain[0].full, uint64(0)
	if full != nil {
		fullSeq, chain = chain[0].seq, chain[1:]
	}
	// A path any of the deltas says was named is sent whatever the stamp
	// shipped (a stamp can recur: takeSnapshot).
	merged := map[string]change{}
	for _, c := range chain {
		for rel, ch := range c.delta {
			ch.named = ch.named || merged[rel].named
			merged[rel] = ch
		}
	}
	// So is one named in the full snapshot's delta, or in one before it
	// the follower has not shipped: full holds their stamps, not their
	// names (every snapshot after seen is live until the follower passes
	// it).
	for _, l := range s.live {
		if l.seq <= seen || l.seq > fullSeq {
			continue
		}
		for rel, ch := range l.delta {
			if !ch.named {
				continue
			}
			if m, ok := merged[rel]; ok {
				m.named = true
				merged[rel] = m
			} else if st, ok := full[rel]; ok {
				merged[rel] = change{st: st, named: true}
			}
		}
	}
	tails := s.appendable(seen, snap, shipped, appends)
	need := func(rel string, st stamp, named bool) bool {
		if old, ok := shipped[rel]; ok && old == st && !named {
			return true
		}
		c := snap.files[rel]
		if c == nil || c.st != st {
			return false
		}
		f := send{rel: rel, st: st, c: c}
		if from := tails[rel]; from > 0 && from < int64(len(c.raw)) {
			f.from = from
		}
		files = append(files, f)
		return true
	}
	for rel, ch := range merged {
		if ch.gone {
			if _, ok := shipped[rel]; ok {
				gone = append(gone, rel)
			}
		} else if !need(rel, ch.st, ch.named) {
			s.mu.Unlock()
			return false, nil
		}
	}
	if full != nil {
		for rel, st := range full {
			if _, ok := merged[rel]; !ok && !need(rel, st, false) {
				s.mu.Unlock()
				return false, nil
			}
		}
		for rel := range shipped {
			if _, ok := merged[rel]; !ok {
				if _, ok := full[rel]; !ok {
					gone = append(gone, rel)
				}
			}
		}
	}
	// The lent bytes sent are held until sent: a stream whose lease
	// lapsed no longer keeps its snapshots live (dropPassed), and what it
	// is still sending must not go back to the store meanwhile.
	var held []*memFile
	for _, f := range files {
		if f.c.mem != nil {
			f.c.mem.hold()
			held = append(held, f.c.mem)
		}
	}
	s.mu.Unlock()
	defer func() {
		for _, m := range held {
			m.dec()
		}
	}()
	if len(files) == 0 && len(gone) == 0 && !force {
		return true, nil
	}
	slices.SortFunc(files, func(a, b send) int { return strings.Compare(a.rel, b.rel) })
	slices.Sort(gone)
	if err := ss.SendMsg(jsonFrame(kindBegin, begin{Unit: unit, Epoch: s.cfg.Epoch})); err != nil {
		return true, err
	}
	for _, f := range files {
		frames := f.c.frames
		if f.from > 0 {
			if err := ss.SendMsg(appendFrame(f.rel, f.c.size, f.from)); err != nil {
				return true, err
			}
			frames = dataFrames(f.c.raw[f.from:], nil)
			s.appendsSent.Add(1)
			s.cfg.Shipped.Appended.Add(uint64(f.c.size - f.from))
		} else if err := ss.SendMsg(pathFrame(kindFile, f.rel, f.c.size)); err != nil {
			return true, err
		} else {
			s.cfg.Shipped.Whole.Add(uint64(f.c.size))
		}
		for _, d := range frames {
			if err := sendData(ss, d, codec); err != nil {
				return true, err
			}
		}
		shipped[f.rel] = f.st
	}
	for _, rel := range gone {
		if err := ss.SendMsg(pathFrame(kindDelete, rel, 0)); err != nil {
			return true, err
		}
		delete(shipped, rel)
	}
	return true, sendEnd(ss, unit)
}

// appendable says which files changed from seen to snap a follower can
// be sent as appends, and from which offset: when it takes appends,
// every snapshot after seen up to snap is live, each that changed the
// file only appended to it, and the follower holds the file (shipped:
// the same inode) at least up to where the first of those appends
// starts, short of its size at snap. s.mu is held.
func (s *Source) appendable(seen uint64, snap *snapshot, shipped map[string]stamp, appends bool) map[string]int64 {
	if !appends {
		return nil
	}
	var span []*snapshot
	for _, l := range s.live {
		if l.seq > seen && l.seq <= snap.seq {
			span = append(span, l)
		}
	}
	if uint64(len(span)) != snap.seq-seen {
		return nil
	}
	first := map[string]int64{} // the offset a file's appends start at; 0: not only appended to
	last := map[string]stamp{}
	for _, l := range span {
		for rel, ch := range l.delta {
			if _, ok := first[rel]; !ok || ch.appendFrom == 0 {
				first[rel] = ch.appendFrom
			}
			last[rel] = ch.st
		}
	}
	var out map[string]int64
	for rel, from := range first {
		held, ok := shipped[rel]
		if from == 0 || !ok || held.ino != last[rel].ino || from > held.size || held.size >= last[rel].size {
			continue
		}
		if out == nil {
			out = map[string]int64{}
		}
		out[rel] = held.size
	}
	return out
}

// chain returns the snapshots a follower holding cut or snapshot seen
// must apply to hold snap, oldest first: those after seen up to snap,
// or from the newest full one among them; nil when one is no longer
// live (or snap is not newer than seen). s.mu is held.
func (s *Source) chain(seen uint64, snap *snapshot) []*snapshot {
	i := len(s.live) - 1
	for i >= 0 && s.live[i] != snap {
		i--
	}
	if i < 0 || snap.seq <= seen {
		return nil
	}
	j := i
	for ; s.live[j].full == nil && s.live[j].seq > seen+1; j-- {
		if j == 0 || s.live[j-1].seq != s.live[j].seq-1 {
			return nil
		}
	}
	return s.live[j : i+1]
}

// openImmutable opens an immutable file the walk saw at want, to be read
// after the freeze, locked shared (atomicfile.LockShared) before the
// freeze ends: the store may retire the name once commits go on, and its
// pool of spares then never writes this inode while the read holds the
// lock — the file keeps the bytes it was opened with, as a removed file
// does. A writer that does not take the freeze (the reducer's optimizer
// states) may retire the name and write the inode anew between the open
// and the lock: the file, locked, is checked to be still what the walk
// saw, or counts as removed since (os.ErrNotExist).
func openImmutable(path string, want stamp) (*os.File, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	if err := atomicfile.LockShared(f); err != nil {
		f.Close()
		return nil, err
	}
	fi, err := f.Stat()
	if err == nil && stampOf(fi) != want {
		err = fmt.Errorf("replica: %s was replaced since the walk: %w", path, os.ErrNotExist)
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// maxTails bounds the appended files' contents a Source keeps between
// snapshots (Source.tails); past it, a file's appends are read with the
// file whole, as before any was kept.
const maxTails = 64 << 20

// keepTail keeps c as rel's newest content for the next snapshot's
// append (nil: forgets it), within maxTails; s.snapMu is held.
func (s *Source) keepTail(rel string, c *content) {
	if old := s.tails[rel]; old != nil {
		s.tailBytes -= int64(cap(old.raw))
		delete(s.tails, rel)
	}
	if c == nil || s.tailBytes+int64(cap(c.raw)) > s.tailsMax {
		return
	}
	if s.tails == nil {
		s.tails = map[string]*content{}
	}
	s.tails[rel] = c
	s.tailBytes += int64(cap(c.raw))
}

// readAsWalked reads the first st.size bytes of the file at path when it
// is still st's inode and at least that long (an append-only file
// appended to since the walk holds what the walk saw there); nil when
// it is not. With base, the file's first bytes as a snapshot read them,
// it reads only the bytes past base's: into base's spare capacity when
// no other content took it (the bytes base holds never change, and no
// one reads past them), else after a copy of base with room to grow. A
// journal appended to at every step is then read once, not once a step.
// It returns the bytes it read too. s.snapMu is held (base.extended).
func readAsWalked(path string, st stamp, base *content) ([]byte, int, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, 0, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, 0, err
	}
	if now := stampOf(fi); now.ino != st.ino || now.size < st.size {
		return nil, 0, nil
	}
	var b []byte
	var from int
	switch {
	case base == nil || int64(len(base.raw)) >= st.size:
		b = make([]byte, st.size)
	case !base.extended && int64(cap(base.raw)) >= st.size:
		b, from = base.raw[:st.size], len(base.raw)
		base.extended = true
	default:
		b = make([]byte, st.size, 2*st.size)
		from = copy(b, base.raw)
	}
	n, err := f.ReadAt(b[from:], int64(from))
	if err != nil {
		return nil, n, err
	}
	return b, n, nil
}

// opened is one file of a unit: its content read (mutable files) or an
// open descriptor (immutable ones, read after the freeze).
type opened struct {
	rel  string
	st   stamp
	data []byte
	f    *os.File
	keep bool
}

// keepRule is which immutable files a full sync keeps at the follower's
// size (sendCut).
type keepRule int

const (
	keepNone   keepRule = iota // none: every file is sent
	keepBefore                 // those present, at their stamps, when the term began (Source.before)
	keepHeld                   // every one the follower holds at the primary's size, but under a model deleted in this term (Deleted)
)

// cut takes the unit's files: the store's first, then ARS's and the
// reducer's, with commits held off throughout.
//
// seq is the cut's place among snapshots (the newest snapshot's seq when
// it was taken: the cut is newer than it).
func (s *Source) cut(shipped map[string]stamp, have map[string]int64, full bool, keep keepRule) (files []opened, gone []string, seq uint64, err error) {
	s.freeze.Lock()
	defer s.freeze.Unlock()
	s.mu.Lock()
	seq = s.seq
	deleted := maps.Clone(s.deleted)
	s.mu.Unlock()
	defer func() {
		if err != nil {
			for _, o := range files {
				if o.f != nil {
					o.f.Close()
				}
			}
			files = nil
		}
	}()
	var all []entry
	for _, dirs := range [][]string{{"store"}, stateDirs} {
		es, err := walk(s.cfg.DataDir, dirs)
		if err != nil {
			return files, nil, 0, err
		}
		for _, e := range es {
			all = append(all, e)
			// An immutable file's stamp stands for its content. A mutable
			// one's can recur with new content (takeSnapshot): it is sent
			// whatever was shipped. Mutable files are small (manifests and
			// state records), and a follower needs its own cut rarely.
			if old, ok := shipped[e.rel]; ok && old == e.st && !full && immutable(e.rel) {
				continue
			}
			if full && immutable(e.rel) && (keep == keepHeld && !deleted[filepath.Dir(e.rel)] || keep == keepBefore && s.before[e.rel] == e.st) {
				if sz, ok := have[e.rel]; ok && sz == e.st.size {
					files = append(files, opened{rel: e.rel, st: e.st, keep: true})
					continue
				}
			}
			o := opened{rel: e.rel, st: e.st}
			path := filepath.Join(s.cfg.DataDir, e.rel)
			if immutable(e.rel) {
				o.f, err = openImmutable(path, e.st)
			} else {
				o.data, err = os.ReadFile(path)
			}
			if errors.Is(err, os.ErrNotExist) {
				continue // removed since the walk; its absence ships next time
			}
			if err != nil {
				return files, nil, 0, fmt.Errorf("replica: read %s: %w", e.rel, err)
			}
			files = append(files, o)
		}
	}
	if !full {
		present := make(map[string]bool, len(all))
		for _, e := range all {
			present[e.rel] = true
		}
		for rel := range shipped {
			if !present[rel] {
				gone = append(gone, rel)
			}
		}
	}
	return files, gone, seq, nil
}

// sendCut sends the follower a unit from its own cut (a full sync, or
// what a snapshot could not give it): everything when full, else what
// changed since shipped; an empty one only when force. It returns the
// cut's seq.
func (s *Source) sendCut(ss frameStream, p *peer, u uint64, full bool, shipped map[string]stamp, have map[string]int64, force bool) (uint64, error) {
	// A file this primary wrote in its term may share its name and size
	// with one of the term before that nobody acknowledged (a version or
	// an optimizer state of a step the dead primary committed, shipped to
	// this standby alone, and that this term made again from other
	// gradients): held by a follower that took no unit of this term, it
	// is sent, not kept. The term's files are told by their stamps, not
	// by a clock (Source.before). And a follower whose copy descends from
	// another term than this primary's (it led a term this primary never
	// followed, or it missed one) may hold any file of its name with
	// other bytes: it is sent every file.
	keep := keepNone
	switch {
	case p.term == s.cfg.Epoch:
		keep = keepHeld
	case max(p.term, p.led) == s.cfg.Lineage:
		keep = keepBefore
	}
	files, gone, seq, err := s.cut(shipped, have, full, keep)
	if err != nil {
		return 0, status.Error(codes.Internal, err.Error())
	}
	if !full && !force && len(files) == 0 && len(gone) == 0 {
		return seq, nil
	}
	if err := s.send(ss, u, full, files, gone, shipped, p.codec); err != nil {
		return 0, err
	}
	s.mu.Lock()
	p.seen = max(p.seen, seq)
	s.mu.Unlock()
	return seq, nil
}

// send writes one unit and records what the follower now holds.
func (s *Source) send(ss frameStream, u uint64, full bool, files []opened, gone []string, shipped map[string]stamp, codec bool) error {
	defer func() {
		for _, o := range files {
			if o.f != nil {
				o.f.Close()
			}
		}
	}()
	if err := ss.SendMsg(jsonFrame(kindBegin, begin{Unit: u, Full: full, Epoch: s.cfg.Epoch})); err != nil {
		return err
	}
	s.cfg.Shipped.Cuts.Add(1)
	for _, o := range files {
		if o.keep {
			if err := ss.SendMsg(pathFrame(kindKeep, o.rel, 0)); err != nil {
				return err
			}
			shipped[o.rel] = o.st
			continue
		}
		size := int64(len(o.data))
		if o.f != nil {
			fi, err := o.f.Stat()
			if err != nil {
				return status.Error(codes.Internal, err.Error())
			}
			size = fi.Size()
		}
		if err := ss.SendMsg(pathFrame(kindFile, o.rel, size)); err != nil {
			return err
		}
		s.cfg.Shipped.Cut.Add(uint64(size))
		if o.f == nil {
			for _, d := range dataFrames(o.data, nil) {
				if err := sendData(ss, d, codec); err != nil {
					return err
				}
			}
		} else {
			for left := size; left > 0; {
				// A buffer per frame: gRPC may read it after SendMsg.
				buf := make([]byte, min(int64(chunkBytes), left))
				if _, err := io.ReadFull(o.f, buf); err != nil {
					return status.Errorf(codes.Internal, "replica: read %s: %v", o.rel, err)
				}
				if err := sendData(ss, &dataOut{b: buf}, codec); err != nil {
					return err
				}
				left -= int64(len(buf))
			}
		}
		shipped[o.rel] = o.st
	}
	for _, rel := range gone {
		if err := ss.SendMsg(pathFrame(kindDelete, rel, 0)); err != nil {
			return err
		}
		delete(shipped, rel)
	}
	return sendEnd(ss, u)
}

// endingStream is a follower's stream as ship sends on it: it records
// the unit of each End frame before the frame goes out (peer.ended),
// so that readAcks refuses an acknowledgement of a unit never sent.
type endingStream struct {
	frameStream
	s *Source
	p *peer
}

// sendEnd sends the End frame of unit u, recorded first on an
// endingStream: the follower may acknowledge u as soon as it has it.
func sendEnd(ss frameStream, u uint64) error {
	if e, ok := ss.(*endingStream); ok {
		e.s.mu.Lock()
		e.p.ended, e.p.ends = max(e.p.ended, u), true
		e.s.mu.Unlock()
	}
	return ss.SendMsg(uvarintFrame(kindEnd, u))
}
