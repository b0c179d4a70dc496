package auth

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"

	"github.com/rlhub/rlhub/internal/errs/grpcerr"
	"github.com/rlhub/rlhub/internal/testkit"
	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// tapStore is a ModelStore that counts the calls its handlers ran.
type tapStore struct {
	rlhubv1.UnimplementedModelStoreServer
	lists, deletes atomic.Int32
}

func (s *tapStore) List(context.Context, *rlhubv1.StoreListRequest) (*rlhubv1.StoreListResponse, error) {
	s.lists.Add(1)
	return &rlhubv1.StoreListResponse{}, nil
}

func (s *tapStore) Delete(context.Context, *rlhubv1.StoreDeleteRequest) (*rlhubv1.StoreDeleteResponse, error) {
	s.deletes.Add(1)
	return &rlhubv1.StoreDeleteResponse{}, nil
}

func (s *tapStore) Watch(_ *rlhubv1.StoreWatchRequest, ss grpc.ServerStreamingServer[rlhubv1.StorePullResponse]) error {
	return ss.Send(&rlhubv1.StorePullResponse{})
}

// serveTapped serves a tapStore on 127.0.0.1 behind v as a hub wires it:
// Tap on the headers, then the interceptors.
func serveTapped(t *testing.T, v *Verifier) (*tapStore, *grpc.ClientConn) {
	t.Helper()
	s := &tapStore{}
	addr := testkit.ServeGRPC(t, nil, func(g *grpc.Server) { rlhubv1.RegisterModelStoreServer(g, s) },
		grpc.InTapHandle(func(ctx context.Context, info *tap.Info) (context.Context, error) {
			ctx, err := v.Tap(ctx, info.FullMethodName, info.Header)
			return ctx, grpcerr.ToStatus(err)
		}),
		grpc.ChainUnaryInterceptor(v.UnaryInterceptor()), grpc.ChainStreamInterceptor(v.StreamInterceptor()))
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return s, conn
}

// TestTokenLookedUpOncePerCall: a call the tap admitted on its headers is
// not hashed and looked up again by the interceptors (before: twice per
// call, unary or stream).
func TestTokenLookedUpOncePerCall(t *testing.T) {
	tok, hash, err := NewToken()
	if err != nil {
		t.Fatal(err)
	}
	v := NewVerifier(map[string]Principal{hash: {Name: "r", Role: Reader, Scopes: []string{""}}})
	s, conn := serveTapped(t, v)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, TokenHeader, "Bearer "+tok)
	c := rlhubv1.NewModelStoreClient(conn)
	before := v.stats.lookups.Load()
	if _, err := c.List(ctx, &rlhubv1.StoreListRequest{}); err != nil {
		t.Fatal(err)
	}
	if n := v.stats.lookups.Load() - before; n != 1 || s.lists.Load() != 1 {
		t.Errorf("a unary call looked its token up %d times (handler ran %d times), want once", n, s.lists.Load())
	}
	before = v.stats.lookups.Load()
	w, err := c.Watch(ctx, &rlhubv1.StoreWatchRequest{Model: "m"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Recv(); err != nil {
		t.Fatal(err)
	}
	if n := v.stats.lookups.Load() - before; n != 1 {
		t.Errorf("a stream looked its token up %d times, want once", n)
	}
}

// TestTokenRevokedWhileAUnaryMessageArrivesIsRefused: the tap admits a
// unary call on its headers; a token revoked before its message is in is
// refused by the interceptor, and the handler never runs (the admission
// the tap kept is not taken on trust).
func TestTokenRevokedWhileAUnaryMessageArrivesIsRefused(t *testing.T) {
	tok, hash, err := NewToken()
	if err != nil {
		t.Fatal(err)
	}
	v := NewVerifier(map[string]Principal{hash: {Name: "a", Role: Admin, Scopes: []string{""}}})
	s, conn := serveTapped(t, v)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, TokenHeader, "Bearer "+tok)
	// A stream on the unary method: its headers go now, its message later.
	cs, err := conn.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}, rlhubv1.ModelStore_Delete_FullMethodName)
	if err != nil {
		t.Fatal(err)
	}
	// The headers were admitted once the tap looked the token up.
	testkit.Eventually(t, 10*time.Second, "the tap to admit the headers", func() bool { return v.stats.lookups.Load() == 1 })
	v.Replace(map[string]Principal{})
	if err := cs.SendMsg(&rlhubv1.StoreDeleteRequest{Model: "m"}); err != nil {
		t.Fatal(err)
	}
	if err := cs.CloseSend(); err != nil {
		t.Fatal(err)
	}
	var resp rlhubv1.StoreDeleteResponse
	if err := cs.RecvMsg(&resp); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("a revoked token's delete: %v, want Unauthenticated", err)
	}
	if n := s.deletes.Load(); n != 0 {
		t.Fatalf("the delete handler ran %d times for a revoked token", n)
	}
}
