package wsync

import (
	"fmt"

	"github.com/rlhub/rlhub/internal/errs"
)

func errClosed(what string) error {
	return fmt.Errorf("%w: wsync: %s closed", errs.ErrUnavailable, what)
}

func errWrongModel(want, got string) error {
	return fmt.Errorf("%w: wsync: model %q published to the channel of %q", errs.ErrInvalid, got, want)
}
