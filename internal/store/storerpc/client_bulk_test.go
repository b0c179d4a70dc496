package storerpc_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/safetensors"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/store/storerpc"
	"github.com/rlhub/rlhub/internal/store/storetest"
	"github.com/rlhub/rlhub/internal/tensor"
	"github.com/rlhub/rlhub/internal/testkit"
	"github.com/rlhub/rlhub/internal/wire/bulk"
	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// serveBoth serves st's store service over gRPC and, unless noBulk, its
// data-plane pulls and watches, on one port; it returns the address, the
// service and the bulk server (which counts the data-plane requests it
// served). A test may stop them itself; cleanup stops whatever is left.
func serveBoth(t *testing.T, st store.Store, noBulk bool) (string, *storerpc.Service, *bulk.Server) {
	t.Helper()
	svc, err := storerpc.New(storerpc.Config{Store: st, NoBulk: noBulk, Logger: testkit.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	b := bulk.NewServer()
	svc.RegisterBulk(b)
	addr := testkit.ServeGRPC(t, b.Listen(testkit.Listen(t)), svc.Register)
	t.Cleanup(func() { svc.Drain(); b.Close(); svc.Close() })
	return addr, svc, b
}

// The whole store suite holds with pulls and WaitNewer on the data plane,
// and they really went there.
func TestSuiteOverTheDataPlane(t *testing.T) {
	var servers []*bulk.Server
	storetest.RunRemote(t, func(t *testing.T, cfg store.Config) store.Store {
		mem, err := store.NewMemory(cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { mem.Close() })
		addr, _, b := serveBoth(t, mem, false)
		servers = append(servers, b)
		return newClient(t, storerpc.ClientConfig{Addr: addr, ChunkBytes: 4096})
	})
	var served uint64
	for _, b := range servers {
		served += b.Requests()
	}
	if served == 0 {
		t.Fatal("no pull or watch reached the data plane")
	}
}

// pushVersion pushes version v of model m (4 KiB, every byte v).
func pushVersion(t *testing.T, st store.Store, v uint64) []byte {
	t.Helper()
	w := tensor.NewF32("w", 1024)
	for i := range w.Data {
		w.Data[i] = byte(v)
	}
	sd, _ := tensor.NewStateDict(w)
	blob, err := safetensors.Encode(sd, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Push(context.Background(), store.PushRequest{Name: "m", Version: v, Expect: store.ExpectAny, Blob: blob}); err != nil {
		t.Fatal(err)
	}
	return blob
}

// WaitNewer on the data plane delivers every version in order to a reader
// that keeps up, and a pull into a reused buffer lands in it.
func TestDataPlaneWaitNewerInOrder(t *testing.T) {
	mem, _ := store.NewMemory(store.Config{})
	defer mem.Close()
	addr, _, b := serveBoth(t, mem, false)
	c := newClient(t, storerpc.ClientConfig{Addr: addr})
	defer c.Close()
	ctx := context.Background()
	got := make(chan uint64, 16)
	done := make(chan error, 1)
	go func() {
		after := uint64(0)
		for after < 5 {
			s, err := c.WaitNewer(ctx, "m", after)
			if err != nil {
				done <- err
				return
			}
			got <- s.Version
			after = s.Version
		}
		done <- nil
	}()
	blobs := map[uint64][]byte{}
	for v := uint64(1); v <= 5; v++ {
		blobs[v] = pushVersion(t, mem, v)
		if g := testkit.Recv(t, got, 20*time.Second, "the next version"); g != v {
			t.Fatalf("WaitNewer gave version %d, want %d", g, v)
		}
	}
	if err := testkit.Recv(t, done, 20*time.Second, "the waiter"); err != nil {
		t.Fatal(err)
	}
	buf := tensor.AlignedBytes(len(blobs[5]))
	s, err := c.GetInto(ctx, "m", 0, buf)
	if err != nil || s.Version != 5 || !bytes.Equal(s.Blob, blobs[5]) || !sameMemory(s.Blob, buf) {
		t.Fatalf("GetInto: %v, %v; want version 5 in the given buffer", s, err)
	}
	if s, err := c.GetIfNewer(ctx, "m", 5); s != nil || err != nil {
		t.Fatalf("GetIfNewer(5) = %v, %v; want nil, nil", s, err)
	}
	if b.Requests() < 7 {
		t.Fatalf("%d data-plane requests, want every pull and watch there", b.Requests())
	}
}

// Against a hub that has the data plane but not the store's methods
// (UNIMPLEMENTED), and one without a data plane, pulls, WaitNewer and
// pushes use gRPC and give the same versions.
func TestDataPlaneFallsBackToGRPC(t *testing.T) {
	for _, tc := range []struct {
		name  string
		serve func(t *testing.T, st store.Store) string
	}{
		{"method-unregistered", func(t *testing.T, st store.Store) string { a, _, _ := serveBoth(t, st, true); return a }},
		{"no-data-plane", func(t *testing.T, st store.Store) string { return serve(t, st) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mem, _ := store.NewMemory(store.Config{})
			defer mem.Close()
			addr := tc.serve(t, mem)
			c := newClient(t, storerpc.ClientConfig{Addr: addr})
			defer c.Close()
			ctx := context.Background()
			b1 := pushVersion(t, mem, 1)
			for range 2 { // the second call does not try the data plane again
				s, err := c.Get(ctx, "m", 0)
				if err != nil || !bytes.Equal(s.Blob, b1) {
					t.Fatalf("Get: %v, %v", s, err)
				}
			}
			pushVersion(t, mem, 2)
			s, err := c.WaitNewer(ctx, "m", 1)
			if err != nil || s.Version != 2 {
				t.Fatalf("WaitNewer: %v, %v", s, err)
			}
			// Pushes too.
			b3 := blobOf(t, 3)
			if info, err := c.Push(ctx, store.PushRequest{Name: "m", Version: 3, Expect: 2, Blob: b3}); err != nil || info.Version != 3 {
				t.Fatalf("Push: %+v, %v", info, err)
			}
			newestIs(t, mem, 3, b3)
		})
	}
}

// A data-plane answer cut off mid-body is an error, never a snapshot; the
// client retries it as a broken connection, and a whole answer after the
// cut is returned.
func TestDataPlaneTruncatedPullIsAnError(t *testing.T) {
	w := tensor.NewF32("w", 100_000)
	sd, _ := tensor.NewStateDict(w)
	blob, _ := safetensors.Encode(sd, nil)
	lis := testkit.Listen(t)
	var wg sync.WaitGroup
	var mu sync.Mutex
	cutsLeft := 1
	defer func() { lis.Close(); wg.Wait() }()
	wg.Go(func() {
		for {
			conn, err := lis.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer conn.Close()
				for {
					if !readBulkRequest(conn) {
						return
					}
					mu.Lock()
					cut := cutsLeft > 0
					cutsLeft--
					mu.Unlock()
					hb, _ := proto.Marshal(&rlhubv1.StorePullHeader{Blob: &rlhubv1.BlobInfo{Model: "m", Version: 7, TotalBytes: uint64(len(blob))}})
					frame := binary.LittleEndian.AppendUint32([]byte{4}, uint32(len(hb)))
					frame = append(frame, hb...)
					frame = binary.LittleEndian.AppendUint64(frame, uint64(len(blob)))
					if cut {
						conn.Write(append(frame, blob[:len(blob)/2]...))
						return
					}
					frame = append(frame, blob...)
					frame = binary.LittleEndian.AppendUint32(append(frame, 3), 0) // OK, empty status
					conn.Write(frame)
				}
			})
		}
	})
	// No retries: the cut is the call's error.
	c := newClient(t, storerpc.ClientConfig{Addr: lis.Addr().String(), MaxAttempts: 1})
	defer c.Close()
	if s, err := c.Get(context.Background(), "m", 0); !errors.Is(err, errs.ErrUnavailable) || s != nil {
		t.Fatalf("cut-off pull: %v, %v; want nil and Unavailable", s, err)
	}
	// With retries the next (whole) answer is the result.
	mu.Lock()
	cutsLeft = 1
	mu.Unlock()
	c2 := newClient(t, storerpc.ClientConfig{Addr: lis.Addr().String(), BaseBackoff: time.Millisecond, MaxBackoff: time.Millisecond})
	defer c2.Close()
	s, err := c2.Get(context.Background(), "m", 0)
	if err != nil || s.Version != 7 || !bytes.Equal(s.Blob, blob) {
		t.Fatalf("pull after a cut: %v, %v; want version 7 whole", s, err)
	}
}

// readBulkRequest reads the hello (on a new connection: magic, token,
// answered with the magic) and one request frame.
func readBulkRequest(conn net.Conn) bool {
	var b [8]byte
	if _, err := io.ReadFull(conn, b[:1]); err != nil {
		return false
	}
	if b[0] == 'R' {
		if _, err := io.ReadFull(conn, b[1:]); err != nil {
			return false
		}
		var tl [2]byte
		if _, err := io.ReadFull(conn, tl[:]); err != nil {
			return false
		}
		if _, err := io.ReadFull(conn, make([]byte, binary.LittleEndian.Uint16(tl[:]))); err != nil {
			return false
		}
		if _, err := conn.Write([]byte(bulk.Magic)); err != nil {
			return false
		}
		if _, err := io.ReadFull(conn, b[:1]); err != nil {
			return false
		}
	}
	var l [4]byte
	if _, err := io.ReadFull(conn, l[:2]); err != nil {
		return false
	}
	if _, err := io.ReadFull(conn, make([]byte, binary.LittleEndian.Uint16(l[:2]))); err != nil {
		return false
	}
	if _, err := io.ReadFull(conn, l[:]); err != nil {
		return false
	}
	_, err := io.ReadFull(conn, make([]byte, binary.LittleEndian.Uint32(l[:])))
	return err == nil
}
