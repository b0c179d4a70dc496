package replica

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/rlhub/rlhub/internal/hub"
	"github.com/rlhub/rlhub/internal/optim"
	"github.com/rlhub/rlhub/internal/reducer"
	"github.com/rlhub/rlhub/internal/safetensors"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/store/storerpc"
	"github.com/rlhub/rlhub/internal/tensor"
	"github.com/rlhub/rlhub/internal/testkit"
	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// The reducer's and the ARS coordinator's state reaches a standby by the
// paths their writers name (Source.Changed), not by walking ars/ and
// reducer/: a real hub (its reducer and ARS coordinator writing under its
// --data, gRPC and the data plane on 127.0.0.1) replicating through a
// Source whose safety-net walk never comes due, to a real Follower.

// namedPrimary is an in-process hub replicating to one follower, "s1",
// acks all.
type namedPrimary struct {
	dir  string
	src  *Source
	hub  *hub.Hub
	addr string
	d    *dpFollower
}

func startNamedPrimary(t *testing.T, ctx context.Context) *namedPrimary {
	t.Helper()
	return startNamedPrimaryScan(t, ctx, 0)
}

// startNamedPrimaryScan is startNamedPrimary with the Source's scan
// interval (SourceConfig.Interval; 0: its default).
func startNamedPrimaryScan(t *testing.T, ctx context.Context, scan time.Duration) *namedPrimary {
	t.Helper()
	p := &namedPrimary{dir: t.TempDir()}
	var err error
	p.src, err = NewSource(SourceConfig{DataDir: p.dir, Epoch: 5, Acks: AcksAll, AckTimeout: time.Minute, Logger: testkit.Logger(),
		Interval: scan, Standbys: func(context.Context) ([]string, error) { return []string{"s1"}, nil }})
	if err != nil {
		t.Fatal(err)
	}
	// The whole walk is the safety net: here it never comes due, so what
	// reaches the follower after the first snapshot was named.
	p.src.fullEvery = 24 * time.Hour
	p.hub, err = hub.New(hub.Config{Listen: "127.0.0.1:0", DataDir: p.dir, Logger: testkit.Logger(),
		Reducer:      reducer.Config{BatchSize: 1},
		WrapStore:    func(s store.Store) store.Store { return &Fenced{Store: s, Epoch: 5, Source: p.src} },
		Replication:  p.src,
		StateChanged: p.src.Changed, StateAppended: p.src.Appended})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.hub.Start(); err != nil {
		p.hub.Close()
		t.Fatal(err)
	}
	p.addr = p.hub.Addr().String()
	p.d = newDPFollower(t, "", TransportAuto)
	p.d.follow(t, ctx, p.addr)
	t.Cleanup(func() { p.hub.Close() }) // before the follower's cleanup (LIFO): its stream ends
	testkit.Eventually(t, time.Minute, "the follower's full sync", p.d.f.Synced)
	return p
}

// sameFile fails unless the follower holds rel with the primary's bytes.
func (p *namedPrimary) sameFile(t *testing.T, rel string) {
	t.Helper()
	want, err := os.ReadFile(filepath.Join(p.dir, rel))
	if err != nil {
		t.Fatalf("the primary's %s: %v", rel, err)
	}
	got, err := os.ReadFile(filepath.Join(p.d.dir, rel))
	if err != nil {
		t.Fatalf("the standby's %s: %v", rel, err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("the standby's %s: %d bytes, not the primary's %d (or different bytes)", rel, len(got), len(want))
	}
}

// step registers model (first call) and pushes one gradient; it returns
// once the step's version, want, is acknowledged (visible to readers:
// every standby applied the unit carrying it).
func (p *namedPrimary) step(t *testing.T, ctx context.Context, sc *storerpc.Client, rc *reducer.Client, model string, want uint64) {
	t.Helper()
	grad, _ := tensor.NewStateDict(tensor.FromFloat32s("w", []int64{4}, []float32{1, 1, 1, 1}))
	if _, err := rc.PushGrad(ctx, model, want-1, grad); err != nil {
		t.Fatalf("push a gradient on v%d: %v", want-1, err)
	}
	testkit.Eventually(t, time.Minute, "the step's version acknowledged", func() bool {
		s, err := sc.Get(ctx, model, 0)
		return err == nil && s.Version >= want
	})
}

func newNamedClients(t *testing.T, ctx context.Context, p *namedPrimary, model string) (*storerpc.Client, *reducer.Client) {
	t.Helper()
	sc, err := storerpc.NewClient(storerpc.ClientConfig{Addr: p.addr})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sc.Close() })
	sd, _ := tensor.NewStateDict(tensor.FromFloat32s("w", []int64{4}, []float32{0, 0, 0, 0}))
	blob, err := safetensors.Encode(sd, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sc.Push(ctx, store.PushRequest{Name: model, Version: 1, Expect: 0, Blob: blob}); err != nil {
		t.Fatal(err)
	}
	rc, err := reducer.NewClient(reducer.ClientConfig{Hub: p.addr, ClientID: "a"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rc.Close() })
	if _, _, err := rc.Register(ctx, reducer.ModelConfig{Model: model, Optimizer: optim.Config{Kind: optim.Adam, LR: 0.01}}); err != nil {
		t.Fatal(err)
	}
	return sc, rc
}

// A reducer step's journal record and optimizer state are on the
// standby when the step's version is acknowledged (the unit that acks it
// carries them), an ARS run's state reaches it by name, a unit that
// changes no state stats nothing under ars/ and reducer/, and none walks
// a model's store directory (the store names its files too).
func TestNamedStateReachesTheFollower(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p := startNamedPrimary(t, ctx)
	const model = "named"
	sc, rc := newNamedClients(t, ctx, p, model)
	mdir := filepath.Join("reducer", store.ModelDir(model))

	p.step(t, ctx, sc, rc, model, 2)
	// Acknowledged: the standby holds the step's state, no waiting.
	if _, err := os.Stat(filepath.Join(p.d.dir, mdir, "optim-v00000000000000000002.safetensors")); err != nil {
		t.Fatalf("the standby lacks v2's optimizer state once v2 is acknowledged: %v", err)
	}
	steps, err := reducer.ReadJournal(filepath.Join(p.d.dir, "reducer"), model)
	if err != nil || len(steps) == 0 || steps[len(steps)-1].Version != 2 {
		t.Fatalf("the standby's journal once v2 is acknowledged: %v (%v), want it to end at v2", steps, err)
	}

	// An ARS run's state is written after its policy's push and reaches
	// the standby by name (StartRun waits for its acknowledgement).
	conn, err := grpc.NewClient(p.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	spec := &rlhubv1.ARSRunSpec{Env: "CartPole-v1", Seed: 1, Directions: 4, Top: 2, EvalEvery: 1 << 30, MaxIterations: 1000}
	run, err := rlhubv1.NewARSClient(conn).StartRun(ctx, &rlhubv1.ARSStartRunRequest{Spec: spec})
	if err != nil {
		t.Fatal(err)
	}
	state := filepath.Join("ars", run.RunId, "state.json")
	testkit.Eventually(t, time.Minute, "the run's state on the standby", func() bool {
		_, err := os.Stat(filepath.Join(p.d.dir, state))
		return err == nil
	})
	p.sameFile(t, state)
	p.sameFile(t, filepath.Join("ars", run.RunId, "progress.log"))
	p.sameFile(t, filepath.Join(mdir, "registration.json"))

	// v1's optimizer state (none: v1 was the seed) and the scan's units
	// are settled once the journal matches; then a unit that changes no
	// state walks nothing under ars/ and reducer/.
	testkit.Eventually(t, time.Minute, "the journal settled on the standby", func() bool {
		a, _ := os.ReadFile(filepath.Join(p.dir, mdir, "journal.log"))
		b, _ := os.ReadFile(filepath.Join(p.d.dir, mdir, "journal.log"))
		return len(a) > 0 && bytes.Equal(a, b)
	})
	walks, named := p.src.stateWalks.Load(), p.src.namedWalks.Load()
	if walks != 1 {
		t.Fatalf("%d whole walks of ars/ and reducer/, want 1 (the first snapshot's): the rest came by name", walks)
	}
	if named == 0 {
		t.Fatal("no named path was walked")
	}
	other := storeBlob(t, 3)
	if _, err := sc.Push(ctx, store.PushRequest{Name: "other", Version: 1, Expect: 0, Blob: other}); err != nil {
		t.Fatal(err)
	}
	p.d.same(t, "other", 1, other) // acknowledged: installed
	if w, n := p.src.stateWalks.Load(), p.src.namedWalks.Load(); w != walks || n != named {
		t.Fatalf("a unit with no state change walked ars/ and reducer/ whole %d times and %d named paths, want none", w-walks, n-named)
	}
	// The store names the files each commit writes (store.FileConfig.Changed):
	// no unit walked a model's directory.
	if n := p.src.modelDirWalks.Load(); n != 0 {
		t.Fatalf("units walked %d model directories of the store, want none: the store names its files", n)
	}
}

// A state file the reducer removes (the optimizer state of the version
// before the newest published one, removed when the step after it
// starts: publishDue) is removed on the standby by name.
func TestNamedRemovalReachesTheFollower(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p := startNamedPrimary(t, ctx)
	const model = "removed"
	sc, rc := newNamedClients(t, ctx, p, model)
	mdir := filepath.Join("reducer", store.ModelDir(model))
	v2 := filepath.Join(mdir, "optim-v00000000000000000002.safetensors")
	v3 := filepath.Join(mdir, "optim-v00000000000000000003.safetensors")

	p.step(t, ctx, sc, rc, model, 2)
	p.sameFile(t, v2)
	p.step(t, ctx, sc, rc, model, 3)
	p.sameFile(t, v3)
	p.step(t, ctx, sc, rc, model, 4) // its start marks v3 published: v2's state goes
	testkit.Eventually(t, time.Minute, "v2's optimizer state removed on the primary", func() bool {
		_, err := os.Stat(filepath.Join(p.dir, v2))
		return os.IsNotExist(err)
	})
	testkit.Eventually(t, time.Minute, "v2's optimizer state removed on the standby", func() bool {
		_, err := os.Stat(filepath.Join(p.d.dir, v2))
		return os.IsNotExist(err)
	})
	p.sameFile(t, v3)
	if w := p.src.stateWalks.Load(); w != 1 {
		t.Fatalf("%d whole walks of ars/ and reducer/, want 1 (the first snapshot's): the removal came by name", w)
	}
}

// A reducer registration is on the standby when Register returns: with
// the scan that ships unannounced state never due, only the unit Register
// waits for can carry it (before, Register returned once the model's
// claim was acknowledged and the registration it wrote after waited for
// the scan: a primary killed in between left a successor without it).
func TestRegistrationIsOnTheStandbyWhenRegisterReturns(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p := startNamedPrimaryScan(t, ctx, time.Hour)
	const model = "registered"
	sc, rc := newNamedClients(t, ctx, p, model) // returns once Register did
	mdir := filepath.Join("reducer", store.ModelDir(model))
	p.sameFile(t, filepath.Join(mdir, "registration.json"))
	p.sameFile(t, filepath.Join(mdir, "journal.log"))
	// A repeated Register (a client carrying on after a failover) waits
	// for the same acknowledgement and changes nothing.
	if v, steps, err := rc.Register(ctx, reducer.ModelConfig{Model: model, Optimizer: optim.Config{Kind: optim.Adam, LR: 0.01}}); err != nil || v != 1 || steps != 0 {
		t.Fatalf("register again: v%d, %d steps, %v; want v1, 0 steps", v, steps, err)
	}
	p.step(t, ctx, sc, rc, model, 2)
	p.sameFile(t, filepath.Join(mdir, "journal.log"))
}

// A deleted model's registration is off the standby when the Delete
// returns (the scan never due, as above): before, the reducer's drop was
// named but shipped only with the next unit, so a primary killed right
// after the Delete left a successor that had the registration again.
func TestDroppedRegistrationIsOffTheStandbyWhenDeleteReturns(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p := startNamedPrimaryScan(t, ctx, time.Hour)
	const model = "doomed"
	sc, rc := newNamedClients(t, ctx, p, model)
	p.step(t, ctx, sc, rc, model, 2)
	mdir := filepath.Join("reducer", store.ModelDir(model))
	p.sameFile(t, filepath.Join(mdir, "registration.json"))
	if err := sc.Delete(ctx, model); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(p.dir, mdir)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the primary's registration directory after the delete: %v, want it removed", err)
	}
	if _, err := os.Stat(filepath.Join(p.d.dir, mdir, "registration.json")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the standby's registration of the deleted model when the Delete returned: %v, want it removed", err)
	}
}

// An ARS run's state is on the standby when StartRun returns, and its
// stopped state when StopRun does (the scan never due, as above).
func TestARSRunStateIsOnTheStandbyWhenStartOrStopReturns(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p := startNamedPrimaryScan(t, ctx, time.Hour)
	conn, err := grpc.NewClient(p.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ars := rlhubv1.NewARSClient(conn)
	spec := &rlhubv1.ARSRunSpec{Env: "CartPole-v1", Seed: 1, Directions: 4, Top: 2, EvalEvery: 1 << 30, MaxIterations: 1000}
	run, err := ars.StartRun(ctx, &rlhubv1.ARSStartRunRequest{Spec: spec, RequestId: "r1"})
	if err != nil {
		t.Fatal(err)
	}
	state := filepath.Join("ars", run.RunId, "state.json")
	p.sameFile(t, state)
	p.sameFile(t, filepath.Join("ars", run.RunId, "progress.log"))
	before, _ := os.ReadFile(filepath.Join(p.dir, state))
	if _, err := ars.StopRun(ctx, &rlhubv1.ARSStopRunRequest{RunId: run.RunId}); err != nil {
		t.Fatal(err)
	}
	after, _ := os.ReadFile(filepath.Join(p.dir, state))
	if bytes.Equal(before, after) {
		t.Fatal("StopRun did not change the run's state file")
	}
	p.sameFile(t, state)
	// A retried StartRun (same request id) answers the same run.
	again, err := ars.StartRun(ctx, &rlhubv1.ARSStartRunRequest{Spec: spec, RequestId: "r1"})
	if err != nil || again.RunId != run.RunId {
		t.Fatalf("retried StartRun: %v, %v; want run %s", again, err, run.RunId)
	}
}

// storeBlob is a small valid version blob.
func storeBlob(t *testing.T, seed float32) []byte {
	t.Helper()
	sd, _ := tensor.NewStateDict(tensor.FromFloat32s("w", []int64{4}, []float32{seed, seed, seed, seed}))
	b, err := safetensors.Encode(sd, nil)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Changed keeps the paths under ars/ and reducer/, relative to the data
// directory however either was given, and those under store/ (the
// store's names) with the store's, and nothing else; past maxNamed it
// asks for the whole walk instead.
func TestChangedNamesOnlyStatePaths(t *testing.T) {
	abs := t.TempDir()
	t.Chdir(abs)
	for _, dataDir := range []string{abs, "data", "./data/"} {
		root := dataDir
		if !filepath.IsAbs(root) {
			root = filepath.Join(abs, root)
		}
		src, err := NewSource(SourceConfig{DataDir: dataDir, Logger: testkit.Logger()})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct {
			path  string
			want  string // "" ignored
			store bool   // kept with the store's (Source.dirty)
		}{
			{filepath.Join(root, "reducer", "m", "journal.log"), filepath.Join("reducer", "m", "journal.log"), false},
			{filepath.Join(dataDir, "ars", "run-1", "state.json"), filepath.Join("ars", "run-1", "state.json"), false},
			{filepath.Join(root, "reducer"), "reducer", false},
			{filepath.Join(root, "store", "m", "MANIFEST.json"), filepath.Join("store", "m", "MANIFEST.json"), true},
			{filepath.Join(root, "store"), "", false},
			{filepath.Join(root, "reducerx", "f"), "", false},
			{root, "", false},
			{filepath.Dir(root), "", false},
			{filepath.Join(abs, "elsewhere", "reducer", "f"), "", false},
		} {
			src.named, src.dirty = nil, nil
			src.Changed(c.path)
			kept, other := src.named, src.dirty
			if c.store {
				kept, other = other, kept
			}
			var got string
			for rel := range kept {
				got = rel
			}
			if len(kept) > 1 || got != c.want || len(other) != 0 {
				t.Errorf("DataDir %q: Changed(%q) named %v and %v for the store, want %q (store %v)", dataDir, c.path, src.named, src.dirty, c.want, c.store)
			}
		}
		src.dirty = nil
		for i := range maxNamed + 1 {
			src.Changed(filepath.Join(root, "store", "m", fmt.Sprint(i)))
		}
		if !src.dirtyAll || len(src.dirty) != 0 {
			t.Errorf("DataDir %q: %d store names past the bound: dirtyAll %v with %d kept, want the whole walk and none kept", dataDir, maxNamed+1, src.dirtyAll, len(src.dirty))
		}
		src.named = nil
		for i := range maxNamed + 1 {
			src.Changed(filepath.Join(root, "reducer", "m", fmt.Sprint(i)))
		}
		if !src.namedAll || len(src.named) != 0 {
			t.Errorf("DataDir %q: %d names past the bound: namedAll %v with %d kept, want the whole walk and none kept", dataDir, maxNamed+1, src.namedAll, len(src.named))
		}
	}
}

// A reducer step's journal record reaches a standby as an append (a G
// frame of the record's bytes, through a real follower over the data
// plane), and the standby's journal stays byte for byte the primary's
// step after step.
func TestJournalReachesTheFollowerAsAppends(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p := startNamedPrimary(t, ctx)
	const model = "appended"
	sc, rc := newNamedClients(t, ctx, p, model)
	journal := filepath.Join("reducer", store.ModelDir(model), "journal.log")
	for v := uint64(2); v <= 8; v++ {
		p.step(t, ctx, sc, rc, model, v)
		// Acknowledged: the unit that carried v's version carried its
		// journal record.
		steps, err := reducer.ReadJournal(filepath.Join(p.d.dir, "reducer"), model)
		if err != nil || len(steps) == 0 || steps[len(steps)-1].Version != v {
			t.Fatalf("the standby's journal once v%d is acknowledged: %v (%v)", v, steps, err)
		}
		p.sameFile(t, journal)
	}
	if n := p.src.appendsSent.Load(); n < 5 {
		t.Fatalf("%d journal records reached the standby as appends, want at least 5 of 7 steps", n)
	}
	// What the appends shipped is less than the journal holds (every
	// record but the first's, at most).
	fi, err := os.Stat(filepath.Join(p.dir, journal))
	if err != nil {
		t.Fatal(err)
	}
	if n := p.src.cfg.Shipped.Appended.Load(); n == 0 || n >= uint64(fi.Size()) {
		t.Fatalf("the appends shipped %d bytes of a %d-byte journal", n, fi.Size())
	}
}
