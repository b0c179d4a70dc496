package rlhub_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/testkit"
	"github.com/rlhub/rlhub/rlhub"
)

// A ViaDataPlane or ViaStore collector's Status is what its own polls of
// the hub saw: connected after a poll answered; not connected, naming the
// failure, once the hub (behind a proxy) hangs and a poll fails; connected
// again once a poll is answered. The hub hangs two ways: its open
// connections stay open but it answers nothing on them or on new ones (as
// a SIGSTOPped hub), or they are cut and new ones are accepted and never
// answered. Before, Status was the gRPC connection's state: ready on the
// stalled connection however the polls failed, never naming a failure, and
// on ViaDataPlane (whose polls do not use it) idle, so not connected on a
// hub that answers. The caller's own cancel (of a Poll, or of Run) and a
// refused apply are not the hub's failures.
func TestCollectorStatusFollowsPolls(t *testing.T) {
	for _, tc := range []struct {
		name        string
		via         string
		noDataPlane bool // the hub's store serves no data plane: ViaStore pulls over gRPC
		proxy       func(t *testing.T, hub string) hangingHub
	}{
		{"dataplane stalled", rlhub.ViaDataPlane, false, stalling},
		{"dataplane silent", rlhub.ViaDataPlane, false, silent},
		{"store on the data plane stalled", rlhub.ViaStore, false, stalling},
		{"store on the data plane silent", rlhub.ViaStore, false, silent},
		{"store over gRPC stalled", rlhub.ViaStore, true, stalling},
		{"store over gRPC silent", rlhub.ViaStore, true, silent},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			hub, s := policyHub(t, ctx, tc.noDataPlane)
			p := tc.proxy(t, hub)
			c, err := rlhub.NewCollector(ctx, rlhub.CollectorConfig{Hub: p.addr(), Model: "policy", Via: tc.via,
				CollectorID: "go-status-" + tc.via, Weights: weights(0), Logger: testkit.Logger()})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if ok, err := c.Poll(ctx); err != nil || !ok {
				t.Fatalf("first poll: applied %v, err %v", ok, err)
			}
			st := c.Status()
			if !st.Connected || st.LastError != "" || st.Since.IsZero() {
				t.Fatalf("status after a poll answered %+v, want connected", st)
			}
			// The caller's own: a Poll it cancelled, a Run it stopped.
			cctx, ccancel := context.WithCancel(ctx)
			ccancel()
			if _, err := c.Poll(cctx); err == nil {
				t.Fatal("a poll with a cancelled ctx succeeded")
			}
			running(ctx, c)()
			if got := c.Status(); !got.Connected || got.LastError != "" || !got.Since.Equal(st.Since) {
				t.Fatalf("status after the caller's cancels %+v, want %+v", got, st)
			}

			p.hang()
			pctx, pcancel := context.WithTimeout(ctx, 500*time.Millisecond)
			_, perr := c.Poll(pctx)
			pcancel()
			if perr == nil {
				t.Fatal("a poll of the hung hub succeeded")
			}
			failed := c.Status()
			if failed.Connected || !strings.Contains(failed.LastError, perr.Error()) || !failed.Since.After(st.Since) ||
				len(failed.LastError) > 512 {
				t.Fatalf("status after a failed poll (%v) %+v, want not connected naming it, Since after %v",
					perr, failed, st.Since)
			}

			p.resume()
			if _, err := s.Push(ctx, "policy", 2, 1, weights(2)); err != nil {
				t.Fatal(err)
			}
			testkit.Eventually(t, time.Minute, "a poll answered", func() bool {
				pctx, pcancel := context.WithTimeout(ctx, 2*time.Second)
				defer pcancel()
				_, err := c.Poll(pctx)
				return err == nil
			})
			if st := c.Status(); !st.Connected || st.LastError != "" || st.Since.Before(failed.Since) || c.Version() != 2 {
				t.Fatalf("status after a poll answered again %+v at version %d, want connected at 2", st, c.Version())
			}

			c.Close()
			if st := c.Status(); st.Connected || !strings.Contains(st.LastError, "closed") {
				t.Fatalf("status after Close %+v, want not connected, saying closed", st)
			}
		})
	}
}

// A version the collector refuses (its Weights' layout differs) fails Poll
// but is no failure of the hub, which answered: Status stays connected.
func TestCollectorStatusRefusedApplyIsNotTheHubs(t *testing.T) {
	for _, via := range []string{rlhub.ViaDataPlane, rlhub.ViaStore} {
		t.Run(via, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			hub, _ := policyHub(t, ctx, false)
			c, err := rlhub.NewCollector(ctx, rlhub.CollectorConfig{Hub: hub, Model: "policy", Via: via,
				CollectorID: "go-status-refused", Weights: otherLayout(t), Logger: testkit.Logger()})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if _, err := c.Poll(ctx); !errors.Is(err, rlhub.ErrInvalid) {
				t.Fatalf("poll into weights of another layout: %v, want ErrInvalid", err)
			}
			if st := c.Status(); !st.Connected || st.LastError != "" {
				t.Fatalf("status after a refused apply %+v, want connected", st)
			}
		})
	}
}

// hangingHub is a proxy to a hub that hangs the hub, as the test sees it,
// and resumes it.
type hangingHub interface {
	addr() string
	hang()
	resume()
}

func silent(t *testing.T, hub string) hangingHub {
	return startHangingProxy(t, hub)
}

// stallingProxy forwards connections to a hub (testkit.Proxy) and, while
// hung, holds the hub's answers on every connection, open or new, as a
// SIGSTOPped hub's kernel does: connections stay open, requests are taken,
// nothing comes back; resume lets them through.
type stallingProxy struct {
	p    *testkit.Proxy
	mu   sync.Mutex
	cond *sync.Cond // signalled when held or done changes
	held bool
	done bool // the test ended: forward whatever is held
}

func stalling(t *testing.T, hub string) hangingHub {
	s := &stallingProxy{}
	s.cond = sync.NewCond(&s.mu)
	s.p = testkit.StartProxy(t, hub, s.down)
	t.Cleanup(func() { s.set(func() { s.done = true }) }) // before the proxy's cleanup waits for down
	return s
}

func (s *stallingProxy) addr() string { return s.p.Addr() }
func (s *stallingProxy) hang()        { s.set(func() { s.held = true }) }
func (s *stallingProxy) resume()      { s.set(func() { s.held = false }) }

func (s *stallingProxy) set(f func()) {
	s.mu.Lock()
	f()
	s.mu.Unlock()
	s.cond.Broadcast()
}

// down forwards upstream's bytes to client, holding each read while hung.
func (s *stallingProxy) down(client, upstream net.Conn) {
	buf := make([]byte, 64<<10)
	for {
		n, err := upstream.Read(buf)
		s.mu.Lock()
		for s.held && !s.done {
			s.cond.Wait()
		}
		s.mu.Unlock()
		if n > 0 {
			if _, werr := client.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// otherLayout is weights of a layout the hub's "policy" versions do not
// have (three floats, not two).
func otherLayout(t *testing.T) *rlhub.StateDict {
	t.Helper()
	sd, err := rlhub.NewStateDict(rlhub.FromFloat32s("w", []int64{3}, []float32{0, 0, 0}))
	if err != nil {
		t.Fatal(err)
	}
	return sd
}
