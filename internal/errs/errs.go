// Package errs holds the error conditions that cross process boundaries and
// the one table that maps them to gRPC status codes and back.
//
// Core packages wrap these sentinels with %w (for example
// fmt.Errorf("%w: model %q", errs.ErrNotFound, name)); gRPC services return
// errs.ToStatus(err); clients call errs.FromStatus(err) so that errors.Is
// works on both sides of the wire. The Python client maps the same codes to
// its named exceptions (python/rlhub/errors.py).
package errs

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Sentinel conditions. Each maps to exactly one gRPC code.
var (
	// ErrInvalid: malformed input (bad tensor bytes, wrong shape or dtype,
	// NaN/Inf, bad name). InvalidArgument.
	ErrInvalid = errors.New("invalid argument")
	// ErrNotFound: unknown model, version, learner or job. NotFound.
	ErrNotFound = errors.New("not found")
	// ErrStale: a stale or conflicting version or epoch. FailedPrecondition.
	ErrStale = errors.New("stale version")
	// ErrExists: something that must be new already exists. AlreadyExists.
	ErrExists = errors.New("already exists")
	// ErrFull: a bounded queue or size limit is exhausted. ResourceExhausted.
	ErrFull = errors.New("resource exhausted")
	// ErrUnauthenticated: missing or bad credentials. Unauthenticated.
	ErrUnauthenticated = errors.New("unauthenticated")
	// ErrPermission: credentials lack the right. PermissionDenied.
	ErrPermission = errors.New("permission denied")
	// ErrUnavailable: a peer or role is down or failing over. Unavailable.
	ErrUnavailable = errors.New("unavailable")
	// ErrAborted: an operation lost a race and may be retried. Aborted.
	ErrAborted = errors.New("aborted")
)

var table = []struct {
	err  error
	code codes.Code
}{
	{ErrInvalid, codes.InvalidArgument},
	{ErrNotFound, codes.NotFound},
	{ErrStale, codes.FailedPrecondition},
	{ErrExists, codes.AlreadyExists},
	{ErrFull, codes.ResourceExhausted},
	{ErrUnauthenticated, codes.Unauthenticated},
	{ErrPermission, codes.PermissionDenied},
	{ErrUnavailable, codes.Unavailable},
	{ErrAborted, codes.Aborted},
}

// StaleError is a version conflict that tells the caller what is current.
// It matches ErrStale with errors.Is.
type StaleError struct {
	Model          string
	CurrentVersion uint64
	CurrentEpoch   uint64
	Reason         string

	remote string // the whole message, for one received over gRPC
}

func (e *StaleError) Error() string {
	if e.remote != "" {
		// The server's message already says all of the above (and what
		// it was doing); saying it again doubled it.
		return e.remote
	}
	return fmt.Sprintf("stale version: model %q is at version %d (epoch %d): %s", e.Model, e.CurrentVersion, e.CurrentEpoch, e.Reason)
}

// Is makes errors.Is(e, ErrStale) true.
func (e *StaleError) Is(target error) bool { return target == ErrStale }

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

// ToStatus converts err into a gRPC status error for a service to return.
// A StaleError carries its current version in an ErrorInfo detail.
func ToStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := err.(interface{ GRPCStatus() *status.Status }); ok && Code(err) == status.Code(err) {
		return err
	}
	st := status.New(Code(err), err.Error())
	var se *StaleError
	if errors.As(err, &se) {
		if d, derr := st.WithDetails(&errdetails.ErrorInfo{
			Reason: "STALE_VERSION",
			Domain: domain,
			Metadata: map[string]string{
				"model":           se.Model,
				"current_version": strconv.FormatUint(se.CurrentVersion, 10),
				"current_epoch":   strconv.FormatUint(se.CurrentEpoch, 10),
				"reason":          se.Reason,
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
// matches the sentinels (and *StaleError) with errors.Is / errors.As. Errors
// that are not gRPC statuses are returned unchanged.
func FromStatus(err error) error {
	if err == nil {
		return nil
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.Reason == "STALE_VERSION" && info.Domain == domain {
			v, _ := strconv.ParseUint(info.Metadata["current_version"], 10, 64)
			ep, _ := strconv.ParseUint(info.Metadata["current_epoch"], 10, 64)
			reason, ok := info.Metadata["reason"]
			if !ok { // from a server before the reason travelled
				reason = st.Message()
			}
			return &StaleError{Model: info.Metadata["model"], CurrentVersion: v, CurrentEpoch: ep, Reason: reason, remote: st.Message()}
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
