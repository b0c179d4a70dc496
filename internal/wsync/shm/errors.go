package shm

import (
	"fmt"

	"github.com/rlhub/rlhub/internal/errs"
)

// errClosed is the error of a closed writer or reader, worded as wsync's
// own (the text predates this package's move out of wsync).
func errClosed(what string) error {
	return fmt.Errorf("%w: wsync: %s closed", errs.ErrUnavailable, what)
}

// staleErr refuses a version that is not newer than the published one
// (the same refusal as wsync's Board).
func staleErr(name string, cur, got uint64) error {
	return &errs.StaleError{Model: name, CurrentVersion: cur, Reason: fmt.Sprintf("version %d is not newer", got)}
}

// errWrongModel refuses a snapshot of another model than the segment's.
func errWrongModel(want, got string) error {
	return fmt.Errorf("%w: wsync: model %q published to the channel of %q", errs.ErrInvalid, got, want)
}
