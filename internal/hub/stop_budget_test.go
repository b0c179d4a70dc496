package hub

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/reducer"
	"github.com/rlhub/rlhub/internal/tensor"
	"github.com/rlhub/rlhub/internal/testkit"
)

// stopWithin starts a hub with StopTimeout stop, lets hold open a
// connection to it, and returns how long Close took.
func stopWithin(t *testing.T, cfg Config, hold func(h *Hub) net.Conn) time.Duration {
	t.Helper()
	cfg.Listen, cfg.Logger = "127.0.0.1:0", testkit.Logger()
	h, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Start(); err != nil {
		t.Fatal(err)
	}
	c := hold(h)
	defer c.Close()
	time.Sleep(200 * time.Millisecond) // the hub has read what c sent
	start := time.Now()
	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
	return time.Since(start)
}

func dialSend(t *testing.T, addr string, b []byte) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write(b); err != nil {
		t.Fatal(err)
	}
	return c
}

// A client that sent gRPC's connection preface and nothing more (its
// SETTINGS frame never comes) held the hub's stop for the whole gRPC
// handshake timeout (10 s), whatever StopTimeout (`serve --stop-timeout`)
// said: grpc-go's Stop waits for handshakes in progress. The hard stop
// now cuts them.
func TestStopIsNotHeldByAHalfDoneGRPCHandshake(t *testing.T) {
	const stop = 200 * time.Millisecond
	took := stopWithin(t, Config{StopTimeout: stop}, func(h *Hub) net.Conn {
		return dialSend(t, h.Addr().String(), []byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"))
	})
	if took > stop+2*time.Second {
		t.Errorf("Close took %v with StopTimeout %v and one client stalled in the gRPC handshake", took.Round(time.Millisecond), stop)
	}
}

// A client of the metrics endpoint with a request in progress (here its
// headers never end) held the hub's stop for the endpoint's own 2 s
// shutdown, before the gRPC stop had even begun, whatever StopTimeout
// said. The endpoint now stops within the hub's budget.
func TestStopIsNotHeldByAMetricsRequest(t *testing.T) {
	const stop = 200 * time.Millisecond
	took := stopWithin(t, Config{StopTimeout: stop, MetricsListen: "127.0.0.1:0"}, func(h *Hub) net.Conn {
		return dialSend(t, h.MetricsAddr(), []byte("GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n"))
	})
	if took > stop+time.Second {
		t.Errorf("Close took %v with StopTimeout %v and one metrics request in progress", took.Round(time.Millisecond), stop)
	}
}

// A secondary reducer whose primary stopped answering (its link hung: the
// primary's replies never come) held the hub's stop for its close flush
// (5 s) and then for the retries of each release (5 s each), whatever
// StopTimeout (`serve --stop-timeout`) said. The secondary's close now
// keeps to the hub's budget: what it could not forward within it is
// released as far as the link allows and counted lost.
func TestStopIsNotHeldByAHungPrimary(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	model, _ := tensor.NewStateDict(tensor.NewF32("w", 8))
	p, c := startWithSGDModel(t, ctx, Config{Listen: "127.0.0.1:0", Logger: testkit.Logger(), Reducer: reducer.Config{Secondaries: -1}}, model)
	var hung atomic.Bool
	px := testkit.StartProxy(t, p.Addr().String(), func(client, upstream net.Conn) {
		buf := make([]byte, 32<<10)
		for {
			n, err := upstream.Read(buf)
			if err != nil {
				return
			}
			if !hung.Load() {
				if _, err := client.Write(buf[:n]); err != nil {
					return
				}
			}
		}
	})
	const stop = 200 * time.Millisecond
	s, err := New(Config{Listen: "127.0.0.1:0", Logger: testkit.Logger(), StopTimeout: stop,
		Reducer: reducer.Config{Primary: px.Addr(), ForwardTransport: reducer.TransportGRPC, Secondaries: 1, BatchSize: 2, MaxWait: time.Hour}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 20*time.Second, "the secondary to attach", func() bool {
		return s.Reducer().SecondaryNodes()[0].Attached()
	})
	if _, err := c.PushGrad(ctx, "m", 0, model); err != nil { // held: its batch is not full
		t.Fatal(err)
	}
	if st := s.Reducer().SecondaryNodes()[0].Stats(); st.Counters.Pushed != 1 || st.Counters.Applied != 0 {
		t.Fatalf("the secondary behind the proxy saw %d gradients, %d applied; want it holding the one pushed", st.Counters.Pushed, st.Counters.Applied)
	}
	hung.Store(true)
	start := time.Now()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > stop+2*time.Second {
		t.Errorf("Close took %v with StopTimeout %v and the primary's link hung", took.Round(time.Millisecond), stop)
	}
}
