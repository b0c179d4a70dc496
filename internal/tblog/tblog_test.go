package tblog_test

import (
	"bytes"
	"encoding/json"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/tblog"
)

// ReadWithTensorBoard reads dir with the tensorboard package's event
// reader (python3 testdata/read_scalars.py): tag → [[step, value,
// wall_time]…]. It fails, naming the set-up step, when tensorboard is not
// installed.
func readWithTensorBoard(t *testing.T, dir string) map[string][][3]float64 {
	t.Helper()
	cmd := exec.Command("python3", "testdata/read_scalars.py", dir)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("tensorboard's reader failed (is tensorboard installed? scripts/setup.sh installs python/requirements-dev.txt): %v\n%s", err, stderr.String())
	}
	var got map[string][][3]float64
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("reader output %q: %v", out, err)
	}
	return got
}

func TestTensorBoardReadsWhatWeWrite(t *testing.T) {
	dir := t.TempDir()
	clock := time.Unix(1_700_000_000, 0)
	w, err := tblog.Create(dir, tblog.Config{Now: func() time.Time { clock = clock.Add(time.Second); return clock }})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][][2]float64{}
	for step := int64(0); step < 50; step++ {
		ret := -100 + 2.5*float64(step)
		rate := 1000 + float64(step)
		if err := w.Scalars(step*10, map[string]float64{"eval/return": ret, "perf/steps_per_second": rate}); err != nil {
			t.Fatal(err)
		}
		want["eval/return"] = append(want["eval/return"], [2]float64{float64(step * 10), ret})
		want["perf/steps_per_second"] = append(want["perf/steps_per_second"], [2]float64{float64(step * 10), rate})
	}
	if err := w.Scalar("train/return", 7, math.Pi); err != nil {
		t.Fatal(err)
	}
	want["train/return"] = [][2]float64{{7, float64(float32(math.Pi))}}
	// A tag that is not UTF-8 is refused, writing nothing: TensorBoard's
	// reader would fail the whole file on it (proto3 strings).
	for _, bad := range []string{"bad\xff", "", strings.Repeat("t", 257)} {
		if err := w.Scalar(bad, 8, 1); err == nil {
			t.Errorf("tag %.40q accepted", bad)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := w.Scalar("late", 1, 1); err == nil {
		t.Error("Scalar after Close succeeded")
	}
	got := readWithTensorBoard(t, dir)
	if len(got) != len(want) {
		t.Fatalf("tensorboard sees tags %v, want %d tags", keys(got), len(want))
	}
	for tag, ws := range want {
		gs := got[tag]
		if len(gs) != len(ws) {
			t.Fatalf("%s: %d points, want %d", tag, len(gs), len(ws))
		}
		for i := range ws {
			if gs[i][0] != ws[i][0] || float32(gs[i][1]) != float32(ws[i][1]) || gs[i][2] < 1_700_000_000 {
				t.Fatalf("%s[%d] = step %v value %v wall %v, want step %v value %v", tag, i, gs[i][0], gs[i][1], gs[i][2], ws[i][0], ws[i][1])
			}
		}
	}

	// Go's reader agrees and checks the CRCs.
	f, err := os.Open(w.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	evs, err := tblog.Read(f)
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 52 || evs[0].FileVersion != tblog.FileVersion || evs[1].Scalars["eval/return"] != -100 {
		t.Fatalf("Read: %d events, first %+v, second %+v", len(evs), evs[0], evs[1])
	}
}

// A flipped byte fails the CRC check.
func TestReadRejectsCorruption(t *testing.T) {
	dir := t.TempDir()
	w, err := tblog.Create(dir, tblog.Config{})
	if err != nil {
		t.Fatal(err)
	}
	w.Scalar("x", 1, 2)
	w.Close()
	b, err := os.ReadFile(w.Path())
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)-6] ^= 0x40
	if _, err := tblog.Read(bytes.NewReader(b)); err == nil {
		t.Fatal("corrupted file read without error")
	}
	if m, _ := filepath.Glob(filepath.Join(dir, "events.out.tfevents.*")); len(m) != 1 {
		t.Fatalf("event files %v, want one named events.out.tfevents.*", m)
	}
}

func keys(m map[string][][3]float64) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
