package storerpc_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"testing"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/store/storerpc"
	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// blobOf is version v's blob as pushVersion makes it (4 KiB, every byte v).
func blobOf(t *testing.T, v uint64) []byte {
	t.Helper()
	scratch, _ := store.NewMemory(store.Config{})
	defer scratch.Close()
	return pushVersion(t, scratch, v)
}

// newestIs fails the test unless model m's newest version in st is v with
// exactly blob's bytes.
func newestIs(t *testing.T, st store.Store, v uint64, blob []byte) {
	t.Helper()
	s, err := st.Get(context.Background(), "m", 0)
	if err != nil || s.Version != v || !bytes.Equal(s.Blob, blob) {
		t.Fatalf("newest of m: %v, %v; want version %d with its bytes", s, err, v)
	}
}

// Pushes go over the data plane when the hub serves them there: the version
// lands whole, and every refusal keeps its kind and changes nothing.
func TestDataPlanePush(t *testing.T) {
	mem, _ := store.NewMemory(store.Config{MaxModelBytes: 64 << 10})
	defer mem.Close()
	addr, _, b := serveBoth(t, mem, false)
	c := newClient(t, storerpc.ClientConfig{Addr: addr, MaxAttempts: 1})
	defer c.Close()
	ctx := context.Background()

	b1 := blobOf(t, 1)
	before := b.Requests()
	info, err := c.Push(ctx, store.PushRequest{Name: "m", Version: 1, Expect: 0, Blob: b1})
	if err != nil || info.Version != 1 || info.Bytes != int64(len(b1)) {
		t.Fatalf("push: %+v, %v", info, err)
	}
	if got := b.Requests() - before; got != 1 {
		t.Fatalf("%d data-plane requests for one push, want 1", got)
	}
	newestIs(t, mem, 1, b1)

	b2 := blobOf(t, 2)
	badHeader := bytes.Clone(b2)
	binary.LittleEndian.PutUint64(badHeader, uint64(len(b2))) // header longer than the blob
	for _, tc := range []struct {
		name string
		req  store.PushRequest
		want error
	}{
		{"not newer", store.PushRequest{Name: "m", Version: 1, Expect: store.ExpectAny, Blob: b2}, errs.ErrStale},
		{"expect mismatch", store.PushRequest{Name: "m", Version: 2, Expect: 7, Blob: b2}, errs.ErrStale},
		{"header longer than the blob", store.PushRequest{Name: "m", Version: 2, Expect: store.ExpectAny, Blob: badHeader}, errs.ErrInvalid},
		{"over the store's limit", store.PushRequest{Name: "m", Version: 2, Expect: store.ExpectAny, Blob: make([]byte, 65<<10)}, errs.ErrFull},
		{"bad model name", store.PushRequest{Name: "no spaces", Version: 2, Expect: store.ExpectAny, Blob: b2}, errs.ErrInvalid},
	} {
		before := b.Requests()
		if _, err := c.Push(ctx, tc.req); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
		if b.Requests() == before {
			t.Errorf("%s: not sent on the data plane", tc.name)
		}
		newestIs(t, mem, 1, b1)
	}
	if _, err := c.Push(ctx, store.PushRequest{Name: "m", Version: 2, Expect: 1, Blob: b2}); err != nil {
		t.Fatal(err)
	}
	newestIs(t, mem, 2, b2)
}

// The hub decides from the header alone whether it takes a push: one over
// its size limit is refused before the client is asked for the body.
func TestDataPlanePushRefusedBeforeItsBody(t *testing.T) {
	mem, _ := store.NewMemory(store.Config{MaxModelBytes: 64 << 10})
	defer mem.Close()
	addr, _, _ := serveBoth(t, mem, false)
	d := dialDP(t, addr)
	defer d.c.Close()
	kind, st := d.push(t, &rlhubv1.StorePushHeader{Blob: &rlhubv1.BlobInfo{Model: "m", Version: 1, TotalBytes: 1 << 30}, ExpectAny: true}, nil)
	if kind != 3 || codes.Code(st.GetCode()) != codes.ResourceExhausted {
		t.Fatalf("oversize push: frame %d, status %v; want a final ResourceExhausted before any body", kind, st)
	}
	if _, err := mem.Get(context.Background(), "m", 0); !errors.Is(err, errs.ErrNotFound) {
		t.Fatalf("after the refusal: %v, want no model", err)
	}
}

// A push whose body is cut off mid-way lands nothing, and the hub goes on
// taking pushes.
func TestDataPlanePushCutOffLandsNothing(t *testing.T) {
	mem, _ := store.NewMemory(store.Config{})
	defer mem.Close()
	addr, _, b := serveBoth(t, mem, false)
	c := newClient(t, storerpc.ClientConfig{Addr: addr})
	defer c.Close()
	b1 := blobOf(t, 1)
	if _, err := c.Push(context.Background(), store.PushRequest{Name: "m", Version: 1, Expect: store.ExpectAny, Blob: b1}); err != nil {
		t.Fatal(err)
	}
	b2 := blobOf(t, 2)
	before := b.Requests()
	d := dialDP(t, addr)
	kind, _ := d.push(t, &rlhubv1.StorePushHeader{Blob: &rlhubv1.BlobInfo{Model: "m", Version: 2, TotalBytes: uint64(len(b2))}, ExpectAny: true}, b2[:len(b2)/2])
	if kind != 2 {
		t.Fatalf("frame %d after the header, want continue (2)", kind)
	}
	d.c.Close() // half the body sent
	newestIs(t, mem, 1, b1)
	// Version 2 is still free (Expect 1): the cut-off push did not land it,
	// and the hub takes the whole one.
	if _, err := c.Push(context.Background(), store.PushRequest{Name: "m", Version: 2, Expect: 1, Blob: b2}); err != nil {
		t.Fatalf("a whole push after the cut-off one: %v", err)
	}
	newestIs(t, mem, 2, b2)
	if b.Requests() <= before {
		t.Fatal("the whole push did not go over the data plane")
	}
}

// push sends a push request with hdr and, if the hub asks for it (frame
// kind 2, continue), body; it returns the first frame's kind and, when
// that is a final status (3), the status. A body shorter than hdr
// announces is left cut off: the caller closes the connection.
func (d *rawDP) push(t *testing.T, hdr *rlhubv1.StorePushHeader, body []byte) (byte, *spb.Status) {
	t.Helper()
	if err := d.request(storerpc.BulkPushMethod, hdr); err != nil {
		t.Fatal(err)
	}
	kind, err := d.r.ReadByte()
	if err != nil {
		t.Fatal(err)
	}
	switch kind {
	case 2:
		if _, err := d.c.Write(body); err != nil {
			t.Fatal(err)
		}
	case 3:
		st, err := d.final()
		if err != nil {
			t.Fatal(err)
		}
		return kind, st
	}
	return kind, nil
}
