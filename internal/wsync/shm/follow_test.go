//go:build linux

package shm

import (
	"bytes"
	"context"
	"errors"
	"hash/crc32"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/testkit"
	"github.com/rlhub/rlhub/internal/wsync/wsynctest"
)

// A copying reader's WaitNewer follows a version the writer is still
// writing in place (Begin, Progress): it copies the bytes marked final as
// they come and returns the version once committed, whole; it refuses a
// version whose committed CRC differs from what it copied (a writer that
// changed bytes it had marked final); it never returns an aborted one.
func TestShmReaderFollowsAWriteInProgress(t *testing.T) {
	old := followMin
	followMin = 0
	defer func() { followMin = old }()
	for _, tc := range []string{"commit", "bytes changed after Progress", "abort"} {
		t.Run(tc, func(t *testing.T) {
			path := wsynctest.ShmPath(t)
			const words = 200_000
			w, err := Create(Config{Path: path, Name: "m", Capacity: 4*words + 4096})
			if err != nil {
				t.Fatal(err)
			}
			defer w.Close()
			if err := w.Write(1, 0, wsynctest.Snap(t, "m", 1, words).Blob); err != nil {
				t.Fatal(err)
			}
			r, err := Open(ReaderConfig{Path: path, Verify: true})
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			if s, err := r.GetIfNewer(context.Background(), 0); err != nil || s.Version != 1 {
				t.Fatalf("v1: %v, %v", s, err)
			}

			v2 := wsynctest.Snap(t, "m", 2, words).Blob
			half := len(v2) / 2
			copied := make(chan int, 64)
			followed = func(done int) { copied <- done }
			defer func() { followed = nil }()
			txn, err := w.Begin(2, 0, len(v2))
			if err != nil {
				t.Fatal(err)
			}
			buf := txn.Buf()
			if tc == "bytes changed after Progress" {
				for i := range half {
					buf[i] = 0xAB
				}
			} else {
				copy(buf[:half], v2[:half])
			}
			txn.Progress(half)

			type got struct {
				s   *store.Snapshot
				err error
			}
			res := make(chan got, 1)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			go func() {
				s, err := r.WaitNewer(ctx, 1)
				res <- got{s, err}
			}()
			if d := testkit.Recv(t, copied, 20*time.Second, "the reader following the write"); d != half {
				t.Fatalf("the reader copied %d bytes ahead of the commit, want %d", d, half)
			}
			copy(buf, v2) // the rest (and, for the bad writer, the first half again)
			switch tc {
			case "abort":
				txn.Abort()
				if err := w.Write(3, 0, wsynctest.Snap(t, "m", 3, words).Blob); err != nil {
					t.Fatal(err)
				}
			default:
				if err := txn.Commit(crc32.Checksum(v2, castagnoli)); err != nil {
					t.Fatal(err)
				}
			}
			g := testkit.Recv(t, res, 20*time.Second, "WaitNewer")
			switch tc {
			case "commit":
				if g.err != nil || g.s.Version != 2 || !bytes.Equal(g.s.Blob, v2) {
					t.Fatalf("followed read: %v, %v; want version 2 whole", g.s, g.err)
				}
				if st := r.Stats(); st.Followed != 1 {
					t.Fatalf("stats %+v: want one followed read", st)
				}
			case "bytes changed after Progress":
				if !errors.Is(g.err, errs.ErrInvalid) {
					t.Fatalf("followed a write that changed final bytes: %v, %v; want a CRC error", g.s, g.err)
				}
			case "abort":
				if g.err != nil || g.s.Version != 3 || wsynctest.Check(g.s) != nil {
					t.Fatalf("after an abort: %v, %v; want version 3 whole", g.s, g.err)
				}
			}
		})
	}
}
