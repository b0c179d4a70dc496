//go:build mujoco && cgo

package mjenv_test

import (
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/rlhub/rlhub/internal/arsrpc"
	"github.com/rlhub/rlhub/internal/env"
	_ "github.com/rlhub/rlhub/internal/env/mjenv" // registers the MuJoCo tasks
	pb "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// rssMiB is this process's resident memory.
func rssMiB(t *testing.T) float64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		t.Fatal(err)
	}
	pages, err := strconv.Atoi(strings.Fields(string(b))[1])
	if err != nil {
		t.Fatal(err)
	}
	return float64(pages*os.Getpagesize()) / (1 << 20)
}

// An environment made only to read its spec is closed: a MuJoCo task
// holds some MiB of C memory that Go's collector, seeing a few KB of Go
// heap, frees too seldom. The hub normalises every run it starts or
// restores this way; 300 Humanoid-v5 runs grew it by 1.1 GB before.
func TestNormalisingARunDoesNotKeepItsEnvironment(t *testing.T) {
	before := rssMiB(t)
	for range 300 {
		if _, _, err := arsrpc.Normalise(&pb.ARSRunSpec{Env: "Humanoid-v5"}); err != nil {
			t.Fatal(err)
		}
	}
	if grew := rssMiB(t) - before; grew > 300 {
		t.Fatalf("resident memory grew by %.0f MiB over 300 normalised Humanoid-v5 runs", grew)
	}
	// env.Close on an environment that holds nothing outside Go's heap, and
	// twice on one that does, is harmless.
	e, err := env.Make("Humanoid-v5")
	if err != nil {
		t.Fatal(err)
	}
	env.Close(e)
	env.Close(e)
	c, _ := env.Make("CartPole-v1")
	env.Close(c)
}
