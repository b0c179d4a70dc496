package aggregator

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/rlhub/rlhub/internal/errs"
	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// The current task outlives its aggregator: a new one on the same data
// serves it with its info, merge options and recorded demand, starts
// learners on it as they attach, and learns without a new Start.
func TestTaskSurvivesARestart(t *testing.T) {
	dir := t.TempDir()
	var mu sync.Mutex
	var told []string
	changed := func(p string) { mu.Lock(); told = append(told, p); mu.Unlock() }
	h1 := newHarness(t, Config{DataDir: dir, StateChanged: changed})
	runLearners(t, h1, exampleCfg("a", 4), exampleCfg("b", 12))
	ctx := testCtx(t, 60*time.Second)
	// Merge options other than the hub's, which the restored task keeps.
	mo := &rlhubv1.MergeOptions{Rule: "strict", SetHomogeneousKeys: true, HomogeneousKeys: []string{}}
	if _, err := h1.client.StartWith(ctx, "t1", map[string]any{"w": testWeights}, mo); err != nil {
		t.Fatal(err)
	}
	if _, err := h1.client.GetDataDemand(ctx, "t1"); err != nil {
		t.Fatal(err)
	}
	batch := regressionBatch(t, 16, 3)
	before, err := h1.client.Learn(ctx, "t1", batch, nil)
	if err != nil {
		t.Fatal(err)
	}
	t1, err := h1.svc.currentTask("t1")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, taskFileName)
	mu.Lock()
	if !slices.Contains(told, path) {
		t.Errorf("StateChanged was told %v, not %s", told, path)
	}
	mu.Unlock()
	h1.svc.Close()

	h2 := newHarness(t, Config{DataDir: dir})
	// Learners with the same demands attach to the new one; nobody calls Start.
	runLearners(t, h2, exampleCfg("a", 4), exampleCfg("b", 12))
	h2.waitAttached(t, "t1", "a", "b")
	t2, err := h2.svc.currentTask("t1")
	if err != nil || !reflect.DeepEqual(t2.merge, t1.merge) || t2.merge.Rule != RuleStrict || t2.seq != t1.seq {
		t.Fatalf("restored task %+v (%v), want the merge and seq of %+v", t2, err, t1)
	}
	after, err := h2.client.Learn(ctx, "", batch, nil)
	if err != nil {
		t.Fatalf("learn on the restarted aggregator without a Start: %v", err)
	}
	// The split by the recorded demand (4:12, not 8:8), the info the
	// learners computed with (the task's weights) and the merge all match.
	if !proto.Equal(before, after) {
		t.Fatalf("learn after the restart differs:\nbefore %v\nafter  %v", before, after)
	}
	if got := after.Shares; len(got) != 2 || got[0].Rows != 4 || got[1].Rows != 12 {
		t.Fatalf("shares after the restart %v, want 4 and 12 rows (the recorded demand)", got)
	}
	checkExactlyOnce(t, after, batch)
	// A new Start replaces the saved task.
	if _, err := h2.client.Start(ctx, "t2", map[string]any{"w": testWeights}); err != nil {
		t.Fatal(err)
	}
	h2.svc.Close()
	svc, err := New(Config{DataDir: dir, Logger: h2.svc.cfg.Logger})
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close()
	if got, err := svc.currentTask(""); err != nil || got.id != "t2" || got.order != nil {
		t.Fatalf("task after a second Start and a restart: %+v, %v; want t2 with no recorded demand", got, err)
	}
}

// A saved task that cannot be read stops the aggregator from starting,
// naming the file; one that cannot be written fails the Start, which then
// leaves no task.
func TestTaskFileErrors(t *testing.T) {
	for name, body := range map[string]string{
		"torn":       `{"format":1,"seq":1,"id":"t`,
		"format":     `{"format":9,"seq":1,"id":"t","info":{}}`,
		"no id":      `{"format":1,"seq":1,"id":"","info":{}}`,
		"bad info":   `{"format":1,"seq":1,"id":"t","info":[1]}`,
		"bad merge":  `{"format":1,"seq":1,"id":"t","info":{},"merge":{"rule":"nope"}}`,
		"order/size": `{"format":1,"seq":1,"id":"t","info":{},"order":["a"]}`,
		"bad id":     `{"format":1,"seq":1,"id":"t\u0001","info":{}}`,
		"long id":    `{"format":1,"seq":1,"id":"` + strings.Repeat("t", 200) + `","info":{}}`,
		"bad order":  `{"format":1,"seq":1,"id":"t","info":{},"order":["a b"],"sizes":[1]}`,
		"twice":      `{"format":1,"seq":1,"id":"t","info":{},"order":["a","a"],"sizes":[1,1]}`,
		"negative":   `{"format":1,"seq":1,"id":"t","info":{},"order":["a"],"sizes":[-4]}`,
		// Tasks are numbered from 1: with seq 0 every attaching learner
		// would count as started on the task without being sent it.
		"no seq": `{"format":1,"id":"t","info":{}}`,
		// Sizes no split accepts (a demand adding up past 2^62 rows).
		"sizes past 2^62": `{"format":1,"seq":1,"id":"t","info":{},"order":["a","b"],"sizes":[4611686018427387904,1]}`,
	} {
		dir := t.TempDir()
		path := filepath.Join(dir, taskFileName)
		if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		svc, err := New(Config{DataDir: dir})
		if err == nil {
			svc.Close()
			t.Errorf("%s: New accepted %s", name, body)
			continue
		}
		if !strings.Contains(err.Error(), path) {
			t.Errorf("%s: error %q does not name the file", name, err)
		}
	}

	// DataDir replaced by a regular file once the aggregator runs: the
	// task cannot be saved (root ignores permissions, so no chmod).
	notDir := filepath.Join(t.TempDir(), "agg")
	h := newHarness(t, Config{DataDir: notDir})
	if err := os.WriteFile(notDir, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	runLearners(t, h, exampleCfg("a", 4))
	ctx := testCtx(t, 30*time.Second)
	if _, err := h.client.Start(ctx, "t1", map[string]any{"w": testWeights}); !errors.Is(err, errs.ErrUnavailable) || !strings.Contains(err.Error(), "not a directory") {
		t.Fatalf("Start that cannot be saved: %v, want Unavailable naming the save", err)
	}
	if _, err := h.client.GetDataDemand(ctx, ""); !errors.Is(err, errs.ErrNotFound) {
		t.Fatalf("demand after an unsaved Start: %v, want NotFound (no task)", err)
	}

	// A demand that cannot be saved fails and records nothing.
	okDir := filepath.Join(t.TempDir(), "agg")
	h2 := newHarness(t, Config{DataDir: okDir})
	runLearners(t, h2, exampleCfg("b", 4))
	if _, err := h2.client.Start(ctx, "t1", map[string]any{"w": testWeights}); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(okDir); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(okDir, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := h2.client.GetDataDemand(ctx, "t1"); !errors.Is(err, errs.ErrUnavailable) || !strings.Contains(err.Error(), "not a directory") {
		t.Fatalf("demand that cannot be saved: %v, want Unavailable naming the save", err)
	}
	if cur, err := h2.svc.currentTask("t1"); err != nil || cur.order != nil || cur.sizes != nil {
		t.Fatalf("task after an unsaved demand: %+v, %v; want no recorded demand", cur, err)
	}
}
