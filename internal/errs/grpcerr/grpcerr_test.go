package grpcerr

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/rlhub/rlhub/internal/errs"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestCodeTable(t *testing.T) {
	tests := []struct {
		err  error
		want codes.Code
	}{
		{nil, codes.OK},
		{fmt.Errorf("%w: tensor x", errs.ErrInvalid), codes.InvalidArgument},
		{fmt.Errorf("%w: model m", errs.ErrNotFound), codes.NotFound},
		{&errs.StaleError{Model: "m", CurrentVersion: 3}, codes.FailedPrecondition},
		{fmt.Errorf("wrapped: %w", errs.ErrFull), codes.ResourceExhausted},
		{errs.ErrUnauthenticated, codes.Unauthenticated},
		{errs.ErrPermission, codes.PermissionDenied},
		{errs.ErrUnavailable, codes.Unavailable},
		{context.DeadlineExceeded, codes.DeadlineExceeded},
		{context.Canceled, codes.Canceled},
		{errors.New("boom"), codes.Internal},
		{status.Error(codes.Unimplemented, "x"), codes.Unimplemented},
	}
	for _, tt := range tests {
		if got := Code(tt.err); got != tt.want {
			t.Errorf("Code(%v) = %v, want %v", tt.err, got, tt.want)
		}
		if got := status.Code(ToStatus(tt.err)); got != tt.want {
			t.Errorf("status.Code(ToStatus(%v)) = %v, want %v", tt.err, got, tt.want)
		}
	}
}

func TestRoundTripKeepsSentinelsAndStaleFields(t *testing.T) {
	for _, s := range []error{errs.ErrInvalid, errs.ErrNotFound, errs.ErrFull, errs.ErrUnauthenticated, errs.ErrPermission, errs.ErrUnavailable, errs.ErrAborted, errs.ErrExists} {
		back := FromStatus(ToStatus(fmt.Errorf("%w: detail", s)))
		if !errors.Is(back, s) {
			t.Errorf("FromStatus(ToStatus(%v)) = %v, does not match", s, back)
		}
	}
	back := FromStatus(ToStatus(fmt.Errorf("push: %w", &errs.StaleError{Model: "pol", CurrentVersion: 7, CurrentEpoch: 2, Reason: "expected 5"})))
	var se *errs.StaleError
	if !errors.As(back, &se) || !errors.Is(back, errs.ErrStale) {
		t.Fatalf("stale error lost on the wire: %v", back)
	}
	if se.Model != "pol" || se.CurrentVersion != 7 || se.CurrentEpoch != 2 || se.Reason != "expected 5" {
		t.Fatalf("stale fields = %+v, want pol/7/2/expected 5", se)
	}
	if want := `push: stale version: model "pol" is at version 7 (epoch 2): expected 5`; back.Error() != want {
		t.Fatalf("stale error reads %q after the wire, want the server's %q", back.Error(), want)
	}
	if !errors.Is(FromStatus(status.Error(codes.DeadlineExceeded, "late")), context.DeadlineExceeded) {
		t.Error("DeadlineExceeded did not map back to context.DeadlineExceeded")
	}
	plain := errors.New("plain")
	if FromStatus(plain) != plain {
		t.Error("non-status error was changed")
	}
}

// TestPermanent: the refusals a retry cannot change are permanent whether
// they come from the wire or in process; the retryable ones are not.
func TestPermanent(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{status.Error(codes.InvalidArgument, "bad id"), true},
		{status.Error(codes.Unauthenticated, "no token"), true},
		{status.Error(codes.PermissionDenied, "reader"), true},
		{fmt.Errorf("attach: %w", errs.ErrPermission), true},
		{ToStatus(fmt.Errorf("%w: x", errs.ErrInvalid)), true},
		{status.Error(codes.Unavailable, "down"), false},
		{status.Error(codes.ResourceExhausted, "full"), false},
		{status.Error(codes.Aborted, "claimed"), false},
		{status.Error(codes.NotFound, "gone"), false},
		{status.Error(codes.DeadlineExceeded, "slow"), false},
		{errors.New("connection reset"), false},
		{nil, false},
	} {
		if got := Permanent(tc.err); got != tc.want {
			t.Errorf("Permanent(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

// A peer's status message reaches the caller bounded, as ours leave
// (ToStatus), keeping its code and details: over the data plane a status
// may carry 4 MiB.
func TestFromStatusBoundsAPeersMessage(t *testing.T) {
	long := strings.Repeat("x", 3<<20)
	err := FromStatus(status.Error(codes.InvalidArgument, long))
	if !errors.Is(err, errs.ErrInvalid) || len(err.Error()) > MaxMessageBytes+64 {
		t.Fatalf("a 3 MiB message: %d bytes of error text, %v", len(err.Error()), errors.Is(err, errs.ErrInvalid))
	}
	stale := ToStatus(&errs.StaleError{Model: "m", CurrentVersion: 7, Reason: long})
	var se *errs.StaleError
	if err := FromStatus(stale); !errors.As(err, &se) || se.CurrentVersion != 7 || len(se.Remote) > MaxMessageBytes+64 || len(se.Reason) > MaxMessageBytes+64 {
		t.Fatalf("a stale refusal with a long reason: %T %v", err, se)
	}
}
