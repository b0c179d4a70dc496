package cluster

// The standby refusal: the one answer a hub that is not the primary gives
// to every write and coordinator call, on both planes. Servers build it
// with Refuse (or Refusal.Status / Refusal.Trailer); clients recognise it
// with AsRefusal, whatever plane it came over, and learn where the
// primary is.
//
// Contract (docs/cluster.md):
//   - code Unavailable;
//   - message "rlhub: this hub is a standby; the primary is ADDR (epoch N)",
//     or "rlhub: this hub is a standby; the primary is unknown" while an
//     election runs;
//   - gRPC trailing metadata rlhub-primary: ADDR and rlhub-epoch: N (absent
//     while unknown);
//   - an ErrorInfo detail (reason STANDBY, domain rlhub, metadata primary
//     and epoch), which is what reaches a data-plane client in the final
//     frame, beside the same message.

import (
	"context"
	"errors"
	"strconv"
	"strings"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	gstatus "google.golang.org/grpc/status"

	"github.com/rlhub/rlhub/internal/errs"
)

// Trailer keys of the refusal.
const (
	TrailerPrimary = "rlhub-primary"
	TrailerEpoch   = "rlhub-epoch"
)

const (
	refusalPrefix = "rlhub: this hub is a standby; the primary is "
	refusalReason = "STANDBY"
	refusalDomain = "rlhub"
	// maxAddrBytes bounds the primary address a refusal carries or a
	// client accepts from one (a host name plus a port).
	maxAddrBytes = 300
)

// Refusal is a standby's answer: where the primary is, if known. It is an
// error matching errs.ErrUnavailable, and a gRPC status error (so
// grpcerr.ToStatus and the data plane pass it through unchanged).
type Refusal struct {
	// Primary is the primary's address, "" while unknown.
	Primary string
	// Epoch is the primary's term, 0 while unknown.
	Epoch uint64
}

// Known reports whether the refusal names a primary.
func (r *Refusal) Known() bool { return r.Primary != "" }

// Error is the contract's message.
func (r *Refusal) Error() string {
	if !r.Known() {
		return refusalPrefix + "unknown"
	}
	return refusalPrefix + r.Primary + " (epoch " + strconv.FormatUint(r.Epoch, 10) + ")"
}

// Unwrap makes a refusal match errs.ErrUnavailable: every client that
// retries Unavailable retries it.
func (r *Refusal) Unwrap() error { return errs.ErrUnavailable }

// GRPCStatus is the refusal as a status: Unavailable, the message, and the
// STANDBY ErrorInfo detail.
func (r *Refusal) GRPCStatus() *gstatus.Status {
	st := gstatus.New(codes.Unavailable, r.Error())
	md := map[string]string{}
	if r.Known() {
		md["primary"] = r.Primary
		md["epoch"] = strconv.FormatUint(r.Epoch, 10)
	}
	if d, err := st.WithDetails(&errdetails.ErrorInfo{Reason: refusalReason, Domain: refusalDomain, Metadata: md}); err == nil {
		st = d
	}
	return st
}

// Trailer is the refusal's trailing metadata (empty while unknown).
func (r *Refusal) Trailer() metadata.MD {
	if !r.Known() {
		return metadata.MD{}
	}
	return metadata.Pairs(TrailerPrimary, r.Primary, TrailerEpoch, strconv.FormatUint(r.Epoch, 10))
}

// NewRefusal builds the refusal for a standby that knows leader (nil or
// an empty address: unknown). An address longer than the contract allows
// is reported as unknown rather than sent.
func NewRefusal(leader *Leader) *Refusal {
	if leader == nil || leader.Addr == "" || len(leader.Addr) > maxAddrBytes {
		return &Refusal{}
	}
	return &Refusal{Primary: leader.Addr, Epoch: leader.Epoch}
}

// Refuse is the server side of a gRPC call: it sets the refusal's
// trailers on the call in ctx (unary) and returns the status error to
// return from the handler or interceptor. For a stream, call
// ss.SetTrailer(r.Trailer()) and return r.
func Refuse(ctx context.Context, r *Refusal) error {
	_ = grpc.SetTrailer(ctx, r.Trailer()) // fails only outside a call
	return r
}

// RefuseStream is Refuse for a streaming call: it sets the trailers on
// ss and returns the status error.
func RefuseStream(ss grpc.ServerStream, r *Refusal) error {
	ss.SetTrailer(r.Trailer())
	return r
}

// AsRefusal recognises a standby's refusal in err (a gRPC error, a
// data-plane error, or an error wrapping either, including one already
// through grpcerr.FromStatus), with the call's trailer if the caller
// captured it (grpc.Trailer; nil otherwise). The ErrorInfo detail wins,
// then the trailer, then the message text. It reports false for any other
// error, and for an Unavailable that is not a refusal (a hub that is
// down).
func AsRefusal(err error, trailer metadata.MD) (*Refusal, bool) {
	if err == nil {
		return nil, false
	}
	var r *Refusal
	if errors.As(err, &r) {
		return r, true
	}
	var st *gstatus.Status
	var gs interface{ GRPCStatus() *gstatus.Status }
	if errors.As(err, &gs) {
		st = gs.GRPCStatus()
	} else if s, ok := gstatus.FromError(err); ok {
		st = s
	}
	if st != nil && st.Code() != codes.Unavailable {
		return nil, false
	}
	if st != nil {
		for _, d := range st.Details() {
			if info, ok := d.(*errdetails.ErrorInfo); ok && info.Reason == refusalReason && info.Domain == refusalDomain {
				return fromPair(info.Metadata["primary"], info.Metadata["epoch"]), true
			}
		}
	}
	if p := trailer.Get(TrailerPrimary); len(p) > 0 {
		var ep string
		if e := trailer.Get(TrailerEpoch); len(e) > 0 {
			ep = e[0]
		}
		return fromPair(p[0], ep), true
	}
	msg := err.Error()
	if st != nil {
		msg = st.Message()
	}
	return ParseRefusal(msg)
}

func fromPair(addr, epoch string) *Refusal {
	ep, err := strconv.ParseUint(epoch, 10, 64)
	if err != nil || !NamesPrimary(addr) {
		return &Refusal{}
	}
	return &Refusal{Primary: addr, Epoch: ep}
}

// NamesPrimary reports whether addr is an address a hub may name as the
// primary (in a refusal, or answering Cluster/Primary): not empty, at
// most 300 bytes, no white space. A client takes any other as naming no
// primary.
func NamesPrimary(addr string) bool {
	return addr != "" && len(addr) <= maxAddrBytes && !strings.ContainsAny(addr, " \t\r\n")
}

// ParseRefusal recognises the contract's message text anywhere in msg
// (clients prefix errors with their own context). It is the fallback for
// a client that has neither the detail nor the trailers.
func ParseRefusal(msg string) (*Refusal, bool) {
	i := strings.Index(msg, refusalPrefix)
	if i < 0 {
		return nil, false
	}
	rest := msg[i+len(refusalPrefix):]
	if strings.HasPrefix(rest, "unknown") {
		return &Refusal{}, true
	}
	addr, tail, ok := strings.Cut(rest, " (epoch ")
	if !ok {
		return &Refusal{}, true
	}
	ep, _, ok := strings.Cut(tail, ")")
	if !ok {
		return &Refusal{}, true
	}
	return fromPair(addr, ep), true
}

// String is the refusal's message.
func (r *Refusal) String() string { return r.Error() }
