// Package errs holds the error conditions that cross process boundaries.
// It imports no transport: the pure cores (tensor, safetensors, reduce,
// optim, ars, env, the store's core) wrap these sentinels with %w, for
// example fmt.Errorf("%w: model %q", errs.ErrNotFound, name).
//
// The one table that maps them to gRPC status codes and back is in
// errs/grpcerr, which only services and clients import. The Python client
// maps the same codes to its named exceptions (python/rlhub/errors.py).
package errs

import (
	"errors"
	"fmt"
)

// Sentinel conditions. Each maps to exactly one gRPC code (errs/grpcerr).
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

// StaleError is a version conflict that tells the caller what is current.
// It matches ErrStale with errors.Is.
type StaleError struct {
	Model          string
	CurrentVersion uint64
	CurrentEpoch   uint64
	Reason         string

	// Remote, when set, is the whole message of a StaleError received
	// from another process; Error returns it as it is.
	Remote string
}

func (e *StaleError) Error() string {
	if e.Remote != "" {
		// The server's message already says all of the above (and what
		// it was doing); saying it again doubled it.
		return e.Remote
	}
	return fmt.Sprintf("stale version: model %q is at version %d (epoch %d): %s", e.Model, e.CurrentVersion, e.CurrentEpoch, e.Reason)
}

// Is makes errors.Is(e, ErrStale) true.
func (e *StaleError) Is(target error) bool { return target == ErrStale }

// Permanent reports whether err is a refusal that a retry of the same
// request cannot change: the request is invalid (ErrInvalid) or the
// caller's credentials are missing or lack the right (ErrUnauthenticated,
// ErrPermission). Every retry loop gives these back to its caller at once
// (python/rlhub/errors.py's is_permanent is the same rule). An error from
// the wire is classified with grpcerr.Permanent.
func Permanent(err error) bool {
	return errors.Is(err, ErrInvalid) || errors.Is(err, ErrUnauthenticated) || errors.Is(err, ErrPermission)
}
