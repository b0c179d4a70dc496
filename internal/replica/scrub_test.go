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

// A standby checks its copy while it follows, every --replica-scrub-every:
// a bit flipped in an acknowledged version on its disk, the standby
// running, is moved aside and sent again by the primary without a
// restart, and the standby, elected after the primary's kill, serves the
// version byte for byte. Scrubs that run while units replace and remove
// versions under them (a model pushed on, the store keeping 3) find
// nothing damaged.
func TestRunningStandbyScrubsItsCopy(t *testing.T) {
	args := []string{"--replica-scrub-every", "100ms"}
	primary := &hubProc{t: t, id: "h0", data: t.TempDir(), args: args}
	standby := &hubProc{t: t, id: "h1", data: t.TempDir(), args: args}
	c, l := primaryAndStandby(t, "runscrub", primary, standby)

	blob := storetest.Blob(t, 1, 1<<18)
	c.push("final", 1, 0, blob)
	checked := func() int { return strings.Count(standby.out.String(), `msg="replica: this hub's copy checked"`) }
	before := checked()
	for v := uint64(1); v <= 40 || checked() < before+5 && v <= 400; v++ {
		c.push("busy", v, v-1, storetest.Blob(t, v, 1<<16))
	}
	if n := checked() - before; n < 5 {
		t.Fatalf("the standby checked its copy %d times while 400 versions were pushed; want 5 or more:\n%s", n, standby.out.String())
	}
	if out := standby.out.String(); strings.Contains(out, "is damaged; moved aside") {
		t.Fatalf("a scrub while units were installed found damage in an intact copy:\n%s", out)
	}

	rel := filepath.Join("store", store.VersionFile("final", 1))
	p := filepath.Join(standby.data, rel)
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)-1] ^= 0x10 // in the tensor's data: the size unchanged
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 60*time.Second, "the running standby to get the damaged version sent again", func() bool {
		got, err := os.ReadFile(p)
		return err == nil && bytes.Equal(got, blob)
	})
	if !strings.Contains(standby.out.String(), "file="+rel) {
		t.Errorf("the standby's log does not name the damaged %s:\n%s", rel, standby.out.String())
	}
	if kept, err := os.ReadFile(filepath.Join(standby.data, ".replica", "damaged", rel)); err != nil || bytes.Equal(kept, blob) {
		t.Errorf("the damaged copy was not kept aside as it was found (%v)", err)
	}
	// In sync again: acks-all publishes go on, and the standby may serve.
	c.synced(standby, l)
	c.push("after", 1, 0, blob)

	primary.kill()
	if _, p := c.leader(l.Epoch); p != standby {
		t.Fatalf("the new primary is %s, want %s", p.id, standby.id)
	}
	if snap := c.newest("final"); snap.Version != 1 || !bytes.Equal(snap.Blob, blob) {
		t.Fatalf("the new primary serves final v%d, %d bytes; want v1 as pushed", snap.Version, len(snap.Blob))
	}
}
