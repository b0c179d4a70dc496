package ars

import (
	"os"
	"os/exec"
	"runtime"
	"testing"
)

// TestNoFusedMultiplyAdd builds testdata/fusion at GOAMD64=v1 and at v3
// (where the Go compiler may fuse x*y + z into one FMA instruction, which
// rounds once) and requires both to compute the same bits: environments,
// rollouts, filter statistics and updates round every product, so Go
// workers built either way, and the hub, train byte-identical policies.
// Environments that call the Go math library's sin, cos or tanh are left
// out: the library's own bits differ at v3 (docs/ars.md).
func TestNoFusedMultiplyAdd(t *testing.T) {
	if runtime.GOARCH != "amd64" || testing.Short() {
		t.Skip("builds the probe twice for amd64")
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command")
	}
	out := map[string]string{}
	for _, level := range []string{"v1", "v3"} {
		cmd := exec.Command(goBin, "run", "./testdata/fusion")
		cmd.Env = append(os.Environ(), "GOAMD64="+level)
		b, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("GOAMD64=%s: %v\n%s", level, err, b)
		}
		out[level] = string(b)
	}
	if out["v1"] != out["v3"] {
		t.Fatalf("GOAMD64=v1 and v3 compute different bits:\nv1:\n%sv3:\n%s", out["v1"], out["v3"])
	}
	t.Logf("GOAMD64=v1 and v3:\n%s", out["v1"])
}
