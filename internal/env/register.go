package env

import (
	"fmt"
	"slices"
	"sync"
)

// Constructor makes a fresh, independent instance of a registered
// environment. It returns an error when the environment cannot run on this
// machine (for example MuJoCo or the robot models are missing), with a
// message saying what to install.
type Constructor func() (Env, error)

// extra holds environments contributed by other packages (such as
// internal/env/mjenv, which needs cgo and MuJoCo) through Register, usually
// from their init functions. Make consults it after the built-in table.
var extra struct {
	mu    sync.RWMutex
	ctors map[string]Constructor
}

// Register makes name constructible through Lookup and Make. It panics when name is
// empty, ctor is nil or name is already registered: all are programming
// errors found at start-up.
func Register(name string, ctor Constructor) {
	if name == "" || ctor == nil {
		panic("env: Register with empty name or nil constructor")
	}
	extra.mu.Lock()
	defer extra.mu.Unlock()
	if extra.ctors == nil {
		extra.ctors = map[string]Constructor{}
	}
	if _, dup := extra.ctors[name]; dup {
		panic(fmt.Sprintf("env: Register called twice for %q", name))
	}
	extra.ctors[name] = ctor
}

// Lookup returns the constructor registered under name.
func Lookup(name string) (Constructor, bool) {
	extra.mu.RLock()
	defer extra.mu.RUnlock()
	c, ok := extra.ctors[name]
	return c, ok
}

// RegisteredNames lists the registered environment names, sorted.
func RegisteredNames() []string {
	extra.mu.RLock()
	defer extra.mu.RUnlock()
	names := make([]string, 0, len(extra.ctors))
	for n := range extra.ctors {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}
