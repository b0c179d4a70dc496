package wsync

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/rlhub/rlhub/internal/safetensors"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/tensor"
)

func TestMain(m *testing.M) {
	// The torn-read test re-executes this binary as separate reader
	// processes.
	if os.Getenv(childEnv) != "" {
		os.Exit(runChild())
	}
	goleak.VerifyTestMain(m)
}

// fillPattern fills b with version v's pattern: the 8-byte word
// v*0x9E3779B97F4A7C15 repeated, so any mix of two versions differs from
// both. It doubles with copy, which stays fast under the race detector.
func fillPattern(b []byte, v uint64) {
	if len(b) == 0 {
		return
	}
	var w [8]byte
	binary.LittleEndian.PutUint64(w[:], v*0x9E3779B97F4A7C15)
	n := copy(b, w[:])
	for n < len(b) {
		n += copy(b[n:], b[:n])
	}
}

// makeSnap builds version v of model name: one tensor "w" of n float32s
// whose bytes follow fillPattern.
func makeSnap(t testing.TB, name string, v uint64, n int) *store.Snapshot {
	t.Helper()
	snap, err := buildSnap(name, v, n)
	if err != nil {
		t.Fatal(err)
	}
	return snap
}

func buildSnap(name string, v uint64, n int) (*store.Snapshot, error) {
	w := tensor.NewF32("w", int64(n))
	fillPattern(w.Data, v)
	sd, err := tensor.NewStateDict(w)
	if err != nil {
		return nil, err
	}
	blob, err := safetensors.Encode(sd, map[string]string{"version": fmt.Sprint(v)})
	if err != nil {
		return nil, err
	}
	f, err := safetensors.Decode(blob)
	if err != nil {
		return nil, err
	}
	return &store.Snapshot{Name: name, Version: v, Blob: blob, Tensors: f.Tensors, Metadata: f.Metadata, Created: time.Unix(0, 0)}, nil
}

// checkSnap returns an error unless every word of snap follows the
// pattern of snap.Version (a torn or mislabelled version).
func checkSnap(snap *store.Snapshot) error {
	w := snap.Tensors.Get("w")
	if w == nil {
		return fmt.Errorf("version %d has no tensor w", snap.Version)
	}
	if snap.Metadata["version"] != fmt.Sprint(snap.Version) {
		return fmt.Errorf("version %d carries metadata version %q", snap.Version, snap.Metadata["version"])
	}
	want := make([]byte, len(w.Data))
	fillPattern(want, snap.Version)
	if !bytes.Equal(w.Data, want) {
		i := 0
		for w.Data[i] == want[i] {
			i++
		}
		return fmt.Errorf("version %d differs from its pattern at byte %d (torn)", snap.Version, i)
	}
	return nil
}
