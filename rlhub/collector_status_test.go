package rlhub_test

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/testkit"
	"github.com/rlhub/rlhub/rlhub"
)

// hangingProxy is a real listener on 127.0.0.1 that forwards each
// connection to a hub until hang is called, which cuts the connections it
// forwards and from then on accepts connections and answers nothing, as a
// SIGSTOPped or wedged hub does; resume forwards again.
type hangingProxy struct {
	lis    net.Listener
	target string
	wg     sync.WaitGroup
	mu     sync.Mutex
	silent bool
	closed bool // by the cleanup: a connection accepted now is closed
	conns  []net.Conn
}

func startHangingProxy(t *testing.T, target string) *hangingProxy {
	t.Helper()
	p := &hangingProxy{lis: testkit.Listen(t), target: target}
	p.wg.Go(p.accept)
	t.Cleanup(func() {
		p.lis.Close()
		p.mu.Lock()
		p.closed = true
		p.mu.Unlock()
		p.cut()
		p.wg.Wait()
	})
	return p
}

func (p *hangingProxy) addr() string { return p.lis.Addr().String() }

func (p *hangingProxy) accept() {
	for {
		c, err := p.lis.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		silent, closed := p.silent, p.closed
		p.conns = append(p.conns, c)
		p.mu.Unlock()
		if closed {
			c.Close()
			return
		}
		if silent {
			p.wg.Go(func() { _, _ = io.Copy(io.Discard, c) }) // until cut
			continue
		}
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, up)
		closed = p.closed
		p.mu.Unlock()
		if closed {
			c.Close()
			up.Close()
			return
		}
		p.wg.Go(func() { _, _ = io.Copy(up, c); up.Close() })
		p.wg.Go(func() { _, _ = io.Copy(c, up); c.Close() })
	}
}

// cut closes every connection the proxy holds.
func (p *hangingProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

func (p *hangingProxy) hang() {
	p.mu.Lock()
	p.silent = true
	p.mu.Unlock()
	p.cut()
}

func (p *hangingProxy) resume() {
	p.mu.Lock()
	p.silent = false
	p.mu.Unlock()
	p.cut()
}

// A ViaPush collector's Status tells a connected collector with no newer
// version from one redialling a hung hub: connected to a real hub; not
// connected, naming the silence, once the hub (behind a proxy) accepts
// connections and answers nothing; connected again once it answers.
// Before, a program had no way to tell: Version stayed put either way.
func TestCollectorStatusTellsAHungHub(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	hub, _ := policyHub(t, ctx, true)
	p := startHangingProxy(t, hub)
	var logs syncBuffer
	c, err := rlhub.NewCollector(ctx, rlhub.CollectorConfig{Hub: p.addr(), Model: "policy", CollectorID: "go-status",
		AnswerWithin: 300 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if st := c.Status(); !st.Connected || st.LastError != "" || st.Since.IsZero() {
		t.Fatalf("status after NewCollector %+v, want connected", st)
	}
	defer running(ctx, c)()
	testkit.Eventually(t, time.Minute, "the collector at v1", func() bool { return c.Version() >= 1 })
	if st := c.Status(); !st.Connected || st.LastError != "" {
		t.Fatalf("status at v1 %+v, want connected", st)
	}

	p.hang()
	hung := time.Now()
	var last rlhub.CollectorStatus
	testkit.Eventually(t, time.Minute, "status not connected, naming the silence", func() bool {
		last = c.Status()
		return !last.Connected && strings.Contains(last.LastError, "sent nothing within 300ms")
	})
	if last.Since.IsZero() || len(last.LastError) > 512 {
		t.Fatalf("status of a hung hub %+v: want Since set and LastError bounded", last)
	}

	p.resume()
	testkit.Eventually(t, time.Minute, "status connected again", func() bool {
		last = c.Status()
		return last.Connected && last.LastError == ""
	})
	// Not a timing assertion: bounds the lines by the rate limit.
	warns := strings.Count(logs.String(), `level=WARN msg="wsync: dial failed; retrying"`)
	if max := 1 + int(time.Since(hung)/(30*time.Second)); warns < 1 || warns > max {
		t.Fatalf("%d warn lines for the failed dials, want 1 to %d:\n%s", warns, max, logs.String())
	}
	if !strings.Contains(logs.String(), "sent nothing within 300ms") {
		t.Fatalf("the warn line does not name the silence:\n%s", logs.String())
	}
}

// syncBuffer is a bytes.Buffer safe for a logger's concurrent writes.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Status of a collector on a hub that answers stays connected (the
// stream open, nothing newer to send), and after Close is not.
func TestCollectorStatusOnARealHub(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	hub, _ := policyHub(t, ctx, true)
	c, err := rlhub.NewCollector(ctx, rlhub.CollectorConfig{Hub: hub, Model: "policy", CollectorID: "go-status-real",
		Logger: testkit.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	stop := running(ctx, c)
	testkit.Eventually(t, time.Minute, "the collector at v1", func() bool { return c.Version() >= 1 })
	if st := c.Status(); !st.Connected || st.LastError != "" {
		t.Fatalf("status at the newest version %+v, want connected", st)
	}
	stop()
	c.Close()
	if st := c.Status(); st.Connected || !strings.Contains(st.LastError, "closed") {
		t.Fatalf("status after Close %+v, want not connected, saying closed", st)
	}
}
