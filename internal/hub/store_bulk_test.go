package hub

import (
	"bytes"
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/errs/grpcerr"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/store/storerpc"
	"github.com/rlhub/rlhub/internal/store/storetest"
	"github.com/rlhub/rlhub/internal/testkit"
	"github.com/rlhub/rlhub/internal/wire/bulk"
	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// bulkPull runs one data-plane store call and returns its header and body
// (nil for "not modified").
func bulkPull(ctx context.Context, c *bulk.Client, addr, method string, req proto.Message) (*rlhubv1.StorePullHeader, []byte, error) {
	h := &rlhubv1.StorePullHeader{}
	var body []byte
	err := c.CallRecv(ctx, addr, method, req, nil, func(hb []byte, n int64, r io.Reader) error {
		if err := proto.Unmarshal(hb, h); err != nil {
			return err
		}
		if n > 0 {
			body = make([]byte, n)
		}
		_, err := io.ReadFull(r, body)
		return err
	}, nil)
	return h, body, err
}

// The store's pulls and watches on the data plane answer what the gRPC
// methods do: exact and newest versions, "not modified", NotFound, a
// long-poll watch that returns the next version when it lands.
func TestStoreOnTheDataPlane(t *testing.T) {
	h, err := New(Config{Listen: "127.0.0.1:0", Logger: testkit.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Start(); err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	addr := h.Addr().String()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := bulk.NewClient()
	defer c.Close()
	b1, b2 := storetest.Blob(t, 1, 1<<18), storetest.Blob(t, 2, 1<<18)
	storetest.MustPush(t, h.Store(), store.PushRequest{Name: "p", Version: 1, Expect: 0, Blob: b1})
	storetest.MustPush(t, h.Store(), store.PushRequest{Name: "p", Version: 2, Expect: 1, Blob: b2})

	for _, tc := range []struct {
		req  *rlhubv1.StorePullRequest
		want []byte
		ver  uint64
	}{
		{&rlhubv1.StorePullRequest{Model: "p"}, b2, 2},
		{&rlhubv1.StorePullRequest{Model: "p", Version: 1}, b1, 1},
		{&rlhubv1.StorePullRequest{Model: "p", IfNewerThan: proto.Uint64(1)}, b2, 2},
		{&rlhubv1.StorePullRequest{Model: "p", IfNewerThan: proto.Uint64(2)}, nil, 2},
	} {
		hdr, body, err := bulkPull(ctx, c, addr, storerpc.BulkPullMethod, tc.req)
		if err != nil {
			t.Fatalf("%v: %v", tc.req, err)
		}
		if hdr.Blob.GetVersion() != tc.ver || !bytes.Equal(body, tc.want) || hdr.NotModified != (tc.want == nil) {
			t.Fatalf("%v: version %d, %d bytes, not_modified %v; want %d, %d bytes", tc.req, hdr.Blob.GetVersion(), len(body), hdr.NotModified, tc.ver, len(tc.want))
		}
		if tc.want != nil && hdr.Blob.GetTotalBytes() != uint64(len(tc.want)) {
			t.Fatalf("total_bytes %d, want %d", hdr.Blob.GetTotalBytes(), len(tc.want))
		}
	}
	if _, _, err := bulkPull(ctx, c, addr, storerpc.BulkPullMethod, &rlhubv1.StorePullRequest{Model: "nope"}); !errors.Is(err, errs.ErrNotFound) {
		t.Fatalf("unknown model: %v, want NotFound", err)
	}
	if _, _, err := bulkPull(ctx, c, addr, storerpc.BulkPullMethod, &rlhubv1.StorePullRequest{Model: "p", Version: 1, IfNewerThan: proto.Uint64(0)}); !errors.Is(err, errs.ErrInvalid) {
		t.Fatalf("exact version with if_newer_than: %v, want InvalidArgument", err)
	}

	// Watch: a version already newer comes at once; otherwise the poll
	// waits and answers the version pushed meanwhile.
	hdr, body, err := bulkPull(ctx, c, addr, storerpc.BulkWatchMethod, &rlhubv1.StoreWatchRequest{Model: "p", After: 1})
	if err != nil || hdr.Blob.GetVersion() != 2 || !bytes.Equal(body, b2) {
		t.Fatalf("watch after 1: version %d, %v", hdr.Blob.GetVersion(), err)
	}
	b3 := storetest.Blob(t, 3, 1<<18)
	type result struct {
		hdr  *rlhubv1.StorePullHeader
		body []byte
		err  error
	}
	got := make(chan result, 1)
	go func() {
		hdr, body, err := bulkPull(ctx, c, addr, storerpc.BulkWatchMethod, &rlhubv1.StoreWatchRequest{Model: "p", After: 2})
		got <- result{hdr, body, err}
	}()
	storetest.MustPush(t, h.Store(), store.PushRequest{Name: "p", Version: 3, Expect: 2, Blob: b3})
	r := testkit.Recv(t, got, 30*time.Second, "the watch's answer")
	if r.err != nil {
		t.Fatal(r.err)
	}
	// The poll may have started after the push (then it answers at once)
	// or before it (then it waited): either way it is version 3.
	if r.hdr.Blob.GetVersion() != 3 || !bytes.Equal(r.body, b3) {
		t.Fatalf("watch after 2: version %d, not_modified %v", r.hdr.Blob.GetVersion(), r.hdr.NotModified)
	}
}

// A hub with Config.StoreNoDataPlane answers the store's data-plane
// methods Unimplemented (what a hub that predates them does), so clients
// fall back to gRPC; pushes on the data plane still work there.
func TestStoreDataPlaneCanBeTurnedOff(t *testing.T) {
	h, err := New(Config{Listen: "127.0.0.1:0", Logger: testkit.Logger(), StoreNoDataPlane: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Start(); err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	storetest.MustPush(t, h.Store(), store.PushRequest{Name: "p", Version: 1, Expect: 0, Blob: storetest.Blob(t, 1, 4)})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := bulk.NewClient()
	defer c.Close()
	_, _, err = bulkPull(ctx, c, h.Addr().String(), storerpc.BulkPullMethod, &rlhubv1.StorePullRequest{Model: "p"})
	if grpcerr.Code(err) != codes.Unimplemented {
		t.Fatalf("got %v, want Unimplemented", err)
	}
}
