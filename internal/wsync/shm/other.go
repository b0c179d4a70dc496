//go:build !linux

package shm

// Shared-memory transport is Linux-only (futex, /dev/shm); on other systems
// the types exist so the package builds, and Create / Open fail.

import (
	"context"
	"errors"
	"os"
	"time"

	"github.com/rlhub/rlhub/internal/store"
)

type Config struct {
	Path     string
	Name     string
	Capacity int64
	Slots    int
	Replace  bool
	Mode     os.FileMode
	Group    string
	Now      func() time.Time
	// CopyWorkers as on Linux.
	CopyWorkers int
	// Life as on Linux.
	Life uint64
}
type Writer struct{}
type ReaderConfig struct {
	Path       string
	Model      string
	Verify     bool
	Lease      bool
	Fresh      bool
	NoFollow   bool
	Tick       time.Duration
	MaxRetries int
}
type Stats struct{ Reads, Retries, InPlace, Followed, Released, Abandoned uint64 }
type Reader struct{}

func Create(Config) (*Writer, error)                           { return nil, errors.ErrUnsupported }
func Room(string) (int64, error)                               { return 0, errors.ErrUnsupported }
func (*Writer) Publish(context.Context, *store.Snapshot) error { return errors.ErrUnsupported }
func (*Writer) Write(uint64, uint64, []byte) error             { return errors.ErrUnsupported }
func (*Writer) Close() error                                   { return nil }
func (*Writer) Path() string                                   { return "" }
func (*Writer) Capacity() int64                                { return 0 }
func (*Writer) Life() uint64                                   { return 0 }
func (*Reader) Life() uint64                                   { return 0 }
func Open(ReaderConfig) (*Reader, error)                       { return nil, errors.ErrUnsupported }
func (*Reader) Name() string                                   { return "" }
func (*Reader) Stats() Stats                                   { return Stats{} }
func (*Reader) Published() uint64                              { return 0 }
func (*Reader) WriterAlive() bool                              { return false }
func (*Reader) Leasing() bool                                  { return false }
func (*Reader) CopyReason() string                             { return "shared memory is Linux only" }
func (*Reader) Release()                                       {}
func (*Reader) Close() error                                   { return nil }
func (*Reader) GetIfNewer(context.Context, uint64) (*store.Snapshot, error) {
	return nil, errors.ErrUnsupported
}
func (*Reader) WaitNewer(context.Context, uint64) (*store.Snapshot, error) {
	return nil, errors.ErrUnsupported
}
func (*Reader) WaitNewerLife(context.Context, uint64, uint64) (*store.Snapshot, error) {
	return nil, errors.ErrUnsupported
}
func (*Reader) GetIfNewerLife(context.Context, uint64, uint64) (*store.Snapshot, error) {
	return nil, errors.ErrUnsupported
}

// Write is unsupported off Linux.
type Write struct{}

func (*Writer) Begin(uint64, uint64, int) (*Write, error) { return nil, errors.ErrUnsupported }
func (*Write) Buf() []byte                                { return nil }
func (*Write) Progress(int)                               {}
func (*Write) Commit(uint32) error                        { return errors.ErrUnsupported }
func (*Write) Abort()                                     {}
