package replica

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"google.golang.org/grpc"

	"github.com/rlhub/rlhub/internal/atomicfile"
	"github.com/rlhub/rlhub/internal/cluster"
	"github.com/rlhub/rlhub/internal/crashpoint"
	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/wire/bulk"
)

// FollowerConfig configures a standby's side of replication.
type FollowerConfig struct {
	// DataDir is the standby's --data; required. Its ars/, reducer/ and
	// store/ become copies of the primary's; DataDir/.replica holds the
	// staging area and the highest epoch seen.
	DataDir string
	// Member is this hub's member id (the primary counts acks by it).
	Member string
	// Dial connects to the primary; required.
	Dial func(ctx context.Context, addr string) (*grpc.ClientConn, error)
	// Bulk is the data-plane client (its TLS and token: the dial
	// config's) the stream is followed on; nil follows on gRPC only.
	Bulk *bulk.Client
	// Transport: TransportAuto (""), or TransportGRPC for the gRPC stream
	// even when Bulk is set.
	Transport Transport
	// Sync is when a unit is acknowledged: SyncWrite (the default) once
	// its files are written and renamed into place, SyncFsync once they
	// and their directories are also fsynced. See SyncMode.
	Sync SyncMode
	// CrashAt (tests only) SIGKILLs the process at a named point of a
	// unit's install (internal/crashpoint; `serve` reads RLHUB_TEST_REPLICA_CRASH).
	CrashAt string
	// Logger; nil means slog.Default().
	Logger *slog.Logger
}

// SyncMode is when a standby acknowledges a unit (`serve --replica-sync`).
//
// SyncWrite: once the unit's files are written and renamed into place, in
// the standby's page cache. The kernel keeps them when any process is
// killed (kill -9 of the primary, of the standby or of both loses no
// acknowledged publish: the primary fsyncs its own commit before it
// waits, and the standby's bytes are in the kernel); what a power loss
// or kernel crash of the standby's machine can lose is its last few
// seconds of units (the kernel's writeback interval, about 30 s at most)
// — an acknowledged publish is then gone only if the primary's disk is
// lost too, or the whole cluster loses power and that standby wins the
// election first.
//
// SyncFsync: once the files and their directories are fsynced on the
// standby's disk too: an acknowledged publish survives the loss of the
// primary's machine and a power loss of every standby, at the cost of
// one fsync per unit on every standby.
type SyncMode string

const (
	SyncWrite SyncMode = "write"
	SyncFsync SyncMode = "fsync"
)

// ParseSyncMode reads `--replica-sync`.
func ParseSyncMode(s string) (SyncMode, error) {
	switch SyncMode(s) {
	case SyncWrite, SyncFsync:
		return SyncMode(s), nil
	}
	return "", fmt.Errorf("%w: --replica-sync: want write or fsync", errs.ErrInvalid)
}

// Follower applies a primary's units to a standby's data directory.
type Follower struct {
	cfg    FollowerConfig
	crash  *crashpoint.Hook
	spares *atomicfile.Spares // retired files whose inodes staged files reuse
	synced atomic.Bool        // a full sync completed (since the last Follow began)
	units  atomic.Uint64
	last   atomic.Uint64 // the newest unit applied
	// scrubs counts the checks of the copy completed (on start and while
	// following), damagedFiles the files they moved aside.
	scrubs, damagedFiles atomic.Uint64

	posMu sync.Mutex
	pos   position // the newest unit applied, with its primary's epoch

	// treeMu is held while a unit is installed and while a running scrub
	// confirms damage and moves it aside (Scrub): the scrub never judges
	// a tree halfway through a unit's moves.
	treeMu sync.Mutex
	// damaged: a running scrub moved files aside (treeMu held). Until a
	// full sync is installed no other unit is: the position a unit saves
	// would claim a copy that lacks them.
	damaged bool
	// gen counts the scrubs that moved files aside (treeMu held): a full
	// sync ends the damage only on a stream opened after the last, whose
	// inventory lacked those files.
	gen uint64
	// stopStream ends the stream being followed (Follow sets it; nil
	// when there is none).
	streamMu   sync.Mutex
	stopStream context.CancelFunc
	// suspected, when set (tests), runs between a running scrub's first
	// check and its second.
	suspected func()

	mu    sync.Mutex
	epoch uint64 // highest primary epoch seen, persisted
	led   uint64 // the newest term this hub led, persisted (Lead)
}

// NewFollower opens the standby's side: it finishes or discards a unit
// a kill interrupted (recoverUnits) and reads the highest epoch it has
// followed.
func NewFollower(cfg FollowerConfig) (*Follower, error) {
	if cfg.DataDir == "" || cfg.Dial == nil {
		return nil, fmt.Errorf("%w: replica: a follower needs DataDir and Dial", errs.ErrInvalid)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Sync == "" {
		cfg.Sync = SyncWrite
	}
	if _, err := ParseSyncMode(string(cfg.Sync)); err != nil {
		return nil, err
	}
	f := &Follower{cfg: cfg, crash: crashpoint.Parse(cfg.CrashAt)}
	if err := os.MkdirAll(f.dir(), 0o755); err != nil {
		return nil, fmt.Errorf("replica: %w", err)
	}
	var err error
	if f.spares, err = atomicfile.OpenSpares(filepath.Join(f.dir(), spareName)); err != nil {
		return nil, err
	}
	if err := f.recoverUnits(); err != nil {
		return nil, err
	}
	f.epoch, f.led = f.readTerm(epochName), f.readTerm(ledName)
	if f.pos, err = f.savedPosition(); err != nil {
		// Written whole (renamed into place): unreadable means damaged.
		// Counting as 0 only makes this copy yield, never win.
		cfg.Logger.Warn("replica: the saved position is unreadable; counting the copy as at 0", "err", err)
	}
	// The copy is checked on start (and, by Scrub, while it follows): a
	// full sync keeps any immutable file the standby holds at the
	// primary's size, so a damaged one would stay until this hub, elected,
	// could not open its store; set aside, it is sent again.
	damaged, err := checkCopy(context.Background(), cfg.DataDir, nil, 0)
	if err != nil {
		return nil, fmt.Errorf("replica: checking the copy in %s: %w", cfg.DataDir, err)
	}
	f.scrubs.Add(1)
	if err := f.setAside(damaged); err != nil {
		return nil, err
	}
	return f, nil
}

// setAside moves the damaged files checkCopy found into
// DataDir/.replica/damaged (outside the mirrored tree), logs each, counts
// them, and resets the position: the copy lacks what its position claims
// until a full sync, so it yields any election meanwhile, as an
// unreadable position does (after a restart too: the next unit saves a
// position again). A follower that runs holds treeMu.
func (f *Follower) setAside(damaged map[string]error) error {
	if len(damaged) == 0 {
		return nil
	}
	f.posMu.Lock()
	f.pos = position{}
	f.posMu.Unlock()
	quarantine := filepath.Join(f.dir(), "damaged")
	err := moveAside(f.cfg.DataDir, quarantine, damaged)
	for rel, why := range damaged {
		f.cfg.Logger.Error("replica: a file of this hub's copy is damaged; moved aside for the primary to send again",
			"file", rel, "err", why, "moved_to", filepath.Join(quarantine, rel))
	}
	f.damagedFiles.Add(uint64(len(damaged)))
	if err != nil {
		return fmt.Errorf("replica: moving damaged files aside: %w", err)
	}
	if err := os.Remove(filepath.Join(f.dir(), positionName)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("replica: %w", err)
	}
	return nil
}

// positionName is the copy's saved position in DataDir/.replica: the
// commit marker of the newest unit installed, renamed there once the
// unit's moves are made (promoteMarker). A marker's "epoch" and "unit"
// are the position's fields; its "files" and "gone" are ignored when the
// position is read (older builds wrote the position alone, which reads
// the same).
const positionName = "position"

func (f *Follower) dir() string { return filepath.Join(f.cfg.DataDir, ".replica") }

// Synced reports whether a full sync with the primary being followed has
// completed: the standby holds every unit that primary acknowledged to
// it since.
func (f *Follower) Synced() bool { return f.synced.Load() }

// position is the copy's position: the newest unit applied and its
// primary's epoch (not reset when a stream ends). It is kept in
// DataDir/.replica/position too (the unit's commit marker, renamed there
// after the unit is installed and before it is acknowledged: positionName),
// so a standby restarted (a whole cluster restarted at once) answers an
// elected hub's position query with the copy it holds, not 0: every
// acknowledged unit's position is there (with the unit's own
// durability: --replica-sync).
func (f *Follower) position() position {
	f.posMu.Lock()
	defer f.posMu.Unlock()
	return f.pos
}

// LastUnit is the newest unit applied from the primary followed now.
func (f *Follower) LastUnit() uint64 { return f.last.Load() }

// Scrubs is the number of checks of the copy completed, on start and
// while following; damagedFiles the files they found damaged and moved
// aside.
func (f *Follower) Scrubs() (scrubs, damagedFiles uint64) {
	return f.scrubs.Load(), f.damagedFiles.Load()
}

// Units counts the units applied.
func (f *Follower) Units() uint64 { return f.units.Load() }

// Epoch is the highest primary epoch this data directory has followed.
func (f *Follower) Epoch() uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.epoch
}

// ObserveEpoch raises the highest epoch seen (a term this hub held, or
// saw elected) and persists it: no primary of an older term is followed
// afterwards.
func (f *Follower) ObserveEpoch(e uint64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if e <= f.epoch {
		return nil
	}
	if err := f.writeTerm(epochName, e); err != nil {
		return err
	}
	f.epoch = e
	return nil
}

// epochName is, in DataDir/.replica, the highest primary epoch followed
// (ObserveEpoch).
const epochName = "epoch"

// readTerm reads the epoch a file of DataDir/.replica holds (epochName,
// ledName); 0 when there is none.
func (f *Follower) readTerm(name string) uint64 {
	b, err := os.ReadFile(filepath.Join(f.dir(), name))
	if err != nil {
		return 0
	}
	e, _ := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	return e
}

// writeTerm makes e what the file name of DataDir/.replica holds, durably.
func (f *Follower) writeTerm(name string, e uint64) error {
	if err := atomicfile.Write(filepath.Join(f.dir(), name), []byte(strconv.FormatUint(e, 10)+"\n")); err != nil {
		return fmt.Errorf("replica: %w", err)
	}
	return nil
}

// ledName is, in DataDir/.replica, the newest term this hub led (Lead).
const ledName = "led"

// Lead records, before this hub writes anything as the primary of term
// epoch, that it led that term, and returns the copy's lineage as the term
// begins: the newest term it descends from, its position's (the term whose
// primary its newest unit came from) or the one it led last, whichever is
// newer. Two copies of one lineage hold one history: a file of one name in
// both, present before either's next term, has the same bytes (Source.cut).
func (f *Follower) Lead(epoch uint64) (lineage uint64, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	lineage = max(f.position().Epoch, f.led)
	if epoch <= f.led {
		return lineage, nil
	}
	if err := f.writeTerm(ledName, epoch); err != nil {
		return lineage, err
	}
	f.led = epoch
	return lineage, nil
}

// ledTerm is the newest term this hub led (Lead); 0 for none.
func (f *Follower) ledTerm() uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.led
}

// Follow streams from leader and applies its units until the stream
// ends, ctx ends, or a unit is refused. A leader whose epoch is older than
// one this standby has seen is refused (fencing).
func (f *Follower) Follow(ctx context.Context, leader cluster.Leader) error {
	f.synced.Store(false)
	f.last.Store(0)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	f.streamMu.Lock()
	f.stopStream = cancel
	f.streamMu.Unlock()
	defer func() {
		f.streamMu.Lock()
		f.stopStream = nil
		f.streamMu.Unlock()
	}()
	// A stream whose first unit does not begin within firstFrameTimeout of
	// the start (an epoch write or inventory slowed by the disk, a
	// connection that never became ready, a stream opened on a hub that
	// was just changing roles) is dropped and followed again.
	first := time.AfterFunc(firstFrameTimeout, cancel)
	defer first.Stop()
	start := time.Now()
	if seen := f.Epoch(); leader.Epoch < seen {
		return fmt.Errorf("%w: replica: %s holds epoch %d, older than %d seen here; not following",
			errs.ErrStale, leader.Addr, leader.Epoch, seen)
	}
	if err := f.ObserveEpoch(leader.Epoch); err != nil {
		return err
	}
	epochWrite := time.Since(start)
	f.treeMu.Lock()
	gen := f.gen
	f.treeMu.Unlock()
	have, err := inventory(f.cfg.DataDir)
	if err != nil {
		return err
	}
	inv := time.Since(start) - epochWrite
	// How long each step of the opening took: a stalled opening says
	// where it stalled (the epoch's write and fsync, the inventory of
	// --data, or the connection).
	opening := func() string {
		return fmt.Sprintf("epoch write %v, inventory %v, total %v", epochWrite.Round(time.Millisecond),
			inv.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
	}
	// The connection and the hello get openTimeout of their own: a stream
	// opened while the elected hub switched from its standby server to the
	// hub was seen to hang before its hello was sent (2 s and more at load
	// 17), and the first frame's 10 s is as long as a publish waits for
	// this standby (AckTimeout's default).
	opened := time.AfterFunc(openTimeout, cancel)
	defer opened.Stop()
	h := hello{Member: f.cfg.Member, Epoch: leader.Epoch, Have: have, Dirs: mirroredDirs, Appends: true, Term: f.position().Epoch, Led: f.ledTerm()}
	us, transport, err := f.open(ctx, leader, h, opening)
	if err != nil {
		return err
	}
	defer us.close()
	opened.Stop()
	f.cfg.Logger.Info("replica: following the primary", "primary", leader.String(), "files_held", len(have), "transport", transport, "opening", opening())
	for {
		holdAt(ctx, f.crash, "unit-hold")
		// applyUnit saves the position with the unit (its marker, and
		// f.pos).
		u, err := f.applyUnit(us, leader.Epoch, gen, first.Stop)
		if err != nil {
			return err
		}
		f.units.Add(1)
		f.last.Store(u)
		if err := us.ack(u); err != nil {
			return err
		}
	}
}

// open opens the stream to leader and sends the hello: on the data plane
// unless FollowerConfig says gRPC, and on gRPC when the primary's data
// plane lacks the method (bulkstream.go). It names the transport used.
func (f *Follower) open(ctx context.Context, leader cluster.Leader, h hello, opening func() string) (unitStream, string, error) {
	if f.cfg.Bulk != nil && f.cfg.Transport != TransportGRPC {
		us, err := openBulk(ctx, f.cfg.Bulk, leader.Addr, h)
		if err == nil {
			return us, "data plane", nil
		}
		if !fallBack(err) {
			return nil, "", fmt.Errorf("replica: opening the stream on the data plane (%s): %w", opening(), err)
		}
		f.cfg.Logger.Info("replica: the primary's data plane has no replication stream; following on gRPC", "primary", leader.Addr, "err", err)
	}
	cc, err := f.cfg.Dial(ctx, leader.Addr)
	if err != nil {
		return nil, "", fmt.Errorf("%w: replica: dial %s: %v", errs.ErrUnavailable, leader.Addr, err)
	}
	// The replication codec: data frames are written to their files from
	// gRPC's receive buffers (codec.go).
	cs, err := cc.NewStream(ctx, &streamDesc, FollowMethod, grpc.CallContentSubtype(codecName))
	if err != nil {
		cc.Close()
		return nil, "", fmt.Errorf("%w: replica: opening the stream (%s): %v", errs.ErrUnavailable, opening(), err)
	}
	if err := cs.SendMsg(jsonFrame(kindHello, h)); err != nil {
		cc.Close()
		return nil, "", fmt.Errorf("%w: replica: hello: %v", errs.ErrUnavailable, err)
	}
	return grpcUnits{cs: cs, done: func() { cc.Close() }}, "gRPC", nil
}

// firstFrameTimeout bounds the wait for a stream's first unit to begin
// (the primary cuts it at once); openTimeout bounds its connection and
// hello.
const (
	firstFrameTimeout = 10 * time.Second
	openTimeout       = 3 * time.Second
)

type staged struct {
	rel, tmp string
}

// applyUnit receives one unit into the staging area and, once its end
// arrives whole, installs it; a unit cut short changes nothing. gen is
// Follower.gen when the stream was opened.
func (f *Follower) applyUnit(us unitStream, epoch, gen uint64, began func() bool) (uint64, error) {
	b, err := us.recv()
	if err != nil {
		return 0, err
	}
	var bg begin
	if b[0] != kindBegin {
		return 0, errFrame
	}
	if err := parseJSON(b[1:], &bg); err != nil {
		return 0, err
	}
	if bg.Epoch != epoch {
		return 0, fmt.Errorf("%w: replica: unit from epoch %d on a stream of epoch %d", errs.ErrStale, bg.Epoch, epoch)
	}
	began()
	stage := filepath.Join(f.dir(), stageName)
	// A unit committed (marked) whose install failed is rolled forward
	// first, never cleared: the copy must not keep part of it.
	f.treeMu.Lock() // as install: a running scrub never sees half a unit
	err = f.rollForward(stage)
	f.treeMu.Unlock()
	if err != nil {
		return 0, err
	}
	if err := clearStage(stage); err != nil {
		return 0, err
	}
	// A unit installed leaves the stage empty (every staged file moved,
	// the marker renamed to the position): only a unit cut short or
	// refused leaves something to clear here (the next unit's clearStage
	// would clear it too).
	installed := false
	defer func() {
		if _, err := os.Lstat(filepath.Join(stage, markerName)); !installed && errors.Is(err, os.ErrNotExist) {
			clearStage(stage) // a marked unit stays, to be rolled forward
		}
	}()
	var files []staged
	var gone []string
	mentioned := map[string]bool{}
	for {
		b, err := us.recv()
		if err != nil {
			return 0, err
		}
		switch b[0] {
		case kindFile:
			rel, size, err := parsePath(kindFile, b[1:])
			if err != nil {
				return 0, err
			}
			tmp := filepath.Join(stage, strconv.Itoa(len(files)))
			if err := f.receiveFile(us, tmp, size); err != nil {
				return 0, err
			}
			files = append(files, staged{rel: rel, tmp: tmp})
			mentioned[rel] = true
		case kindAppend:
			rel, size, from, err := parseAppend(b[1:])
			if err != nil {
				return 0, err
			}
			tmp := filepath.Join(stage, strconv.Itoa(len(files)))
			if err := f.receiveAppend(us, rel, tmp, size, from); err != nil {
				return 0, err
			}
			files = append(files, staged{rel: rel, tmp: tmp})
			mentioned[rel] = true
		case kindKeep:
			rel, _, err := parsePath(kindKeep, b[1:])
			if err != nil {
				return 0, err
			}
			mentioned[rel] = true
		case kindDelete:
			rel, _, err := parsePath(kindDelete, b[1:])
			if err != nil {
				return 0, err
			}
			gone = append(gone, rel)
		case kindEnd:
			u, _, err := parseUvarint(b[1:])
			if err != nil || u != bg.Unit {
				return 0, errFrame
			}
			if err := f.install(stage, files, gone, bg.Full, mentioned, position{Epoch: epoch, Unit: u}, gen); err != nil {
				return 0, err
			}
			installed = true
			if bg.Full {
				f.synced.Store(true)
				f.cfg.Logger.Info("replica: full sync applied", "files", len(files), "kept", len(mentioned)-len(files), "epoch", epoch)
			}
			return u, nil
		default:
			return 0, errFrame
		}
	}
}

// receiveAppend stages rel as the first from bytes of the copy installed
// here followed by the primary's bytes from there to size (a G frame).
// A copy shorter than from fails the unit: the stream starts again with
// a full sync.
func (f *Follower) receiveAppend(us unitStream, rel, tmp string, size, from int64) error {
	in, err := os.Open(filepath.Join(f.cfg.DataDir, rel))
	if err != nil {
		return fmt.Errorf("replica: append to %s: %w", rel, err)
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return fmt.Errorf("replica: append to %s: %w", rel, err)
	}
	if !fi.Mode().IsRegular() || fi.Size() < from {
		return fmt.Errorf("replica: append to %s from byte %d: this copy holds %d", rel, from, fi.Size())
	}
	out, err := f.spares.Create(tmp, size)
	if err != nil {
		return fmt.Errorf("replica: %w", err)
	}
	// In the kernel (copy_file_range), as much as the copy holds.
	if n, err := out.ReadFrom(io.LimitReader(in, from)); err != nil || n != from {
		out.Close()
		return fmt.Errorf("replica: append to %s: copied %d of %d bytes: %v", rel, n, from, err)
	}
	return f.receiveInto(us, out, size-from)
}

func (f *Follower) receiveFile(us unitStream, tmp string, size int64) error {
	out, err := f.spares.Create(tmp, size)
	if err != nil {
		return fmt.Errorf("replica: %w", err)
	}
	return f.receiveInto(us, out, size)
}

// receiveInto writes the stream's next size bytes of data frames to out
// (at its offset) and closes it, synced under SyncFsync.
func (f *Follower) receiveInto(us unitStream, out *os.File, size int64) error {
	for left := size; left > 0; {
		n, err := us.recvData(out, left)
		if err != nil {
			out.Close()
			return err
		}
		left -= n
	}
	if f.cfg.Sync != SyncFsync {
		return out.Close()
	}
	return errors.Join(out.Sync(), out.Close())
}

// A unit is installed whole, even across a SIGKILL of the standby: its
// files are staged in DataDir/.replica/unit-stage (stageName; older
// builds made a unit-* directory per unit), then a commit marker
// (unitMarker, "COMMIT") naming every move and removal is written —
// renamed into place, so it is there whole or not at all, and fsynced
// with the staged files under SyncFsync — and only then are the files
// moved. On start (NewFollower) a staged unit with its marker is rolled
// forward (the moves not yet made are made, the removals repeated) and
// one without is discarded: the mirror never holds part of a unit.
//
// The marker also carries the unit's position (epoch and unit number),
// and once the moves are made it is renamed to DataDir/.replica/position
// (promoteMarker): the saved position is the newest installed unit's
// marker, not a file of its own written per unit (a temporary file's
// creation, write and rename were 8–9% of a standby's CPU). A standby
// killed after the marker and before that rename rolls the unit forward
// on start and then promotes its marker the same way (recoverUnits): the
// position saved is the unit installed (a position file written after
// the install was one unit behind when the kill came between); killed
// before the marker, neither the unit nor its position is there. Every
// acknowledged unit's position is saved before the acknowledgement, as
// before.

// markerName is the commit marker's name in a unit's staging directory.
const markerName = "COMMIT"

// stageName is the staging directory's name under DataDir/.replica: one
// directory kept from unit to unit and emptied before and after each
// (clearStage), not one made and removed per unit — a directory's
// creation and removal was a tenth of a standby's CPU per unit (the
// file system's inode allocation for new directories).
const stageName = "unit-stage"

// spareName is the pool of retired files under DataDir/.replica
// (atomicfile.Spares).
const spareName = "spare"

// clearStage empties the staging directory (making it when missing):
// the commit marker first, so that what is left of a unit is never
// rolled forward under another unit's marker, then every staged file.
// It fails when anything is left.
func clearStage(stage string) error {
	if err := os.Remove(filepath.Join(stage, markerName)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("replica: %w", err)
	}
	ents, err := os.ReadDir(stage)
	if errors.Is(err, os.ErrNotExist) {
		if err := os.MkdirAll(stage, 0o755); err != nil {
			return fmt.Errorf("replica: %w", err)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("replica: %w", err)
	}
	for _, e := range ents {
		if err := os.RemoveAll(filepath.Join(stage, e.Name())); err != nil {
			return fmt.Errorf("replica: %w", err)
		}
	}
	return nil
}

// unitMarker is a staged unit's commit marker.
type unitMarker struct {
	// Files are the moves: each staged file (its name in the staging
	// directory) and where it goes.
	Files []markedFile `json:"files"`
	// Gone are the mirrored files the unit removes.
	Gone []string `json:"gone"`
	// Epoch and Unit are the unit's position (its primary's epoch and its
	// number), saved as the copy's position once the unit is installed;
	// zero in a marker an older build wrote.
	Epoch uint64 `json:"epoch,omitempty"`
	Unit  uint64 `json:"unit,omitempty"`
}

type markedFile struct {
	Rel    string `json:"rel"`
	Staged string `json:"staged"`
}

// install commits a staged unit: it lists what the unit removes (for a
// full sync: also every mirrored file the primary did not mention),
// writes the commit marker (with pos, the unit's position), then moves
// the files into place and makes the removals, (SyncFsync) syncs the
// directories touched, and saves the position by promoting the marker.
func (f *Follower) install(stage string, files []staged, gone []string, full bool, mentioned map[string]bool, pos position, gen uint64) error {
	f.treeMu.Lock()
	defer f.treeMu.Unlock()
	if f.damaged && (!full || gen != f.gen) {
		return errResync
	}
	if full {
		es, err := walk(f.cfg.DataDir, mirroredDirs)
		if err != nil {
			return err
		}
		for _, e := range es {
			if !mentioned[e.rel] {
				gone = append(gone, e.rel)
			}
		}
	}
	mk := unitMarker{Gone: gone, Epoch: pos.Epoch, Unit: pos.Unit}
	for _, s := range files {
		mk.Files = append(mk.Files, markedFile{Rel: s.rel, Staged: filepath.Base(s.tmp)})
	}
	f.crash.At("unit-staged")
	b, _ := json.Marshal(mk)
	if err := f.writeMarker(filepath.Join(stage, markerName), b, f.cfg.Sync == SyncFsync); err != nil {
		return fmt.Errorf("replica: commit marker: %w", err)
	}
	f.crash.At("unit-marked")
	if err := applyUnit(f.cfg.DataDir, stage, mk, f.cfg.Sync == SyncFsync, f.crash, f.spares); err != nil {
		return err
	}
	f.crash.At("unit-installed")
	if err := f.promoteMarker(stage, f.cfg.Sync == SyncFsync); err != nil {
		return err
	}
	f.damaged = false // a full sync sent again what was moved aside
	f.posMu.Lock()
	f.pos = pos
	f.posMu.Unlock()
	return nil
}

// errResync ends a stream whose next unit would be installed on a copy a
// running scrub found damaged: the next stream begins with a full sync.
var errResync = errors.New("replica: this copy was found damaged; following again for a full sync")

// Scrub checks the copy while the follower runs — reading at most pace
// bytes/s, ctx bounding it — and moves aside what is damaged, as the scrub
// on start does: into DataDir/.replica/damaged, the position reset (the
// copy yields every election until synced), and the stream being
// followed ended, so that the next one's full sync sends those files
// again. It returns what it moved aside, with why. A file that fails
// while units are installed (replaced or removed under the read) is
// checked again with none installing before it counts as damaged.
func (f *Follower) Scrub(ctx context.Context, pace int64) (map[string]error, error) {
	suspect, err := checkCopy(ctx, f.cfg.DataDir, nil, pace)
	if err != nil {
		return nil, err
	}
	if len(suspect) == 0 {
		f.scrubs.Add(1)
		return nil, nil
	}
	if f.suspected != nil {
		f.suspected()
	}
	f.treeMu.Lock()
	defer f.treeMu.Unlock()
	bad, err := checkCopy(ctx, f.cfg.DataDir, func(rel string) bool {
		for s := range suspect {
			if s == rel || strings.HasPrefix(s, rel+string(filepath.Separator)) {
				return true
			}
		}
		return false
	}, 0)
	if err != nil {
		return nil, err
	}
	f.scrubs.Add(1)
	if len(bad) == 0 {
		return nil, nil
	}
	f.damaged = true
	f.gen++
	f.synced.Store(false)
	f.streamMu.Lock()
	if f.stopStream != nil {
		f.stopStream()
	}
	f.streamMu.Unlock()
	return bad, f.setAside(bad)
}

// promoteMarker saves an installed unit's position: its commit marker,
// renamed to DataDir/.replica/position (one rename, atomic: the old
// position or the new, whole; with sync the directory is fsynced, the
// marker was already). The staging directory is left without a marker.
func (f *Follower) promoteMarker(stage string, sync bool) error {
	f.spares.KeepReplaced(filepath.Join(f.dir(), positionName))
	if err := os.Rename(filepath.Join(stage, markerName), filepath.Join(f.dir(), positionName)); err != nil {
		return fmt.Errorf("replica: save position: %w", err)
	}
	if sync {
		if err := atomicfile.SyncDir(f.dir()); err != nil {
			return fmt.Errorf("replica: save position: %w", err)
		}
	}
	return nil
}

// writeMarker writes a commit marker whole: a temporary file (a spare
// reused when there is one) renamed into place (and, with sync, fsynced
// before and its directory after).
func (f *Follower) writeMarker(path string, b []byte, sync bool) error {
	if sync {
		return atomicfile.Write(path, b)
	}
	tmp := path + atomicfile.TmpSuffix
	out, err := f.spares.Create(tmp, int64(len(b)))
	if err != nil {
		return err
	}
	_, err = out.Write(b)
	if err = errors.Join(err, out.Close()); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// applyUnit makes a marked unit's moves not yet made (a staged file that
// is gone was moved already) and its removals. What a move replaces and
// what is removed go to sp, the pool of spares, for later units to reuse.
func applyUnit(root, stage string, mk unitMarker, sync bool, crash *crashpoint.Hook, sp *atomicfile.Spares) error {
	dirs := map[string]bool{}
	for i, m := range mk.Files {
		if err := safeRel(m.Rel); err != nil {
			return err
		}
		if filepath.Base(m.Staged) != m.Staged || m.Staged == markerName {
			return fmt.Errorf("replica: commit marker names a bad staged file")
		}
		err := install(root, filepath.Join(stage, m.Staged), m.Rel, sp)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("replica: install %s: %w", m.Rel, err)
		}
		dirs[filepath.Dir(filepath.Join(root, m.Rel))] = true
		if i == 0 && len(mk.Files) > 1 {
			crash.At("install-mid") // one file of the unit moved, the others not
		}
	}
	for _, rel := range mk.Gone {
		if err := safeRel(rel); err != nil {
			return err
		}
		p := filepath.Join(root, rel)
		fi, err := os.Lstat(p)
		if err == nil && fi.IsDir() {
			continue // a file the primary replaced with a directory (moved in above)
		}
		if errors.Is(err, syscall.ENOTDIR) {
			continue // a directory the primary replaced with a file (moved in above)
		}
		if err := sp.Retire(p); err != nil {
			return fmt.Errorf("replica: remove %s: %w", rel, err)
		}
		dirs[filepath.Dir(p)] = true
		removeEmptied(root, filepath.Dir(rel), dirs)
	}
	if !sync {
		return nil
	}
	for d := range dirs {
		if err := atomicfile.SyncDir(d); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("replica: %w", err)
		}
	}
	return nil
}

// removeEmptied removes dir (relative to root) and each directory above
// it that a unit's removals left empty, below the mirrored directory they
// are in, as the primary removes a deleted model's directory (the store's,
// the reducer's): a standby keeps no empty directory per deleted model.
// Each removed directory's parent goes in dirs, to be fsynced. A directory
// not empty (a file installed or kept in it) stays, and so does one that
// cannot be removed: it is litter, not state, and fails no unit; a unit
// rolled forward after a crash tries again.
func removeEmptied(root, dir string, dirs map[string]bool) {
	for ; filepath.Dir(dir) != "."; dir = filepath.Dir(dir) {
		p := filepath.Join(root, dir)
		if err := syscall.Rmdir(p); err != nil {
			return
		}
		delete(dirs, p)
		dirs[filepath.Dir(p)] = true
	}
}

// recoverUnits rolls forward every staged unit that has its commit
// marker and discards every one that has none (a standby killed while it
// staged or installed a unit). A rolled-forward marker that carries a
// position ahead of the saved one is then saved as the position
// (promoteMarker), as its install would have.
func (f *Follower) recoverUnits() error {
	ents, err := os.ReadDir(f.dir())
	if err != nil {
		return fmt.Errorf("replica: %w", err)
	}
	for _, e := range ents {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), "unit-") {
			continue
		}
		stage := filepath.Join(f.dir(), e.Name())
		if _, err := os.Lstat(filepath.Join(stage, markerName)); errors.Is(err, os.ErrNotExist) {
			f.cfg.Logger.Info("replica: discarding a unit staged without its commit marker", "dir", e.Name())
		} else if err := f.rollForward(stage); err != nil {
			return err
		}
		if err := os.RemoveAll(stage); err != nil {
			return fmt.Errorf("replica: %w", err)
		}
	}
	return nil
}

// rollForward installs the unit marked in stage, if there is one (its
// moves not yet made, its removals), and saves its position when it is
// ahead of the saved one; the stage is left without a marker.
func (f *Follower) rollForward(stage string) error {
	b, err := os.ReadFile(filepath.Join(stage, markerName))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("replica: %w", err)
	}
	var mk unitMarker
	if err := json.Unmarshal(b, &mk); err != nil {
		return fmt.Errorf("replica: commit marker %s: %w", filepath.Base(stage), err)
	}
	if err := applyUnit(f.cfg.DataDir, stage, mk, true, nil, f.spares); err != nil {
		return err
	}
	saved, _ := f.savedPosition() // unreadable: the zero position, which any marker is ahead of
	mp := position{Epoch: mk.Epoch, Unit: mk.Unit}
	if mp.ahead(saved) {
		if err := f.promoteMarker(stage, true); err != nil {
			return err
		}
		f.posMu.Lock()
		if mp.ahead(f.pos) {
			f.pos = mp
		}
		f.posMu.Unlock()
	} else if err := os.Remove(filepath.Join(stage, markerName)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("replica: %w", err)
	}
	f.cfg.Logger.Info("replica: rolled a committed unit forward", "dir", filepath.Base(stage), "files", len(mk.Files), "removed", len(mk.Gone))
	return nil
}

// savedPosition reads DataDir/.replica/position (not campaigning): the
// zero position when it is missing, or unreadable (then with the error).
func (f *Follower) savedPosition() (position, error) {
	var p position
	b, err := os.ReadFile(filepath.Join(f.dir(), positionName))
	if err != nil {
		return position{}, nil
	}
	if err := json.Unmarshal(b, &p); err != nil {
		return position{}, err
	}
	p.Campaigning = false
	return p, nil
}

// The follower's crash points (tests only: the hub's
// RLHUB_TEST_REPLICA_CRASH, read by internal/crashpoint as arsrpc's
// RLHUB_TEST_ARS_CRASH is). Points:
// unit-staged (a unit's files staged, no marker), unit-marked (marker
// written, nothing moved), install-mid (one file of a unit moved),
// unit-installed (every move made, the marker not yet the position); and
// unit-hold, which does not kill: the standby stops applying units
// (keeping its lease) until its stream ends.
//
// holdAt blocks until ctx ends the Nth time point is reached.
func holdAt(ctx context.Context, h *crashpoint.Hook, point string) {
	if h.Hit(point) {
		<-ctx.Done()
	}
}
