package reducer

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"google.golang.org/grpc"

	"github.com/rlhub/rlhub/internal/dial"
	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/errs/grpcerr"
	"github.com/rlhub/rlhub/internal/reduce"
	"github.com/rlhub/rlhub/internal/safetensors"
	"github.com/rlhub/rlhub/internal/wire/bulk"
	"github.com/rlhub/rlhub/internal/wire/chunkcodec"
	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// RemotePrimary is an Upstream that reaches a primary over gRPC, and
// forwards batch sums on the primary hub's data plane when it has one.
type RemotePrimary struct {
	c    rlhubv1.ReducerPrimaryClient
	conn grpc.ClientConnInterface
	addr string       // the primary hub's address (or its cluster), for the data plane
	bulk *bulk.Client // nil without addr

	mu       sync.Mutex
	sessions map[uint64]*remoteSession
}

type remoteSession struct {
	cancel context.CancelFunc
	done   chan struct{} // closed when the reader goroutine ends
}

// NewRemotePrimary wraps a connection to a hub hosting the primary. The
// caller owns conn and closes it after the secondaries using this, and
// Close. addr, if not "", is that hub's address: batch sums then travel
// on its data plane (package bulk), or over conn if it has none. On a
// cluster (addr a hub list or etcd://…, conn from dial.Config.GRPC of
// it) the data plane is the primary's that conn follows now
// (dial.PlaneAddr), and a failed forward makes conn resolve it again.
func NewRemotePrimary(conn grpc.ClientConnInterface, addr string) *RemotePrimary {
	r := &RemotePrimary{c: rlhubv1.NewReducerPrimaryClient(conn), conn: conn, addr: addr, sessions: map[uint64]*remoteSession{}}
	if addr != "" {
		r.bulk = bulk.NewClient() // replaced by the caller's dial.Config's (service.go)
	}
	return r
}

// Close closes the data-plane connections.
func (r *RemotePrimary) Close() error {
	if r.bulk != nil {
		return r.bulk.Close()
	}
	return nil
}

// targeted is what a connection from dial.Config.GRPC tells: its target,
// by which package dial finds the primary it follows.
type targeted interface{ Target() string }

// planeAddr is where the data plane dials: addr itself, or on a cluster
// the primary r.conn follows now; false without a data plane or while a
// cluster knows no primary yet (the forward then goes over gRPC, which
// waits for one).
func (r *RemotePrimary) planeAddr() (string, bool) {
	if r.bulk == nil {
		return "", false
	}
	c, _ := r.conn.(targeted)
	return dial.PlaneAddr(c, r.addr)
}

// planeFailed tells a connection following a cluster that a forward on
// the data plane failed: a standby's refusal names the primary to follow,
// anything else has it resolved again.
func (r *RemotePrimary) planeFailed(err error) {
	if c, ok := r.conn.(targeted); ok {
		dial.PlaneFailed(c, err)
	}
}

var _ Upstream = (*RemotePrimary)(nil)
var _ Upstream = (*Primary)(nil)

// Attach opens the session stream; done closes when it breaks. ctx bounds
// the attach itself: opening the stream (which on a cluster target waits
// for a primary, up to dial's FollowTimeout) and its first event. The
// stream then lives until Detach or a break, not with ctx.
func (r *RemotePrimary) Attach(ctx context.Context, s Secondary) (uint64, <-chan struct{}, error) {
	sctx, cancel := context.WithCancel(context.Background())
	// Until the session is established, ctx's end cancels the stream:
	// SecondaryNode.Close cancels ctx and waits for this call, so an
	// attach waiting for a primary must not outlive it.
	unbound := context.AfterFunc(ctx, cancel)
	var ev *rlhubv1.ReducerAttachEvent
	stream, err := r.c.Attach(sctx, &rlhubv1.ReducerAttachRequest{Addr: s.Addr, Id: s.ID})
	if err == nil {
		ev, err = stream.Recv()
	}
	if !unbound() { // ctx ended: cancel has run or is running
		cancel()
		return 0, nil, ctx.Err()
	}
	if err != nil {
		cancel()
		return 0, nil, grpcerr.FromStatus(err)
	}
	rs := &remoteSession{cancel: cancel, done: make(chan struct{})}
	go func() { // owned by the session: ended by Detach (cancel) or a break
		defer close(rs.done)
		for {
			if _, err := stream.Recv(); err != nil {
				return
			}
		}
	}()
	r.mu.Lock()
	r.sessions[ev.GetSession()] = rs
	r.mu.Unlock()
	return ev.GetSession(), rs.done, nil
}

// Detach ends the session stream and waits for its reader.
func (r *RemotePrimary) Detach(session uint64) {
	r.mu.Lock()
	rs := r.sessions[session]
	delete(r.sessions, session)
	r.mu.Unlock()
	if rs != nil {
		rs.cancel()
		<-rs.done
	}
}

func callCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, 30*time.Second)
}

// Describe implements Upstream.
func (r *RemotePrimary) Describe(ctx context.Context, model string) (Layout, error) {
	ctx, cancel := callCtx(ctx)
	defer cancel()
	resp, err := r.c.Describe(ctx, &rlhubv1.ReducerDescribeRequest{Model: model})
	if err != nil {
		return Layout{}, grpcerr.FromStatus(err)
	}
	sd, err := layoutFromProto(resp.GetTensors())
	if err != nil {
		return Layout{}, err
	}
	return Layout{Tensors: sd, Version: resp.GetVersion()}, nil
}

// Admit implements Upstream.
func (r *RemotePrimary) Admit(ctx context.Context, session uint64, model string, id reduce.ID, base, life uint64) (float32, uint64, error) {
	ctx, cancel := callCtx(ctx)
	defer cancel()
	resp, err := r.c.Admit(ctx, &rlhubv1.ReducerAdmitRequest{Session: session, Model: model, ClientId: id.Client, Seq: id.Seq, BaseVersion: base, BaseLife: life})
	if err != nil {
		return 0, 0, grpcerr.FromStatus(err)
	}
	return resp.GetWeight(), resp.GetVersion(), nil
}

// Release implements Upstream.
func (r *RemotePrimary) Release(ctx context.Context, session uint64, model string, ids []reduce.ID) (int, error) {
	ctx, cancel := callCtx(ctx)
	defer cancel()
	resp, err := r.c.Release(ctx, &rlhubv1.ReducerReleaseRequest{Session: session, Model: model, Ids: idsToProto(ids)})
	if err != nil {
		return 0, grpcerr.FromStatus(err)
	}
	return int(resp.GetReleased()), nil
}

// Forward implements Upstream: it streams the batch sum without copying it.
func (r *RemotePrimary) Forward(ctx context.Context, b Batch) (uint64, error) {
	l, err := safetensors.Plan(b.Sum, nil)
	if err != nil {
		return 0, err
	}
	ctx, cancel := callCtx(ctx)
	defer cancel()
	var first int64
	if !b.FirstAdmitted.IsZero() {
		first = b.FirstAdmitted.UnixNano()
	}
	hdr := &rlhubv1.ReducerForwardHeader{Session: b.Session, Ids: idsToProto(b.Members), Weights: b.Weights,
		FirstAdmittedUnixNano: first,
		Blob:                  &rlhubv1.BlobInfo{Model: b.Model, TotalBytes: uint64(l.Size)}}
	if addr, ok := r.planeAddr(); ok && r.bulk.Supported(addr) {
		var resp rlhubv1.ReducerForwardResponse
		c, _ := r.conn.(targeted)
		pctx, planeDone := dial.PlaneContext(c, ctx) // ended if the primary moves away
		err := planeDone(r.bulk.Call(pctx, addr, BulkForwardMethod, hdr, net.Buffers(l.Buffers()), &resp))
		if !errors.Is(err, bulk.ErrNotSupported) {
			if err != nil {
				r.planeFailed(err)
			}
			return resp.GetVersion(), err
		}
	}
	stream, err := r.c.Forward(ctx, grpc.CallContentSubtype(chunkcodec.Name))
	if err != nil {
		return 0, grpcerr.FromStatus(err)
	}
	err = stream.Send(&rlhubv1.ReducerForwardRequest{Body: &rlhubv1.ReducerForwardRequest_Header{Header: hdr}})
	if err == nil {
		err = sendStateDict(l, func(p []byte) error {
			return stream.Send(&rlhubv1.ReducerForwardRequest{Body: &rlhubv1.ReducerForwardRequest_Chunk{Chunk: &rlhubv1.Chunk{Data: p}}})
		})
	}
	resp, rerr := stream.CloseAndRecv()
	if rerr != nil {
		return 0, grpcerr.FromStatus(rerr)
	}
	if err != nil {
		return 0, fmt.Errorf("%w: forward: %v", errs.ErrUnavailable, err)
	}
	return resp.GetVersion(), nil
}

var errNoHeader = errors.New("stream did not start with a header")
