package reducer_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/optim"
	"github.com/rlhub/rlhub/internal/reduce"
	"github.com/rlhub/rlhub/internal/reducer"
	"github.com/rlhub/rlhub/internal/safetensors"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/store/storerpc"
	"github.com/rlhub/rlhub/internal/tensor"
	"github.com/rlhub/rlhub/internal/testkit"
)

// startProcEnv is startProc with env added to the hub's environment.
func startProcEnv(t *testing.T, env []string, args ...string) *testkit.Proc {
	t.Helper()
	addrFile := filepath.Join(t.TempDir(), "addr")
	args = append(args, "--addr-file", addrFile)
	return testkit.StartProc(t, testkit.ProcConfig{Name: "rlhub " + args[0], Path: os.Args[0],
		Env: append([]string{childEnv + "=" + strings.Join(args, "\x1f")}, env...), AddrFile: addrFile, StartTimeout: 30 * time.Second})
}

// restoreOwnerFixture is a --data directory whose store holds model "m"
// at version 1, and the hub's arguments on it.
func restoreOwnerFixture(t *testing.T, n int) (data string, serve []string) {
	t.Helper()
	data = t.TempDir()
	st := openDataStore(t, data)
	defer st.Close()
	blob, _ := safetensors.Encode(gradFor(n, "init", 0), nil)
	if _, err := st.Push(context.Background(), store.PushRequest{Name: "m", Version: 1, Blob: blob}); err != nil {
		t.Fatal(err)
	}
	return data, []string{"serve", "--listen", "127.0.0.1:0", "--data", data, "--reduce-batch-size", "1", "--max-wait", "1ms", "--log-level", "info"}
}

// openDataStore opens the store of the --data directory data, while no
// hub runs on it; the caller closes it.
func openDataStore(t *testing.T, data string) *store.File {
	t.Helper()
	st, err := store.OpenFile(store.FileConfig{Dir: filepath.Join(data, "store"), Logger: testkit.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// startHubOnM skips the test in -short mode (it starts processes), and
// starts a hub with env added to its environment and extra added to its
// arguments (args, to start it again) on restoreOwnerFixture(t, n)'s
// --data directory data; ctx ends with the test, in 2 minutes at most.
func startHubOnM(t *testing.T, n int, env []string, extra ...string) (data string, args []string, hubProc *testkit.Proc, ctx context.Context) {
	t.Helper()
	if testing.Short() {
		t.Skip("starts processes")
	}
	data, args = restoreOwnerFixture(t, n)
	args = append(args, extra...)
	hubProc = startProcEnv(t, env, args...)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return data, args, hubProc, ctx
}

// reducerClient is a reducer client of the hub at addr as id, closed when
// the test ends.
func reducerClient(t *testing.T, addr, id string) *reducer.Client {
	t.Helper()
	cl, err := reducer.NewClient(reducer.ClientConfig{Hub: addr, ClientID: id})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	return cl
}

// sgdOnM registers model "m", gradients summed, for SGD at rate 0.1.
func sgdOnM() reducer.ModelConfig {
	return reducer.ModelConfig{Model: "m", Reduction: reduce.Sum, Optimizer: optim.Config{Kind: optim.SGD, LR: 0.1}}
}

func storeClient(t *testing.T, addr string) *storerpc.Client {
	t.Helper()
	sc, err := storerpc.NewClient(storerpc.ClientConfig{Addr: addr})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sc.Close() })
	return sc
}

func blobOf(t *testing.T, sd *tensor.StateDict) []byte {
	t.Helper()
	blob, err := safetensors.Encode(sd, nil)
	if err != nil {
		t.Fatal(err)
	}
	return blob
}

// TestRestoreDropsTheRegistrationOfAModelDeletedAndPushedAgain: a
// registered model deleted and pushed again by another writer is no
// longer the reducer's, and its steps are refused (they land only on a
// model the reducer still owns). A running hub drops the registration at
// the delete (TestDeletedModelIsRegisteredAgainWithoutARestart); one
// killed between the store's delete and that drop — here the delete is
// made on the store's files while the hub is down — then restored the
// stale registration: the model stopped with that refusal at its first
// step after every restart, and a new Register returned the stale
// registration, until its state directory was deleted by hand. Restore
// now drops it (logged at ERROR): the writer keeps writing, and a new
// Register starts afresh.
func TestRestoreDropsTheRegistrationOfAModelDeletedAndPushedAgain(t *testing.T) {
	const n = 64
	data, args, hubProc, ctx := startHubOnM(t, n, nil)
	mc := sgdOnM()
	admin := reducerClient(t, hubProc.Addr(), "admin")
	if _, _, err := admin.Register(ctx, mc); err != nil {
		t.Fatal(err)
	}
	admin.Close()
	hubProc.Kill()
	other := blobOf(t, gradFor(n, "other", 1))
	{
		st := openDataStore(t, data)
		err := st.Delete(ctx, "m")
		if err == nil {
			_, err = st.Push(ctx, store.PushRequest{Name: "m", Version: 1, Blob: other})
		}
		st.Close()
		if err != nil {
			t.Fatal(err)
		}
	}

	hubProc = startProc(t, args...)
	regDir := filepath.Join(data, "reducer", store.ModelDir("m"))
	if _, err := os.Stat(regDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the stale registration's state directory after the restart: %v, want it removed", err)
	}
	if out := hubProc.Output(); !strings.Contains(out, "registration dropped") || !strings.Contains(out, "model=m") {
		t.Errorf("no ERROR naming the dropped registration's model; output:\n%s", out)
	}
	// Its writer keeps writing it.
	sc := storeClient(t, hubProc.Addr())
	if _, err := sc.Push(ctx, store.PushRequest{Name: "m", Version: 2, Expect: 1, Blob: other}); err != nil {
		t.Fatalf("the writer's push after the restart: %v", err)
	}
	// A new registration starts afresh, claims it, and its steps land.
	cl := reducerClient(t, hubProc.Addr(), "g")
	version, steps, err := cl.Register(ctx, mc)
	if err != nil || version != 2 || steps != 0 {
		t.Fatalf("register again: version %d steps %d, %v; want version 2, a fresh optimizer", version, steps, err)
	}
	if _, err := cl.PushSeq(ctx, "m", 2, 1, gradFor(n, "g", 1)); err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	defer wcancel()
	snap, err := sc.WaitNewer(wctx, "m", 2)
	if err != nil || snap.Version != 3 {
		t.Fatalf("the new registration's first step: %v; output:\n%s", err, hubProc.Output())
	}
	if _, err := os.Stat(filepath.Join(regDir, "registration.json")); err != nil {
		t.Fatalf("the new registration is not on disk: %v", err)
	}
	hubProc.Kill()
}

// TestRestoreReleasesAModelClaimedWithNoRegistration: Register claims the
// model for the reducer before it writes its registration. A hub killed
// between the two left a model the reducer owned and did not reduce: its
// writer's pushes were refused (PERMISSION_DENIED, "managed by reducer")
// after every restart, until an admin deleted it. Restore now releases a
// model the reducer owns with no registration (logged at WARN).
func TestRestoreReleasesAModelClaimedWithNoRegistration(t *testing.T) {
	const n = 64
	data, args, hubProc, ctx := startHubOnM(t, n, []string{"RLHUB_TEST_REDUCER_CRASH=register-claimed"})
	admin := reducerClient(t, hubProc.Addr(), "admin")
	rctx, rcancel := context.WithTimeout(ctx, 3*time.Second) // the hub dies in it; no retry reaches it
	_, _, err := admin.Register(rctx, reducer.ModelConfig{Model: "m", Optimizer: optim.Config{Kind: optim.SGD, LR: 0.1}})
	rcancel()
	admin.Close()
	if err == nil {
		t.Fatal("register returned; want the hub killed in it")
	}
	select {
	case <-hubProc.Done():
	case <-ctx.Done():
		t.Fatal("the hub was not killed at register-claimed")
	}
	if sig, ok := hubProc.KilledBy(); !ok || sig != syscall.SIGKILL {
		t.Fatalf("the hub ended with %v; want SIGKILL at register-claimed", hubProc.State())
	}
	{ // the kill fell between the claim and the registration
		st := openDataStore(t, data)
		infos, err := st.List(ctx)
		st.Close()
		if err != nil || len(infos) != 1 || infos[0].Owner != "reducer" {
			t.Fatalf("the store after the kill: %+v, %v; want m owned by the reducer", infos, err)
		}
		if _, err := os.Stat(filepath.Join(data, "reducer", store.ModelDir("m"), "registration.json")); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("a registration after the kill: %v; want none", err)
		}
	}

	hubProc = startProc(t, args...)
	if out := hubProc.Output(); !strings.Contains(out, "released a model") || !strings.Contains(out, "model=m") {
		t.Errorf("no WARN naming the released model; output:\n%s", out)
	}
	sc := storeClient(t, hubProc.Addr())
	if _, err := sc.Push(ctx, store.PushRequest{Name: "m", Version: 2, Expect: 1, Blob: blobOf(t, gradFor(n, "w", 2))}); err != nil {
		t.Fatalf("the model's writer after the restart: %v", err)
	}
	hubProc.Kill()
}
