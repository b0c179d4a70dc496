package dial

import (
	"context"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/rlhub/rlhub/internal/testkit"
)

// silentHub is a real listener on 127.0.0.1 that accepts connections and
// holds them open, reading and discarding, as a SIGSTOPped or wedged hub
// does. With half it first writes the beginning of an HTTP/2 SETTINGS
// frame (its 9-byte header announcing 6 bytes, and 3 of them) and then
// nothing: a server that stopped mid-message.
func silentHub(t *testing.T, half bool) string {
	t.Helper()
	lis := testkit.Listen(t)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Go(func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Go(func() {
				if half {
					_, _ = c.Write([]byte{0, 0, 6, 0x4, 0, 0, 0, 0, 0, 0, 0x3, 0})
				}
				_, _ = io.Copy(io.Discard, c) // until the client or the cleanup closes it
			})
		}
	})
	t.Cleanup(func() {
		lis.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return lis.Addr().String()
}

// A plaintext call without a deadline to a hub that accepts the connection
// and never answers, or stops mid-message, fails Unavailable at gRPC's
// connect deadline (shortened here), with an error that says the hub sent
// nothing, not that it closed the connection and may want TLS (the hint
// for a TLS hub, which does close it).
func TestCallToSilentHubSaysItSentNothing(t *testing.T) {
	for _, half := range []bool{false, true} {
		name := map[bool]string{false: "silent", true: "half-sent"}[half]
		t.Run(name, func(t *testing.T) {
			conn, err := Config{}.GRPC(silentHub(t, half), grpc.WithConnectParams(grpc.ConnectParams{
				MinConnectTimeout: 100 * time.Millisecond, Backoff: backoff.Config{BaseDelay: 10 * time.Millisecond, Multiplier: 1.6, MaxDelay: 100 * time.Millisecond}}))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			check := func(what string, err error) {
				t.Helper()
				if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "sent nothing") || strings.Contains(err.Error(), "TLS") {
					t.Errorf("%s to a silent hub: %v, want Unavailable saying the hub sent nothing", what, err)
				}
			}
			_, err = healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{})
			check("unary call", err)
			st, err := healthpb.NewHealthClient(conn).Watch(context.Background(), &healthpb.HealthCheckRequest{})
			if err == nil {
				_, err = st.Recv()
			}
			check("stream", err)
		})
	}
}
