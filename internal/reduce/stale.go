package reduce

import (
	"fmt"

	"github.com/rlhub/rlhub/internal/errs"
)

// Policy is what the staleness rule does with a gradient computed on an
// older version than the current one.
type Policy string

// The staleness policies.
const (
	// Accept takes every gradient at full weight, however old.
	Accept Policy = "accept"
	// Drop refuses a gradient more than MaxLag versions behind.
	Drop Policy = "drop"
	// DownWeight scales a gradient lag versions behind by 1/(1+lag) and
	// refuses it beyond MaxLag (MaxLag 0: never refuses).
	DownWeight Policy = "downweight"
)

// Staleness is the configured rule. The zero value accepts everything.
type Staleness struct {
	// Policy; "" means Accept.
	Policy Policy `json:"policy,omitempty"`
	// MaxLag is K, the largest accepted lag in versions (Drop: 0 means only
	// gradients on the current version; DownWeight: 0 means no limit).
	MaxLag uint64 `json:"max_lag,omitempty"`
}

// Validate fills defaults and rejects an unknown policy.
func (s *Staleness) Validate() error {
	switch s.Policy {
	case "":
		s.Policy = Accept
	case Accept, Drop, DownWeight:
	default:
		return fmt.Errorf("%w: unknown staleness policy %q (want accept, drop or downweight)", errs.ErrInvalid, s.Policy)
	}
	if s.Policy == Accept && s.MaxLag != 0 {
		return fmt.Errorf("%w: staleness policy accept takes no max_lag", errs.ErrInvalid)
	}
	return nil
}

// Weigh applies the rule to a gradient computed on base while the model is
// at current. It returns the weight to reduce it with, or an error: an
// *errs.StaleError (matches errs.ErrStale) when it is too old, errs.ErrInvalid
// when base is newer than current.
func (s Staleness) Weigh(model string, base, current, epoch uint64) (float32, error) {
	if base > current {
		return 0, fmt.Errorf("%w: gradient computed on version %d of %q, which is only at version %d", errs.ErrInvalid, base, model, current)
	}
	lag := current - base
	switch s.Policy {
	case Drop:
		if lag > s.MaxLag {
			return 0, &errs.StaleError{Model: model, CurrentVersion: current, CurrentEpoch: epoch,
				Reason: fmt.Sprintf("gradient on version %d is %d versions behind, the limit is %d", base, lag, s.MaxLag)}
		}
	case DownWeight:
		if s.MaxLag > 0 && lag > s.MaxLag {
			return 0, &errs.StaleError{Model: model, CurrentVersion: current, CurrentEpoch: epoch,
				Reason: fmt.Sprintf("gradient on version %d is %d versions behind, the limit is %d", base, lag, s.MaxLag)}
		}
		return float32(1 / (1 + float64(lag))), nil
	}
	return 1, nil
}
