package storerpc_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/store/storerpc"
	"github.com/rlhub/rlhub/internal/store/storetest"
	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// garbage returns n bytes of a pattern no safetensors blob starts with, in
// a buffer of capacity c.
func garbage(n, c int) []byte {
	b := make([]byte, n, c)
	for i := range b[:c] {
		b[:c][i] = byte(0xA5 ^ i)
	}
	return b
}

// sameMemory reports whether a and b start at the same byte.
func sameMemory(a, b []byte) bool {
	return len(a) > 0 && len(b) > 0 && &a[0] == &b[0]
}

// floats32 returns the decoded tensor name of snap (a zero-copy view over
// its blob, which needs the blob aligned).
func floats32(t *testing.T, snap *store.Snapshot, name string) []float32 {
	t.Helper()
	tn := snap.Tensors.Get(name)
	if tn == nil {
		t.Fatalf("v%d has no %s", snap.Version, name)
	}
	f, err := tn.Float32s()
	if err != nil {
		t.Fatalf("%s of v%d: %v", name, snap.Version, err)
	}
	return f
}

// TestGetIntoMatchesGet pulls into buffers filled with garbage, with both
// codecs: a buffer that holds the blob receives it (the snapshot aliases
// it) and gives byte-identical bytes and the same snapshot as a normal
// pull; a buffer too small or not 8-byte aligned is left untouched and the
// blob is freshly allocated.
func TestGetIntoMatchesGet(t *testing.T) {
	mem, _ := store.NewMemory(store.Config{})
	defer mem.Close()
	addr := serve(t, mem)
	blob := storetest.Blob(t, 3, 10_000)
	storetest.MustPush(t, mem, store.PushRequest{Name: "m", Version: 3, Expect: 0, Epoch: 2, Blob: blob})
	for _, stock := range []bool{false, true} {
		t.Run(fmt.Sprintf("stock=%v", stock), func(t *testing.T) {
			c := newClient(t, storerpc.ClientConfig{Addr: addr, ChunkBytes: 4096, StockCodec: stock})
			defer c.Close()
			want, err := c.Get(ctxT(t), "m", 0)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(want.Blob, blob) {
				t.Fatal("Get: blob differs from the pushed one")
			}
			n := len(blob)
			for _, tc := range []struct {
				name  string
				buf   []byte
				reuse bool
			}{
				{"exact", garbage(n, n), true},
				{"longer", garbage(n+1000, n+1000), true},
				{"short len, enough cap", garbage(10, n+8), true},
				{"one byte short", garbage(n-1, n-1), false},
				{"unaligned", garbage(n+8, n+8)[1:], false},
				{"nil", nil, false},
			} {
				t.Run(tc.name, func(t *testing.T) {
					before := slices.Clone(tc.buf[:cap(tc.buf)])
					got, err := c.GetInto(ctxT(t), "m", 0, tc.buf)
					if err != nil {
						t.Fatal(err)
					}
					if !bytes.Equal(got.Blob, want.Blob) {
						t.Fatal("GetInto: blob differs from Get's")
					}
					if got.Name != want.Name || got.Version != want.Version || got.Epoch != want.Epoch ||
						!got.Created.Equal(want.Created) || len(got.Tensors.Tensors()) != len(want.Tensors.Tensors()) {
						t.Fatalf("GetInto = %s v%d e%d %v, want %s v%d e%d %v", got.Name, got.Version, got.Epoch, got.Created,
							want.Name, want.Version, want.Epoch, want.Created)
					}
					if !slices.Equal(floats32(t, got, "layer.weight"), floats32(t, want, "layer.weight")) {
						t.Fatal("decoded weights differ")
					}
					if alias := sameMemory(got.Blob, tc.buf[:cap(tc.buf)]); alias != tc.reuse {
						t.Fatalf("blob aliases buf: %v, want %v", alias, tc.reuse)
					}
					if !tc.reuse && !bytes.Equal(tc.buf[:cap(tc.buf)], before) {
						t.Fatal("a buffer that was not used was written")
					}
				})
			}
		})
	}
}

// badPull is a model store whose Pull announces a blob of total bytes and
// sends data in 4 KiB chunks, whatever they add up to.
type badPull struct {
	rlhubv1.UnimplementedModelStoreServer
	total uint64
	data  []byte
}

func (s *badPull) Pull(_ *rlhubv1.StorePullRequest, ss grpc.ServerStreamingServer[rlhubv1.StorePullResponse]) error {
	hdr := &rlhubv1.StorePullHeader{Blob: &rlhubv1.BlobInfo{Model: "m", Version: 1, TotalBytes: s.total}}
	if err := ss.Send(&rlhubv1.StorePullResponse{Body: &rlhubv1.StorePullResponse_Header{Header: hdr}}); err != nil {
		return err
	}
	for b := s.data; len(b) > 0; {
		n := min(len(b), 4096)
		if err := ss.Send(&rlhubv1.StorePullResponse{Body: &rlhubv1.StorePullResponse_Chunk{Chunk: &rlhubv1.Chunk{Data: b[:n]}}}); err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}

func serveBad(t *testing.T, srv *badPull) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	rlhubv1.RegisterModelStoreServer(g, srv)
	var wg sync.WaitGroup
	wg.Go(func() { _ = g.Serve(lis) })
	t.Cleanup(func() { g.Stop(); wg.Wait() })
	return lis.Addr().String()
}

// TestGetIntoFailures checks that a pull into a buffer fails exactly as a
// normal pull does (same error, no snapshot) on every defect of the
// stream, and that a blob refused by size is refused before buf is
// written.
func TestGetIntoFailures(t *testing.T) {
	blob := storetest.Blob(t, 1, 10_000)
	n := uint64(len(blob))
	badLen := slices.Clone(blob)
	binary.LittleEndian.PutUint64(badLen, n) // header as long as the blob
	badJSON := slices.Clone(blob)
	copy(badJSON[8:], "{nope")
	for _, tc := range []struct {
		name        string
		srv         *badPull
		maxBytes    int64
		sentinel    error
		msg         string
		untouchable bool // refused before any chunk is written
	}{
		{"truncated", &badPull{total: n, data: blob[:n-100]}, 0, errs.ErrInvalid, fmt.Sprintf("stream ended after %d of %d announced bytes", n-100, n), false},
		{"overrun", &badPull{total: n - 8, data: blob}, 0, errs.ErrInvalid, "overrun", false},
		{"header length", &badPull{total: n, data: badLen}, 0, errs.ErrInvalid, "header length", false},
		{"corrupt header", &badPull{total: n, data: badJSON}, 0, errs.ErrInvalid, "header JSON", false},
		{"over the hub limit", &badPull{total: 5 << 30}, 0, errs.ErrFull, "exceeds the limit of 4294967296", true},
		{"over the client's limit", &badPull{total: n, data: blob}, int64(n - 1), errs.ErrFull, fmt.Sprintf("blob of %d bytes exceeds the limit of %d", n, n-1), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newClient(t, storerpc.ClientConfig{Addr: serveBad(t, tc.srv), MaxModelBytes: tc.maxBytes, MaxAttempts: 1})
			defer c.Close()
			_, plainErr := c.Get(ctxT(t), "m", 0)
			buf := garbage(int(n)+64, int(n)+64)
			before := slices.Clone(buf)
			snap, err := c.GetInto(ctxT(t), "m", 0, buf)
			if snap != nil || err == nil {
				t.Fatalf("GetInto = %v, %v; want no snapshot and an error", snap, err)
			}
			if plainErr == nil || err.Error() != plainErr.Error() {
				t.Fatalf("GetInto error %q, Get error %q: want the same", err, plainErr)
			}
			if !errors.Is(err, tc.sentinel) || !strings.Contains(err.Error(), tc.msg) || !strings.Contains(err.Error(), `model "m" version 1`) {
				t.Fatalf("err = %v, want %v saying %q about model \"m\" version 1", err, tc.sentinel, tc.msg)
			}
			if tc.untouchable && !bytes.Equal(buf, before) {
				t.Fatal("a pull refused by its announced size wrote buf")
			}
			snap, err = c.GetIfNewerInto(ctxT(t), "m", 0, buf)
			if snap != nil || err == nil || err.Error() != plainErr.Error() {
				t.Fatalf("GetIfNewerInto = %v, %v; want no snapshot and %q", snap, err, plainErr)
			}
		})
	}
}

// TestGetIfNewerIntoReuse follows a model version by version, each pulled
// into the blob of the version before: one buffer serves every version of
// the same size, a not-modified reply leaves it alone, and a version that
// outgrows it gets fresh memory.
func TestGetIfNewerIntoReuse(t *testing.T) {
	mem, _ := store.NewMemory(store.Config{})
	defer mem.Close()
	c := newClient(t, storerpc.ClientConfig{Addr: serve(t, mem), ChunkBytes: 4096})
	defer c.Close()
	const floats = 20_000
	blobs := map[uint64][]byte{}
	push := func(v uint64, floats int) {
		blobs[v] = storetest.Blob(t, v, floats)
		storetest.MustPush(t, mem, store.PushRequest{Name: "m", Version: v, Expect: v - 1, Blob: blobs[v]})
	}
	push(1, floats)
	first, err := c.GetIfNewerInto(ctxT(t), "m", 0, nil)
	if err != nil || first == nil || !bytes.Equal(first.Blob, blobs[1]) {
		t.Fatalf("first pull: %v, %v", first, err)
	}
	have := first
	for v := uint64(2); v <= 5; v++ {
		push(v, floats)
		snap, err := c.GetIfNewerInto(ctxT(t), "m", have.Version, have.Blob)
		if err != nil || snap == nil {
			t.Fatalf("v%d: %v, %v", v, snap, err)
		}
		if snap.Version != v || !bytes.Equal(snap.Blob, blobs[v]) {
			t.Fatalf("pulled v%d, want v%d byte-identical to the push", snap.Version, v)
		}
		if !sameMemory(snap.Blob, first.Blob) {
			t.Fatalf("v%d was not received into the first version's memory", v)
		}
		if b := floats32(t, snap, "layer.bias"); b[0] != float32(v) {
			t.Fatalf("v%d: decoded layer.bias[0] = %v, want %d", v, b[0], v)
		}
		have = snap
	}
	// Not modified: (nil, nil), and the buffer still holds version 5.
	snap, err := c.GetIfNewerInto(ctxT(t), "m", 5, have.Blob)
	if snap != nil || err != nil {
		t.Fatalf("GetIfNewerInto at the newest = %v, %v; want nil, nil", snap, err)
	}
	if !bytes.Equal(have.Blob, blobs[5]) {
		t.Fatal("a not-modified reply wrote the buffer")
	}
	// The model grows: the old buffer cannot hold it and is left alone.
	push(6, 2*floats)
	snap, err = c.GetIfNewerInto(ctxT(t), "m", 5, have.Blob)
	if err != nil || snap == nil || !bytes.Equal(snap.Blob, blobs[6]) {
		t.Fatalf("v6 after growth: %v, %v", snap, err)
	}
	if sameMemory(snap.Blob, have.Blob) || !bytes.Equal(have.Blob, blobs[5]) {
		t.Fatal("a blob larger than the buffer was received into it")
	}
	// And a GetInto of an exact older version reuses the grown buffer.
	old, err := c.GetInto(ctxT(t), "m", 5, snap.Blob)
	if err != nil || !bytes.Equal(old.Blob, blobs[5]) || !sameMemory(old.Blob, snap.Blob) {
		t.Fatalf("GetInto v5 into v6's buffer: %v, reused %v", err, err == nil && sameMemory(old.Blob, snap.Blob))
	}
}
