// Package wsynctest builds and checks the versions weight-sync tests
// publish: one float32 tensor whose bytes follow a per-version pattern, so
// a torn or mislabelled version is detected byte for byte. The wsync
// transports' tests (wsync, wsync/shm, wsync/relay) share it;
// WriteVersion answers a data-plane request with a whole or cut-off
// version.
package wsynctest

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/rlhub/rlhub/internal/safetensors"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/tensor"
	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// Fill fills b with version v's pattern: the 8-byte word
// v*0x9E3779B97F4A7C15 repeated, so any mix of two versions differs from
// both. It doubles with copy, which stays fast under the race detector.
func Fill(b []byte, v uint64) {
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

// Snap builds version v of model name: one tensor "w" of n float32s
// whose bytes follow Fill.
func Snap(t testing.TB, name string, v uint64, n int) *store.Snapshot {
	t.Helper()
	snap, err := Build(name, v, n)
	if err != nil {
		t.Fatal(err)
	}
	return snap
}

// Build is Snap for callers without a testing.TB (helper processes).
func Build(name string, v uint64, n int) (*store.Snapshot, error) {
	w := tensor.NewF32("w", int64(n))
	Fill(w.Data, v)
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

// Check returns an error unless every word of snap follows the
// pattern of snap.Version (a torn or mislabelled version).
func Check(snap *store.Snapshot) error {
	w := snap.Tensors.Get("w")
	if w == nil {
		return fmt.Errorf("version %d has no tensor w", snap.Version)
	}
	if snap.Metadata["version"] != fmt.Sprint(snap.Version) {
		return fmt.Errorf("version %d carries metadata version %q", snap.Version, snap.Metadata["version"])
	}
	want := make([]byte, len(w.Data))
	Fill(want, snap.Version)
	if !bytes.Equal(w.Data, want) {
		i := 0
		for w.Data[i] == want[i] {
			i++
		}
		return fmt.Errorf("version %d differs from its pattern at byte %d (torn)", snap.Version, i)
	}
	return nil
}

// PushLife pushes version v of model "m" to st at epoch, its tensor (64
// float32s) filled with fill, so two lives' versions of one number
// differ, and returns its bytes.
func PushLife(t testing.TB, st store.Store, v, epoch, fill uint64) string {
	t.Helper()
	snap := Snap(t, "m", fill, 64)
	if _, err := st.Push(context.Background(), store.PushRequest{Name: "m", Version: v, Epoch: epoch, Expect: store.ExpectAny, Blob: snap.Blob}); err != nil {
		t.Fatal(err)
	}
	return string(snap.Blob)
}

// ShmPath returns a fresh segment path in /dev/shm, removed after the test.
func ShmPath(t testing.TB) string {
	t.Helper()
	dir := "/dev/shm"
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		dir = t.TempDir()
	}
	p := filepath.Join(dir, fmt.Sprintf("rlhub-wsync-test-%d-%s", os.Getpid(), strings.ReplaceAll(t.Name(), "/", "_")))
	os.Remove(p)
	t.Cleanup(func() { os.Remove(p) })
	return p
}

// WriteVersion answers a data-plane pull or watch (docs/wire.md) with
// snap's data frame, of which only send body
// bytes are written, and the final OK status when final.
func WriteVersion(conn io.Writer, snap *store.Snapshot, send int, final bool) {
	hb, _ := proto.Marshal(&rlhubv1.StorePullHeader{Blob: &rlhubv1.BlobInfo{Model: snap.Name, Version: snap.Version, Epoch: snap.Epoch, TotalBytes: uint64(len(snap.Blob))}})
	frame := binary.LittleEndian.AppendUint32([]byte{4}, uint32(len(hb)))
	frame = append(frame, hb...)
	frame = binary.LittleEndian.AppendUint64(frame, uint64(len(snap.Blob)))
	frame = append(frame, snap.Blob[:send]...)
	if final {
		st, _ := proto.Marshal(&spb.Status{})
		frame = binary.LittleEndian.AppendUint32(append(frame, 3), uint32(len(st)))
		frame = append(frame, st...)
	}
	_, _ = conn.Write(frame)
}
