//go:build !linux

package wsync

// Shared-memory transport is Linux-only (futex, /dev/shm); on other systems
// the types exist so the package builds, and CreateShm / OpenShm fail.

import (
	"context"
	"errors"
	"os"
	"time"

	"github.com/rlhub/rlhub/internal/store"
)

type ShmConfig struct {
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
}
type ShmWriter struct{}
type ShmReaderConfig struct {
	Path       string
	Verify     bool
	Lease      bool
	Tick       time.Duration
	MaxRetries int
}
type ShmStats struct{ Reads, Retries, InPlace uint64 }
type ShmReader struct{}

func CreateShm(ShmConfig) (*ShmWriter, error)                     { return nil, errors.ErrUnsupported }
func (*ShmWriter) Publish(context.Context, *store.Snapshot) error { return errors.ErrUnsupported }
func (*ShmWriter) Write(uint64, uint64, []byte) error             { return errors.ErrUnsupported }
func (*ShmWriter) Close() error                                   { return nil }
func (*ShmWriter) Path() string                                   { return "" }
func (*ShmWriter) Capacity() int64                                { return 0 }
func OpenShm(ShmReaderConfig) (*ShmReader, error)                 { return nil, errors.ErrUnsupported }
func (*ShmReader) Name() string                                   { return "" }
func (*ShmReader) Stats() ShmStats                                { return ShmStats{} }
func (*ShmReader) Published() uint64                              { return 0 }
func (*ShmReader) WriterAlive() bool                              { return false }
func (*ShmReader) Leasing() bool                                  { return false }
func (*ShmReader) Close() error                                   { return nil }
func (*ShmReader) GetIfNewer(context.Context, uint64) (*store.Snapshot, error) {
	return nil, errors.ErrUnsupported
}
func (*ShmReader) WaitNewer(context.Context, uint64) (*store.Snapshot, error) {
	return nil, errors.ErrUnsupported
}

// ShmWrite is unsupported off Linux.
type ShmWrite struct{}

func (*ShmWriter) Begin(uint64, uint64, int) (*ShmWrite, error) { return nil, errors.ErrUnsupported }
func (*ShmWrite) Buf() []byte                                   { return nil }
func (*ShmWrite) Commit(uint32) error                           { return errors.ErrUnsupported }
func (*ShmWrite) Abort()                                        {}
