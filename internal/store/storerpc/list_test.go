package storerpc_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/rlhub/rlhub/internal/hub"
	"github.com/rlhub/rlhub/internal/hub/hubtest"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/store/storerpc"
	"github.com/rlhub/rlhub/internal/store/storetest"
	"github.com/rlhub/rlhub/internal/testkit"
	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// TestListIsBounded is the audit's case: 40000 models with ~110-byte names
// (about 5.4 MB of entries, past gRPC's 4 MiB message limit) on a real
// hub. Before paging every List failed ResourceExhausted; now the client
// gets them all, in name order, a page at a time.
func TestListIsBounded(t *testing.T) {
	if testing.Short() {
		t.Skip("40000 models")
	}
	h := hubtest.Start(t, hub.Config{DataDir: "", Logger: testkit.Logger()})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := newClient(t, storerpc.ClientConfig{Addr: h.Addr().String(), MaxAttempts: 1})
	defer c.Close()
	blob := storetest.Blob(t, 1, 1)
	pad := strings.Repeat("x", 100)
	const models = 40000
	name := func(i int) string { return fmt.Sprintf("team/%s-%06d", pad, i) }
	for i := range models {
		if _, err := h.Store().Push(ctx, store.PushRequest{Name: name(i), Version: 1, Blob: blob}); err != nil {
			t.Fatal(err)
		}
	}
	infos, err := c.List(ctx)
	if err != nil {
		t.Fatalf("List of %d models: %v", models, err)
	}
	if len(infos) != models {
		t.Fatalf("List gave %d models, want %d", len(infos), models)
	}
	for i, in := range infos {
		if in.Name != name(i) || in.Version != 1 {
			t.Fatalf("model %d is %s v%d, want %s v1", i, in.Name, in.Version, name(i))
		}
	}
}

// pushN pushes version 1 of each name into h's store.
func pushN(t *testing.T, h *harness, names []string) {
	t.Helper()
	blob := storetest.Blob(t, 1, 1)
	for _, n := range names {
		if _, err := h.mem.Push(ctxT(t), store.PushRequest{Name: n, Version: 1, Blob: blob}); err != nil {
			t.Fatal(err)
		}
	}
}

// TestListPages: with a small page size every model comes exactly once and
// in name order, though models are deleted between pages: the model the
// token names (the page resumes after it) and one not yet sent (it does
// not come). Pages never exceed the size asked; the last has no token.
func TestListPages(t *testing.T) {
	h, addr := startAddr(t, store.Config{})
	var names []string
	for i := range 20 {
		names = append(names, fmt.Sprintf("m%02d", i))
	}
	pushN(t, h, names)
	deleted := map[string]bool{}
	var got []string
	token := ""
	for pages := 0; ; pages++ {
		if pages > 20 {
			t.Fatalf("no last page after %d pages; got %v", pages, got)
		}
		resp, err := h.rpc.List(ctxT(t), &rlhubv1.StoreListRequest{PageSize: 3, PageToken: token})
		if err != nil {
			t.Fatalf("page %d: %v", pages, err)
		}
		if len(resp.Models) > 3 {
			t.Fatalf("page %d holds %d models, asked for 3", pages, len(resp.Models))
		}
		for _, m := range resp.Models {
			got = append(got, m.Name)
		}
		if resp.NextPageToken == "" {
			break
		}
		token = resp.NextPageToken
		if pages == 1 { // delete the last model sent, which the token names, and one ahead
			for _, n := range []string{got[len(got)-1], "m13"} {
				if err := h.mem.Delete(ctxT(t), n); err != nil {
					t.Fatal(err)
				}
				deleted[n] = true
			}
		}
	}
	var want []string
	for _, n := range names {
		if n != "m13" {
			want = append(want, n)
		}
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("pages gave %v\nwant %v", got, want)
	}
	if !deleted["m05"] {
		t.Fatalf("the token's model was not the one deleted: %v", deleted)
	}
	// The client's List sees the models as they are now, in one call.
	c := newClient(t, storerpc.ClientConfig{Addr: addr})
	defer c.Close()
	infos, err := c.List(ctxT(t))
	if err != nil || len(infos) != len(names)-2 {
		t.Fatalf("client List = %d models, %v; want %d", len(infos), err, len(names)-2)
	}
}

// TestListPageCaps: a page holds at most 1000 models whatever is asked,
// and at most about 2 MiB however long the models' entries are (here
// 10 KB names, 2000 of them: 20 MB), always at least one.
func TestListPageCaps(t *testing.T) {
	h, addr := startAddr(t, store.Config{MaxNameBytes: 16 << 10})
	var names []string
	for i := range 1500 {
		names = append(names, fmt.Sprintf("s%04d", i))
	}
	pushN(t, h, names)
	for _, size := range []uint32{0, 5000} {
		resp, err := h.rpc.List(ctxT(t), &rlhubv1.StoreListRequest{PageSize: size})
		if err != nil || len(resp.Models) != 1000 || resp.NextPageToken == "" {
			t.Fatalf("page_size %d: %d models, token %q, %v; want 1000 and a token", size, len(resp.GetModels()), resp.GetNextPageToken(), err)
		}
	}
	for _, n := range names {
		if err := h.mem.Delete(ctxT(t), n); err != nil {
			t.Fatal(err)
		}
	}
	names = names[:0]
	for i := range 2000 {
		names = append(names, fmt.Sprintf("l%04d-%s", i, strings.Repeat("y", 10000)))
	}
	pushN(t, h, names)
	token, n, pages := "", 0, 0
	for {
		resp, err := h.rpc.List(ctxT(t), &rlhubv1.StoreListRequest{PageToken: token})
		if err != nil {
			t.Fatalf("page %d: %v", pages, err)
		}
		if size := proto.Size(resp); size > 2<<20+64<<10 || len(resp.Models) == 0 {
			t.Fatalf("page %d: %d models in %d bytes; want 1 or more in about 2 MiB at most", pages, len(resp.Models), size)
		}
		for _, m := range resp.Models {
			if m.Name != names[n] {
				t.Fatalf("model %d is %.10s…, want %.10s…", n, m.Name, names[n])
			}
			n++
		}
		pages++
		if token = resp.NextPageToken; token == "" {
			break
		}
	}
	if n != len(names) || pages < 10 {
		t.Fatalf("%d models in %d pages; want %d in 10 or more", n, pages, len(names))
	}
	c := newClient(t, storerpc.ClientConfig{Addr: addr})
	defer c.Close()
	infos, err := c.List(ctxT(t))
	if err != nil || len(infos) != len(names) {
		t.Fatalf("client List = %d models, %v; want %d", len(infos), err, len(names))
	}
}

// TestListRefusesBadTokens: a token the hub did not hand out is
// InvalidArgument, and the error never quotes it.
func TestListRefusesBadTokens(t *testing.T) {
	h := start(t, store.Config{})
	pushN(t, h, []string{"a", "b"})
	huge := strings.Repeat("Q", 1<<20)
	for _, tok := range []string{"garbage", "n1.", "n1.!!!", "n1." + huge, huge} {
		_, err := h.rpc.List(ctxT(t), &rlhubv1.StoreListRequest{PageToken: tok})
		st := status.Convert(err)
		if st.Code() != codes.InvalidArgument || len(st.Message()) > 256 || strings.Contains(st.Message(), "QQQQ") || !strings.Contains(st.Message(), "page_token") {
			t.Errorf("token of %d bytes: %v %.300q; want InvalidArgument naming page_token, without the token", len(tok), st.Code(), st.Message())
		}
	}
}

// stuckStore is a ModelStore whose List never reaches a last page.
type stuckStore struct {
	rlhubv1.UnimplementedModelStoreServer
	empty bool // empty pages with fresh tokens; else one model and the same token
	calls atomic.Int32
}

func (s *stuckStore) List(ctx context.Context, req *rlhubv1.StoreListRequest) (*rlhubv1.StoreListResponse, error) {
	n := s.calls.Add(1)
	if s.empty {
		return &rlhubv1.StoreListResponse{NextPageToken: fmt.Sprint("t", n)}, nil
	}
	return &rlhubv1.StoreListResponse{Models: []*rlhubv1.StoreModelInfo{{Name: "m", Version: 1}}, NextPageToken: "same"}, nil
}

// TestClientListGuardsAgainstStuckPages: a hub whose pages do not move
// forward (the same token again, an empty page with a token, a page not
// after the previous one) fails the List promptly rather than looping.
func TestClientListGuardsAgainstStuckPages(t *testing.T) {
	for _, empty := range []bool{false, true} {
		s := &stuckStore{empty: empty}
		addr := testkit.ServeGRPC(t, nil, func(g *grpc.Server) { rlhubv1.RegisterModelStoreServer(g, s) })
		c := newClient(t, storerpc.ClientConfig{Addr: addr, MaxAttempts: 1, CallTimeout: 20 * time.Second})
		infos, err := c.List(ctxT(t))
		if err == nil || !strings.Contains(err.Error(), "protocol") || s.calls.Load() > 2 {
			t.Errorf("empty pages %v: List = %d models, %v after %d calls; want a protocol error", empty, len(infos), err, s.calls.Load())
		}
		c.Close()
	}
}
