// Package grpcerr is the one table that maps rlhub's error conditions
// (package errs) to gRPC status codes and back. gRPC services return
// grpcerr.ToStatus(err); clients call grpcerr.FromStatus(err) so that
// errors.Is and errors.As work on both sides of the wire.
package grpcerr

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/rlhub/rlhub/internal/errs"
)

var table = []struct {
	err  error
	code codes.Code
}{
	{errs.ErrInvalid, codes.InvalidArgument},
	{errs.ErrNotFound, codes.NotFound},
	{errs.ErrStale, codes.FailedPrecondition},
	{errs.ErrExists, codes.AlreadyExists},
	{errs.ErrFull, codes.ResourceExhausted},
	{errs.ErrUnauthenticated, codes.Unauthenticated},
	{errs.ErrPermission, codes.PermissionDenied},
	{errs.ErrUnavailable, codes.Unavailable},
	{errs.ErrAborted, codes.Aborted},
}

const domain = "rlhub"

// Code returns the gRPC code for err: the code of the first sentinel it
// wraps, Canceled/DeadlineExceeded for context errors, the code of an
// existing status, or Internal.
func Code(err error) codes.Code {
	if err == nil {
		return codes.OK
	}
	for _, row := range table {
		if errors.Is(err, row.err) {
			return row.code
		}
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return codes.DeadlineExceeded
	case errors.Is(err, context.Canceled):
		return codes.Canceled
	}
	if s, ok := status.FromError(err); ok {
		return s.Code()
	}
	return codes.Internal
}

// MaxMessageBytes bounds the message of a status ToStatus makes: the
// message travels in a response header (grpc-message), which peers limit
// to 8-16 KiB with every other header, so an error that quoted a huge
// client input must not reach it whole. Errors that format client input
// use errs.Quote; this is the backstop.
const MaxMessageBytes = 2 << 10

// boundMessage cuts msg to MaxMessageBytes at a rune boundary.
func boundMessage(msg string) string {
	if len(msg) <= MaxMessageBytes {
		return msg
	}
	return errs.Clip(msg, MaxMessageBytes) + "…(truncated)"
}

// ToStatus converts err into a gRPC status error for a service to return.
// A errs.StaleError carries its current version in an ErrorInfo detail.
func ToStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := err.(interface{ GRPCStatus() *status.Status }); ok && Code(err) == status.Code(err) {
		return err
	}
	st := status.New(Code(err), boundMessage(err.Error()))
	var se *errs.StaleError
	if errors.As(err, &se) {
		if d, derr := st.WithDetails(&errdetails.ErrorInfo{
			Reason: "STALE_VERSION",
			Domain: domain,
			Metadata: map[string]string{
				"model":           se.Model,
				"current_version": strconv.FormatUint(se.CurrentVersion, 10),
				"current_epoch":   strconv.FormatUint(se.CurrentEpoch, 10),
				"reason":          boundMessage(se.Reason),
			},
		}); derr == nil {
			st = d
		}
	}
	return st.Err()
}

// remoteError is an error received over gRPC, matching its sentinel.
type remoteError struct {
	sentinel error
	st       *status.Status
}

func (e *remoteError) Error() string              { return e.st.Message() }
func (e *remoteError) Unwrap() error              { return e.sentinel }
func (e *remoteError) GRPCStatus() *status.Status { return e.st }

// FromStatus converts an error returned by a gRPC call back into one that
// matches the sentinels (and *errs.StaleError) with errors.Is / errors.As. Errors
// that are not gRPC statuses are returned unchanged.
func FromStatus(err error) error {
	if err == nil {
		return nil
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	if len(st.Message()) > MaxMessageBytes {
		// A peer's message is bounded as ours are (ToStatus): over the data
		// plane a status may carry 4 MiB, and the error is logged on every
		// retry.
		p := st.Proto()
		p.Message = boundMessage(p.Message)
		st = status.FromProto(p)
		err = st.Err()
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.Reason == "STALE_VERSION" && info.Domain == domain {
			v, _ := strconv.ParseUint(info.Metadata["current_version"], 10, 64)
			ep, _ := strconv.ParseUint(info.Metadata["current_epoch"], 10, 64)
			reason, ok := info.Metadata["reason"]
			if !ok { // from a server before the reason travelled
				reason = st.Message()
			}
			reason = boundMessage(reason)
			return &errs.StaleError{Model: info.Metadata["model"], CurrentVersion: v, CurrentEpoch: ep, Reason: reason, Remote: st.Message()}
		}
	}
	switch st.Code() {
	case codes.DeadlineExceeded:
		return fmt.Errorf("%s: %w", st.Message(), context.DeadlineExceeded)
	case codes.Canceled:
		return fmt.Errorf("%s: %w", st.Message(), context.Canceled)
	}
	for _, row := range table {
		if row.code == st.Code() {
			return &remoteError{sentinel: row.err, st: st}
		}
	}
	return err
}

// Permanent is errs.Permanent for an error a gRPC call returned (a status
// or an error already converted by FromStatus).
func Permanent(err error) bool { return errs.Permanent(FromStatus(err)) }
