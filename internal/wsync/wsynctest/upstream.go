package wsynctest

import (
	"context"
	"encoding/binary"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/testkit"
	"github.com/rlhub/rlhub/internal/wire/bulk"
)

// Answer is one scripted answer of a fake data-plane upstream
// (ServeScript): Snap's data frame with only its first Send body bytes,
// then the final OK status when Final. An answer that is not Final cuts
// the version off: the upstream keeps the connection open for Hold (a
// sender stalled mid-version), then closes it.
type Answer struct {
	Snap  *store.Snapshot
	Send  int
	Final bool
	Hold  time.Duration
}

// Whole is the whole of snap, with the final OK status.
func Whole(snap *store.Snapshot) Answer { return Answer{Snap: snap, Send: len(snap.Blob), Final: true} }

// Cut is the first half of snap's body, and no status: a version cut off
// mid-stream.
func Cut(snap *store.Snapshot) Answer { return Answer{Snap: snap, Send: len(snap.Blob) / 2} }

// Upstream is a fake data-plane server (docs/wire.md) answering requests
// from a script, across connections, in the order they come.
type Upstream struct {
	// Addr is where it listens (127.0.0.1).
	Addr string
	// Afters receives, for every request, the version the client said
	// it has (its "after"), in order.
	Afters chan uint64
	// Cuts receives a value after each cut-off answer has been written.
	Cuts chan struct{}
}

// ServeScript starts a fake data-plane upstream that answers request i
// with script[i] and leaves every request past the script unanswered
// until the test ends. decode returns a request's "after" from its
// header bytes (a StoreWatchRequest's After, a SyncHello's Version …).
// The server stops, and its goroutines are waited for, when t ends.
func ServeScript(t testing.TB, decode func(header []byte) (uint64, bool), script ...Answer) *Upstream {
	t.Helper()
	lis := testkit.Listen(t)
	u := &Upstream{Addr: lis.Addr().String(), Afters: make(chan uint64, 64), Cuts: make(chan struct{}, len(script))}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); lis.Close(); wg.Wait() })
	var mu sync.Mutex
	step := 0
	next := func() (Answer, bool) {
		mu.Lock()
		defer mu.Unlock()
		step++
		if step > len(script) {
			return Answer{}, false
		}
		return script[step-1], true
	}
	wg.Go(func() {
		for {
			conn, err := lis.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer conn.Close()
				context.AfterFunc(ctx, func() { conn.Close() })
				for {
					hb, ok := ReadRequest(conn)
					if !ok {
						return
					}
					after, ok := decode(hb)
					if !ok {
						return
					}
					u.Afters <- after
					a, ok := next()
					if !ok {
						<-ctx.Done()
						return
					}
					WriteVersion(conn, a.Snap, a.Send, a.Final)
					if !a.Final {
						if a.Hold > 0 {
							t := time.NewTimer(a.Hold)
							select {
							case <-t.C:
							case <-ctx.Done():
								t.Stop()
							}
						}
						u.Cuts <- struct{}{}
						return
					}
				}
			})
		}
	})
	return u
}

// ReadRequest reads the hello (magic and token, on a new connection; it
// answers with the magic) and one request frame, and returns the frame's
// header bytes (a protobuf message).
func ReadRequest(conn net.Conn) ([]byte, bool) {
	var head [8]byte
	if _, err := io.ReadFull(conn, head[:1]); err != nil {
		return nil, false
	}
	if head[0] == 'R' { // the hello (magic + u16-length token), once per connection
		if _, err := io.ReadFull(conn, head[1:]); err != nil {
			return nil, false
		}
		var tl [2]byte
		if _, err := io.ReadFull(conn, tl[:]); err != nil {
			return nil, false
		}
		if _, err := io.ReadFull(conn, make([]byte, binary.LittleEndian.Uint16(tl[:]))); err != nil {
			return nil, false
		}
		if _, err := conn.Write([]byte(bulk.Magic)); err != nil {
			return nil, false
		}
		if _, err := io.ReadFull(conn, head[:1]); err != nil {
			return nil, false
		}
	}
	var l [4]byte
	if _, err := io.ReadFull(conn, l[:2]); err != nil {
		return nil, false
	}
	if _, err := io.ReadFull(conn, make([]byte, binary.LittleEndian.Uint16(l[:2]))); err != nil {
		return nil, false
	}
	if _, err := io.ReadFull(conn, l[:]); err != nil {
		return nil, false
	}
	hb := make([]byte, binary.LittleEndian.Uint32(l[:]))
	if _, err := io.ReadFull(conn, hb); err != nil {
		return nil, false
	}
	return hb, true
}
