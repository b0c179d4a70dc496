package dial

import (
	"context"
	"strings"
)

// The data plane (package bulk) dials addresses itself and makes no gRPC
// call a cluster connection would learn from, so a data-plane client on a
// cluster target follows the primary through the gRPC connection of the
// same target, in two steps that every such client (the store client's
// pulls, the relay's upstream watch, weight-sync collectors) takes alike:
//
//  1. before each request, PlaneAddr: where to dial now;
//  2. after a request failed, PlaneFailed: a standby's refusal (its error
//     frame carries the refusal's text) makes the connection follow the
//     primary it names; any other failure makes it resolve again, so the
//     next PlaneAddr answers the new primary once one is elected.
//
//  3. around the request itself, PlaneContext: when the connection learns
//     (from etcd's election) that the primary moved to another hub, the
//     request still in flight on the old one ends with a
//     *PrimaryMovedError (Unavailable) instead of waiting on a machine
//     that may have died without closing anything.
//
// There is one follower per connection (cluster.go); these only read it
// and feed it, so the data plane and gRPC never disagree for long about
// where the primary is.

// PlaneAddr is where a data-plane request for the client whose address is
// addr and whose gRPC connection is conn should dial: the primary conn
// follows when addr is a cluster target, else addr itself. ok is false
// while a cluster target knows no primary yet (the caller fails the
// request as unavailable and tries again); conn may be nil for a plain
// address.
func PlaneAddr(conn interface{ Target() string }, addr string) (string, bool) {
	if conn != nil {
		if p, ok := CurrentPrimary(conn); ok {
			return p.Addr, true
		}
	}
	if IsCluster(addr) {
		return "", false
	}
	return addr, true
}

// PlaneFailed tells conn (from Config.GRPC on a cluster target) what a
// failed data-plane request saw: a standby's refusal names the primary to
// follow; anything else asks for the primary to be resolved again. A
// plain connection, a nil conn or a nil err is ignored.
func PlaneFailed(conn interface{ Target() string }, err error) {
	if conn == nil || err == nil {
		return
	}
	p, _ := RefusalText(err.Error())
	Offer(conn, p)
}

// IsCluster reports whether addr is a cluster target ("h1:p1,h2:p2" or
// "etcd://…") rather than one address. It does not validate addr.
func IsCluster(addr string) bool {
	if strings.HasPrefix(addr, "etcd://") {
		return true
	}
	if !strings.Contains(addr, ",") {
		return false
	}
	t, err := ParseTarget(addr)
	return err != nil || t.Clustered()
}

// PlaneContext is ctx for one data-plane request to the primary conn
// follows (PlaneAddr), ended also when that primary moves to another hub.
// Pass the request's error through done, which releases the context and
// returns a *PrimaryMovedError (Unavailable: follow with PlaneFailed and
// try again, or count the outcome unknown) when the move ended it, err
// otherwise. For a plain connection, or a nil conn, it is ctx.
func PlaneContext(conn interface{ Target() string }, ctx context.Context) (tctx context.Context, done func(err error) error) {
	f := followerOf(conn)
	if f == nil {
		return ctx, func(err error) error { return err }
	}
	tctx, moved, stop := f.inTerm(ctx)
	return tctx, func(err error) error {
		defer stop()
		if pm := moved(); err != nil && pm != nil {
			e := *pm.(*PrimaryMovedError)
			e.Err = err
			return &e
		}
		return err
	}
}
