package store

import "context"

// Memory is the in-memory Store: nothing survives Close. It is the store of
// a hub without a data directory and the fake other components test with.
type Memory struct {
	c *core
}

var (
	_ Store      = (*Memory)(nil)
	_ Prechecker = (*Memory)(nil)
)

// NewMemory returns an empty in-memory store.
func NewMemory(cfg Config) (*Memory, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &Memory{c: newCore(cfg)}, nil
}

// Push implements Store.
func (s *Memory) Push(ctx context.Context, req PushRequest) (Info, error) {
	return s.c.push(ctx, req, nil)
}

// Get implements Store.
func (s *Memory) Get(ctx context.Context, name string, version uint64) (*Snapshot, error) {
	return s.c.get(name, version)
}

// GetIfNewer implements Store.
func (s *Memory) GetIfNewer(ctx context.Context, name string, than uint64) (*Snapshot, error) {
	return s.c.getIfNewer(name, than)
}

// WaitNewer implements Store.
func (s *Memory) WaitNewer(ctx context.Context, name string, after uint64) (*Snapshot, error) {
	return s.c.waitNewer(ctx, name, after)
}

// Lend implements Lender.
func (s *Memory) Lend(_ context.Context, name string, version uint64) (*Snapshot, func(), error) {
	return s.c.lend(name, version)
}

// LendNewer implements Lender.
func (s *Memory) LendNewer(ctx context.Context, name string, after uint64) (*Snapshot, func(), error) {
	return s.c.lendNewer(ctx, name, after)
}

// LendNewerLife implements LifeWaiter.
func (s *Memory) LendNewerLife(ctx context.Context, name string, after, life uint64) (*Snapshot, func(), error) {
	return s.c.lendNewerLife(ctx, name, after, life)
}

// NewestLife implements LifeReader.
func (s *Memory) NewestLife(name string) (uint64, uint64, error) { return s.c.newestLife(name) }

// List implements Store.
func (s *Memory) List(ctx context.Context) ([]Info, error) { return s.c.list() }

// OwnerUsage implements UsageReader.
func (s *Memory) OwnerUsage(owner, name string) (int, int64, bool, int64) {
	return s.c.ownerUsage(owner, name)
}

// Precheck implements Prechecker.
func (s *Memory) Precheck(name string, totalBytes uint64) error {
	return s.c.Precheck(name, totalBytes)
}

// Claim implements Claimer.
func (s *Memory) Claim(ctx context.Context, name, owner string) error {
	return s.c.setOwner(ctx, name, owner, true, nil)
}

// Release implements Claimer.
func (s *Memory) Release(ctx context.Context, name, owner string) error {
	return s.c.setOwner(ctx, name, owner, false, nil)
}

// Delete implements Deleter.
func (s *Memory) Delete(ctx context.Context, name string) error {
	return s.c.delete(ctx, name, nil)
}

// Close wakes every waiting watcher with an error wrapping
// errs.ErrUnavailable; later calls fail the same way. Safe to call twice.
func (s *Memory) Close() error {
	s.c.close()
	return nil
}
