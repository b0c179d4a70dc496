package replica

import (
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"net"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/tap"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/rlhub/rlhub/internal/auth"
	"github.com/rlhub/rlhub/internal/cluster"
	"github.com/rlhub/rlhub/internal/hub"
	"github.com/rlhub/rlhub/internal/reducer"
	"github.com/rlhub/rlhub/internal/store/storerpc"
	"github.com/rlhub/rlhub/internal/wire/bulk"
	"github.com/rlhub/rlhub/internal/wire/chunkcodec"
	"github.com/rlhub/rlhub/internal/wire/messagedue"
	"github.com/rlhub/rlhub/internal/wire/streamcap"
	"github.com/rlhub/rlhub/internal/wsync"
	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// Registrar attaches a service that a standby serves too (the cluster's
// Primary service: every hub answers who the primary is).
type Registrar interface {
	Register(*grpc.Server)
}

// standbyServer is what a standby hub serves on its address: health,
// the registrars, and the refusal for every other call on both planes.
type standbyServer struct {
	grpc    *grpc.Server
	bulk    *bulk.Server
	calls   *streamcap.Calls // calls in progress per peer, from their headers (nil: no cap)
	serveCh chan error
}

// bulkMethods are the hub's data-plane methods, each refused by a standby
// with the contract's status (an unknown method would be Unimplemented).
var bulkMethods = []string{reducer.BulkPushMethod, reducer.BulkForwardMethod, storerpc.BulkPullMethod, storerpc.BulkWatchMethod,
	wsync.DataPlaneWatchMethod, BulkFollowMethod}

// startStandby serves lis as a standby. guard, when set (the hub's
// tokens), admits the replication stream (the position query) as the
// primary admits it: the admin token the followers carry (policy table:
// /rlhub.v1.Replica/Follow); nil admits it without a token, as the primary
// without --token-file does. lim are the hub's limits, validated or not:
// by lim.MaxStreamsPerPeer (0 its default, negative no cap) a peer may
// have twice as many calls in progress here, as on the primary, and the
// listener holds a peer to the primary's connection cap, frame, idle and
// body timeouts (hub.Limits.ApplyBulk). logger reports the calls cut
// (nil: slog.Default()).
func startStandby(lis net.Listener, tlsCfg *tls.Config, guard *auth.Verifier, lim hub.Limits, logger *slog.Logger,
	refusal func() *cluster.Refusal, pos func() position, extra []Registrar) *standbyServer {
	opts := append([]grpc.ServerOption{
		grpc.UnknownServiceHandler(func(_ any, ss grpc.ServerStream) error {
			return cluster.RefuseStream(ss, refusal())
		}),
		grpc.ConnectionTimeout(standbyHandshake),
		grpc.MaxRecvMsgSize(standbyMaxMsgBytes),
	}, chunkcodec.ServerOptions()...)
	if tlsCfg != nil {
		opts = append(opts, grpc.Creds(bulk.TLSCredentials()))
	}
	// The standby answers callers without a token (below), so they are
	// bounded on their headers instead, as on the primary: the calls a
	// peer has in progress, and the clock of each call's message. Without
	// them a peer held a goroutine and up to 4 MiB (gRPC's default
	// receive limit) per unary call it never finished, any number of
	// them, for as long as its connection lived.
	s := &standbyServer{bulk: bulk.NewServer(), serveCh: make(chan error, 1)}
	switch {
	case lim.MaxStreamsPerPeer == 0:
		s.calls = streamcap.NewCalls(2 * streamcap.DefaultPerPeer)
	case lim.MaxStreamsPerPeer > 0:
		s.calls = streamcap.NewCalls(2 * lim.MaxStreamsPerPeer)
	}
	// The listener is the hub's address, both planes: a peer is held to
	// --max-conns-per-peer and --frame-timeout here as on the primary
	// (before: the data plane's defaults, 256 connections and 10 s,
	// whatever the flags said).
	lim.ApplyBulk(s.bulk)
	due := messagedue.Clock{After: standbyMessageDue, Bound: "the standby's " + standbyMessageDue.String(), Logger: logger}
	opts = append(opts, due.ServerOptions()...) // first in the chains: before the tokens' check
	opts = append(opts, grpc.InTapHandle(func(ctx context.Context, info *tap.Info) (context.Context, error) {
		if s.calls != nil {
			if err := s.calls.Tap(ctx); err != nil {
				return nil, err
			}
		}
		return due.Arm(ctx, info.FullMethodName), nil
	}))
	if guard != nil {
		// Only the position query: the refusals, health and Cluster/Primary
		// answer every caller (a client learns where the primary is before
		// it has a token checked there).
		check := guard.StreamInterceptor()
		opts = append(opts, grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			if info.FullMethod != FollowMethod {
				return h(srv, ss)
			}
			return check(srv, ss, info, h)
		}))
		// Cluster/Replication (a member's place in the replication) wants
		// the policy's reader token here as on the primary; Cluster/Primary
		// and health answer every caller.
		checkUnary := guard.UnaryInterceptor()
		opts = append(opts, grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			if info.FullMethod != rlhubv1.Cluster_Replication_FullMethodName {
				return h(ctx, req)
			}
			return checkUnary(ctx, req, info, h)
		}))
	}
	s.grpc = grpc.NewServer(opts...)
	hs := health.NewServer()
	hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(s.grpc, hs)
	for _, r := range extra {
		r.Register(s.grpc)
	}
	rlhubv1.RegisterReplicaServer(s.grpc, positionServer{pos: pos, refusal: refusal})
	if tlsCfg != nil {
		s.bulk.TLS = bulk.ServerTLS(tlsCfg)
	}
	for _, m := range bulkMethods {
		s.bulk.Handle(m, func(context.Context, *bulk.Request) (proto.Message, error) { return nil, refusal() })
	}
	g := s.bulk.Listen(lis)
	go func() { s.serveCh <- s.grpc.Serve(g) }()
	return s
}

// standbyMaxMsgBytes bounds a request message the standby reads. Every
// one is tiny: Cluster/Primary's and Cluster/Replication's are empty, a
// health check names a service, the position query's hello is some 150
// bytes (a member id is at most 64: cluster.ValidID). A follower's own hello over gRPC (its files'
// list) may be larger: it fails ResourceExhausted where it was refused
// (grpc-go ends the call itself), and the follower reads the primary
// from etcd again either way. A call the standby refuses is answered
// whatever its message's size: the refusal reads none.
const standbyMaxMsgBytes = 16 << 10

// standbyMessageDue bounds the time from a call's headers to its whole
// request message (messagedue): a client sends its few bytes right after
// the headers; the rest is room for a loaded machine.
const standbyMessageDue = 5 * time.Second

// standbyDrain bounds how long a stopping standby server lets calls in
// progress finish: the hub that takes over waits for it.
const standbyDrain = 250 * time.Millisecond

// standbyHandshake bounds a gRPC connection's HTTP/2 handshake on the
// standby server (grpc.ConnectionTimeout; gRPC's default is 120 s). Its
// Stop waits for every handshake in progress, and a peer stopped in the
// middle of one — a newly elected hub SIGSTOPped while it asked this
// standby's position, its preface sent and its SETTINGS not — held this
// standby's takeover for that long (issue 15: two primaries stopped one
// after the other). A client that has sent its first bytes sends the
// rest of its preface at once; one cut here reconnects.
const standbyHandshake = time.Second

// positionServer answers a newly elected primary's position query on the
// replication stream (it yields the term to a standby whose copy is ahead
// of its own: docs/cluster.md); any other use of the stream is refused.
type positionServer struct {
	rlhubv1.UnimplementedReplicaServer
	pos     func() position
	refusal func() *cluster.Refusal
}

// Follow implements rlhubv1.ReplicaServer.
func (p positionServer) Follow(ss grpc.BidiStreamingServer[wrapperspb.BytesValue, wrapperspb.BytesValue]) error {
	var m wrapperspb.BytesValue
	if err := ss.RecvMsg(&m); err != nil {
		return err
	}
	var h hello
	if b := m.GetValue(); len(b) > 0 && b[0] == kindHello && parseJSON(b[1:], &h) == nil && h.Query {
		return ss.SendMsg(jsonFrame(kindPos, p.pos()))
	}
	return cluster.RefuseStream(ss, p.refusal())
}

// stop ends the standby's use of the socket, closes its connections and
// waits for its goroutines. Calls in progress finish first, for at most
// standbyDrain (every call a standby answers is short: a refusal, a
// position, the primary's address), and a client's next call, sent after
// the server's GOAWAY, reaches the hub that takes over on a new
// connection instead of failing; a long stream (a health watch) is cut
// at standbyDrain.
func (s *standbyServer) stop() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	done := make(chan struct{})
	go func() { _ = s.bulk.Shutdown(ctx); close(done) }()
	graceful := make(chan struct{})
	go func() { s.grpc.GracefulStop(); close(graceful) }()
	select {
	case <-graceful:
	case <-time.After(standbyDrain):
		s.grpc.Stop()
		<-graceful
	}
	<-done
	err := <-s.serveCh
	if errors.Is(err, grpc.ErrServerStopped) {
		err = nil
	}
	return err
}
