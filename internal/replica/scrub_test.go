package replica_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/optim"
	"github.com/rlhub/rlhub/internal/reducer"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/store/storetest"
	"github.com/rlhub/rlhub/internal/tensor"
	"github.com/rlhub/rlhub/internal/testkit"
)

// A standby restarted with damaged copies (a flipped bit, the size
// unchanged) of an acknowledged store version and of the reducer's
// optimizer state moves them aside and is sent them again by the primary's
// full sync; elected after the primary's kill, it serves the version byte
// for byte and carries the optimizer on. Before, every full sync kept the
// damaged files (the standby's inventory names sizes only): the elected
// standby could not open its store.
func TestStandbyScrubsADamagedCopy(t *testing.T) {
	primary := &hubProc{t: t, id: "h0", data: t.TempDir(), args: []string{"--reduce-batch-size", "1"}}
	standby := &hubProc{t: t, id: "h1", data: t.TempDir(), args: []string{"--reduce-batch-size", "1"}}
	c, l := primaryAndStandby(t, "scrub", primary, standby)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// A model no one pushes again (its version stays on disk), and a
	// reducer model with Adam's state.
	blob := storetest.Blob(t, 1, 1<<16)
	c.push("final", 1, 0, blob)
	seedVector(c, "g")
	rc, err := reducer.NewClient(reducer.ClientConfig{Hub: primary.addr, ClientID: "a"})
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	if _, _, err := rc.Register(ctx, reducer.ModelConfig{Model: "g", Optimizer: optim.Config{Kind: optim.Adam, LR: 0.01}}); err != nil {
		t.Fatal(err)
	}
	grad, _ := tensor.NewStateDict(tensor.FromFloat32s("w", []int64{4}, []float32{1, 2, 3, 4}))
	for v := uint64(1); v <= 2; v++ {
		if _, err := rc.PushGrad(ctx, "g", v, grad); err != nil {
			t.Fatalf("gradient on v%d: %v", v, err)
		}
		testkit.Eventually(t, 30*time.Second, fmt.Sprintf("g at v%d", v+1), func() bool { return c.newest("g").Version == v+1 })
	}
	blobRel := filepath.Join("store", store.VersionFile("final", 1))
	stateRel := filepath.Join("reducer", "g", "optim-v00000000000000000003.safetensors")
	same := func(rel string) bool {
		a, errA := os.ReadFile(filepath.Join(primary.data, rel))
		b, errB := os.ReadFile(filepath.Join(standby.data, rel))
		return errA == nil && errB == nil && bytes.Equal(a, b)
	}
	for _, rel := range []string{blobRel, stateRel} {
		if !same(rel) { // acknowledged, so on the standby
			t.Fatalf("%s differs on the standby before any damage", rel)
		}
	}

	standby.kill()
	for _, rel := range []string{blobRel, stateRel} {
		p := filepath.Join(standby.data, rel)
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		b[len(b)-1] ^= 0x10 // in the last tensor's data
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	c.start(standby)
	c.synced(standby, l)
	for _, rel := range []string{blobRel, stateRel} {
		if !same(rel) {
			t.Fatalf("%s still differs on the standby after its full sync:\n%s", rel, standby.out.String())
		}
		if _, err := os.Stat(filepath.Join(standby.data, ".replica", "damaged", rel)); err != nil {
			t.Errorf("the damaged %s was not kept aside: %v", rel, err)
		}
		if !strings.Contains(standby.out.String(), "file="+rel) {
			t.Errorf("the standby's log does not name the damaged %s:\n%s", rel, standby.out.String())
		}
	}

	primary.kill()
	if _, p := c.leader(l.Epoch); p != standby {
		t.Fatalf("the new primary is %s, want %s", p.id, standby.id)
	}
	if snap := c.newest("final"); snap.Version != 1 || !bytes.Equal(snap.Blob, blob) {
		t.Fatalf("the new primary serves final v%d, %d bytes; want v1 as pushed", snap.Version, len(snap.Blob))
	}
	rc2, err := reducer.NewClient(reducer.ClientConfig{Hub: standby.addr, ClientID: "b"})
	if err != nil {
		t.Fatal(err)
	}
	defer rc2.Close()
	st, err := rc2.HubStats(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if m := st.Models["g"]; m.OptimizerSteps != 2 || m.StateError != "" {
		t.Fatalf("the new primary's reducer model: %d optimizer steps, state error %q; want 2 and none", m.OptimizerSteps, m.StateError)
	}
}
