package replica

import (
	"context"
	"net"

	"google.golang.org/grpc"

	"github.com/rlhub/rlhub/internal/auth"
	"github.com/rlhub/rlhub/internal/cluster"
	"github.com/rlhub/rlhub/internal/clusterrpc"
	"github.com/rlhub/rlhub/internal/hub"
	"github.com/rlhub/rlhub/internal/testkit"
)

// StartStandbyForTest serves a standby's own calls on lis (its position:
// unit of epoch; every other call refused), checking tokens with guard
// when set; stop ends it.
func StartStandbyForTest(lis net.Listener, guard *auth.Verifier, epoch, unit uint64) (stop func() error) {
	s := startStandby(lis, nil, guard, hub.Limits{}, nil, func() *cluster.Refusal { return cluster.NewRefusal(nil) },
		func() position { return position{Epoch: epoch, Unit: unit} }, nil)
	return s.stop
}

// StartCappedStandbyForTest is StartStandbyForTest with the hub's
// maxStreamsPerPeer (hub.Limits.MaxStreamsPerPeer), refusals naming
// primary, and the cluster's Primary service (answering primary); held
// is how many calls the peer ip has in progress there.
func StartCappedStandbyForTest(lis net.Listener, guard *auth.Verifier, maxStreamsPerPeer int, primary string) (stop func() error, held func(ip string) int, err error) {
	csvc, err := clusterrpc.New(clusterrpc.Config{Self: func() string { return primary }})
	if err != nil {
		return nil, nil, err
	}
	s := startStandby(lis, nil, guard, hub.Limits{MaxStreamsPerPeer: maxStreamsPerPeer}, testkit.Logger(), func() *cluster.Refusal {
		return cluster.NewRefusal(&cluster.Leader{ID: "p", Addr: primary, Epoch: 7})
	}, func() position { return position{Epoch: 7, Unit: 1} }, []Registrar{csvc})
	return s.stop, s.calls.Held, nil
}

// QueryPositionForTest is an elected hub's position query to the standby
// at cc.
func QueryPositionForTest(ctx context.Context, cc *grpc.ClientConn) (epoch, unit uint64, err error) {
	p, err := queryPosition(ctx, cc, "test")
	return p.Epoch, p.Unit, err
}

// PositionForTest is the copy's position (what a position query answers).
func (f *Follower) PositionForTest() (epoch, unit uint64) {
	p := f.position()
	return p.Epoch, p.Unit
}
