package store

import (
	"fmt"
	"regexp"
	"time"

	"github.com/rlhub/rlhub/internal/errs"
)

// DefaultNamePattern is the default name rule: one or more '/'-separated
// segments of ASCII letters, digits, '.', '_' and '-', each starting with a
// letter or digit ("policy", "cartpole/actor-v2").
var DefaultNamePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)*$`)

// Config configures a store. The zero value is a valid in-memory store with
// the defaults noted on each field.
type Config struct {
	// Retain is how many of a model's newest versions are kept in memory
	// (and readable by exact version); 0 means 3. The newest is always kept.
	Retain int
	// MaxModelBytes bounds one pushed blob; 0 means 1 GiB. A larger push
	// fails with errs.ErrFull before its bytes are accepted.
	MaxModelBytes int64
	// MaxHeaderBytes bounds a blob's safetensors JSON header; 0 means 16 MiB.
	MaxHeaderBytes int64
	// MaxNameBytes bounds a model name; 0 means 128.
	MaxNameBytes int
	// NamePattern is the name rule; nil means DefaultNamePattern.
	NamePattern *regexp.Regexp
	// Now is the clock stamped on new versions; nil means time.Now.
	Now func() time.Time
}

func (c *Config) validate() error {
	if c.Retain == 0 {
		c.Retain = 3
	}
	if c.Retain < 0 {
		return fmt.Errorf("store: Retain %d is negative", c.Retain)
	}
	if c.MaxModelBytes == 0 {
		c.MaxModelBytes = 1 << 30
	}
	if c.MaxModelBytes < 16 {
		return fmt.Errorf("store: MaxModelBytes %d cannot hold any safetensors blob", c.MaxModelBytes)
	}
	if c.MaxHeaderBytes == 0 {
		c.MaxHeaderBytes = 16 << 20
	}
	if c.MaxHeaderBytes < 2 {
		return fmt.Errorf("store: MaxHeaderBytes %d cannot hold a JSON header", c.MaxHeaderBytes)
	}
	if c.MaxNameBytes == 0 {
		c.MaxNameBytes = 128
	}
	if c.MaxNameBytes < 1 {
		return fmt.Errorf("store: MaxNameBytes %d is below 1", c.MaxNameBytes)
	}
	if c.NamePattern == nil {
		c.NamePattern = DefaultNamePattern
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return nil
}

// checkName returns an error wrapping errs.ErrInvalid when name breaks the
// configured name rules. cfg must have been validated.
func (c *Config) checkName(name string) error {
	if name == "" {
		return fmt.Errorf("%w: empty model name", errs.ErrInvalid)
	}
	if len(name) > c.MaxNameBytes {
		return fmt.Errorf("%w: model name of %d bytes exceeds the limit of %d", errs.ErrInvalid, len(name), c.MaxNameBytes)
	}
	if !c.NamePattern.MatchString(name) {
		return fmt.Errorf("%w: model name %s does not match %s", errs.ErrInvalid, errs.Quote(name), c.NamePattern)
	}
	return nil
}
