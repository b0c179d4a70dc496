package reducer

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/rlhub/rlhub/internal/atomicfile"
	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/optim"
	"github.com/rlhub/rlhub/internal/reduce"
	"github.com/rlhub/rlhub/internal/safetensors"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/tensor"
)

// The primary's durable state (PrimaryConfig.StateDir), docs/durability.md:
//
//	DIR/LOCK                                  flock held while open
//	DIR/<escaped model>/registration.json     the ModelConfig and start version
//	DIR/<escaped model>/journal.log           one CRC-framed record per step
//	DIR/<escaped model>/optim-v<20 digits>.safetensors
//	                                          optimizer state at that version
//
// A step of version V is made durable before the store publishes V: its
// journal record (V, members, weights) is appended and fsynced, then the
// optimizer state that produced V is written to a temp file, fsynced,
// renamed into place and the directory fsynced. Only then is V pushed to the
// store. So whatever moment the process dies at, the store's newest version
// S has its optimizer state on disk and its members in the journal; journal
// records and state files past S belong to a step that never published and
// are removed at restore (their gradients were not applied: they count as
// lost, at most once). Once V is published the state file of V-1 is removed.
const (
	stateLockName    = "LOCK"
	registrationName = "registration.json"
	journalName      = "journal.log"
	registrationFmt  = 1
	spareDir         = ".spare" // the pool of dropped optimizer states (stateDir.spares)
	stateTmpSuffix   = atomicfile.TmpSuffix
)

// journalRecordMax bounds one journal record (a step of a batch of a few
// thousand members is a few hundred KiB; a ledger snapshot of many
// clients more): a compaction whose snapshot would pass it is not made,
// and a frame claiming more is damage. A variable for tests.
var journalRecordMax uint32 = 256 << 20

var crcTable = crc32.MakeTable(crc32.Castagnoli)

func stateFileName(version uint64) string { return fmt.Sprintf("optim-v%020d.safetensors", version) }

// parseStateFileName returns the version a state file name holds.
func parseStateFileName(name string) (uint64, bool) {
	s, ok := strings.CutPrefix(name, "optim-v")
	if !ok {
		return 0, false
	}
	s, ok = strings.CutSuffix(s, ".safetensors")
	if !ok || len(s) != 20 {
		return 0, false
	}
	v, err := strconv.ParseUint(s, 10, 64)
	return v, err == nil
}

// registration is a model's registration.json.
type registration struct {
	Format int         `json:"format"`
	Model  string      `json:"model"`
	Config ModelConfig `json:"config"`
	// StartVersion is the model version the registration started from: a
	// restore at that version with an empty journal starts a fresh
	// optimizer, as the registration did.
	StartVersion uint64    `json:"start_version"`
	Registered   time.Time `json:"registered"`
}

// journalID is a gradient id in a journal record: [client, seq].
type journalID struct {
	Client string
	Seq    uint64
}

func (j journalID) MarshalJSON() ([]byte, error) { return json.Marshal([]any{j.Client, j.Seq}) }

func (j *journalID) UnmarshalJSON(b []byte) error {
	var raw []json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil || len(raw) != 2 {
		return fmt.Errorf("journal id %s: want [client, seq]", truncate(string(b), 64))
	}
	if err := json.Unmarshal(raw[0], &j.Client); err != nil {
		return err
	}
	return json.Unmarshal(raw[1], &j.Seq)
}

// journalRecord is one journal entry: a published step (Members), or a
// snapshot of the ledger's applied ids up to Version (Ledger) that replaces
// every record before it when the journal is compacted.
type journalRecord struct {
	Version uint64                        `json:"v"`
	Steps   uint64                        `json:"steps"`
	Members []journalID                   `json:"m,omitempty"`
	Weights []float32                     `json:"w,omitempty"`
	Ledger  map[string]reduce.AppliedSeqs `json:"ledger,omitempty"`
}

func (r *journalRecord) ids() []reduce.ID {
	out := make([]reduce.ID, len(r.Members))
	for i, m := range r.Members {
		out[i] = reduce.ID{Client: m.Client, Seq: m.Seq}
	}
	return out
}

// appendFrame frames payload: 4-byte little-endian length, 4-byte CRC-32C
// of the payload, the payload.
func appendFrame(dst, payload []byte) []byte {
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(payload)))
	dst = binary.LittleEndian.AppendUint32(dst, crc32.Checksum(payload, crcTable))
	return append(dst, payload...)
}

// readJournal reads the records of a journal of size bytes up to its
// first torn or damaged frame, and returns them with the byte offset just
// past each. A torn frame is the journal's last, cut short by a kill
// during its append: the file ends within it or just at its end (its
// checksum then fails), and it is not an error. A bad frame the file goes
// on past (a zero or oversized length, a checksum that fails) is damage:
// an error, for the caller to keep the journal aside rather than cut the
// records after it silently.
func readJournal(r io.Reader, size int64) (recs []journalRecord, ends []int64, err error) {
	br := bufio.NewReaderSize(r, 1<<16)
	var off int64
	var hdr [8]byte
	for {
		if _, err := io.ReadFull(br, hdr[:]); err != nil {
			return recs, ends, nil // end, or a torn frame header
		}
		n := binary.LittleEndian.Uint32(hdr[:4])
		torn := off+8+int64(n) >= size
		if n == 0 || n > journalRecordMax {
			if torn {
				return recs, ends, nil
			}
			return recs, ends, fmt.Errorf("journal damaged at byte %d of %d: a record of %d bytes (at most %d)", off, size, n, journalRecordMax)
		}
		payload := make([]byte, n)
		if _, err := io.ReadFull(br, payload); err != nil {
			return recs, ends, nil
		}
		if crc32.Checksum(payload, crcTable) != binary.LittleEndian.Uint32(hdr[4:]) {
			if torn {
				return recs, ends, nil
			}
			return recs, ends, fmt.Errorf("journal damaged at byte %d of %d: a record's checksum fails", off, size)
		}
		var rec journalRecord
		if err := json.Unmarshal(payload, &rec); err != nil {
			// A checksummed record that does not parse is not a torn
			// write: the journal is damaged.
			return recs, ends, fmt.Errorf("journal record at byte %d: %v", off, err)
		}
		off += 8 + int64(n)
		recs = append(recs, rec)
		ends = append(ends, off)
	}
}

// ReadJournal returns the published steps recorded in a model's journal
// under a primary's state directory (PrimaryConfig.StateDir), oldest first:
// version, optimizer step count, members and weights. A compacted journal
// starts with its snapshot (no members). For tests and inspection.
func ReadJournal(stateDir, model string) ([]JournalStep, error) {
	f, err := os.Open(filepath.Join(stateDir, store.ModelDir(model), journalName))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	recs, _, err := readJournal(f, st.Size())
	out := make([]JournalStep, len(recs))
	for i, r := range recs {
		out[i] = JournalStep{Version: r.Version, Steps: r.Steps, Members: r.ids(), Weights: r.Weights, Snapshot: r.Ledger != nil}
	}
	return out, err
}

// JournalStep is one record of a model's journal (ReadJournal).
type JournalStep struct {
	Version  uint64
	Steps    uint64
	Members  []reduce.ID
	Weights  []float32
	Snapshot bool // a compaction snapshot, not a step
}

// ReadOptimizerState reads the optimizer state a primary's state directory
// holds for model at version (the state that produced it): tensors named
// "<slot>/<param>" and metadata (optim.steps, optim.kind, model.version).
// For tests and inspection.
func ReadOptimizerState(stateDir, model string, version uint64) (*tensor.StateDict, map[string]string, error) {
	raw, err := os.ReadFile(filepath.Join(stateDir, store.ModelDir(model), stateFileName(version)))
	if err != nil {
		return nil, nil, err
	}
	return decodeState(raw, version)
}

// VerifyStateFile checks an optimizer state file (optim-vN.safetensors)
// against the version its name holds and the checksum it records, without
// opening the state directory (a standby's scrub of its copy,
// internal/replica).
func VerifyStateFile(path string) error {
	version, ok := parseStateFileName(filepath.Base(path))
	if !ok {
		return fmt.Errorf("%w: %s is not an optimizer state file name", errs.ErrInvalid, errs.Quote(filepath.Base(path)))
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	_, _, err = decodeState(raw, version)
	return err
}

func decodeState(raw []byte, version uint64) (*tensor.StateDict, map[string]string, error) {
	f, err := safetensors.Decode(raw)
	if err != nil {
		return nil, nil, err
	}
	if v := f.Metadata["model.version"]; v != strconv.FormatUint(version, 10) {
		return nil, nil, fmt.Errorf("optimizer state file of version %d says model.version %q", version, truncate(v, 32))
	}
	var crc uint32
	for _, t := range f.Tensors.Tensors() {
		crc = crc32.Update(crc, crcTable, t.Data)
	}
	if want := f.Metadata["reducer.crc32c"]; want != strconv.FormatUint(uint64(crc), 10) {
		return nil, nil, fmt.Errorf("optimizer state of version %d: checksum %d, recorded %q", version, crc, truncate(want, 16))
	}
	return f.Tensors, f.Metadata, nil
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

// stateDir is an open StateDir: locked against a second process.
type stateDir struct {
	dir          string
	lock         *os.File
	spares       *atomicfile.Spares // the optimizer states dropped, whose inodes and blocks the next are written into
	compactBytes int64
	logger       *slog.Logger
	changed      func(path string)             // PrimaryConfig.StateChanged; nil: no one
	appendedTo   func(path string, from int64) // PrimaryConfig.StateAppended; nil: changed
	// now and forgetAfter: PrimaryConfig.Clock and LedgerForgetAfter
	// (forgetAfter 0: clients are never forgotten), so that a compaction's
	// ledger snapshot forgets the clients the live ledger forgets.
	now         func() time.Time
	forgetAfter time.Duration
}

// newLedger is a ledger of applied ids that forgets idle clients as the
// live one does.
func (d *stateDir) newLedger(window int) *reduce.Ledger {
	l := reduce.NewLedger(window)
	if d.forgetAfter > 0 {
		l.SetClock(d.now)
	}
	return l
}

// named tells PrimaryConfig.StateChanged that path was written or
// removed; every write below names its file once done, before the
// version it belongs to is pushed (the replica contract:
// replica.Source.Changed).
func (d *stateDir) named(path string) {
	if d.changed != nil {
		d.changed(path)
	}
}

// appended tells PrimaryConfig.StateAppended that path grew from from
// bytes, its first from bytes unchanged since it was last named (or
// StateChanged, when no one takes appends).
func (d *stateDir) appended(path string, from int64) {
	if d.appendedTo != nil {
		d.appendedTo(path, from)
	} else {
		d.named(path)
	}
}

func openStateDir(dir string, compactBytes int64, logger *slog.Logger, changed func(string), appended func(string, int64)) (*stateDir, error) {
	if err := atomicfile.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("reducer: state dir: %w", err)
	}
	lock, err := os.OpenFile(filepath.Join(dir, stateLockName), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("reducer: state dir: %w", err)
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		lock.Close()
		return nil, fmt.Errorf("reducer: state dir %s is in use by another process: %w", dir, err)
	}
	// Each step writes its optimizer state to a new file and removes the
	// one before: with a pool the file system neither allocates nor frees
	// an inode and its blocks per step (BenchmarkDurableSteps). The
	// pool's directory starts with a dot: no model's, never replicated.
	spares, err := atomicfile.OpenSpares(filepath.Join(dir, spareDir))
	if err != nil {
		lock.Close()
		return nil, fmt.Errorf("reducer: state dir: %w", err)
	}
	return &stateDir{dir: dir, lock: lock, spares: spares, compactBytes: compactBytes, logger: logger, changed: changed, appendedTo: appended}, nil
}

func (d *stateDir) close() error { return d.lock.Close() }

// registrations lists the model directories holding a registration.
func (d *stateDir) registrations() ([]string, error) {
	ents, err := os.ReadDir(d.dir)
	if err != nil {
		return nil, fmt.Errorf("reducer: state dir: %w", err)
	}
	var out []string
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		if _, err := os.Stat(filepath.Join(d.dir, e.Name(), registrationName)); err == nil {
			out = append(out, filepath.Join(d.dir, e.Name()))
		}
	}
	return out, nil
}

// registered reports whether model has a registration in the state
// directory (one that restore may not have restored). A directory that
// cannot be read counts as registered: restore then leaves the model as it
// is.
func (d *stateDir) registered(model string) bool {
	_, err := os.Stat(filepath.Join(d.dir, store.ModelDir(model), registrationName))
	return !errors.Is(err, os.ErrNotExist)
}

// drop removes a stale registration's files for good. The registration
// goes first, as create writes it last: a kill in between leaves debris
// that restore ignores (registrations) and a new registration replaces
// (create), never a registration without its journal.
func (d *stateDir) drop(dir string) error {
	defer d.named(dir)
	if err := os.Remove(filepath.Join(dir, registrationName)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if err := atomicfile.SyncDir(dir); err != nil {
		return err
	}
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	return atomicfile.SyncDir(d.dir)
}

func readRegistration(dir string) (registration, error) {
	var reg registration
	raw, err := os.ReadFile(filepath.Join(dir, registrationName))
	if err != nil {
		return reg, err
	}
	if err := json.Unmarshal(raw, &reg); err != nil {
		return reg, fmt.Errorf("%s: %v", registrationName, err)
	}
	if reg.Format != registrationFmt {
		return reg, fmt.Errorf("%s: format %d (this build reads %d)", registrationName, reg.Format, registrationFmt)
	}
	if reg.Model == "" || reg.Config.Model != reg.Model || store.ModelDir(reg.Model) != filepath.Base(dir) {
		return reg, fmt.Errorf("%s: names model %q in directory %q", registrationName, truncate(reg.Model, 64), filepath.Base(dir))
	}
	return reg, nil
}

// modelFiles is one model's durable files. Its methods run with the
// model's stepMu held (or before the model is visible).
type modelFiles struct {
	d       *stateDir
	dir     string
	journal *os.File
	size    int64 // journal bytes
	// base is the journal's size when it was last compacted (its ledger
	// snapshot; 0: it starts with a step): compaction waits for the
	// journal to double past it as well as for the threshold, so that a
	// ledger bigger than the threshold is not rewritten at every step.
	base int64
	// applied mirrors the ledger's applied ids through the newest
	// published version (the live ledger also holds ids settled for steps
	// not yet journaled, or not yet published): the compaction snapshot is
	// taken from it.
	applied *reduce.Ledger
	// stateVersion is the version whose optimizer state file is on disk
	// and published (0: none).
	stateVersion uint64
	// unpublished is the journal's records of the steps committed and not
	// yet published (a replicated store: commitStep; at most maxUnacked),
	// oldest first: a compaction keeps their frames after its snapshot.
	unpublished []unpublishedStep
}

// unpublishedStep is a committed step's journal record, as framed, with
// its members.
type unpublishedStep struct {
	version uint64
	frame   []byte
	members []reduce.ID
}

// create starts a model's files afresh for a new registration: any earlier
// files of the name are removed.
func (d *stateDir) create(reg registration, window int) (*modelFiles, error) {
	dir := filepath.Join(d.dir, store.ModelDir(reg.Model))
	defer d.named(dir) // the whole directory: an earlier registration's files go with it
	if err := os.RemoveAll(dir); err != nil {
		return nil, fmt.Errorf("reducer: state of %q: %w", reg.Model, err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("reducer: state of %q: %w", reg.Model, err)
	}
	if err := atomicfile.SyncDir(d.dir); err != nil {
		return nil, fmt.Errorf("reducer: state of %q: %w", reg.Model, err)
	}
	j, err := os.OpenFile(filepath.Join(dir, journalName), os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, fmt.Errorf("reducer: state of %q: %w", reg.Model, err)
	}
	raw, err := json.MarshalIndent(reg, "", "  ")
	if err == nil {
		// The registration is committed last: a directory without it is
		// debris of a registration that never completed.
		err = atomicfile.Write(filepath.Join(dir, registrationName), raw, []byte{'\n'})
	}
	if err != nil {
		j.Close()
		return nil, fmt.Errorf("reducer: persist registration of %q: %w", reg.Model, err)
	}
	return &modelFiles{d: d, dir: dir, journal: j, applied: d.newLedger(window)}, nil
}

// restored is what a model's files hold at the store's newest version.
type restored struct {
	files    *modelFiles
	ledger   *reduce.Ledger // applied ids through the newest version
	steps    uint64         // optimizer steps recorded for the newest version
	state    *tensor.StateDict
	meta     map[string]string // the state file's metadata (nil: no state file)
	problems []string          // why state or ledger may be incomplete
}

// restore opens a model's files at newest, the store's newest version:
// journal records past it are cut off (a step that never published), its
// optimizer state is read, other state files are removed.
func (d *stateDir) restore(dir string, reg registration, newest uint64, window int) (*restored, error) {
	defer d.named(dir) // the journal cut back, stale state files removed
	jpath := filepath.Join(dir, journalName)
	j, err := os.OpenFile(jpath, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	var size int64
	if st, err := j.Stat(); err == nil {
		size = st.Size()
	}
	recs, ends, jerr := readJournal(j, size)
	out := &restored{ledger: reduce.NewLedger(window)}
	applied := reduce.NewLedger(window)
	keep := int64(0)
	last := reg.StartVersion
	for i, r := range recs {
		if r.Version > newest {
			break
		}
		if r.Ledger != nil {
			out.ledger.RestoreApplied(r.Ledger)
			applied.RestoreApplied(r.Ledger)
		} else {
			if r.Version != last+1 {
				out.problems = append(out.problems, fmt.Sprintf("journal skips from version %d to %d", last, r.Version))
			}
			ids := r.ids()
			out.ledger.AddApplied(ids)
			applied.AddApplied(ids)
		}
		last, out.steps, keep = r.Version, r.Steps, ends[i]
	}
	if d.forgetAfter > 0 {
		applied.SetClock(d.now) // its clients are idle from now, as the live ledger's
	}
	read := int64(0) // the bytes of whole records readJournal read
	if len(ends) > 0 {
		read = ends[len(ends)-1]
	}
	if jerr == nil && read < size && keep == read && last < newest {
		// A kill tears only the record of a step never published, past
		// the records of the store's newest version: a journal that
		// stops short of that version at a bad frame is damaged.
		jerr = fmt.Errorf("journal damaged at byte %d of %d: a bad frame after version %d, before the store's newest %d (not a torn append)", read, size, last, newest)
	}
	if jerr != nil {
		out.problems = append(out.problems, jerr.Error())
		// Cut back below, the records after the damage would be gone for
		// good: the journal is kept aside as it was, for the operator.
		aside := jpath + ".damaged"
		if err := copyFile(jpath, aside); err != nil {
			d.logger.Error("reducer: cannot keep the damaged journal aside", "model", reg.Model, "err", err)
		} else {
			d.logger.Error("reducer: the journal is damaged; kept aside as it was, and cut back before the damage", "model", reg.Model,
				"kept_as", aside, "err", jerr)
		}
	}
	if size > keep {
		d.logger.Info("reducer: journal cut back to the newest published version", "model", reg.Model,
			"version", newest, "bytes_removed", size-keep)
		if err := j.Truncate(keep); err != nil {
			j.Close()
			return nil, err
		}
		if err := j.Sync(); err != nil {
			j.Close()
			return nil, err
		}
	}
	if _, err := j.Seek(keep, io.SeekStart); err != nil {
		j.Close()
		return nil, err
	}
	if last != newest {
		out.problems = append(out.problems, fmt.Sprintf("the journal ends at version %d, the store's newest is %d (published by another writer, or the journal was lost): gradients applied in between may be accepted again", last, newest))
	}
	// A crash leaves at most maxUnacked steps committed and not published:
	// more records past the store's newest mean the store went back (the
	// model deleted and pushed again, or rolled back), not a crash. Their
	// cut is then not the routine one: said, and the optimizer not exact.
	beyond := 0
	for _, r := range recs {
		if r.Version > newest {
			beyond++
		}
	}
	if beyond > maxUnacked {
		out.problems = append(out.problems, fmt.Sprintf("the journal runs %d steps past the store's newest version %d: the model was replaced (deleted and pushed again) or rolled back; its steps past %d are cut and its optimizer starts again", beyond, newest, newest))
	}
	out.files = &modelFiles{d: d, dir: dir, journal: j, size: keep, applied: applied}
	if len(recs) > 0 && recs[0].Ledger != nil && ends[0] <= keep {
		out.files.base = ends[0]
	}

	// The state file of newest; any other is debris of a step that never
	// published or of one whose successor did.
	ents, err := os.ReadDir(dir)
	if err != nil {
		j.Close()
		return nil, err
	}
	for _, e := range ents {
		name := e.Name()
		v, isState := parseStateFileName(name)
		switch {
		case isState && v == newest:
			raw, err := os.ReadFile(filepath.Join(dir, name))
			if err == nil {
				out.state, out.meta, err = decodeState(raw, newest)
			}
			if err == nil && last == newest && keep > 0 && out.meta["optim.steps"] != strconv.FormatUint(out.steps, 10) {
				// The checksum covers the tensors, not the metadata: the
				// journal's step count of newest is checked against it.
				err = fmt.Errorf("its step count %q is not the journal's %d", truncate(out.meta["optim.steps"], 32), out.steps)
			}
			if err != nil {
				out.problems = append(out.problems, fmt.Sprintf("optimizer state of version %d unreadable: %v", newest, err))
				out.state, out.meta = nil, nil
				continue
			}
			out.files.stateVersion = newest
		case isState, strings.HasSuffix(name, stateTmpSuffix):
			if err := os.Remove(filepath.Join(dir, name)); err != nil {
				d.logger.Warn("reducer: cannot remove stale optimizer state", "file", filepath.Join(dir, name), "err", err)
			}
		}
	}
	return out, nil
}

// commit makes the step that produced version durable before it is
// published: the journal record, then the optimizer state. steps is the
// optimizer's step count after the step; opt is nil for an external model
// (its host checkpoints its own state in the store), which writes only the
// journal record. stateErr, when set, is carried in the state's metadata
// so that a state lost once stays reported after later restarts.
func (f *modelFiles) commit(version, steps uint64, members []reduce.ID, weights []float32, opt *optim.Optimizer, stateErr string) error {
	rec := journalRecord{Version: version, Steps: steps, Members: make([]journalID, len(members)), Weights: weights}
	for i, id := range members {
		rec.Members[i] = journalID{id.Client, id.Seq}
	}
	payload, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	from := f.size
	frame := appendFrame(make([]byte, 0, 8+len(payload)), payload)
	if err = f.appendJournal(frame); err != nil {
		f.d.named(filepath.Join(f.dir, journalName)) // a failed append may have cut it back
		return err
	}
	if from > 0 {
		f.d.appended(filepath.Join(f.dir, journalName), from)
	} else {
		f.d.named(filepath.Join(f.dir, journalName))
	}
	f.unpublished = append(f.unpublished, unpublishedStep{version: version, frame: frame, members: slices.Clone(members)})
	if opt == nil {
		return nil
	}
	st, meta := opt.State()
	meta["model.version"] = strconv.FormatUint(version, 10)
	if stateErr != "" {
		meta["reducer.state_error"] = stateErr
	}
	var crc uint32
	plan, err := safetensors.Plan(st, nil)
	if err != nil {
		return err
	}
	for _, t := range plan.Order {
		crc = crc32.Update(crc, crcTable, t.Data)
	}
	meta["reducer.crc32c"] = strconv.FormatUint(uint64(crc), 10)
	if plan, err = safetensors.Plan(st, meta); err != nil {
		return err
	}
	path := filepath.Join(f.dir, stateFileName(version))
	if err := f.d.spares.WriteWith(path, atomicfile.Hooks{}, plan.Buffers()...); err != nil {
		return fmt.Errorf("optimizer state of version %d: %w", version, err)
	}
	f.d.named(path)
	return nil
}

// appendJournal appends one framed record and fsyncs it.
func (f *modelFiles) appendJournal(frame []byte) error {
	n, err := f.journal.Write(frame)
	if err == nil {
		err = f.journal.Sync()
	}
	if err != nil {
		// Cut a partial frame off so the next append starts on a frame
		// boundary (a reader would stop at it anyway).
		if n > 0 {
			_ = f.journal.Truncate(f.size)
			_, _ = f.journal.Seek(f.size, io.SeekStart)
		}
		return fmt.Errorf("journal: %w", err)
	}
	f.size += int64(n)
	return nil
}

// published records that version (committed) is in the store: the state
// file of the version before it is removed, and the journal compacted when
// it has grown past the threshold. Failures here cost disk space, not
// correctness; they are logged.
func (f *modelFiles) published(version, steps uint64) {
	if f.stateVersion != 0 && f.stateVersion != version {
		old := filepath.Join(f.dir, stateFileName(f.stateVersion))
		if err := f.d.spares.Retire(old); err != nil {
			f.d.logger.Warn("reducer: cannot remove an old optimizer state", "dir", f.dir, "version", f.stateVersion, "err", err)
		}
		f.d.named(old)
	}
	f.stateVersion = version
	n := 0
	for _, u := range f.unpublished {
		if u.version > version {
			break
		}
		f.applied.AddApplied(u.members)
		n++
	}
	f.unpublished = slices.Delete(f.unpublished, 0, n)
	// A later step may be committed and not yet published (a replicated
	// store: commitStep; on a saturated primary, always): the compaction
	// keeps its record after the snapshot (it used to wait for none, and
	// under a steady load never ran).
	if f.d.compactBytes > 0 && f.size > max(f.d.compactBytes, 2*f.base) {
		if err := f.compact(version, steps); err != nil {
			f.d.logger.Warn("reducer: journal compaction failed; the journal keeps growing", "dir", f.dir, "err", err)
		}
	}
}

// compact replaces the journal by one snapshot record of the applied ids
// through version (published), followed by the records of the steps
// committed after it and not yet published, as they were.
func (f *modelFiles) compact(version, steps uint64) error {
	if f.d.forgetAfter > 0 {
		// The clients the live ledger forgot are not restored either.
		f.applied.ForgetIdle(f.d.now().Add(-f.d.forgetAfter))
	}
	payload, err := json.Marshal(journalRecord{Version: version, Steps: steps, Ledger: f.applied.Applied()})
	if err != nil {
		return err
	}
	if len(payload) > int(journalRecordMax) {
		// A reader would take it for damage: the journal keeps its records.
		return fmt.Errorf("the ledger's snapshot is %d bytes, more than a journal record may be (%d)", len(payload), journalRecordMax)
	}
	pieces := [][]byte{appendFrame(nil, payload)}
	size := int64(len(pieces[0]))
	for _, u := range f.unpublished {
		pieces = append(pieces, u.frame)
		size += int64(len(u.frame))
	}
	if err := atomicfile.Write(filepath.Join(f.dir, journalName), pieces...); err != nil {
		return err
	}
	f.d.named(filepath.Join(f.dir, journalName))
	j, err := openJournal(filepath.Join(f.dir, journalName))
	if err == nil {
		_, err = j.Seek(size, io.SeekStart)
	}
	if err != nil {
		// The compacted journal is in place and the handle held is on the
		// file it replaced: closed, so that the next step's append fails
		// and the model stops, loudly (appended to, the replaced file
		// would take records no restart reads).
		if j != nil {
			j.Close()
		}
		f.journal.Close()
		return err
	}
	f.journal.Close()
	f.journal, f.size, f.base = j, size, int64(len(pieces[0]))
	return nil
}

// openJournal opens a compacted journal to append to (tests replace it
// to make the open fail).
var openJournal = func(path string) (*os.File, error) { return os.OpenFile(path, os.O_WRONLY, 0o644) }

// copyFile copies src to dst (a temporary file fsynced and renamed in;
// in the kernel, copy_file_range, where it can).
func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	tmp := dst + atomicfile.TmpSuffix
	out, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	_, err = io.Copy(out, in)
	if err == nil {
		err = out.Sync()
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, dst)
	}
	if err != nil {
		os.Remove(tmp)
		return err
	}
	return atomicfile.SyncDir(filepath.Dir(dst))
}

func (f *modelFiles) close() error {
	if err := f.journal.Close(); err != nil && !errors.Is(err, os.ErrClosed) { // closed by a failed compaction
		return err
	}
	return nil
}
