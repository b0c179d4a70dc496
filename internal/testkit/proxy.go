package testkit

import (
	"io"
	"net"
	"sync"
	"testing"
)

// Proxy relays TCP connections from a 127.0.0.1 listener to a target: a
// client's bytes go upstream as they come, and down forwards the target's
// answers to the client (io.Copy when nil), a test's hook to cut, delay or
// count them. Both connections are closed once either direction ends.
// Closed, its goroutines waited for, at cleanup.
type Proxy struct {
	lis    net.Listener
	target string
	down   func(client, upstream net.Conn)
	wg     sync.WaitGroup
	mu     sync.Mutex
	conns  []net.Conn
}

// StartProxy starts a Proxy to target.
func StartProxy(tb testing.TB, target string, down func(client, upstream net.Conn)) *Proxy {
	tb.Helper()
	if down == nil {
		down = func(c, u net.Conn) { _, _ = io.Copy(c, u) }
	}
	p := &Proxy{lis: Listen(tb), target: target, down: down}
	p.wg.Go(func() {
		for {
			c, err := p.lis.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, u)
			p.mu.Unlock()
			p.wg.Go(func() { _, _ = io.Copy(u, c); u.Close(); c.Close() })
			p.wg.Go(func() { p.down(c, u); u.Close(); c.Close() })
		}
	})
	tb.Cleanup(func() {
		p.lis.Close()
		p.Cut()
		p.wg.Wait()
	})
	return p
}

// Addr is the address clients dial.
func (p *Proxy) Addr() string { return p.lis.Addr().String() }

// Cut closes every connection relayed so far (a network blip); new ones
// are relayed again.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}
