package dial

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/rlhub/rlhub/internal/testkit"
)

// A plaintext call without a deadline to a hub that accepts the connection
// and never answers, or stops mid-message, fails Unavailable at gRPC's
// connect deadline (shortened here), with an error that says the hub sent
// nothing, not that it closed the connection and may want TLS (the hint
// for a TLS hub, which does close it).
func TestCallToSilentHubSaysItSentNothing(t *testing.T) {
	for _, hub := range []struct {
		name  string
		first []byte
	}{{"silent", testkit.Silent}, {"half-sent", testkit.HalfSettings}} {
		t.Run(hub.name, func(t *testing.T) {
			conn, err := Config{}.GRPC(testkit.SilentHub(t, hub.first), grpc.WithConnectParams(grpc.ConnectParams{
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
