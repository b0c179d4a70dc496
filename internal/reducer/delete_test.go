package reducer_test

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/errs/grpcerr"
	"github.com/rlhub/rlhub/internal/optim"
	"github.com/rlhub/rlhub/internal/reduce"
	"github.com/rlhub/rlhub/internal/reducer"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/store/storerpc"
	"github.com/rlhub/rlhub/internal/tensor"
	"github.com/rlhub/rlhub/internal/testkit"
)

// TestDeletedModelIsRegisteredAgainWithoutARestart: a registered model
// deleted by an administrator (`rlhub model rm`) kept its registration in
// the running hub: pushed again from version 1, its Register with the
// same config returned the deleted model's registration (its version and
// optimizer steps) and its next step was refused (the reducer's publishes
// land only on a model it still owns), so the model stopped; with another
// config Register failed ALREADY_EXISTS; `reducer stats` still listed it.
// Only a restart dropped it. The reducer now drops a registration when its
// model is deleted, on disk too: a new Register starts afresh, with any
// config, its steps land on the new model, and a restart restores the new
// registration.
func TestDeletedModelIsRegisteredAgainWithoutARestart(t *testing.T) {
	const n = 64
	data, args, hubProc, ctx := startHubOnM(t, n, nil)
	sgd := sgdOnM()
	adam := reducer.ModelConfig{Model: "m", Reduction: reduce.Sum, Optimizer: optim.Config{Kind: optim.Adam, LR: 0.01}}
	regDir := filepath.Join(data, "reducer", store.ModelDir("m"))

	cl := reducerClient(t, hubProc.Addr(), "g")
	sc := storeClient(t, hubProc.Addr())
	steps := &gradSteps{t: t, ctx: ctx, hub: hubProc, cl: cl, sc: sc, n: n}
	// deleteAndPush deletes m and pushes a fresh version 1 as another
	// writer; it returns the weights pushed.
	deleteAndPush := func(fill string) *tensor.StateDict {
		t.Helper()
		if err := sc.Delete(ctx, "m"); err != nil {
			t.Fatal(err)
		}
		st, err := cl.HubStats(ctx, "")
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := st.Models["m"]; ok {
			t.Errorf("reducer stats after the delete list the deleted model's registration: %+v", st.Models["m"])
		}
		if _, err := os.Stat(regDir); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the deleted model's registration on disk after the delete: %v, want its directory removed", err)
		}
		w := gradFor(n, fill, 1)
		if _, err := sc.Push(ctx, store.PushRequest{Name: "m", Version: 1, Blob: blobOf(t, w)}); err != nil {
			t.Fatal(err)
		}
		return w
	}
	register := func(what string, mc reducer.ModelConfig) {
		t.Helper()
		version, steps, err := cl.Register(ctx, mc)
		if err != nil || version != 1 || steps != 0 {
			t.Fatalf("%s: version %d, steps %d, %v; want version 1 of the new model and a fresh optimizer", what, version, steps, err)
		}
	}

	if _, _, err := cl.Register(ctx, sgd); err != nil {
		t.Fatal(err)
	}
	steps.step("the first registration", 1, 0)
	steps.step("the first registration", 2, 0)

	// Deleted, pushed again, registered again with the same config.
	w := deleteAndPush("second life")
	register("register again, same config", sgd)
	got := steps.step("the second registration", 1, 0)
	g := gradFor(n, "g", steps.seq)
	for _, tt := range w.Tensors() {
		name := tt.Name
		wf, gf, nf := f32s(t, w, name), f32s(t, g, name), f32s(t, got, name)
		for i := range nf {
			// Within rounding (the kernel may fuse the multiply-add): the
			// deleted model's weights are nowhere near.
			if want := wf[i] - float32(0.1)*gf[i]; math.Abs(float64(nf[i]-want)) > 1e-6 {
				t.Fatalf("%s[%d] after the new registration's first step: %v, want %v (the new model's weights minus one SGD step)", name, i, nf[i], want)
			}
		}
	}

	// Deleted, pushed again, registered again with another config.
	deleteAndPush("third life")
	register("register again, another config", adam)
	steps.step("the third registration", 1, 0)
	steps.step("the third registration", 2, 0)
	raw, err := os.ReadFile(filepath.Join(regDir, "registration.json"))
	if err != nil {
		t.Fatal(err)
	}
	var reg struct {
		Config       reducer.ModelConfig `json:"config"`
		StartVersion uint64              `json:"start_version"`
	}
	if err := json.Unmarshal(raw, &reg); err != nil {
		t.Fatal(err)
	}
	if reg.Config.Optimizer.Kind != optim.Adam || reg.StartVersion != 1 {
		t.Fatalf("registration on disk: %+v; want the Adam registration from version 1", reg)
	}

	// A restart restores the new registration: its steps go on.
	hubProc.Kill()
	hubProc = startProc(t, args...)
	cl2 := reducerClient(t, hubProc.Addr(), "g")
	version, restored, err := cl2.Register(ctx, adam)
	if err != nil || version != 3 || restored != 2 {
		t.Fatalf("register after the restart: version %d, steps %d, %v; want the restored registration at version 3, 2 steps", version, restored, err)
	}
	cl.Close()
	steps.hub, steps.cl, steps.sc = hubProc, cl2, storeClient(t, hubProc.Addr())
	steps.step("after the restart", 3, 0)
	hubProc.Kill()
}

func f32s(t *testing.T, sd *tensor.StateDict, name string) []float32 {
	t.Helper()
	tt := sd.Get(name)
	if tt == nil {
		t.Fatalf("no tensor %s", name)
	}
	f, err := tt.Float32s()
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// gradSteps pushes client cl's gradients (of gradFor(n, "g", seq)) to
// model "m" of the hub and waits for each step.
type gradSteps struct {
	t   *testing.T
	ctx context.Context
	hub *testkit.Proc
	cl  *reducer.Client
	sc  *storerpc.Client
	n   int
	seq uint64 // the last gradient's sequence number
	// via, when set, is the secondary (in a process of its own) every
	// push must be taken by.
	via *testkit.Proc
}

// step pushes the next gradient at version base of life (0: whichever m
// is) and waits for m's version base+1, whose weights it returns; what
// names the step in a failure.
func (s *gradSteps) step(what string, base, life uint64) *tensor.StateDict {
	s.t.Helper()
	s.seq++
	r, err := s.cl.PushLife(s.ctx, "m", base, life, s.seq, gradFor(s.n, "g", s.seq))
	if err != nil {
		s.t.Fatalf("%s: push at version %d (life %d): %v", what, base, life, err)
	}
	if s.via != nil && r.Addr != s.via.Addr() {
		s.t.Fatalf("%s: push at version %d taken by %q, want the secondary %q", what, base, r.Addr, s.via.Addr())
	}
	wctx, wcancel := context.WithTimeout(s.ctx, 20*time.Second)
	defer wcancel()
	snap, err := s.sc.WaitNewer(wctx, "m", base)
	if err != nil || snap.Version != base+1 {
		st, _ := s.cl.HubStats(s.ctx, "")
		out := s.hub.Output()
		if s.via != nil {
			out += "\nsecondary's:\n" + s.via.Output()
		}
		s.t.Fatalf("%s: the step from version %d: %v (stats %+v); output:\n%s", what, base, err, st.Models, out)
	}
	return snap.Tensors
}

// TestFailedRegistrationReleasesItsClaim: Register claims its model for
// the reducer before it writes the registration. One that failed after
// the claim (here the state directory cannot be written) kept the claim:
// the model's writer's pushes were refused PERMISSION_DENIED ("managed by
// reducer") for a reducer that does not reduce it, until the hub
// restarted. The failed registration now releases the claim.
func TestFailedRegistrationReleasesItsClaim(t *testing.T) {
	const n = 64
	data, _, hubProc, ctx := startHubOnM(t, n, nil)
	// The state directory is replaced by a file: the registration's files
	// cannot be made (the directory's lock stays held by the hub).
	stateDir := filepath.Join(data, "reducer")
	if err := os.Rename(stateDir, stateDir+".away"); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(stateDir, []byte("not a directory\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cl := reducerClient(t, hubProc.Addr(), "g")
	if _, _, err := cl.Register(ctx, reducer.ModelConfig{Model: "m", Optimizer: optim.Config{Kind: optim.SGD, LR: 0.1}}); err == nil {
		t.Fatal("register with a state directory that cannot be written succeeded")
	}
	sc := storeClient(t, hubProc.Addr())
	infos, err := sc.List(ctx)
	if err != nil || len(infos) != 1 || infos[0].Owner != "" {
		t.Errorf("the store after the failed registration: %+v, %v; want m with no owner", infos, err)
	}
	if _, err := sc.Push(ctx, store.PushRequest{Name: "m", Version: 2, Expect: 1, Blob: blobOf(t, gradFor(n, "w", 2))}); err != nil {
		t.Fatalf("the model's writer after a failed registration: %v; output:\n%s", err, hubProc.Output())
	}
	hubProc.Kill()
}

// TestDeletedModelPushedAgainWithAnotherLayout: a model deleted and pushed
// again with another architecture (other tensor shapes) is registered
// again and trained. The secondaries — two on the primary's hub and one on
// another hub reducing into it (tree reduction) — kept the deleted model's
// layout, read once per model name: every gradient of the new model was
// refused INVALID_ARGUMENT (its shapes are not the model's) until they
// restarted. A secondary now reads the layout again when a gradient does
// not match the one it holds, and takes the primary's new one.
func TestDeletedModelPushedAgainWithAnotherLayout(t *testing.T) {
	const n, n2 = 64, 16
	_, _, hubProc, ctx := startHubOnM(t, n, nil, "--reducer-secondaries", "2")
	leaf := startProc(t, "serve", "--role", "reducer", "--primary", hubProc.Addr(), "--listen", "127.0.0.1:0", "--data", "", "--reduce-batch-size", "1", "--max-wait", "1ms")
	mc := sgdOnM()
	cl := reducerClient(t, hubProc.Addr(), "g")
	if _, _, err := cl.Register(ctx, mc); err != nil {
		t.Fatal(err)
	}
	sc := storeClient(t, hubProc.Addr())
	var seq uint64
	version := uint64(1)
	// trainAll pushes gradients of a model of size n (each waits for its
	// step) until every secondary has taken one: the client picks one at
	// random for each push.
	trainAll := func(what string, size int) {
		t.Helper()
		took := map[string]bool{}
		for attempt := 0; len(took) < 3; attempt++ {
			if attempt == 100 {
				t.Fatalf("%s: after %d pushes only %v took one", what, attempt, took)
			}
			seq++
			r, err := cl.PushSeq(ctx, "m", version, seq, gradFor(size, "g", seq))
			if err != nil {
				t.Fatalf("%s: push: %v (secondaries that took one: %v)", what, err, took)
			}
			took[r.Addr+"/"+r.ID] = true
			wctx, wcancel := context.WithTimeout(ctx, 20*time.Second)
			snap, err := sc.WaitNewer(wctx, "m", version)
			wcancel()
			if err != nil || snap.Version != version+1 {
				t.Fatalf("%s: the step from version %d: %v; output:\n%s", what, version, err, hubProc.Output())
			}
			version++
		}
	}
	for {
		ss, err := cl.Secondaries(ctx)
		if err == nil && len(ss) == 3 {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("secondaries: %v, %v; want 3", ss, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	trainAll("the first model", n)

	if err := sc.Delete(ctx, "m"); err != nil {
		t.Fatal(err)
	}
	if _, err := sc.Push(ctx, store.PushRequest{Name: "m", Version: 1, Blob: blobOf(t, gradFor(n2, "second life", 1))}); err != nil {
		t.Fatal(err)
	}
	if v, steps, err := cl.Register(ctx, mc); err != nil || v != 1 || steps != 0 {
		t.Fatalf("register again: version %d, steps %d, %v", v, steps, err)
	}
	version = 1
	trainAll("the new model", n2)
	leaf.Kill()
	hubProc.Kill()
}

// TestGradientOfADeletedModelIsRefused: a gradient computed on version V
// of a model that was deleted since, pushed once the model pushed again
// is registered and also at V, was admitted and applied to the new model
// (nothing in a push said which model it was computed on). The push now
// names the life of the version it was computed on (BlobInfo.life), and
// the primary refuses one of another life than its registration's
// (FAILED_PRECONDITION, counted stale), changing nothing; the right life
// is applied.
func TestGradientOfADeletedModelIsRefused(t *testing.T) {
	const n = 64
	_, _, hubProc, ctx := startHubOnM(t, n, nil)
	defer hubProc.Kill()
	sgd := sgdOnM()
	cl := reducerClient(t, hubProc.Addr(), "g")
	sc := storeClient(t, hubProc.Addr())
	steps := &gradSteps{t: t, ctx: ctx, hub: hubProc, cl: cl, sc: sc, n: n}
	refusesADeletedLifesGradient(steps, sgd, "")
}

// refusesADeletedLifesGradient is TestGradientOfADeletedModelIsRefused's
// story, pushed through steps (via, when set, naming where the pushes
// go): m registered and stepped to version 3, deleted, pushed again to
// version 3 by another writer and registered again; a gradient of the
// deleted model's version 3 is refused FAILED_PRECONDITION, counted stale
// once (the hub's stats: the whole reducer's, other processes' secondaries
// merged), the new model unchanged; then one of the new life is applied.
func refusesADeletedLifesGradient(steps *gradSteps, sgd reducer.ModelConfig, via string) {
	t, ctx, cl, sc, n := steps.t, steps.ctx, steps.cl, steps.sc, steps.n
	t.Helper()
	counts := func() reducer.Stats {
		t.Helper()
		st, err := cl.HubStats(ctx, "")
		if err != nil {
			t.Fatal(err)
		}
		if len(st.Unreachable) > 0 {
			t.Fatalf("stats: unreachable secondaries %v", st.Unreachable)
		}
		return st
	}
	if _, _, err := cl.Register(ctx, sgd); err != nil {
		t.Fatal(err)
	}
	steps.step("the deleted model", 1, 0)
	steps.step("the deleted model", 2, 0)
	old, err := sc.Get(ctx, "m", 0)
	if err != nil || old.Version != 3 || old.Life() == 0 {
		t.Fatalf("pull: version %d, life %d, %v; want version 3 of a known life", old.Version, old.Life(), err)
	}

	// Deleted, pushed again up to version 3 by another writer, registered.
	if err := sc.Delete(ctx, "m"); err != nil {
		t.Fatal(err)
	}
	for v := uint64(1); v <= 3; v++ {
		if _, err := sc.Push(ctx, store.PushRequest{Name: "m", Version: v, Expect: v - 1, Blob: blobOf(t, gradFor(n, "second life", v))}); err != nil {
			t.Fatal(err)
		}
	}
	if version, _, err := cl.Register(ctx, sgd); err != nil || version != 3 {
		t.Fatalf("register again: version %d, %v; want the new model's version 3", version, err)
	}
	now, err := sc.Get(ctx, "m", 0)
	if err != nil || now.Version != 3 || now.Life() == old.Life() {
		t.Fatalf("the new model: version %d, life %d (deleted one's %d), %v", now.Version, now.Life(), old.Life(), err)
	}
	before := counts()

	steps.seq++
	_, err = cl.PushLife(ctx, "m", 3, old.Life(), steps.seq, gradFor(n, "g", steps.seq))
	if !errors.Is(err, errs.ErrStale) || grpcerr.Code(err) != codes.FailedPrecondition ||
		!strings.Contains(err.Error(), `"m"`) || !strings.Contains(err.Error(), "version 3") {
		t.Fatalf("gradient of the deleted model's version 3%s: %v; want FAILED_PRECONDITION naming model \"m\" and version 3", via, err)
	}
	after := counts()
	if d := after.Total.Dropped[reduce.ReasonStale] - before.Total.Dropped[reduce.ReasonStale]; d != 1 || after.Total.Applied != before.Total.Applied {
		t.Fatalf("stats: %d more stale drops (want 1), applied %d → %d (want unchanged)", d, before.Total.Applied, after.Total.Applied)
	}
	if m := after.Models["m"]; m.Version != 3 {
		t.Fatalf("the registration's version after the refusal: %d, want 3", m.Version)
	}
	got, err := sc.Get(ctx, "m", 0)
	if err != nil || got.Version != 3 || got.Life() != now.Life() {
		t.Fatalf("the new model after the refusal: version %d, life %d, %v; want version 3 of life %d", got.Version, got.Life(), err, now.Life())
	}
	want := gradFor(n, "second life", 3)
	for _, tt := range want.Tensors() {
		if !slices.Equal(f32s(t, got.Tensors, tt.Name), f32s(t, want, tt.Name)) {
			t.Fatalf("%s of the new model changed by the refused gradient", tt.Name)
		}
	}

	// The new model's life is trained (via the same secondary).
	steps.step("the new model", 3, now.Life())
}
