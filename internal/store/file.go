package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/rlhub/rlhub/internal/atomicfile"
	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/safetensors"
	"github.com/rlhub/rlhub/internal/tensor"
)

// FileConfig configures a file-backed store.
type FileConfig struct {
	// Dir holds the checkpoints; required. It is created if missing and
	// locked against a second process opening it.
	Dir string
	// Store configures retention, limits and the clock. The same Retain
	// newest versions of each model are kept in memory and on disk.
	Store Config
	// Logger receives recovery and cleanup notes; nil means slog.Default().
	Logger *slog.Logger
	// Changed, when set, is told each file under Dir the store wrote or
	// removed (a model's directory when it removes the model), after the
	// write and before the call that made it returns: a cluster
	// primary's replica.Source.Changed, so that a replication unit stats
	// what a commit wrote instead of walking the model's directory
	// (NamesFiles). nil tells no one.
	Changed func(path string)

	// hook, in tests, is called at named points of a checkpoint write so a
	// child process can be killed exactly there.
	hook func(stage string)
}

func (c *FileConfig) validate() error {
	if c.Dir == "" {
		return errors.New("store: FileConfig.Dir is required")
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c.Store.validate()
}

// File is the file-backed Store: the in-memory store plus a checkpoint of
// every version written before the push returns. On-disk layout (see
// docs/store.md):
//
//	DIR/LOCK                            flock held while open
//	DIR/<escaped name>/MANIFEST.json    the committed versions of one model
//	DIR/<escaped name>/v<20 digits>.safetensors
//
// A version is committed when the manifest naming it has been renamed into
// place: blob written to a temp file, fsynced, renamed, directory fsynced,
// then the manifest the same way. Anything else found at open (temp files,
// blobs no manifest names) is debris of a crash and is removed.
type File struct {
	c    *core
	cfg  FileConfig
	lock *os.File
	// spares holds the files persist dropped or replaced, whose inodes
	// the next versions and manifests are written into (atomicfile.Spares,
	// in Dir/.spare).
	spares *atomicfile.Spares

	mu        sync.Mutex
	closed    bool                 // guarded by mu
	inflight  sync.WaitGroup       // pushes writing to disk
	manifests map[string]*manifest // guarded by mu; each entry written only under its model's wsem
}

var (
	_ Store      = (*File)(nil)
	_ Prechecker = (*File)(nil)
)

const (
	manifestName   = "MANIFEST.json"
	manifestFormat = 1
	// trashPrefix names a deleted model's directory between the rename
	// that commits a Delete and the removal that finishes it.
	trashPrefix = ".deleted-"
	// spareDir is the pool of retired files (File.spares) under Dir: like
	// the trash, a name no model directory has, and never replicated.
	spareDir = ".spare"
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// manifest is one model's MANIFEST.json. Life is recorded so that the
// store opened again, or a standby's copy opened by a promoted hub, names
// the life its followers know (docs/weight-sync.md, "Lives").
type manifest struct {
	Format   int             `json:"format"`
	Name     string          `json:"name"`
	Epoch    uint64          `json:"epoch"`           // highest epoch landed
	Owner    string          `json:"owner,omitempty"` // the model's owner (rule 6); "" for none
	Life     uint64          `json:"life,omitempty"`  // the model's life (Snapshot.Life); 0: written before lives were recorded
	Versions []manifestEntry `json:"versions"`        // empty only for a claimed model never pushed
}

type manifestEntry struct {
	Version uint64    `json:"version"`
	Epoch   uint64    `json:"epoch"`
	Seq     uint64    `json:"seq"`
	Bytes   int64     `json:"bytes"`
	CRC32C  uint32    `json:"crc32c"`
	Created time.Time `json:"created"`
	File    string    `json:"file"`
}

// OpenFile opens (creating if needed) the store in cfg.Dir and recovers
// every model at its last committed versions.
func OpenFile(cfg FileConfig) (*File, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if err := atomicfile.MkdirAll(cfg.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	lock, err := os.OpenFile(filepath.Join(cfg.Dir, "LOCK"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		lock.Close()
		return nil, fmt.Errorf("store: %s is in use by another process: %w", cfg.Dir, err)
	}
	f := &File{c: newCore(cfg.Store), cfg: cfg, lock: lock, manifests: make(map[string]*manifest)}
	if f.spares, err = atomicfile.OpenSpares(filepath.Join(cfg.Dir, spareDir)); err != nil {
		lock.Close()
		return nil, fmt.Errorf("store: %w", err)
	}
	if err := f.recover(); err != nil {
		lock.Close()
		return nil, err
	}
	return f, nil
}

// escapeName maps a model name to one directory name: bytes outside
// [A-Za-z0-9_-] and '.' (except a leading one) become %XX, so '/' never
// nests and no name can escape Dir. The reducer's state directory uses
// the same rule (ModelDir).
func escapeName(name string) string {
	var b strings.Builder
	for i := 0; i < len(name); i++ {
		ch := name[i]
		switch {
		case ch >= 'a' && ch <= 'z', ch >= 'A' && ch <= 'Z', ch >= '0' && ch <= '9', ch == '_', ch == '-', ch == '.' && i > 0:
			b.WriteByte(ch)
		default:
			fmt.Fprintf(&b, "%%%02X", ch)
		}
	}
	return b.String()
}

func blobFileName(version uint64) string { return fmt.Sprintf("v%020d.safetensors", version) }

// ModelDir is the directory, relative to a File store's Dir, that holds
// model name's manifest and version files (internal/replica uses it to
// know what a commit touched).
func ModelDir(name string) string { return escapeName(name) }

// VersionFile is the path, relative to a File store's Dir, of model
// name's version file: once written it never changes (the bytes of the
// push's Blob).
func VersionFile(name string, version uint64) string {
	return filepath.Join(escapeName(name), blobFileName(version))
}

// recover loads every model directory. A model whose manifest cannot be
// read or whose blobs fail their checks makes Open fail: that is disk
// corruption, not a crash, and silently serving an older version would
// break the ordering promise.
func (f *File) recover() error {
	ents, err := os.ReadDir(f.cfg.Dir)
	if err != nil {
		return fmt.Errorf("store: %w", err)
	}
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		dir := filepath.Join(f.cfg.Dir, e.Name())
		if e.Name() == spareDir {
			continue
		}
		if strings.HasPrefix(e.Name(), trashPrefix) {
			// A Delete committed (renamed) but not finished: no model
			// directory starts with '.', escapeName sees to that.
			if err := os.RemoveAll(dir); err != nil {
				f.cfg.Logger.Warn("store: cannot remove a deleted model", "dir", dir, "err", err)
			}
			continue
		}
		m, snaps, err := f.loadModel(dir)
		if err != nil {
			return fmt.Errorf("store: recover %s: %w", dir, err)
		}
		if m == nil {
			continue // a model directory whose first push never committed
		}
		f.manifests[m.Name] = m
		f.c.mu.Lock()
		mod := f.c.modelLocked(m.Name)
		if m.Life != 0 {
			restoreLife(mod, m.Life)
		} else {
			// Written by a build that did not record lives: a new one,
			// once (the next write of its manifest records it).
			f.cfg.Logger.Info("store: a model's manifest names no life; it starts a new one", "name", m.Name, "life", mod.life)
		}
		for _, s := range snaps {
			s.life = mod.life
		}
		mod.versions = snaps
		mod.epoch = m.Epoch
		mod.owner = m.Owner
		f.c.mu.Unlock()
		if len(snaps) == 0 {
			f.cfg.Logger.Info("store: recovered a claimed model with no versions", "name", m.Name, "owner", m.Owner)
			continue
		}
		f.cfg.Logger.Info("store: recovered model", "name", m.Name, "version", snaps[len(snaps)-1].Version, "retained", len(snaps), "owner", m.Owner)
	}
	return nil
}

func (f *File) loadModel(dir string) (*manifest, []*Snapshot, error) {
	m, err := readManifest(dir)
	if errors.Is(err, os.ErrNotExist) {
		f.removeModelDir(dir)
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, err
	}
	if m.Name == "" || escapeName(m.Name) != filepath.Base(dir) {
		return nil, nil, fmt.Errorf("%s: model name %s does not belong in this directory", manifestName, errs.Quote(m.Name))
	}
	if err := f.cfg.Store.checkName(m.Name); err != nil {
		// The rules were tightened since it was made: it stays usable
		// (core.checkName); only new models must meet them.
		f.cfg.Logger.Warn("store: a model's name breaks the name rules (--max-name-bytes, --name-pattern); it stays readable, writable and deletable", "name", m.Name, "err", err)
	}
	if len(m.Versions) == 0 && m.Owner == "" {
		// A claim given up on a model that never had a version (Claim,
		// then Release): nothing to keep. Refused, it made the whole
		// store refuse to open.
		f.removeModelDir(dir)
		return nil, nil, nil
	}
	keep := map[string]bool{manifestName: true}
	var snaps []*Snapshot
	for _, v := range m.Versions {
		keep[v.File] = true
	}
	// Only the newest Retain versions are loaded. Older ones listed (from
	// a run with a larger Retain) stay on disk, as the manifest there still
	// names them (an open with the larger Retain again loads them); the
	// next push writes a manifest without them, and the open after it
	// removes their files as debris.
	load := m.Versions[max(0, len(m.Versions)-f.cfg.Store.Retain):]
	for _, v := range load {
		if v.File != blobFileName(v.Version) {
			return nil, nil, fmt.Errorf("%s: version %d names file %q", manifestName, v.Version, v.File)
		}
		blob, err := readBlob(filepath.Join(dir, v.File), v.Bytes)
		if err != nil {
			return nil, nil, fmt.Errorf("version %d: %w", v.Version, err)
		}
		if sum := crc32.Checksum(blob, castagnoli); sum != v.CRC32C {
			return nil, nil, fmt.Errorf("version %d: %s has CRC32C %08x, manifest says %08x", v.Version, v.File, sum, v.CRC32C)
		}
		sf, err := safetensors.DecodeOptions(blob, safetensors.Options{MaxHeaderBytes: f.cfg.Store.MaxHeaderBytes})
		if err != nil {
			return nil, nil, fmt.Errorf("version %d: %w", v.Version, err)
		}
		snaps = append(snaps, &Snapshot{
			Name: m.Name, Version: v.Version, Epoch: v.Epoch, Seq: v.Seq,
			Blob: blob, Tensors: sf.Tensors, Metadata: sf.Metadata, Created: v.Created,
		})
	}
	for i := 1; i < len(snaps); i++ {
		if snaps[i].Version <= snaps[i-1].Version {
			return nil, nil, fmt.Errorf("%s: versions out of order", manifestName)
		}
	}
	m.Versions = slices.Clone(load)
	f.removeDebris(dir, keep)
	return m, snaps, nil
}

// readManifest reads and parses the manifest in a model's directory
// (os.ErrNotExist: there is none).
func readManifest(dir string) (*manifest, error) {
	raw, err := os.ReadFile(filepath.Join(dir, manifestName))
	if err != nil {
		return nil, err
	}
	var m manifest
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, fmt.Errorf("%s: %w", manifestName, err)
	}
	if m.Format != manifestFormat {
		return nil, fmt.Errorf("%s: format %d, want %d", manifestName, m.Format, manifestFormat)
	}
	if m.Life >= MaxVersion {
		// No store numbers one so high; the counter restored past it
		// would wrap to 0, "unknown".
		return nil, fmt.Errorf("%s: life %d is out of range (at most %d)", manifestName, m.Life, MaxVersion-1)
	}
	return &m, nil
}

// VerifyModelDir checks, without opening the store, the version files
// that the manifest in a model's directory lists: each must have the
// listed size and CRC-32C. It returns the files that fail, with why (a
// standby's scrub of its copy, internal/replica); err when the manifest
// cannot be read or parsed (os.ErrNotExist: the directory has none).
func VerifyModelDir(dir string) (map[string]error, error) {
	m, err := readManifest(dir)
	if err != nil {
		return nil, err
	}
	bad := map[string]error{}
	for _, v := range m.Versions {
		if v.File != blobFileName(v.Version) {
			return nil, fmt.Errorf("%s: version %d names file %s", manifestName, v.Version, errs.Quote(v.File))
		}
		if err := verifyBlob(filepath.Join(dir, v.File), v.Bytes, v.CRC32C); err != nil {
			bad[v.File] = fmt.Errorf("version %d: %w", v.Version, err)
		}
	}
	return bad, nil
}

// verifyBlob checks a checkpoint's size and CRC-32C, streaming it.
func verifyBlob(path string, size int64, crc uint32) error {
	fh, err := os.Open(path)
	if err != nil {
		return err
	}
	defer fh.Close()
	h := crc32.New(castagnoli)
	n, err := io.Copy(h, fh)
	if err != nil {
		return err
	}
	if n != size {
		return fmt.Errorf("%s is %d bytes, manifest says %d", filepath.Base(path), n, size)
	}
	if sum := h.Sum32(); sum != crc {
		return fmt.Errorf("%s has CRC32C %08x, manifest says %08x", filepath.Base(path), sum, crc)
	}
	return nil
}

// readBlob reads a checkpoint into an 8-byte-aligned buffer.
func readBlob(path string, size int64) ([]byte, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer fh.Close()
	st, err := fh.Stat()
	if err != nil {
		return nil, err
	}
	if st.Size() != size {
		return nil, fmt.Errorf("%s is %d bytes, manifest says %d", path, st.Size(), size)
	}
	buf := tensor.AlignedBytes(int(size))
	if _, err := io.ReadFull(fh, buf); err != nil {
		return nil, err
	}
	return buf, nil
}

// removeModelDir removes a model directory that holds nothing committed
// (debris, at open).
func (f *File) removeModelDir(dir string) {
	f.removeDebris(dir, nil)
	f.named(dir)
	if err := os.Remove(dir); err != nil {
		f.cfg.Logger.Warn("store: cannot remove crash debris", "dir", dir, "err", err)
	}
}

// removeDebris deletes files in dir not named in keep (nil keeps nothing
// but leaves the directory).
func (f *File) removeDebris(dir string, keep map[string]bool) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range ents {
		if keep[e.Name()] {
			continue
		}
		f.named(filepath.Join(dir, e.Name()))
		if err := os.Remove(filepath.Join(dir, e.Name())); err != nil {
			f.cfg.Logger.Warn("store: cannot remove crash debris", "file", filepath.Join(dir, e.Name()), "err", err)
		} else {
			f.cfg.Logger.Info("store: removed crash debris", "file", filepath.Join(dir, e.Name()))
		}
	}
}

// writeAtomic writes data to dir/name via a temp file: write, fsync,
// rename, fsync dir. A crash leaves either the old file or the new one,
// plus perhaps a temp file that recovery removes.
// It names the file (FileConfig.Changed) whether or not it succeeded: a
// failure may come after the rename.
func (f *File) writeAtomic(dir, name string, data []byte, stage string) error {
	defer f.named(filepath.Join(dir, name))
	var h atomicfile.Hooks
	if hook := f.cfg.hook; hook != nil {
		h.Written = func(i int) {
			if i == 0 {
				hook(stage + "-partial")
			}
		}
		h.Renamed = func() { hook(stage + "-renamed") }
	}
	// Written in two pieces so the test hook can stop it half-way, as a
	// crash would.
	half := len(data) / 2
	// A version's file is written into a spare: its name is new, so no
	// reader's (inode, size, mtime) of it can repeat. The manifest, whose
	// name is written every commit, is a new file (atomicfile.Spares).
	pool := f.spares
	if name == manifestName {
		pool = nil
	}
	return pool.WriteWith(filepath.Join(dir, name), h, data[:half], data[half:])
}

// named tells FileConfig.Changed of path.
func (f *File) named(path string) {
	if f.cfg.Changed != nil {
		f.cfg.Changed(path)
	}
}

// NamesFiles reports whether the store names every file it writes or
// removes (FileConfig.Changed is set): a replication unit then stats
// those files alone.
func (f *File) NamesFiles() bool { return f.cfg.Changed != nil }

// modelDir returns name's directory and its committed manifest, creating
// the directory (and an empty manifest in memory) for a model with none.
// The model's write slot must be held.
func (f *File) modelDir(name string) (string, *manifest, error) {
	dir := filepath.Join(f.cfg.Dir, escapeName(name))
	f.mu.Lock()
	old := f.manifests[name]
	f.mu.Unlock()
	if old == nil {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return "", nil, fmt.Errorf("store: checkpoint %q: %w", name, err)
		}
		if err := atomicfile.SyncDir(f.cfg.Dir); err != nil {
			return "", nil, fmt.Errorf("store: checkpoint %q: %w", name, err)
		}
		old = &manifest{Format: manifestFormat, Name: name}
	}
	return dir, old, nil
}

// commitManifest writes m as its model's manifest (the commit point) and
// records it. The model's write slot must be held.
func (f *File) commitManifest(dir string, m *manifest) error {
	raw, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	if err := f.writeAtomic(dir, manifestName, append(raw, '\n'), "manifest"); err != nil {
		return err
	}
	f.mu.Lock()
	f.manifests[m.Name] = m
	f.mu.Unlock()
	return nil
}

// abandon removes what a write that failed to commit left in a model's
// directory: the version file it wrote (file; "" for none), unless the
// manifest on disk names it (the commit failed after its rename, in the
// directory's fsync: the version may be committed, and recovery decides),
// and the directory itself when it holds no manifest (the model's first
// write: nothing of it is committed). What it cannot remove, or cannot
// tell, is left to the next open, which removes debris. The model's write
// slot must be held.
func (f *File) abandon(dir, file string) {
	m, err := readManifest(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		f.named(dir)
		if err := os.RemoveAll(dir); err != nil {
			f.cfg.Logger.Warn("store: cannot remove a model's directory after a failed write (removed at the next start)", "dir", dir, "err", err)
		}
	case err != nil || file == "" || slices.ContainsFunc(m.Versions, func(v manifestEntry) bool { return v.File == file }):
	default:
		f.named(filepath.Join(dir, file))
		if err := os.Remove(filepath.Join(dir, file)); err != nil && !errors.Is(err, os.ErrNotExist) {
			f.cfg.Logger.Warn("store: cannot remove a version file after a failed commit (removed at the next start)", "file", filepath.Join(dir, file), "err", err)
		}
	}
}

// persistOwner records a model's new owner in its manifest (Claim,
// Release). A model left with no version and no owner (a claim released
// before any push) is removed as Delete removes one, so that claims leave
// nothing behind; a failed claim of such a model removes the directory it
// made. It runs with the model's write slot held.
func (f *File) persistOwner(name, owner string, life uint64) error {
	f.mu.Lock()
	old := f.manifests[name]
	f.mu.Unlock()
	if owner == "" && (old == nil || len(old.Versions) == 0) {
		return f.persistDelete(name)
	}
	dir, old, err := f.modelDir(name)
	if err != nil {
		return err
	}
	next := *old
	next.Owner, next.Life = owner, life
	next.Versions = slices.Clone(old.Versions)
	if err := f.commitManifest(dir, &next); err != nil {
		f.abandon(dir, "")
		return fmt.Errorf("store: record the owner of %q: %w", name, err)
	}
	return nil
}

// persistDelete removes a model's directory: renamed to a trash name (the
// commit point: recovery finishes the removal of any trash directory),
// the parent fsynced, then removed. It runs with the write slot held.
func (f *File) persistDelete(name string) error {
	dir := filepath.Join(f.cfg.Dir, escapeName(name))
	trash := filepath.Join(f.cfg.Dir, fmt.Sprintf("%s%d", trashPrefix, time.Now().UnixNano()))
	if err := os.Rename(dir, trash); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("store: delete %q: %w", name, err)
	}
	if err := atomicfile.SyncDir(f.cfg.Dir); err != nil {
		return fmt.Errorf("store: delete %q: %w", name, err)
	}
	f.named(dir)
	f.mu.Lock()
	delete(f.manifests, name)
	f.mu.Unlock()
	if f.cfg.hook != nil {
		f.cfg.hook("delete-renamed")
	}
	if err := os.RemoveAll(trash); err != nil {
		f.cfg.Logger.Warn("store: cannot remove a deleted model's files (removed at the next start)", "dir", trash, "err", err)
	}
	return nil
}

// persist checkpoints snap and commits it in the model's manifest, with
// the model's owner once it lands. It runs with the model's write slot
// held, so the model's manifest entry is ours.
func (f *File) persist(snap *Snapshot, owner string) error {
	dir, old, err := f.modelDir(snap.Name)
	if err != nil {
		return err
	}
	entry := manifestEntry{
		Version: snap.Version, Epoch: snap.Epoch, Seq: snap.Seq,
		Bytes: int64(len(snap.Blob)), CRC32C: crc32.Checksum(snap.Blob, castagnoli),
		Created: snap.Created.UTC(), File: blobFileName(snap.Version),
	}
	if err := f.writeAtomic(dir, entry.File, snap.Blob, "blob"); err != nil {
		f.abandon(dir, entry.File)
		return fmt.Errorf("store: checkpoint %q version %d: %w", snap.Name, snap.Version, err)
	}
	next := &manifest{Format: manifestFormat, Name: snap.Name, Epoch: max(old.Epoch, snap.Epoch), Owner: owner, Life: snap.life}
	next.Versions = append(slices.Clone(old.Versions), entry)
	var dropped []manifestEntry
	if over := len(next.Versions) - f.cfg.Store.Retain; over > 0 {
		dropped = next.Versions[:over]
		next.Versions = next.Versions[over:]
	}
	if err := f.commitManifest(dir, next); err != nil {
		f.abandon(dir, entry.File)
		return fmt.Errorf("store: commit %q version %d: %w", snap.Name, snap.Version, err)
	}
	for _, d := range dropped {
		f.named(filepath.Join(dir, d.File))
		if err := f.spares.Retire(filepath.Join(dir, d.File)); err != nil {
			f.cfg.Logger.Warn("store: cannot remove an old checkpoint", "file", d.File, "err", err)
		}
	}
	return nil
}

// Push implements Store: the version is on disk (fsynced, committed in its
// model's manifest) before Push returns it. A push that fails with an I/O
// error changes nothing in memory.
func (f *File) Push(ctx context.Context, req PushRequest) (Info, error) {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return Info{}, errClosed
	}
	f.inflight.Add(1)
	f.mu.Unlock()
	defer f.inflight.Done()
	return f.c.push(ctx, req, f.persist)
}

// Get implements Store.
func (f *File) Get(ctx context.Context, name string, version uint64) (*Snapshot, error) {
	return f.c.get(name, version)
}

// GetIfNewer implements Store.
func (f *File) GetIfNewer(ctx context.Context, name string, than uint64) (*Snapshot, error) {
	return f.c.getIfNewer(name, than)
}

// WaitNewer implements Store.
func (f *File) WaitNewer(ctx context.Context, name string, after uint64) (*Snapshot, error) {
	return f.c.waitNewer(ctx, name, after)
}

// Lend implements Lender.
func (f *File) Lend(_ context.Context, name string, version uint64) (*Snapshot, func(), error) {
	return f.c.lend(name, version)
}

// LendNewer implements Lender.
func (f *File) LendNewer(ctx context.Context, name string, after uint64) (*Snapshot, func(), error) {
	return f.c.lendNewer(ctx, name, after)
}

// LendNewerLife implements LifeWaiter.
func (f *File) LendNewerLife(ctx context.Context, name string, after, life uint64) (*Snapshot, func(), error) {
	return f.c.lendNewerLife(ctx, name, after, life)
}

// NewestLife implements LifeReader.
func (f *File) NewestLife(name string) (uint64, uint64, error) { return f.c.newestLife(name) }

// List implements Store.
func (f *File) List(ctx context.Context) ([]Info, error) { return f.c.list() }

// OwnerUsage implements UsageReader.
func (f *File) OwnerUsage(owner, name string) (int, int64, bool, int64) {
	return f.c.ownerUsage(owner, name)
}

// Precheck implements Prechecker.
func (f *File) Precheck(name string, totalBytes uint64) error { return f.c.Precheck(name, totalBytes) }

// Claim implements Claimer: the owner is committed in the model's
// manifest before Claim returns.
func (f *File) Claim(ctx context.Context, name, owner string) error {
	return f.writeOp(func() error { return f.c.setOwner(ctx, name, owner, true, f.persistOwner) })
}

// Release implements Claimer, committed like Claim.
func (f *File) Release(ctx context.Context, name, owner string) error {
	return f.writeOp(func() error { return f.c.setOwner(ctx, name, owner, false, f.persistOwner) })
}

// Delete implements Deleter: the model's directory is gone (or renamed to
// a trash name that the next start removes) before Delete returns.
func (f *File) Delete(ctx context.Context, name string) error {
	return f.writeOp(func() error { return f.c.delete(ctx, name, f.persistDelete) })
}

// writeOp runs op as a disk write that Close waits for.
func (f *File) writeOp(op func() error) error {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return errClosed
	}
	f.inflight.Add(1)
	f.mu.Unlock()
	defer f.inflight.Done()
	return op()
}

// Close wakes watchers, waits for checkpoint writes in flight and releases
// the directory lock. Safe to call twice.
func (f *File) Close() error {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return nil
	}
	f.closed = true
	f.mu.Unlock()
	f.c.close()
	f.inflight.Wait()
	return f.lock.Close() // closing the descriptor releases the flock
}
