//go:build linux

package shm

import (
	"errors"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/wsync/wsynctest"
)

// A FIFO at the segment's path is refused at once, as a file that is no
// segment: opening it for reading would wait in open(2), with no deadline,
// for a writer that never comes (a Failover's dial, a relay's start).
func TestOpenRefusesAFIFO(t *testing.T) {
	for _, lease := range []bool{false, true} {
		path := wsynctest.ShmPath(t)
		if err := unix.Mkfifo(path, 0o600); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() {
			r, err := Open(ReaderConfig{Path: path, Lease: lease})
			if err == nil {
				r.Close()
			}
			done <- err
		}()
		select {
		case err := <-done:
			if !errors.Is(err, errs.ErrInvalid) {
				t.Fatalf("lease %v: Open of a FIFO: %v, want ErrInvalid", lease, err)
			}
		case <-time.After(10 * time.Second):
			// A writer's open lets the blocked open return.
			if f, err := os.OpenFile(path, os.O_WRONLY|unix.O_NONBLOCK, 0); err == nil {
				f.Close()
			}
			<-done
			t.Fatalf("lease %v: Open of a FIFO still waiting after 10 s", lease)
		}
		os.Remove(path)
	}
}

// A FIFO named as a temporary segment of the path (PATH.tmp-PID) does not
// hold Create: looking for orphans opened it for reading, which waits in
// open(2) for a writer. It is not a segment, so it is left alone.
func TestCreateIsNotHeldByAFIFONamedAsATemporary(t *testing.T) {
	path := wsynctest.ShmPath(t)
	fifo := path + ".tmp-1"
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(fifo)
	done := make(chan error, 1)
	go func() {
		w, err := Create(Config{Path: path, Name: "m", Capacity: 4 << 10, Slots: 2})
		if err == nil {
			w.Close()
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		if f, err := os.OpenFile(fifo, os.O_WRONLY|unix.O_NONBLOCK, 0); err == nil {
			f.Close()
		}
		<-done
		t.Fatal("Create still waiting on a FIFO named as a temporary after 10 s")
	}
	if fi, err := os.Lstat(fifo); err != nil || fi.Mode().Type() != os.ModeNamedPipe {
		t.Fatalf("the FIFO: %v, %v; want it left alone", fi, err)
	}
}
