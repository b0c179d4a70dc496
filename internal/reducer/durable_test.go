package reducer

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/optim"
	"github.com/rlhub/rlhub/internal/reduce"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/tensor"
	"github.com/rlhub/rlhub/internal/testkit"
)

// durableEnv is a file-backed store and a reducer state directory that
// outlive the primaries a test opens on them one after another.
type durableEnv struct {
	t        *testing.T
	storeDir string
	stateDir string
	init     *tensor.StateDict
	mc       ModelConfig
	logs     *testkit.Buffer

	st store.Store
	p  *Primary
}

const durableN = 8

func newDurableEnv(t *testing.T) *durableEnv {
	t.Helper()
	root := t.TempDir()
	e := &durableEnv{t: t, storeDir: filepath.Join(root, "store"), stateDir: filepath.Join(root, "reducer"),
		init: fill(testLayout(durableN), rand.New(rand.NewPCG(11, 12)), 1), logs: &testkit.Buffer{},
		mc: ModelConfig{Model: "m", Optimizer: optim.Config{Kind: optim.Adam, LR: 0.01,
			Schedule: optim.Schedule{Kind: optim.Cosine, TMax: 50, WarmupSteps: 3}}, Reduction: reduce.Sum}}
	e.openStore()
	pushModel(t, e.st, "m", e.init)
	t.Cleanup(e.close)
	return e
}

func (e *durableEnv) openStore() {
	st, err := store.OpenFile(store.FileConfig{Dir: e.storeDir, Store: store.Config{Retain: 64}, Logger: slog.New(slog.NewTextHandler(e.logs, nil))})
	if err != nil {
		e.t.Fatal(err)
	}
	e.st = st
}

// open starts a primary on the store and state directory.
func (e *durableEnv) open(cfg PrimaryConfig) *Primary {
	e.t.Helper()
	cfg.Store, cfg.StateDir = e.st, e.stateDir
	cfg.Logger = slog.New(slog.NewTextHandler(e.logs, nil))
	p, err := NewPrimary(cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	e.p = p
	return p
}

// restart closes the primary and the store and opens both again, as a
// restarted hub does.
func (e *durableEnv) restart(cfg PrimaryConfig) *Primary {
	e.t.Helper()
	e.close()
	e.openStore()
	return e.open(cfg)
}

func (e *durableEnv) close() {
	if e.p != nil {
		if err := e.p.Close(); err != nil {
			e.t.Error(err)
		}
		e.p = nil
	}
	if e.st != nil {
		e.st.Close()
		e.st = nil
	}
}

// registered opens a primary with cfg, registers the model and attaches
// a secondary, whose session it returns.
func (e *durableEnv) registered(cfg PrimaryConfig) (*Primary, uint64) {
	e.t.Helper()
	p := e.open(cfg)
	ctx := context.Background()
	if _, _, err := p.Register(ctx, e.mc); err != nil {
		e.t.Fatal(err)
	}
	sess, _, err := p.Attach(ctx, Secondary{ID: "x"})
	if err != nil {
		e.t.Fatal(err)
	}
	return p, sess
}

// steppedEnv is a closed durable environment whose model was registered
// and stepped n times (seqs 1..n).
func steppedEnv(t *testing.T, n uint64) *durableEnv {
	t.Helper()
	e := newDurableEnv(t)
	p := e.open(PrimaryConfig{})
	if _, _, err := p.Register(context.Background(), e.mc); err != nil {
		t.Fatal(err)
	}
	e.steps(p, 1, n)
	e.close()
	return e
}

// steps applies one gradient per step, client "ck", seqs from..to.
func (e *durableEnv) steps(p *Primary, from, to uint64) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	sess, _, err := p.Attach(ctx, Secondary{ID: "x"})
	if err != nil {
		e.t.Fatal(err)
	}
	defer p.Detach(sess)
	for s := from; s <= to; s++ {
		if err := step(ctx, p, sess, reduce.ID{Client: "ck", Seq: s}); err != nil {
			e.t.Fatalf("seq %d: %v", s, err)
		}
	}
}

// step admits id's gradient and forwards it alone: one step.
func step(ctx context.Context, p *Primary, sess uint64, id reduce.ID) error {
	if _, _, err := p.Admit(ctx, sess, "m", id, 0, 0); err != nil {
		return fmt.Errorf("admit: %w", err)
	}
	if _, err := p.Forward(ctx, Batch{Session: sess, Model: "m", Members: []reduce.ID{id}, Weights: []float32{1}, Sum: gradFor(durableN, id.Client, id.Seq)}); err != nil {
		return fmt.Errorf("forward: %w", err)
	}
	return nil
}

// refusesApplied checks that p refuses each of ids as a duplicate:
// applied before (a restart).
func (e *durableEnv) refusesApplied(p *Primary, ids ...reduce.ID) {
	e.t.Helper()
	ctx := context.Background()
	sess, _, err := p.Attach(ctx, Secondary{ID: "check"})
	if err != nil {
		e.t.Fatal(err)
	}
	defer p.Detach(sess)
	for _, id := range ids {
		if _, _, err := p.Admit(ctx, sess, "m", id, 0, 0); !errors.Is(err, errs.ErrExists) {
			e.t.Fatalf("%v, applied before: admit says %v", id, err)
		}
	}
}

// seqs is the ids of client ck's seqs from..to.
func seqs(from, to uint64) []reduce.ID {
	var out []reduce.ID
	for s := from; s <= to; s++ {
		out = append(out, reduce.ID{Client: "ck", Seq: s})
	}
	return out
}

// checkReplay: the store's newest version equals a replay of seqs 1..n,
// one per step, with one uninterrupted optimizer.
func (e *durableEnv) checkReplay(n uint64) {
	e.t.Helper()
	var recs []applyRec
	for s := uint64(1); s <= n; s++ {
		recs = append(recs, applyRec{version: s + 1, members: []reduce.ID{{Client: "ck", Seq: s}}, weights: []float32{1}})
	}
	want := replay(e.t, e.init, e.mc, recs, func(id reduce.ID) *tensor.StateDict { return gradFor(durableN, id.Client, id.Seq) })
	got, err := e.st.Get(context.Background(), "m", 0)
	if err != nil {
		e.t.Fatal(err)
	}
	if got.Version != n+1 {
		e.t.Fatalf("newest version %d, want %d", got.Version, n+1)
	}
	for _, name := range []string{"fc.weight", "fc.bias"} {
		if !slices.Equal(f32(e.t, got.Tensors, name), f32(e.t, want, name)) {
			e.t.Fatalf("%s at version %d differs from an uninterrupted replay of %d steps", name, got.Version, n)
		}
	}
}

func (e *durableEnv) model(p *Primary) ModelStats {
	e.t.Helper()
	ms, ok := p.Stats().Models["m"]
	if !ok {
		e.t.Fatalf("model m is not registered after the restart (logs:\n%s)", e.logs.String())
	}
	return ms
}

// TestDurableRegistrationAndOptimizerResume: a restarted primary restores
// the registration by itself (pushes apply without Register), resumes the
// optimizer state (Adam moments, step count, schedule) of the newest
// version exactly, and remembers which gradients it applied.
func TestDurableRegistrationAndOptimizerResume(t *testing.T) {
	e := newDurableEnv(t)
	p := e.open(PrimaryConfig{})
	ctx := context.Background()
	if v, steps, err := p.Register(ctx, e.mc); err != nil || v != 1 || steps != 0 {
		t.Fatalf("register: version %d steps %d err %v", v, steps, err)
	}
	e.steps(p, 1, 3)

	p = e.restart(PrimaryConfig{})
	if ms := e.model(p); ms.Version != 4 || ms.OptimizerSteps != 3 || ms.StateError != "" {
		t.Fatalf("restored model: %+v", ms)
	}
	e.steps(p, 4, 6) // no Register
	e.checkReplay(6)
	// Registering again with the same config carries on; another config
	// is refused.
	if v, steps, err := p.Register(ctx, e.mc); err != nil || v != 7 || steps != 6 {
		t.Fatalf("re-register: version %d steps %d err %v", v, steps, err)
	}
	other := e.mc
	other.Optimizer.LR = 0.5
	if _, _, err := p.Register(ctx, other); !errors.Is(err, errs.ErrExists) {
		t.Fatalf("re-register with another config: %v", err)
	}

	// The ledger survived: a retry of an applied gradient is refused.
	p = e.restart(PrimaryConfig{})
	sess, _, _ := p.Attach(ctx, Secondary{ID: "y"})
	if _, _, err := p.Admit(ctx, sess, "m", reduce.ID{Client: "ck", Seq: 2}, 0, 0); !errors.Is(err, errs.ErrExists) {
		t.Fatalf("admit of a gradient applied before the restart: %v", err)
	}
	p.Detach(sess)
	if strings.Contains(e.logs.String(), "level=ERROR") {
		t.Fatalf("clean restarts logged an error:\n%s", e.logs.String())
	}
	// Only the newest version's state is kept.
	ents, _ := os.ReadDir(filepath.Join(e.stateDir, "m"))
	var states []string
	for _, en := range ents {
		if _, ok := parseStateFileName(en.Name()); ok {
			states = append(states, en.Name())
		}
	}
	if !slices.Equal(states, []string{stateFileName(7)}) {
		t.Fatalf("state files %v, want only version 7's", states)
	}
}

// TestDurableRegistrationWithoutSteps: a registration that never stepped
// is restored with a fresh optimizer and no error.
func TestDurableRegistrationWithoutSteps(t *testing.T) {
	e := newDurableEnv(t)
	p := e.open(PrimaryConfig{})
	if _, _, err := p.Register(context.Background(), e.mc); err != nil {
		t.Fatal(err)
	}
	p = e.restart(PrimaryConfig{})
	if ms := e.model(p); ms.Version != 1 || ms.OptimizerSteps != 0 || ms.StateError != "" {
		t.Fatalf("restored model: %+v", ms)
	}
	e.steps(p, 1, 2)
	e.checkReplay(2)
}

// failingStore fails the model's pushes from version failAt on, as a
// process killed after the step was persisted and before the version was
// published would have left it.
type failingStore struct {
	store.Store
	failAt uint64
}

func (f *failingStore) Push(ctx context.Context, req store.PushRequest) (store.Info, error) {
	if req.Name == "m" && req.Version >= f.failAt {
		return store.Info{}, errors.New("injected: killed before the publish")
	}
	return f.Store.Push(ctx, req)
}

// TestDurableStepPersistedButNotPublished: a step whose journal record and
// optimizer state reached the disk but whose version never published is
// undone at restore: the state of the newest published version is
// restored, and the step's gradient is not counted applied (a retry is
// accepted and applied once).
func TestDurableStepPersistedButNotPublished(t *testing.T) {
	e := newDurableEnv(t)
	p := e.open(PrimaryConfig{})
	ctx := context.Background()
	if _, _, err := p.Register(ctx, e.mc); err != nil {
		t.Fatal(err)
	}
	e.steps(p, 1, 3)
	p.cfg.Store = &failingStore{Store: e.st, failAt: 5}
	sess, _, _ := p.Attach(ctx, Secondary{ID: "x"})
	id := reduce.ID{Client: "ck", Seq: 4}
	if _, _, err := p.Admit(ctx, sess, "m", id, 0, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Forward(ctx, Batch{Session: sess, Model: "m", Members: []reduce.ID{id}, Weights: []float32{1}, Sum: gradFor(durableN, "ck", 4)}); err == nil {
		t.Fatal("the injected publish failure was not reported")
	}
	// The model takes no more steps: a gradient is refused at admission
	// (Unavailable), not acknowledged to be lost at its forward.
	if _, _, err := p.Admit(ctx, sess, "m", reduce.ID{Client: "ck", Seq: 9}, 0, 0); !errors.Is(err, errs.ErrUnavailable) {
		t.Fatalf("admission to a model that stopped: %v, want Unavailable", err)
	}
	if _, err := os.Stat(filepath.Join(e.stateDir, "m", stateFileName(5))); err != nil {
		t.Fatalf("the unpublished step's state was not written before the publish: %v", err)
	}
	steps, _ := ReadJournal(e.stateDir, "m")
	if len(steps) != 4 || steps[3].Version != 5 {
		t.Fatalf("journal before the restart: %+v", steps)
	}

	p = e.restart(PrimaryConfig{})
	if ms := e.model(p); ms.Version != 4 || ms.OptimizerSteps != 3 || ms.StateError != "" {
		t.Fatalf("restored model: %+v", ms)
	}
	if steps, _ := ReadJournal(e.stateDir, "m"); len(steps) != 3 || steps[2].Version != 4 {
		t.Fatalf("journal after the restart still holds the unpublished step: %+v", steps)
	}
	if _, err := os.Stat(filepath.Join(e.stateDir, "m", stateFileName(5))); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the unpublished step's state is still there: %v", err)
	}
	e.steps(p, 4, 5) // seq 4 again: it was never applied
	e.checkReplay(5)
}

// TestDurableLostStateIsReported: when the newest version's optimizer
// state is gone, the registration is restored with a fresh optimizer, the
// loss is logged at ERROR and shown in the model's stats, and it stays
// shown after later restarts.
func TestDurableLostStateIsReported(t *testing.T) {
	e := steppedEnv(t, 3)
	if err := os.Remove(filepath.Join(e.stateDir, "m", stateFileName(4))); err != nil {
		t.Fatal(err)
	}
	e.openStore()
	p := e.open(PrimaryConfig{})
	ms := e.model(p)
	if !strings.Contains(ms.StateError, "no optimizer state for version 4") || ms.OptimizerSteps != 0 {
		t.Fatalf("a lost optimizer state is not reported: %+v", ms)
	}
	if !strings.Contains(e.logs.String(), "level=ERROR") || !strings.Contains(e.logs.String(), "no optimizer state for version 4") {
		t.Fatalf("no ERROR log of the lost state:\n%s", e.logs.String())
	}
	e.steps(p, 4, 4) // it still trains
	p = e.restart(PrimaryConfig{})
	if ms := e.model(p); !strings.Contains(ms.StateError, "earlier: no optimizer state for version 4") || ms.OptimizerSteps != 1 {
		t.Fatalf("after a further restart the earlier loss is not reported: %+v", ms)
	}
}

// TestDurableTornJournalTail: a journal ending in half a frame (a kill
// mid-append) is cut back to its last whole record and appended to again.
func TestDurableTornJournalTail(t *testing.T) {
	e := steppedEnv(t, 2)
	jp := filepath.Join(e.stateDir, "m", journalName)
	before, _ := os.Stat(jp)
	f, _ := os.OpenFile(jp, os.O_APPEND|os.O_WRONLY, 0)
	frame := appendFrame(nil, []byte(`{"v":4,"steps":3,"m":[["ck",3]],"w":[1]}`))
	f.Write(frame[:len(frame)-5])
	f.Close()
	e.openStore()
	p := e.open(PrimaryConfig{})
	if ms := e.model(p); ms.Version != 3 || ms.StateError != "" {
		t.Fatalf("restored model: %+v", ms)
	}
	if after, _ := os.Stat(jp); after.Size() != before.Size() {
		t.Fatalf("journal is %d bytes after the restore, %d before the torn append", after.Size(), before.Size())
	}
	e.steps(p, 3, 4)
	p = e.restart(PrimaryConfig{})
	if steps, err := ReadJournal(e.stateDir, "m"); err != nil || len(steps) != 4 {
		t.Fatalf("journal after appending past the cut: %d records, %v", len(steps), err)
	}
	e.checkReplay(4)
}

// TestDurableJournalCompaction: a journal past its threshold is replaced
// by a snapshot of the ledger; the restored ledger still refuses applied
// gradients.
func TestDurableJournalCompaction(t *testing.T) {
	e := newDurableEnv(t)
	cfg := PrimaryConfig{JournalCompactBytes: 300, LedgerWindow: 4}
	p := e.open(cfg)
	ctx := context.Background()
	if _, _, err := p.Register(ctx, e.mc); err != nil {
		t.Fatal(err)
	}
	e.steps(p, 1, 12)
	steps, err := ReadJournal(e.stateDir, "m")
	if err != nil || len(steps) == 0 || !steps[0].Snapshot || len(steps) > 6 {
		t.Fatalf("journal after 12 steps with a 300-byte threshold: %+v, %v", steps, err)
	}
	p = e.restart(cfg)
	e.refusesApplied(p, seqs(1, 12)...)
	e.steps(p, 13, 14)
	e.checkReplay(14)
}

// TestDurableJournalCompactionWaitsForTheJournalToDouble: a ledger
// snapshot bigger than the threshold is not rewritten at every step: the
// journal is compacted again only once it has doubled past the snapshot
// it starts with, also across restarts (which read that size back).
// Compacting every step would write the whole ledger, and ship it to a
// cluster's standbys, per step.
func TestDurableJournalCompactionWaitsForTheJournalToDouble(t *testing.T) {
	e := newDurableEnv(t)
	cfg := PrimaryConfig{JournalCompactBytes: 100, LedgerWindow: 64}
	p := e.open(cfg)
	if _, _, err := p.Register(context.Background(), e.mc); err != nil {
		t.Fatal(err)
	}
	e.steps(p, 1, 30)
	compactions := 0
	for s := uint64(31); s <= 60; s++ {
		e.steps(p, s, s)
		steps, err := ReadJournal(e.stateDir, "m")
		if err != nil || len(steps) == 0 || !steps[0].Snapshot {
			t.Fatalf("journal after step %d: %+v, %v", s, steps, err)
		}
		if len(steps) == 1 {
			compactions++
		}
		p = e.restart(cfg)
	}
	// The ledger of 30–60 seqs is a snapshot of 130–250 bytes, a step
	// record ~50: compacted every 3–6 steps (every step with the plain
	// 100-byte threshold).
	if compactions == 0 || compactions > 12 {
		t.Fatalf("%d of 30 steps compacted the journal", compactions)
	}
	e.checkReplay(60)
}

// TestDurableOptimizerStatesReuseTheirFiles: a step's optimizer state
// is written into the file of a state dropped before it (the pool under
// the state directory), never over one a restore needs: every state on
// disk verifies, a restart amid a full pool resumes exactly, and the
// pool is no model's registration.
func TestDurableOptimizerStatesReuseTheirFiles(t *testing.T) {
	e := newDurableEnv(t)
	p := e.open(PrimaryConfig{})
	if _, _, err := p.Register(context.Background(), e.mc); err != nil {
		t.Fatal(err)
	}
	inode := func(v uint64) uint64 {
		t.Helper()
		path := filepath.Join(e.stateDir, "m", stateFileName(v))
		if err := VerifyStateFile(path); err != nil {
			t.Fatalf("the state of version %d: %v", v, err)
		}
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		return fi.Sys().(*syscall.Stat_t).Ino
	}
	seen, reused := map[uint64]bool{}, 0
	for s := uint64(1); s <= 12; s++ {
		e.steps(p, s, s)
		ino := inode(s + 1)
		if seen[ino] {
			reused++
		}
		seen[ino] = true
		if _, err := os.Stat(filepath.Join(e.stateDir, "m", stateFileName(s))); !os.IsNotExist(err) {
			t.Fatalf("after step %d the state of version %d is still there (%v)", s, s, err)
		}
		if s == 6 {
			p = e.restart(PrimaryConfig{})
			if len(p.Stats().Models) != 1 {
				t.Fatalf("after a restart: models %v", p.Stats().Models)
			}
		}
	}
	if reused < 9 {
		t.Fatalf("12 steps wrote their states into %d distinct files, %d of them reused", len(seen), reused)
	}
	p = e.restart(PrimaryConfig{})
	e.steps(p, 13, 14)
	e.checkReplay(14)
}

// TestDurableStateDirLocked: a second primary cannot open a state
// directory in use.
func TestDurableStateDirLocked(t *testing.T) {
	e := newDurableEnv(t)
	e.open(PrimaryConfig{})
	if _, err := NewPrimary(PrimaryConfig{Store: e.st, StateDir: e.stateDir}); err == nil || !strings.Contains(err.Error(), "in use") {
		t.Fatalf("second primary on the same state dir: %v", err)
	}
}

// VerifyStateFile (a standby's scrub of its copy) passes a state file as
// written and fails one whose bytes, or name, no longer match it.
func TestVerifyStateFile(t *testing.T) {
	e := steppedEnv(t, 2)
	path := filepath.Join(e.stateDir, "m", stateFileName(3))
	if err := VerifyStateFile(path); err != nil {
		t.Fatalf("the state as written: %v", err)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	flipped := bytes.Clone(raw)
	flipped[len(flipped)-1] ^= 0x40 // in the last tensor's data
	for _, tc := range []struct {
		path, want string
	}{
		{write(stateFileName(3), flipped), "checksum"},
		{write(stateFileName(4), raw), "says model.version"},
		{write("optim-v3.safetensors", raw), "not an optimizer state file name"},
	} {
		if err := VerifyStateFile(tc.path); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("VerifyStateFile(%s): %v, want an error saying %q", filepath.Base(tc.path), err, tc.want)
		}
	}
}

// A remote secondary's Admit is refused for a client id over 128 bytes:
// the ledger (restored after a restart) and the journal never hold it.
func TestAdmitRefusesALongClientID(t *testing.T) {
	e := newDurableEnv(t)
	p, sess := e.registered(PrimaryConfig{})
	ctx := context.Background()
	defer p.Detach(sess)
	long := reduce.ID{Client: strings.Repeat("C", reduce.MaxClientIDBytes+1), Seq: 1}
	if _, _, err := p.Admit(ctx, sess, "m", long, 0, 0); !errors.Is(err, errs.ErrInvalid) || !strings.Contains(err.Error(), "client id") {
		t.Fatalf("admit with a %d-byte client id: %v, want ErrInvalid naming the client id", len(long.Client), err)
	}
	e.steps(p, 1, 1) // a short id is admitted and applied
}

// TestDurableJournalReopenFailureStopsTheModel: when the compacted
// journal is in place but cannot be opened to append to (a descriptor
// limit, say), the handle on the journal it replaced is closed: the next
// step fails and the model stops, loudly. Kept, that handle took the
// next records into an unlinked file no restart reads, and their
// versions were published: a restart forgot their gradients.
func TestDurableJournalReopenFailureStopsTheModel(t *testing.T) {
	e := newDurableEnv(t)
	cfg := PrimaryConfig{JournalCompactBytes: 300, LedgerWindow: 4}
	p := e.open(cfg)
	ctx := context.Background()
	if _, _, err := p.Register(ctx, e.mc); err != nil {
		t.Fatal(err)
	}
	failed := 0
	open := openJournal
	openJournal = func(string) (*os.File, error) { failed++; return nil, fmt.Errorf("too many open files") }
	defer func() { openJournal = open }()
	sess, _, err := p.Attach(ctx, Secondary{ID: "x"})
	if err != nil {
		t.Fatal(err)
	}
	var last uint64 // the last seq whose step published
	for s := uint64(1); s <= 20; s++ {
		if err := step(ctx, p, sess, reduce.ID{Client: "ck", Seq: s}); err != nil {
			break // the model stopped
		}
		last = s
	}
	p.Detach(sess)
	openJournal = open
	if failed == 0 || last == 20 {
		t.Fatalf("compactions that could not reopen the journal: %d; steps published after: through seq %d of 20", failed, last)
	}
	p = e.restart(cfg)
	if ms := e.model(p); ms.StateError != "" || ms.Version != last+1 {
		t.Fatalf("restarted after the failed reopen: v%d, state error %q (want v%d, none)", ms.Version, ms.StateError, last+1)
	}
	e.refusesApplied(p, seqs(1, last)...)
	e.checkReplay(last)
}

// TestDurableJournalDamageIsKeptAside: a journal damaged before its end
// (a record's checksum fails, or a length no record may have, with more
// records after it) is not a torn tail: a restart says so in the model's
// state error and keeps the journal aside as it was before cutting it
// back. It was cut back silently, the records after the damage gone.
func TestDurableJournalDamageIsKeptAside(t *testing.T) {
	for _, tc := range []struct {
		name   string
		damage func(t *testing.T, b []byte) []byte
	}{
		{"checksum", func(t *testing.T, b []byte) []byte { b[9] ^= 0xff; return b }}, // the first record's payload
		{"length", func(t *testing.T, b []byte) []byte {
			binary.LittleEndian.PutUint32(b[:4], journalRecordMax+1) // then its bytes, and more
			return append(b, make([]byte, journalRecordMax+1)...)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			old := journalRecordMax
			journalRecordMax = 4 << 10
			defer func() { journalRecordMax = old }()
			e := steppedEnv(t, 3)
			jpath := filepath.Join(e.stateDir, "m", journalName)
			b, err := os.ReadFile(jpath)
			if err != nil {
				t.Fatal(err)
			}
			damaged := tc.damage(t, b)
			if err := os.WriteFile(jpath, damaged, 0o644); err != nil {
				t.Fatal(err)
			}
			e.openStore()
			p := e.open(PrimaryConfig{})
			if ms := e.model(p); !strings.Contains(ms.StateError, "journal damaged at byte 0") {
				t.Fatalf("state error after a damaged journal: %q", ms.StateError)
			}
			aside, err := os.ReadFile(jpath + ".damaged")
			if err != nil || !bytes.Equal(aside, damaged) {
				t.Fatalf("the damaged journal kept aside: %d bytes, %v (want the %d it had)", len(aside), err, len(damaged))
			}
		})
	}
}

// TestDurableCompactionNeverWritesAnUnreadableSnapshot: a ledger snapshot
// longer than a journal record may be is not written (a restart read
// such a record as a torn tail and cut the journal to nothing, every
// applied gradient forgotten); the journal keeps its records, and a
// restart refuses every gradient applied.
func TestDurableCompactionNeverWritesAnUnreadableSnapshot(t *testing.T) {
	old := journalRecordMax
	journalRecordMax = 600
	defer func() { journalRecordMax = old }()
	e := newDurableEnv(t)
	cfg := PrimaryConfig{JournalCompactBytes: 100, LedgerWindow: 64}
	p, sess := e.registered(cfg)
	ctx := context.Background()
	const n = 40 // one client each: the ledger's snapshot outgrows 600 bytes
	var ids []reduce.ID
	for s := uint64(1); s <= n; s++ {
		ids = append(ids, reduce.ID{Client: fmt.Sprintf("client-%03d", s), Seq: 1})
		if err := step(ctx, p, sess, ids[s-1]); err != nil {
			t.Fatal(err)
		}
	}
	p.Detach(sess)
	if !strings.Contains(e.logs.String(), "more than a journal record may be") {
		t.Fatalf("no compaction was refused (logs:\n%s)", e.logs.String())
	}
	p = e.restart(cfg)
	if ms := e.model(p); ms.StateError != "" || ms.Version != n+1 {
		t.Fatalf("restarted: v%d, state error %q", ms.Version, ms.StateError)
	}
	e.refusesApplied(p, ids...)
}

// A client idle past LedgerForgetAfter, with nothing pending, is
// forgotten by the live ledger and by the snapshot a compaction writes,
// so the ledger does not grow with every client id ever seen; one a
// restart restores is idle from the restart on, not from its last step,
// so a retry just after a restart is still refused as applied.
func TestDurableLedgerForgetsIdleClients(t *testing.T) {
	e := newDurableEnv(t)
	clk := &fakeClock{now: time.Unix(1_000_000, 0)}
	cfg := PrimaryConfig{Clock: clk, LedgerForgetAfter: time.Hour, JournalCompactBytes: 300}
	p, sess := e.registered(cfg)
	ctx := context.Background()
	old := []reduce.ID{{Client: "old", Seq: 1}, {Client: "old", Seq: 2}}
	for _, id := range old {
		if err := step(ctx, p, sess, id); err != nil {
			t.Fatal(err)
		}
	}
	p.Detach(sess)
	clients := func(p *Primary) int {
		m, err := p.model("m")
		if err != nil {
			t.Fatal(err)
		}
		m.mu.Lock()
		defer m.mu.Unlock()
		return m.ledger.Clients()
	}

	// Restarted at once, then 59 minutes of other clients' steps: "old"
	// was idle for 59 minutes since the restart, so it is remembered.
	p = e.restart(cfg)
	clk.Advance(59 * time.Minute)
	e.steps(p, 1, 3)
	e.refusesApplied(p, old...)
	if n := clients(p); n != 2 {
		t.Fatalf("%d clients remembered, want 2 (old, ck)", n)
	}

	// Two hours on, "old" is forgotten: live, and in the snapshot a
	// compaction writes (a restart does not bring it back).
	clk.Advance(2 * time.Hour)
	e.steps(p, 4, 12)
	if n := clients(p); n != 1 {
		t.Fatalf("%d clients remembered two hours on, want 1 (ck)", n)
	}
	p = e.restart(cfg)
	if n := clients(p); n != 1 {
		t.Fatalf("after a restart, %d clients restored, want 1 (ck)", n)
	}
	e.refusesApplied(p, seqs(1, 12)...)
}

// A model deleted and pushed again under the same name while the reducer
// is down (or before a kill -9) leaves a journal running past the store's
// newest version by more steps than a crash can leave unpublished: the
// restart says the model was replaced (StateError, logged at ERROR) rather
// than cutting the journal as routine and calling a fresh optimizer exact.
func TestDurableRestoreSaysAReplacedModelIsNotExact(t *testing.T) {
	e := steppedEnv(t, 3) // versions 2..4 published by the reducer
	e.openStore()
	ctx := context.Background()
	if err := e.st.(store.Deleter).Delete(ctx, "m"); err != nil {
		t.Fatal(err)
	}
	pushModel(t, e.st, "m", e.init) // another model of that name, at version 1
	e.st.Close()
	e.st = nil
	p := e.restart(PrimaryConfig{})
	ms := e.model(p)
	if ms.Version != 1 || !strings.Contains(ms.StateError, "replaced") {
		t.Fatalf("restored over a replaced model: version %d, state error %q; want version 1 and an error saying it was replaced", ms.Version, ms.StateError)
	}
}
