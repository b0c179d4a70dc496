package replica

import (
	"context"
	"net"

	"google.golang.org/grpc"

	"github.com/rlhub/rlhub/internal/auth"
	"github.com/rlhub/rlhub/internal/cluster"
)

// StartStandbyForTest serves a standby's own calls on lis (its position:
// unit of epoch; every other call refused), checking tokens with guard
// when set; stop ends it.
func StartStandbyForTest(lis net.Listener, guard *auth.Verifier, epoch, unit uint64) (stop func() error) {
	s := startStandby(lis, nil, guard, func() *cluster.Refusal { return cluster.NewRefusal(nil) },
		func() position { return position{Epoch: epoch, Unit: unit} }, nil)
	return s.stop
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
