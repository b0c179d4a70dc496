package ars

import (
	"encoding/json"
	"fmt"
	"math"

	"github.com/rlhub/rlhub/internal/env"
	"github.com/rlhub/rlhub/internal/errs"
)

// Dict observation spaces: per-key filters.
//
// Machin's ARS keeps one MeanStdFilter per key of a dict state. Its
// RunningStat is elementwise (a mean and a variance per component), and
// every step observes every key, so the filters of the keys are exactly
// the flat filter's components, key by key: rlhub keeps one Stats over the
// observation flattened in the space's key order (Gymnasium's
// spaces.flatten order) and reports and checks it per key. The key layout
// travels with the policy (metadata ars.obs_keys), and a worker whose env
// flattens to another layout is refused rather than trained on mismatched
// components.

// MaxObsKeys bounds a Dict observation space's keys, and MaxObsKeyName a
// key's length.
const (
	MaxObsKeys    = 256
	MaxObsKeyName = 128
)

// ValidateObsKeys checks a Dict space's keys against the observation
// length: non-empty unique names, dimensions ≥ 1 summing to obsDim. No
// keys is a flat observation and always valid.
func ValidateObsKeys(keys []env.ObsKey, obsDim int) error {
	if len(keys) == 0 {
		return nil
	}
	if len(keys) > MaxObsKeys {
		return fmt.Errorf("%w: %d observation keys, at most %d", errs.ErrInvalid, len(keys), MaxObsKeys)
	}
	seen := map[string]bool{}
	sum := 0
	for _, k := range keys {
		if k.Name == "" || len(k.Name) > MaxObsKeyName || seen[k.Name] {
			return fmt.Errorf("%w: observation key %s: names must be unique, 1 to %d bytes", errs.ErrInvalid, errs.Quote(k.Name), MaxObsKeyName)
		}
		if k.Dim < 1 || k.Dim > 1<<16 {
			return fmt.Errorf("%w: observation key %s has dimension %d", errs.ErrInvalid, errs.Quote(k.Name), k.Dim)
		}
		seen[k.Name] = true
		sum += k.Dim
	}
	if sum != obsDim {
		return fmt.Errorf("%w: observation keys' dimensions sum to %d, the observation has %d", errs.ErrInvalid, sum, obsDim)
	}
	return nil
}

// SameObsKeys reports whether two key layouts are equal.
func SameObsKeys(a, b []env.ObsKey) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

type obsKeyJSON struct {
	Name string `json:"name"`
	Dim  int    `json:"dim"`
}

func encodeObsKeys(keys []env.ObsKey) string {
	out := make([]obsKeyJSON, len(keys))
	for i, k := range keys {
		out[i] = obsKeyJSON{k.Name, k.Dim}
	}
	b, err := json.Marshal(out)
	if err != nil {
		panic(err) // strings and ints always marshal
	}
	return string(b)
}

func decodeObsKeys(s string, obsDim int) ([]env.ObsKey, error) {
	if s == "" {
		return nil, nil
	}
	var in []obsKeyJSON
	if len(s) > MaxObsKeys*(MaxObsKeyName+32) || json.Unmarshal([]byte(s), &in) != nil {
		return nil, fmt.Errorf("%w: ars policy: metadata ars.obs_keys is not a JSON list of {name, dim}", errs.ErrInvalid)
	}
	keys := make([]env.ObsKey, len(in))
	for i, k := range in {
		keys[i] = env.ObsKey{Name: k.Name, Dim: k.Dim}
	}
	if err := ValidateObsKeys(keys, obsDim); err != nil {
		return nil, err
	}
	return keys, nil
}

// KeyStats is one observation key's filter statistics.
type KeyStats struct {
	Name  string
	Count float64
	Mean  []float64
	M2    []float64
}

// Std is the key's filter standard deviation per component: the sample
// deviation √(M2/(n−1)), as Freeze uses (1 while fewer than two states
// were seen).
func (k KeyStats) Std() []float64 {
	sd := make([]float64, len(k.Mean))
	for i := range sd {
		sd[i] = 1
		if k.Count >= 2 {
			sd[i] = math.Sqrt(k.M2[i] / (k.Count - 1))
		}
	}
	return sd
}

// ByKey splits the statistics into the keys' filters (copies), in key
// order. keys must have passed ValidateObsKeys for s.Dim().
func (s *Stats) ByKey(keys []env.ObsKey) []KeyStats {
	out := make([]KeyStats, len(keys))
	off := 0
	for i, k := range keys {
		out[i] = KeyStats{Name: k.Name, Count: s.Count,
			Mean: append([]float64(nil), s.Mean[off:off+k.Dim]...), M2: append([]float64(nil), s.M2[off:off+k.Dim]...)}
		off += k.Dim
	}
	return out
}
