//go:build linux

package wsync

import (
	"context"
	"io"
	"runtime/debug"
	"testing"

	"github.com/rlhub/rlhub/internal/testkit"
	"github.com/rlhub/rlhub/internal/wsync/shm"
	"github.com/rlhub/rlhub/internal/wsync/wsynctest"
)

// A Failover whose leasing shm source fails keeps the segment mapped until
// a newer version has been taken from the next source: the version the
// Receiver holds is a view of that mapping.
func TestFailoverKeepsLeasedSnapshotUntilNewer(t *testing.T) {
	ctx := context.Background()
	w, path := threeSlots(t)
	if err := w.Publish(ctx, wsynctest.Snap(t, "m", 1, 1000)); err != nil {
		t.Fatal(err)
	}
	board := NewBoard("m")
	var rd *shm.Reader
	leasing := ShmReaderDialer("shm", shm.ReaderConfig{Path: path, Lease: true})
	f, err := NewFailover(FailoverConfig{Dialers: []Dialer{
		{Name: "shm", Dial: func(ctx context.Context, have uint64) (Source, io.Closer, error) {
			src, closer, err := leasing.Dial(ctx, have)
			if err == nil {
				rd = src.(*shm.Reader)
			}
			return src, closer, err
		}},
		{Name: "board", Dial: func(context.Context, uint64) (Source, io.Closer, error) { return board, io.NopCloser(nil), nil }},
	}, Logger: testkit.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	s1, err := f.GetIfNewer(ctx, 0)
	if err != nil || s1 == nil || s1.Version != 1 || !rd.Leasing() || !rd.InMapping(s1.Blob) {
		t.Fatalf("GetIfNewer(0) = %v, %v; want v1 leased in place", s1, err)
	}
	// The writer goes away; the board has nothing newer yet.
	w.Close()
	if s, err := f.GetIfNewer(ctx, 1); s != nil || err != nil || f.Current() != "board" {
		t.Fatalf("after the writer closed: %v, %v, source %q; want nothing newer from the board", s, err, f.Current())
	}
	func() {
		defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
		defer func() {
			if p := recover(); p != nil {
				t.Fatalf("reading the held v1 after failing over faulted: %v", p)
			}
		}()
		if err := wsynctest.Check(s1); err != nil {
			t.Fatalf("the held v1 after failing over: %v", err)
		}
	}()
	if !rd.Leasing() {
		t.Fatal("the failed leasing reader was closed before a newer version was taken")
	}
	board.Publish(ctx, wsynctest.Snap(t, "m", 2, 1000))
	if s, err := f.GetIfNewer(ctx, 1); err != nil || s == nil || s.Version != 2 {
		t.Fatalf("GetIfNewer(1) from the board = %v, %v", s, err)
	}
	if rd.Leasing() {
		t.Fatal("the failed leasing reader is still open after a newer version was taken")
	}
}
