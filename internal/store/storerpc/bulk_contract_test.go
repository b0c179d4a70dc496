package storerpc_test

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/rlhub/rlhub/internal/safetensors"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/store/storerpc"
	"github.com/rlhub/rlhub/internal/tensor"
	"github.com/rlhub/rlhub/internal/wire/bulk"
	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// The contract the Python pull_into / watch_into direct path relies on
// (docs/wire.md, "Pulls on the data plane"): once the store's data-plane
// Pull or Watch has sent a data frame with a version, the frame that follows
// is a final status OK, or nothing at all (the connection ends). Never a
// non-OK status after a whole version: the client has already written the
// version into the caller's tensors by then. These tests read the frames
// off a raw connection, so that a non-OK status and a broken connection
// cannot be confused, as they would be through bulk.Client.

// rawDP is a plaintext data-plane connection read frame by frame.
type rawDP struct {
	c net.Conn
	r *bufio.Reader
}

func dialDP(t *testing.T, addr string) *rawDP {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	d := &rawDP{c: c, r: bufio.NewReaderSize(c, 64<<10)}
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := c.Write(append([]byte(bulk.Magic), 0, 0)); err != nil { // no token
		t.Fatal(err)
	}
	var m [8]byte
	if _, err := io.ReadFull(d.r, m[:]); err != nil || string(m[:]) != bulk.Magic {
		t.Fatalf("data-plane hello: %q, %v", m, err)
	}
	return d
}

// dpAnswer is what one request got back.
type dpAnswer struct {
	data        bool   // a data frame came
	notModified bool   // its header said not_modified
	version     uint64 // its header's version
	whole       bool   // its body was read whole
	final       *spb.Status
}

// call sends one request and reads its answer. With slow set the body is
// read in 64 KiB pieces a millisecond apart, so that the server's write of
// it is still going on while the test stops the server. err is set when
// the connection ended (then final is nil) or a frame was malformed.
func (d *rawDP) call(method string, req proto.Message, slow bool) (a dpAnswer, err error) {
	if err := d.request(method, req); err != nil {
		return a, err
	}
	kind, err := d.r.ReadByte()
	if err != nil {
		return a, err
	}
	if kind == 4 {
		a.data = true
		var n4 [4]byte
		if _, err := io.ReadFull(d.r, n4[:]); err != nil {
			return a, err
		}
		hb := make([]byte, binary.LittleEndian.Uint32(n4[:]))
		if _, err := io.ReadFull(d.r, hb); err != nil {
			return a, err
		}
		ph := &rlhubv1.StorePullHeader{}
		if err := proto.Unmarshal(hb, ph); err != nil {
			return a, fmt.Errorf("data frame header: %v", err)
		}
		a.notModified, a.version = ph.GetNotModified(), ph.GetBlob().GetVersion()
		var n8 [8]byte
		if _, err := io.ReadFull(d.r, n8[:]); err != nil {
			return a, err
		}
		n := int64(binary.LittleEndian.Uint64(n8[:]))
		if !a.notModified && uint64(n) != ph.GetBlob().GetTotalBytes() {
			return a, fmt.Errorf("data frame of %d bytes, header says %d", n, ph.GetBlob().GetTotalBytes())
		}
		for n > 0 {
			k := n
			if slow {
				k = min(n, 64<<10)
				time.Sleep(time.Millisecond)
			}
			if _, err := io.CopyN(io.Discard, d.r, k); err != nil {
				return a, err
			}
			n -= k
		}
		a.whole = true
		if kind, err = d.r.ReadByte(); err != nil {
			return a, err
		}
	}
	if kind != 3 {
		return a, fmt.Errorf("frame kind %d, want a final status (3)", kind)
	}
	a.final, err = d.final()
	return a, err
}

// request writes one request frame: method and its header, req.
func (d *rawDP) request(method string, req proto.Message) error {
	h, err := proto.Marshal(req)
	if err != nil {
		return err
	}
	_ = d.c.SetDeadline(time.Now().Add(30 * time.Second))
	f := binary.LittleEndian.AppendUint16([]byte{1}, uint16(len(method)))
	f = append(f, method...)
	f = binary.LittleEndian.AppendUint32(f, uint32(len(h)))
	_, err = d.c.Write(append(f, h...))
	return err
}

// final reads a final-status frame's body, its kind byte already read.
func (d *rawDP) final() (*spb.Status, error) {
	var n4 [4]byte
	if _, err := io.ReadFull(d.r, n4[:]); err != nil {
		return nil, err
	}
	sb := make([]byte, binary.LittleEndian.Uint32(n4[:]))
	if _, err := io.ReadFull(d.r, sb); err != nil {
		return nil, err
	}
	st := &spb.Status{}
	if err := proto.Unmarshal(sb, st); err != nil {
		return nil, fmt.Errorf("final status: %v", err)
	}
	return st, nil
}

// checkAfterVersion fails the test when a whole version was followed by a
// final status other than OK.
func checkAfterVersion(t *testing.T, what string, a dpAnswer) {
	t.Helper()
	if a.data && !a.notModified && a.whole && a.final != nil && codes.Code(a.final.GetCode()) != codes.OK {
		t.Errorf("%s: version %d sent whole, then final status %v %q: must be OK or a broken connection",
			what, a.version, codes.Code(a.final.GetCode()), a.final.GetMessage())
	}
}

// pushBlob pushes version v of model "m": n float32s, every byte v.
func pushBlob(st store.Store, v uint64, n int64) error {
	w := tensor.NewF32("w", n)
	for i := range w.Data {
		w.Data[i] = byte(v)
	}
	sd, _ := tensor.NewStateDict(w)
	blob, err := safetensors.Encode(sd, nil)
	if err != nil {
		return err
	}
	_, err = st.Push(context.Background(), store.PushRequest{Name: "m", Version: v, Expect: store.ExpectAny, Blob: blob})
	return err
}

func newMemory(t *testing.T) store.Store {
	t.Helper()
	mem, err := store.NewMemory(store.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mem.Close() })
	return mem
}

// Every kind of answer with a version, one after another on one
// connection: each is followed by OK, and the connection stays usable.
func TestDataPlaneVersionIsFollowedByOK(t *testing.T) {
	mem := newMemory(t)
	addr, _, _ := serveBoth(t, mem, false)
	for v := uint64(1); v <= 3; v++ {
		if err := pushBlob(mem, v, 50_000); err != nil {
			t.Fatal(err)
		}
	}
	d := dialDP(t, addr)
	defer d.c.Close()
	one := uint64(1)
	three := uint64(3)
	cases := []struct {
		name        string
		method      string
		req         proto.Message
		version     uint64
		notModified bool
	}{
		{"pull newest", storerpc.BulkPullMethod, &rlhubv1.StorePullRequest{Model: "m"}, 3, false},
		{"pull exact", storerpc.BulkPullMethod, &rlhubv1.StorePullRequest{Model: "m", Version: 2}, 2, false},
		{"pull if newer", storerpc.BulkPullMethod, &rlhubv1.StorePullRequest{Model: "m", IfNewerThan: &one}, 3, false},
		{"pull not modified", storerpc.BulkPullMethod, &rlhubv1.StorePullRequest{Model: "m", IfNewerThan: &three}, 3, true},
		{"watch, a version waiting", storerpc.BulkWatchMethod, &rlhubv1.StoreWatchRequest{Model: "m", After: 1}, 3, false},
	}
	for _, c := range cases {
		a, err := d.call(c.method, c.req, false)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if !a.data || a.notModified != c.notModified || a.version != c.version || a.final == nil ||
			codes.Code(a.final.GetCode()) != codes.OK {
			t.Fatalf("%s: got data=%v not_modified=%v version=%d final=%v; want version %d (not_modified=%v) then OK",
				c.name, a.data, a.notModified, a.version, a.final, c.version, c.notModified)
		}
	}
	// A watch answered by a push during its wait.
	pushed := make(chan error, 1)
	go func() {
		time.Sleep(50 * time.Millisecond) // usually after the watch waits; either order is right
		pushed <- pushBlob(mem, 4, 50_000)
	}()
	a, err := d.call(storerpc.BulkWatchMethod, &rlhubv1.StoreWatchRequest{Model: "m", After: 3}, false)
	if perr := <-pushed; perr != nil {
		t.Fatal(perr)
	}
	if err != nil || !a.data || a.version != 4 || a.final == nil || codes.Code(a.final.GetCode()) != codes.OK {
		t.Fatalf("watch answered by a push: %+v, %v; want version 4 then OK", a, err)
	}
}

// Clients pulling and watching 4 MB versions (one reading slowly, so the
// server is mid-body) while versions are pushed and evicted, then the
// service drains (watches end, pulls go on) and the data plane shuts down
// with a short grace, after which it closes the connections still busy. Whatever each client saw,
// a whole version was never followed by a non-OK status.
func TestDataPlaneNeverRefusesAfterAVersion(t *testing.T) {
	mem := newMemory(t)
	addr, svc, b := serveBoth(t, mem, false)
	const floats = 1_000_000 // the learner loop's 4 MB model
	if err := pushBlob(mem, 1, floats); err != nil {
		t.Fatal(err)
	}
	var (
		wg       sync.WaitGroup
		versions atomic.Int64 // whole versions answered OK
		answers  atomic.Int64 // requests answered with a final status
		stopPush = make(chan struct{})
	)
	wg.Go(func() {
		for v := uint64(2); ; v++ {
			select {
			case <-stopPush:
				return
			default:
			}
			if err := pushBlob(mem, v, floats); err != nil {
				t.Errorf("push %d: %v", v, err)
				return
			}
			time.Sleep(2 * time.Millisecond)
		}
	})
	for i := range 4 {
		d := dialDP(t, addr)
		wg.Go(func() {
			defer d.c.Close()
			slow := i == 0
			var after uint64
			for k := 0; ; k++ {
				var (
					a   dpAnswer
					err error
				)
				if k%2 == 0 {
					a, err = d.call(storerpc.BulkPullMethod, &rlhubv1.StorePullRequest{Model: "m"}, slow)
				} else {
					a, err = d.call(storerpc.BulkWatchMethod, &rlhubv1.StoreWatchRequest{Model: "m", After: after}, slow)
				}
				checkAfterVersion(t, fmt.Sprintf("client %d request %d", i, k), a)
				if err != nil {
					return // the connection ended (the server stopped)
				}
				answers.Add(1)
				if a.data && !a.notModified && codes.Code(a.final.GetCode()) == codes.OK {
					versions.Add(1)
					after = a.version
				}
			}
		})
	}
	deadline := time.Now().Add(60 * time.Second)
	for versions.Load() < 12 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	// Draining ends the watches; pulls are still answered until the data
	// plane shuts down: let every client make a few requests in between.
	svc.Drain()
	for drained := answers.Load(); answers.Load() < drained+8 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	_ = b.Shutdown(ctx) // past the grace it closes the busy connections
	cancel()
	close(stopPush)
	wg.Wait()
	if versions.Load() == 0 {
		t.Fatal("no version was answered whole and OK")
	}
}
