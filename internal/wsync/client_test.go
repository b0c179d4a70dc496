package wsync

import (
	"context"
	"github.com/rlhub/rlhub/internal/wsync/wsynctest"
	"testing"
	"time"
	"unsafe"

	"github.com/rlhub/rlhub/internal/store"
)

// With ReuseBuffers a push client receives into a handful of buffers, and
// never into one holding a snapshot its consumer may still use: the last
// two taken (checked intact after every take, including while the consumer
// stalls and versions pile up) and the newest not yet taken.
func TestClientReusesOnlyBuffersTheConsumerMovedPast(t *testing.T) {
	const words = 16 << 10 // 64 KiB versions
	for _, reuse := range []bool{false, true} {
		h := startHub(t)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		cl, err := Attach(ctx, ClientConfig{Conn: dial(t, h.addr), CollectorID: "c", Model: "m", ReuseBuffers: reuse})
		if err != nil {
			t.Fatal(err)
		}
		buffers := map[*byte]bool{}
		var held []*store.Snapshot // every snapshot taken, oldest first
		take := func(v uint64) {
			t.Helper()
			s, err := cl.WaitNewer(ctx, v-1)
			if err != nil || s.Version != v {
				t.Fatalf("reuse=%v: took %v, %v; want v%d", reuse, s, err, v)
			}
			held = append(held, s)
			buffers[unsafe.SliceData(s.Blob)] = true
			// The contract: valid until two newer ones are taken.
			for _, h := range held[max(0, len(held)-2):] {
				if err := wsynctest.Check(h); err != nil {
					t.Fatalf("reuse=%v, after taking v%d: %v", reuse, v, err)
				}
			}
			if !reuse { // without reuse, forever
				for _, h := range held {
					if err := wsynctest.Check(h); err != nil {
						t.Fatalf("after taking v%d: %v", v, err)
					}
				}
			}
		}
		v := uint64(0)
		for range 12 { // a consumer keeping up
			v++
			h.push(t, v, words)
			take(v)
		}
		// A stalled consumer: versions keep arriving while it holds the
		// last two; they must be received elsewhere.
		for range 6 {
			v++
			h.push(t, v, words)
			waitFor(t, "the client receives the pushed version", func() bool {
				n := cl.board.Newest()
				return n != nil && n.Version == v
			})
			for _, h := range held[len(held)-2:] {
				if err := wsynctest.Check(h); err != nil {
					t.Fatalf("reuse=%v, consumer stalled, v%d arrived: %v", reuse, v, err)
				}
			}
		}
		take(v)
		for range 4 {
			v++
			h.push(t, v, words)
			take(v)
		}
		cl.Close()
		h.stop()
		if reuse && len(buffers) > maxPooled+3 {
			t.Errorf("reuse: %d versions taken from %d distinct buffers, want at most %d", len(held), len(buffers), maxPooled+3)
		}
		if !reuse && len(buffers) != len(held) {
			t.Errorf("no reuse: %d versions taken from %d buffers, want one each", len(held), len(buffers))
		}
		t.Logf("reuse=%v: %d versions taken, %d distinct buffers", reuse, len(held), len(buffers))
	}
}
