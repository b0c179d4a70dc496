package arsrpc

import (
	"bufio"
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/rlhub/rlhub/internal/ars"
	"github.com/rlhub/rlhub/internal/atomicfile"
	"github.com/rlhub/rlhub/internal/crashpoint"
	pb "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// A run's durable state lives in DIR/RUN/ (DIR is Config.DataDir, the
// hub's --data/ars):
//
//	state.json    the run after its last finished iteration: spec, policy
//	              version, trainer state (iteration, θ, filter statistics,
//	              counters, seed state = spec seed + iteration), done and
//	              reason, and how many progress entries belong to it.
//	              Replaced whole: temp file, fsync, rename, fsync DIR/RUN.
//	progress.log  one line per finished iteration (the curve):
//	              "CRC32C-hex JSON\n", appended and fsynced before
//	              state.json moves on. Lines beyond state.json's count (a
//	              crash between the two writes) or with a bad checksum (a
//	              torn tail) are dropped on load.
//
// Order of one iteration's writes (under the Service mutex, before anyone
// is told): append the progress line, replace state.json, then publish the
// new policy version to the store. So the store is never ahead of
// state.json, and a restart that finds the store one version behind
// republishes it from the restored θ. Leases and the current iteration's
// results are not kept: a restart redoes the unfinished iteration, and
// since every task is a deterministic function of (seed, iteration, task)
// the run ends exactly as it would have.

const stateFormat = 1

// diskState is state.json.
type diskState struct {
	Format  int             `json:"format"`
	ID      string          `json:"id"`
	Model   string          `json:"model"`
	Request string          `json:"request_id,omitempty"`
	Spec    json.RawMessage `json:"spec"` // protojson of the normalised spec
	Version uint64          `json:"version"`
	Started int64           `json:"started_unix_nano"`
	Done    bool            `json:"done"`
	// Trainer is nil for a run that ended (its trainer is dropped).
	Trainer  *ars.TrainerState `json:"trainer,omitempty"`
	Progress int               `json:"progress_entries"`
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

var runDirName = regexp.MustCompile(`^run-([0-9]{1,18})$`)

// persister writes runs' state under dir; the Service mutex serialises it.
type persister struct {
	dir   string
	crash *crashpoint.Hook
	// logs holds each run's open progress.log.
	logs map[string]*os.File
	// changed is Config.StateChanged (nil: no one), told each file once
	// written (named).
	changed func(path string)
	// appended is Config.StateAppended (nil: changed), told a progress
	// log appended to and where its new bytes start.
	appended func(path string, from int64)
}

func newPersister(dir string, crash *crashpoint.Hook, changed func(string), appended func(string, int64)) (*persister, error) {
	if err := atomicfile.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("ars state: %w", err)
	}
	return &persister{dir: dir, crash: crash, logs: map[string]*os.File{}, changed: changed, appended: appended}, nil
}

// named tells Config.StateChanged that path was written: after the
// write, before the push of the policy version it belongs to (save runs
// before it), as the replica contract asks (replica.Source.Changed).
func (p *persister) named(path string) {
	if p.changed != nil {
		p.changed(path)
	}
}

func (p *persister) close() error {
	var out []error
	for id, f := range p.logs {
		out = append(out, f.Close())
		delete(p.logs, id)
	}
	return errors.Join(out...)
}

// save makes r's state durable: the progress entries not yet logged, then
// state.json. When it fails after appending entries, the log is cut back
// to its size before them: the entries stay unlogged (r.logged), and a
// later save appends them once, not again after themselves.
func (p *persister) save(r *run) (err error) {
	if p == nil {
		return nil
	}
	rd := filepath.Join(p.dir, r.id)
	f := p.logs[r.id]
	if f == nil {
		if err := atomicfile.MkdirAll(rd, 0o755); err != nil {
			return err
		}
		var err error
		f, err = os.OpenFile(filepath.Join(rd, "progress.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return err
		}
		p.logs[r.id] = f
		p.named(f.Name()) // created (empty until the first entry)
		if err := atomicfile.SyncDir(p.dir); err != nil {
			return err
		}
	}
	if r.logged < len(r.progress) {
		var buf bytes.Buffer
		for _, e := range r.progress[r.logged:] {
			b, err := protojson.Marshal(e)
			if err != nil {
				return err
			}
			fmt.Fprintf(&buf, "%08x %s\n", crc32.Checksum(b, castagnoli), b)
		}
		from := int64(-1)
		if fi, err := f.Stat(); err == nil {
			from = fi.Size()
		}
		defer func() {
			if err == nil || from < 0 {
				return
			}
			// Cut back to the entries state.json counts (a load takes no
			// more than that many anyway); the change is named.
			if terr := f.Truncate(from); terr == nil {
				terr = f.Sync()
			}
			p.named(f.Name())
		}()
		_, err := f.Write(buf.Bytes())
		if err != nil || from <= 0 || p.appended == nil {
			p.named(f.Name()) // even a failed append may have written part of it
		} else {
			p.appended(f.Name(), from)
		}
		if err != nil {
			return err
		}
		if err := f.Sync(); err != nil {
			return err
		}
	}
	spec, err := protojson.Marshal(r.spec)
	if err != nil {
		return err
	}
	st := diskState{Format: stateFormat, ID: r.id, Model: r.model, Request: r.requestID, Spec: spec, Version: r.version,
		Started: r.started.UnixNano(), Done: r.done, Progress: len(r.progress)}
	if r.tr != nil {
		ts := r.tr.State()
		st.Trainer = &ts
	}
	b, err := json.Marshal(&st)
	if err != nil {
		return err
	}
	if err := p.writeAtomic(filepath.Join(rd, "state.json"), b); err != nil {
		return err
	}
	r.logged = len(r.progress)
	if r.done {
		// An ended run appends no more: its log needs no descriptor (a
		// later save, as StopRun's of an ended run, opens it again).
		delete(p.logs, r.id)
		if err := f.Close(); err != nil {
			return err
		}
	}
	return nil
}

// writeAtomic replaces path with b: temp file, fsync, rename, fsync dir.
func (p *persister) writeAtomic(path string, b []byte) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	if p.crash.Hit("snapshot") {
		f.Write(b[:len(b)/2]) // a torn temp file, as a crash mid-write leaves
		f.Sync()
		crashpoint.Kill()
	}
	_, err = f.Write(b)
	if err = errors.Join(err, f.Sync(), f.Close()); err != nil {
		os.Remove(tmp)
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	p.named(path)
	return atomicfile.SyncDir(filepath.Dir(path))
}

// loaded is one run read back from disk.
type loaded struct {
	r   *run
	num uint64 // N of run-N
}

// load reads the runs under dir, oldest first: every live run, and of
// the ended ones the newest keepEnded by run number (older ones stay on
// disk, read when asked for: readEnded; of those only state.json is
// read, never the progress). A run whose state cannot be read is skipped
// with its error (the caller logs it at ERROR); its number is still
// taken so no new run reuses its name. A run directory without
// state.json is a StartRun that never finished its first save (a crash
// in it: the run was never acknowledged): it is removed, and named in
// unstarted.
func (p *persister) load(keepEnded int) (runs []loaded, maxNum uint64, unstarted []string, bad []error) {
	ents, err := os.ReadDir(p.dir)
	if err != nil {
		return nil, 0, nil, []error{err}
	}
	type runDir struct {
		name string
		num  uint64
	}
	var dirs []runDir
	for _, e := range ents {
		m := runDirName.FindStringSubmatch(e.Name())
		if m == nil || !e.IsDir() {
			continue
		}
		num, _ := strconv.ParseUint(m[1], 10, 64)
		maxNum = max(maxNum, num)
		dirs = append(dirs, runDir{e.Name(), num})
	}
	slices.SortFunc(dirs, func(a, b runDir) int { return cmp.Compare(b.num, a.num) }) // newest first
	for _, d := range dirs {
		name := d.name
		if _, err := os.Stat(filepath.Join(p.dir, name, "state.json")); errors.Is(err, os.ErrNotExist) {
			if err := p.removeRun(name); err != nil {
				bad = append(bad, fmt.Errorf("ars run %s: %w", name, err))
			} else {
				unstarted = append(unstarted, name)
			}
			continue
		}
		r, err := p.loadRun(name, keepEnded > 0)
		if err != nil {
			bad = append(bad, fmt.Errorf("ars run %s: %w", name, err))
			continue
		}
		if r == nil {
			continue // ended, older than the keepEnded kept
		}
		if r.done {
			keepEnded--
		}
		runs = append(runs, loaded{r, d.num})
	}
	slices.Reverse(runs)
	return runs, maxNum, unstarted, bad
}

// removeRun removes a run's directory and the files in it, each named.
func (p *persister) removeRun(name string) error {
	rd := filepath.Join(p.dir, name)
	ents, err := os.ReadDir(rd)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if err := os.RemoveAll(filepath.Join(rd, e.Name())); err != nil {
			return err
		}
		p.named(filepath.Join(rd, e.Name()))
	}
	if err := os.Remove(rd); err != nil {
		return err
	}
	p.named(rd)
	return atomicfile.SyncDir(p.dir)
}

// readState reads and checks DIR/name/state.json and its spec.
func readState(dir, name string) (diskState, *pb.ARSRunSpec, error) {
	raw, err := os.ReadFile(filepath.Join(dir, name, "state.json"))
	if err != nil {
		return diskState{}, nil, err
	}
	var st diskState
	if err := json.Unmarshal(raw, &st); err != nil {
		return diskState{}, nil, fmt.Errorf("state.json: %w", err)
	}
	if st.Format != stateFormat || st.ID != name || st.Progress < 0 {
		return diskState{}, nil, fmt.Errorf("state.json: format %d, id %q", st.Format, truncate(st.ID, 64))
	}
	var spec pb.ARSRunSpec
	if err := protojson.Unmarshal(st.Spec, &spec); err != nil {
		return diskState{}, nil, fmt.Errorf("state.json spec: %w", err)
	}
	return st, &spec, nil
}

// loadRun reads run name, or returns nil for an ended run when
// !wantEnded (its progress unread).
func (p *persister) loadRun(name string, wantEnded bool) (*run, error) {
	rd := filepath.Join(p.dir, name)
	st, spec, err := readState(p.dir, name)
	if err != nil {
		return nil, err
	}
	if st.Done && !wantEnded {
		return nil, nil
	}
	s, cfg, err := Normalise(spec)
	if err != nil {
		return nil, err
	}
	var tr *ars.Trainer
	switch {
	case st.Trainer != nil && !st.Done:
		if tr, err = ars.RestoreTrainer(cfg, *st.Trainer); err != nil {
			return nil, err
		}
	case !st.Done:
		return nil, errors.New("state.json: an unfinished run without trainer state")
	}
	progress, err := readProgress(filepath.Join(rd, "progress.log"), st.Progress)
	if err != nil {
		return nil, err
	}
	num, _ := strconv.ParseUint(runDirName.FindStringSubmatch(name)[1], 10, 64)
	r := &run{id: st.ID, num: num, model: st.Model, requestID: st.Request, spec: s, tr: tr, started: time.Unix(0, st.Started), version: st.Version,
		done: st.Done, progress: make([]*pb.ARSProgress, 0, len(progress)), logged: len(progress)}
	for _, e := range progress {
		r.addProgress(e)
		if e.Episodes > e.PolicyEpisodes {
			r.hasTrain, r.trainMean = true, e.TrainReturn
		}
	}
	if st.Done {
		return r, nil // appends nothing more: its log is read only
	}
	// Rewrite the log without anything beyond state.json (a crash between
	// the two writes): appends then continue a clean file.
	if err := p.rewriteProgress(rd, progress); err != nil {
		return nil, err
	}
	return r, nil
}

// readEnded reads what a client may ask of an ended run the coordinator
// no longer keeps (coordinator.ended) from DIR/id: its model and its
// progress. It only reads files no one writes any more (an ended run's,
// once forgotten), so it needs no lock. ok is false when id names no
// ended run under dir.
func readEnded(dir, id string) (model string, progress []*pb.ARSProgress, ok bool, err error) {
	if runDirName.FindStringSubmatch(id) == nil {
		return "", nil, false, nil // also keeps id from naming a path
	}
	st, _, err := readState(dir, id)
	if errors.Is(err, os.ErrNotExist) {
		return "", nil, false, nil
	}
	if err != nil {
		return "", nil, false, err
	}
	if !st.Done {
		return "", nil, false, nil // unreadable when the hub started: not resumed
	}
	progress, err = readProgress(filepath.Join(dir, id, "progress.log"), st.Progress)
	if err != nil {
		return "", nil, false, err
	}
	return st.Model, progress, true, nil
}

// readProgress reads the first n valid entries of a progress log.
func readProgress(path string, n int) ([]*pb.ARSProgress, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) && n == 0 {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []*pb.ARSProgress
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for len(out) < n && sc.Scan() {
		line := sc.Bytes()
		sum, body, ok := bytes.Cut(line, []byte(" "))
		want, err := strconv.ParseUint(string(sum), 16, 32)
		if !ok || err != nil || crc32.Checksum(body, castagnoli) != uint32(want) {
			break // a torn tail
		}
		var e pb.ARSProgress
		if err := protojson.Unmarshal(body, &e); err != nil {
			break
		}
		out = append(out, &e)
	}
	if len(out) != n {
		return nil, fmt.Errorf("progress.log holds %d valid entries, state.json needs %d", len(out), n)
	}
	return out, nil
}

func (p *persister) rewriteProgress(rd string, entries []*pb.ARSProgress) error {
	var buf bytes.Buffer
	for _, e := range entries {
		b, err := protojson.Marshal(e)
		if err != nil {
			return err
		}
		fmt.Fprintf(&buf, "%08x %s\n", crc32.Checksum(b, castagnoli), b)
	}
	return p.writeAtomic(filepath.Join(rd, "progress.log"), buf.Bytes())
}
