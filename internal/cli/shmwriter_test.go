package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rlhub/rlhub/internal/safetensors"
	"github.com/rlhub/rlhub/internal/tensor"
)

func TestParseF32Spec(t *testing.T) {
	sd, err := parseF32Spec("weight=4x8,bias=4")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := fmt.Sprint(sd.Names()), "[weight bias]"; got != want {
		t.Errorf("names %s, want %s", got, want)
	}
	if got := sd.ByteSize(); got != (32+4)*4 {
		t.Errorf("ByteSize %d, want %d", got, (32+4)*4)
	}
	for _, bad := range []string{"", "w", "=4", "w=4x", "w=-1", "w=4,w=4"} {
		if _, err := parseF32Spec(bad); err == nil {
			t.Errorf("parseF32Spec(%q) succeeded", bad)
		}
	}
}

func TestShmWriterPublishesAndRemovesTheSegment(t *testing.T) {
	path := filepath.Join(t.TempDir(), "seg")
	if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() {
		path = fmt.Sprintf("/dev/shm/rlhub-cli-shmwriter-test-%d", os.Getpid())
	}
	code, out, errOut := run(t, context.Background(), "sync", "shm-writer", "--path", path, "--tensors", "w=16", "--versions", "5")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if !strings.HasPrefix(out, "ready "+path) || !strings.Contains(out, "done 5 versions") {
		t.Errorf("output %q", out)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("segment %s left behind (stat: %v)", path, err)
	}
	if code, _, _ := run(t, context.Background(), "sync", "shm-writer", "--path", path, "--start", "0"); code == 0 {
		t.Error("--start 0 accepted")
	}
}

func TestModelBenchTimesPushesAndPulls(t *testing.T) {
	addr := startStoreHub(t)
	in := filepath.Join(t.TempDir(), "in.safetensors")
	sd, err := parseF32Spec("w=1000")
	if err != nil {
		t.Fatal(err)
	}
	blob := mustEncode(t, sd)
	if err := os.WriteFile(in, blob, 0o644); err != nil {
		t.Fatal(err)
	}
	timed := func(args ...string) []string {
		t.Helper()
		code, out, errOut := run(t, context.Background(), append([]string{"model", "bench", "--hub", addr, "--name", "b"}, append(args, in)...)...)
		if code != 0 {
			t.Fatalf("bench %v: exit %d: %s", args, code, errOut)
		}
		return strings.Split(strings.TrimSpace(out), "\n")
	}
	var ops []string
	for _, line := range timed("--start", "3", "--reps", "2") {
		var r struct {
			Op      string  `json:"op"`
			Bytes   int     `json:"bytes"`
			Seconds float64 `json:"seconds"`
		}
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("line %q: %v", line, err)
		}
		if r.Bytes != len(blob) || r.Seconds <= 0 {
			t.Errorf("line %q: want %d bytes and a positive time", line, len(blob))
		}
		ops = append(ops, r.Op)
	}
	if got, want := strings.Join(ops, ","), "push,pull,push,pull"; got != want {
		t.Errorf("ops %s, want %s", got, want)
	}
	newest := func(want string) {
		t.Helper()
		code, out, _ := run(t, context.Background(), "model", "ls", "--hub", addr)
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if code != 0 || len(lines) != 2 || fmt.Sprint(strings.Fields(lines[1])[:2]) != "[b "+want+"]" {
			t.Errorf("model ls after bench (want b at v%s): %q", want, out)
		}
	}
	newest("4")

	// Warm-up pairs are pushed and pulled but not printed.
	if got := timed("--start", "5", "--warmup", "1", "--reps", "2"); len(got) != 4 {
		t.Errorf("--warmup 1 --reps 2 printed %d lines, want 4: %q", len(got), got)
	}
	newest("7")
	for _, bad := range [][]string{{"--warmup", "-1"}, {"--reps", "0"}} {
		args := append([]string{"model", "bench", "--hub", addr, "--name", "b", "--start", "9"}, append(bad, in)...)
		if code, _, errOut := run(t, context.Background(), args...); code == 0 || !strings.Contains(errOut, bad[0]) {
			t.Errorf("bench %v: exit %d, stderr %q; want a refusal naming %s", bad, code, errOut, bad[0])
		}
	}
	newest("7")
}

func mustEncode(t *testing.T, sd *tensor.StateDict) []byte {
	t.Helper()
	b, err := safetensors.Encode(sd, nil)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
