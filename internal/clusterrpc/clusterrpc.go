// Package clusterrpc serves rlhub.v1.Cluster/Primary: every hub answers
// where the primary is, so a client given any hub's address (or a list of
// them) finds the primary and follows it across failovers (internal/dial's
// cluster targets, python/rlhub/_channel.py).
//
// A hub without a cluster is its own primary at epoch 0 (Source nil). A
// clustered hub sets a Source that reads the election (FromMember): the
// answer is what etcd says now, never a wait for an election.
package clusterrpc

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/rlhub/rlhub/internal/cluster"
	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/errs/grpcerr"
	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// Info is one answer: where the primary is.
type Info struct {
	// Addr is the primary's address; "" while no primary is known.
	Addr string
	// Epoch is the primary's term (0 without a cluster).
	Epoch uint64
	// MemberID is the primary's member id ("" without a cluster).
	MemberID string
	// Self is true when the answering hub is the primary.
	Self bool
	// Cluster names the cluster ("" without one).
	Cluster string
}

// Source tells where the primary is now. It must honour ctx's deadline;
// an error is returned to the caller as its gRPC status (Unavailable when
// etcd cannot be read).
type Source func(ctx context.Context) (Info, error)

// Replication is a member's place in the cluster's replication
// (rlhub.v1.Cluster/Replication).
type Replication struct {
	MemberID string
	Primary  bool
	Epoch    uint64
	// Unit is the newest unit asked for (primary) or applied (standby).
	Unit   uint64
	Synced bool
	// Lag is, on the primary, each connected standby's units not yet
	// acknowledged (Unit minus its newest acknowledged unit), by member id.
	Lag map[string]uint64
}

// Config configures the service.
type Config struct {
	// Self is the hub's own address (a func: it is known only once the
	// hub listens); required. It is the answer while no Source is set.
	Self func() string
}

// Service implements rlhubv1.ClusterServer and hub.Service.
type Service struct {
	rlhubv1.UnimplementedClusterServer
	self func() string
	src  atomic.Pointer[Source]
	repl atomic.Pointer[func() Replication]
}

// New returns a service that answers with the hub itself until SetSource.
func New(cfg Config) (*Service, error) {
	if cfg.Self == nil {
		return nil, errors.New("clusterrpc: Config.Self is required")
	}
	return &Service{self: cfg.Self}, nil
}

// SetSource makes src the answer from now on; nil goes back to "this hub
// is its own primary". Safe to call while serving (a hub joins its cluster
// after it listens).
func (s *Service) SetSource(src Source) {
	if src == nil {
		s.src.Store(nil)
		return
	}
	s.src.Store(&src)
}

// SetReplication makes f the Replication answer (a cluster member's);
// nil: the hub is in no cluster. Safe to call while serving.
func (s *Service) SetReplication(f func() Replication) {
	if f == nil {
		s.repl.Store(nil)
		return
	}
	s.repl.Store(&f)
}

// Replication implements the RPC.
func (s *Service) Replication(ctx context.Context, _ *rlhubv1.ReplicationRequest) (*rlhubv1.ReplicationResponse, error) {
	f := s.repl.Load()
	if f == nil {
		return nil, status.Error(codes.FailedPrecondition, "this hub is in no cluster (serve --etcd)")
	}
	r := (*f)()
	out := &rlhubv1.ReplicationResponse{MemberId: r.MemberID, Primary: r.Primary, Epoch: r.Epoch, Unit: r.Unit, Synced: r.Synced}
	for id, lag := range r.Lag {
		out.Followers = append(out.Followers, &rlhubv1.ReplicationFollower{MemberId: id, Acked: r.Unit - min(lag, r.Unit), Lag: lag})
	}
	slices.SortFunc(out.Followers, func(a, b *rlhubv1.ReplicationFollower) int { return strings.Compare(a.MemberId, b.MemberId) })
	return out, nil
}

// Lookup is the answer the RPC gives, for in-process callers.
func (s *Service) Lookup(ctx context.Context) (Info, error) {
	if p := s.src.Load(); p != nil {
		return (*p)(ctx)
	}
	return Info{Addr: s.self(), Self: true}, nil
}

// Primary implements the RPC.
func (s *Service) Primary(ctx context.Context, _ *rlhubv1.PrimaryRequest) (*rlhubv1.PrimaryResponse, error) {
	in, err := s.Lookup(ctx)
	if err != nil {
		return nil, grpcerr.ToStatus(err)
	}
	return &rlhubv1.PrimaryResponse{Address: in.Addr, Epoch: in.Epoch, MemberId: in.MemberID, Self: in.Self, Cluster: in.Cluster}, nil
}

// Register attaches the service (hub.Service).
func (s *Service) Register(g *grpc.Server) { rlhubv1.RegisterClusterServer(g, s) }

// Close does nothing: the service holds no background work (hub.Service).
func (s *Service) Close() error { return nil }

// FromMember is the Source of a hub that is member m of cluster name: the
// election's current leader, read from etcd on each call. No leader (an
// election running) is an empty Info, not an error.
func FromMember(m *cluster.Member, name string) Source {
	return func(ctx context.Context) (Info, error) {
		l, err := m.Leader(ctx)
		if errors.Is(err, cluster.ErrNoLeader) {
			return Info{Cluster: name}, nil
		}
		if err != nil {
			return Info{}, fmt.Errorf("%w: where the primary is: %v", errs.ErrUnavailable, err)
		}
		return Info{Addr: l.Addr, Epoch: l.Epoch, MemberID: l.ID, Self: l.ID == m.ID(), Cluster: name}, nil
	}
}

// FromProto converts an answer.
func FromProto(r *rlhubv1.PrimaryResponse) Info {
	return Info{Addr: r.GetAddress(), Epoch: r.GetEpoch(), MemberID: r.GetMemberId(), Self: r.GetSelf(), Cluster: r.GetCluster()}
}
