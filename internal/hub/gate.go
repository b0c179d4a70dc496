package hub

import (
	"context"
	"crypto/tls"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/rlhub/rlhub/internal/cluster"
	"github.com/rlhub/rlhub/internal/wire/bulk"
	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// replicaStub is rlhub.v1.Replica on a hub that is not a cluster primary.
type replicaStub struct {
	rlhubv1.UnimplementedReplicaServer
}

func (replicaStub) Register(g *grpc.Server) { rlhubv1.RegisterReplicaServer(g, replicaStub{}) }
func (replicaStub) Close() error            { return nil }
func (replicaStub) Follow(grpc.BidiStreamingServer[wrapperspb.BytesValue, wrapperspb.BytesValue]) error {
	return errNotPrimary
}

// RegisterBulk answers the replication stream's data-plane method
// (replica.BulkFollowMethod) as Follow does.
func (replicaStub) RegisterBulk(b *bulk.Server) {
	b.Handle("rlhub.v1.Replica/Follow", func(context.Context, *bulk.Request) (proto.Message, error) { return nil, errNotPrimary })
}

var errNotPrimary = status.Error(codes.FailedPrecondition, "rlhub: this hub is not a cluster primary: nothing to follow")

// ungated reports whether a gRPC method is answered whatever the hub's
// role: health checks, reflection, and the cluster's own service (which
// says who the primary is).
func ungated(method string) bool {
	return strings.HasPrefix(method, "/grpc.health.v1.") ||
		strings.HasPrefix(method, "/grpc.reflection.") ||
		strings.HasPrefix(method, "/rlhub.v1.Cluster/")
}

func gateUnary(gate func() *cluster.Refusal) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, next grpc.UnaryHandler) (any, error) {
		if !ungated(info.FullMethod) {
			if r := gate(); r != nil {
				return nil, cluster.Refuse(ctx, r)
			}
		}
		return next(ctx, req)
	}
}

func gateStream(gate func() *cluster.Refusal) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, next grpc.StreamHandler) error {
		if !ungated(info.FullMethod) {
			if r := gate(); r != nil {
				return cluster.RefuseStream(ss, r)
			}
		}
		return next(srv, ss)
	}
}

// gateGuard refuses data-plane requests while the gate is shut, before the
// next guard (auth) and before any body byte is read.
type gateGuard struct {
	gate func() *cluster.Refusal
	next bulk.Guard // nil: admit
}

func (g gateGuard) Check(ctx context.Context, token string, st *tls.ConnectionState, method string, header []byte) (context.Context, error) {
	if r := g.gate(); r != nil {
		return ctx, r
	}
	if g.next == nil {
		return ctx, nil
	}
	return g.next.Check(ctx, token, st, method, header)
}

// CheckHello is the next guard's hello check, when it has one: the gate
// refuses requests, never connections (its refusal names the primary).
func (g gateGuard) CheckHello(token string, st *tls.ConnectionState) error {
	if n, ok := g.next.(bulk.HelloGuard); ok {
		return n.CheckHello(token, st)
	}
	return nil
}
