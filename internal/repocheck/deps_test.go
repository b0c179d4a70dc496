package repocheck

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// cores are the packages that hold rlhub's rules and arithmetic. They take
// data in and give data out; no transport reaches them, so that they stay
// small to build, test and reuse (a program that only reads safetensors
// does not pull in gRPC).
var cores = []string{
	"internal/tensor",
	"internal/kernels",
	"internal/safetensors",
	"internal/errs",
	"internal/reduce",
	"internal/optim",
	"internal/ars",
	"internal/env",
	"internal/store",
}

// forbidden are import-path prefixes a core must not depend on, directly
// or through anything it imports.
var forbidden = []string{
	"google.golang.org/grpc",
	"google.golang.org/protobuf",
	"google.golang.org/genproto",
	"golang.org/x/net",
	"net",
	"crypto/tls",
	"github.com/rlhub/rlhub/proto",
	"github.com/rlhub/rlhub/internal/errs/grpcerr",
	"github.com/rlhub/rlhub/internal/wire",
}

const module = "github.com/rlhub/rlhub"

// transportDeps returns, for each core, the forbidden packages in its
// dependency closure. overlay, when not empty, is a go list -overlay file.
func transportDeps(t *testing.T, overlay string) map[string][]string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	bad := map[string][]string{}
	for _, core := range cores {
		args := []string{"list", "-deps", "-f", "{{.ImportPath}}"}
		if overlay != "" {
			args = append(args, "-overlay", overlay)
		}
		args = append(args, "./"+core)
		cmd := exec.Command("go", args...)
		cmd.Dir = root
		out, err := cmd.Output()
		if err != nil {
			msg := ""
			if ee, ok := err.(*exec.ExitError); ok {
				msg = string(ee.Stderr)
			}
			t.Fatalf("go list %s: %v\n%s", core, err, msg)
		}
		for _, dep := range strings.Fields(string(out)) {
			dep = strings.TrimPrefix(dep, "vendor/")
			for _, f := range forbidden {
				if dep == f || strings.HasPrefix(dep, f+"/") {
					bad[core] = append(bad[core], dep)
				}
			}
		}
	}
	return bad
}

// TestCoresImportNoTransport keeps gRPC, protobuf and the network out of
// the pure cores: errs holds the conditions, errs/grpcerr their mapping
// to status codes, and only services and clients import the latter.
func TestCoresImportNoTransport(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Fatal("the go command is needed to list dependencies")
	}
	for core, deps := range transportDeps(t, "") {
		t.Errorf("%s depends on transport packages %v; move the code that needs them to a service or client package", core, deps)
	}
}

// TestTransportCheckCatchesAnImport is the test of the test: the same
// check, with a file importing gRPC added to internal/tensor through a go
// list overlay (the tree is untouched), must name tensor and every core
// that imports it.
func TestTransportCheckCatchesAnImport(t *testing.T) {
	dir := t.TempDir()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	src := filepath.Join(dir, "zz_grpc.go")
	if err := os.WriteFile(src, []byte("package tensor\n\nimport _ \"google.golang.org/grpc\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ov, err := json.Marshal(map[string]map[string]string{
		"Replace": {filepath.Join(root, "internal", "tensor", "zz_grpc.go"): src},
	})
	if err != nil {
		t.Fatal(err)
	}
	ovPath := filepath.Join(dir, "overlay.json")
	if err := os.WriteFile(ovPath, ov, 0o644); err != nil {
		t.Fatal(err)
	}
	bad := transportDeps(t, ovPath)
	for _, core := range []string{"internal/tensor", "internal/safetensors", "internal/store"} {
		found := false
		for _, d := range bad[core] {
			if d == "google.golang.org/grpc" {
				found = true
			}
		}
		if !found {
			t.Errorf("with gRPC imported by tensor, the check did not flag %s (got %v)", core, bad[core])
		}
	}
	if len(bad["internal/kernels"]) != 0 {
		t.Errorf("kernels does not import tensor, yet was flagged: %v", bad["internal/kernels"])
	}
}
