package hub

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/rlhub/rlhub/internal/auth"
	"github.com/rlhub/rlhub/internal/testkit"
	"github.com/rlhub/rlhub/internal/wire/bulk"
)

// What the data plane refuses shows on /metrics, as gRPC's refusals do in
// rlhub_grpc_server_handled_total: a connection without a token, a request
// its token may not make, a method no handler serves, a malformed frame, a frame begun and never finished, a
// connection that never says what it is, and a connection over the
// per-peer cap. Before, none of them moved any counter: an SRE saw a
// client locked out by the cap, or trickling frames, in nothing but the
// client's own errors.
func TestDataPlaneRefusalsAreCounted(t *testing.T) {
	tok, hash, err := auth.NewToken()
	if err != nil {
		t.Fatal(err)
	}
	v := auth.NewVerifier(map[string]auth.Principal{hash: {Name: "trainer", Role: auth.Trainer, Scopes: []string{"*"}}})
	const maxConns = 6
	h, err := New(Config{Listen: "127.0.0.1:0", Auth: v, Logger: testkit.Logger(), MetricsListen: "127.0.0.1:0",
		Limits: Limits{FrameTimeout: 300 * time.Millisecond, MaxConnsPerPeer: maxConns}})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Start(); err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	addr := h.Addr().String()

	if st, _ := helloAnswer(t, addr, ""); codes.Code(st.GetCode()) != codes.Unauthenticated {
		t.Fatalf("a connection without a token: %v, want Unauthenticated", st)
	}
	if _, st := rawBulkRequestAs(t, addr, tok, "rlhub.v1.Replica/Follow", nil); codes.Code(st.GetCode()) != codes.PermissionDenied {
		t.Fatalf("the replication stream with a trainer's token: %v, want PermissionDenied", st)
	}
	if _, st := rawBulkRequestAs(t, addr, tok, "no.such/Method\x1b[2J", nil); codes.Code(st.GetCode()) != codes.Unimplemented {
		t.Fatalf("unknown method: %v, want Unimplemented", st)
	}
	// A malformed frame (kind 7) is answered, then the connection closed;
	// half a frame, and a connection that sends nothing, are closed
	// after the frame timeout.
	for _, tc := range []struct {
		name string
		send []byte
	}{
		{"malformed", append(bulk.Hello(tok), 7)},
		{"half a frame", append(bulk.Hello(tok), 1, 20)},
		{"nothing", nil},
	} {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(20 * time.Second)) // a hang guard
		if _, err := c.Write(tc.send); err != nil {
			t.Fatal(err)
		}
		if _, err := io.Copy(io.Discard, c); err != nil {
			t.Fatalf("%s: the hub did not close the connection: %v", tc.name, err)
		}
		c.Close()
	}
	// Connections (data-plane hellos, held open) up to the cap, then one
	// more: closed at accept.
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	testkit.Eventually(t, 10*time.Second, "the earlier connections are closed", func() bool {
		open, _ := h.bulk.PeerConns("127.0.0.1")
		return open == 0
	})
	for i := 0; i <= maxConns; i++ {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
		c.SetDeadline(time.Now().Add(20 * time.Second))
		c.Write(bulk.Hello(tok))
		magic := make([]byte, len(bulk.Magic))
		_, err = io.ReadFull(bufio.NewReader(c), magic)
		if i < maxConns && err != nil {
			t.Fatalf("connection %d of %d refused: %v", i+1, maxConns, err)
		}
		if i == maxConns && err == nil {
			t.Fatalf("connection %d over a cap of %d was served", i+1, maxConns)
		}
	}

	want := []string{
		`rlhub_conns_refused_total{reason="unauthenticated"} 1`,
		`rlhub_dataplane_requests_total{code="PermissionDenied",method="rlhub.v1.Replica/Follow"} 1`,
		`rlhub_dataplane_requests_total{code="Unimplemented",method="unknown"} 1`,
		`rlhub_conns_refused_total{reason="malformed"} 1`,
		`rlhub_conns_refused_total{reason="frame_timeout"} 1`,
		`rlhub_conns_refused_total{reason="handshake"} 1`,
		`rlhub_conns_refused_total{reason="peer_cap"} 1`,
	}
	var missing []string
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		got := scrapeMetrics(t, h.MetricsAddr(), tok)
		missing = missing[:0]
		for _, w := range want {
			if !strings.Contains(got, w+"\n") {
				missing = append(missing, w)
			}
		}
		if len(missing) == 0 {
			return
		}
		if time.Now().After(deadline) {
			var lines []string
			for _, l := range strings.Split(got, "\n") {
				if strings.HasPrefix(l, "rlhub_dataplane_") || strings.HasPrefix(l, "rlhub_conns_") {
					lines = append(lines, l)
				}
			}
			t.Fatalf("/metrics lacks\n%s\nit has\n%s", strings.Join(missing, "\n"), strings.Join(lines, "\n"))
		}
	}
}

// scrapeMetrics GETs /metrics with token.
func scrapeMetrics(t *testing.T, addr, token string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %d %v", resp.StatusCode, err)
	}
	return string(b)
}
