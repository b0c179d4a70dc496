package replica

import (
	"net"
	"sync"

	"github.com/rlhub/rlhub/internal/wire/bulk"
)

// handoff keeps a node's one listening socket bound for the node's whole
// life and hands what it accepts to whichever role serves now: the
// standby server, the hub, the standby server again. Closing and binding
// the address again at each switch left a gap in which a client was
// refused a connection, or had one accepted into the old socket's queue
// and then reset (seen as CI flakes: TestFencedPrimaryPublishesNothing,
// and Python channels that never became ready across a switch). Now a
// connection made between two roles waits, accepted, for the next one.
type handoff struct {
	lis   net.Listener
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
	wg    sync.WaitGroup
}

// newHandoff takes over lis and accepts from it until close.
func newHandoff(lis net.Listener) *handoff {
	h := &handoff{lis: lis, conns: make(chan net.Conn), done: make(chan struct{})}
	h.wg.Go(h.accept)
	return h
}

func (h *handoff) accept() {
	for {
		c, err := bulk.Accept(h.lis, h.done) // EMFILE and the like pass
		if err != nil {
			select {
			case <-h.done:
			default:
				h.close() // anything else ends the socket for every role
			}
			return
		}
		select {
		case h.conns <- c:
		case <-h.done:
			c.Close()
			return
		}
	}
}

// role is a listener for one role: Accept hands it the socket's next
// connection; Close ends its Accept without closing the socket; Requeue
// gives one back.
func (h *handoff) role() net.Listener {
	return &roleListener{h: h, closed: make(chan struct{})}
}

// close closes the socket for good and waits for the accept loop.
func (h *handoff) close() {
	h.once.Do(func() {
		close(h.done)
		h.lis.Close()
	})
}

func (h *handoff) wait() { h.wg.Wait() }

type roleListener struct {
	h      *handoff
	closed chan struct{}
	once   sync.Once
}

// Accept returns the next connection, or net.ErrClosed once this role
// (or the socket) is closed.
func (r *roleListener) Accept() (net.Conn, error) {
	// A closed role takes nothing more: what waits goes to the next one.
	select {
	case <-r.closed:
		return nil, net.ErrClosed
	default:
	}
	select {
	case c := <-r.h.conns:
		return c, nil
	case <-r.closed:
		return nil, net.ErrClosed
	case <-r.h.done:
		return nil, net.ErrClosed
	}
}

func (r *roleListener) Close() error {
	r.once.Do(func() { close(r.closed) })
	return nil
}

func (r *roleListener) Addr() net.Addr { return r.h.lis.Addr() }

// Requeue implements bulk.Requeuer: a connection this role accepted and
// served nothing on goes to the role that serves next.
func (r *roleListener) Requeue(c net.Conn) {
	r.h.wg.Go(func() {
		select {
		case r.h.conns <- c:
		case <-r.h.done:
			c.Close()
		}
	})
}

var _ bulk.Requeuer = (*roleListener)(nil)
