package storerpc_test

import (
	"errors"
	"strings"
	"testing"

	"google.golang.org/grpc"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/store/storerpc"
	"github.com/rlhub/rlhub/internal/store/storetest"
	"github.com/rlhub/rlhub/internal/testkit"
	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// namedPull answers every pull with version v of model name.
type namedPull struct {
	rlhubv1.UnimplementedModelStoreServer
	name  string
	v     uint64
	total uint64
	data  []byte
}

func (s *namedPull) Pull(_ *rlhubv1.StorePullRequest, ss grpc.ServerStreamingServer[rlhubv1.StorePullResponse]) error {
	hdr := &rlhubv1.StorePullHeader{Blob: &rlhubv1.BlobInfo{Model: s.name, Version: s.v, TotalBytes: s.total}}
	if err := ss.Send(&rlhubv1.StorePullResponse{Body: &rlhubv1.StorePullResponse_Header{Header: hdr}}); err != nil {
		return err
	}
	if len(s.data) > 0 {
		return ss.Send(&rlhubv1.StorePullResponse{Body: &rlhubv1.StorePullResponse_Chunk{Chunk: &rlhubv1.Chunk{Data: s.data}}})
	}
	return nil
}

func serveNamed(t *testing.T, s *namedPull) string {
	return testkit.ServeGRPC(t, nil, func(g *grpc.Server) { rlhubv1.RegisterModelStoreServer(g, s) })
}

// A hub's model name reaches the client's error bounded (errs.Quote), on
// gRPC as on the data plane: an 8 MiB name made 8 MiB of error text.
func TestPullErrorQuotesTheHubsModelName(t *testing.T) {
	srv := &namedPull{name: strings.Repeat("A", 8<<20), v: 1, total: 5 << 30}
	c := newClient(t, storerpc.ClientConfig{Addr: serveNamed(t, srv), Transport: "grpc", MaxAttempts: 1})
	t.Cleanup(func() { c.Close() })
	_, err := c.Get(ctxT(t), "m", 0)
	if err == nil {
		t.Fatal("a 5 GiB version of an 8 MiB name: no error")
	}
	if n := len(err.Error()); n > 4096 {
		t.Fatalf("error text is %d bytes long (starts %.80q)", n, err.Error())
	}
}

// A pull's answer must be what was asked for: the model asked for, the
// version asked for, a version newer than the one the caller has. A hub
// answering otherwise is refused InvalidArgument, not delivered (a
// receiver would copy another model's weights into its own, a watch go
// backwards).
func TestPullRefusesAnAnswerThatWasNotAskedFor(t *testing.T) {
	blob := storetest.Blob(t, 3, 1000)
	srv := &namedPull{name: "b", v: 3, total: uint64(len(blob)), data: blob}
	c := newClient(t, storerpc.ClientConfig{Addr: serveNamed(t, srv), Transport: "grpc", MaxAttempts: 1})
	t.Cleanup(func() { c.Close() })
	ctx := ctxT(t)
	if snap, err := c.GetIfNewer(ctx, "a", 1); !errors.Is(err, errs.ErrInvalid) || snap != nil {
		t.Fatalf("GetIfNewer(a) answered by model b: %v, %v", snap, err)
	}
	srv.name = "a"
	if snap, err := c.GetIfNewer(ctx, "a", 5); !errors.Is(err, errs.ErrInvalid) || snap != nil {
		t.Fatalf("GetIfNewer(a, than 5) answered by version 3: %v, %v", snap, err)
	}
	if snap, err := c.Get(ctx, "a", 7); !errors.Is(err, errs.ErrInvalid) || snap != nil {
		t.Fatalf("Get(a, 7) answered by version 3: %v, %v", snap, err)
	}
	if snap, err := c.Get(ctx, "a", 0); err != nil || snap.Version != 3 {
		t.Fatalf("Get(a, newest): %v, %v", snap, err)
	}
}
