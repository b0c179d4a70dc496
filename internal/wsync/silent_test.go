package wsync

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/testkit"
)

// Attach to a hub that accepts the connection and never answers (silent,
// or after a valid HTTP/2 preface: an empty SETTINGS frame) fails
// Unavailable once AnswerWithin has passed, saying the hub sent nothing.
// Before, opening the stream needed no answer: Attach succeeded and the
// collector then waited like one on a hub with no newer version.
func TestAttachToSilentHubFails(t *testing.T) {
	for _, hub := range []struct {
		name  string
		first []byte
	}{
		{"silent", testkit.Silent},
		{"preface-only", testkit.PrefaceOnly},
	} {
		t.Run(hub.name, func(t *testing.T) {
			conn, err := grpc.NewClient(testkit.SilentHub(t, hub.first), grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			c, err := Attach(ctx, ClientConfig{Conn: conn, CollectorID: "c", Model: "m", AnswerWithin: 200 * time.Millisecond,
				Logger: testkit.Logger()})
			if err == nil {
				c.Close()
				t.Fatalf("Attach to a %s hub succeeded, want it to fail Unavailable", hub.name)
			}
			if !errors.Is(err, errs.ErrUnavailable) || !strings.Contains(err.Error(), "sent nothing within 200ms") {
				t.Fatalf("Attach to a %s hub: %v, want Unavailable saying it sent nothing within 200ms", hub.name, err)
			}
		})
	}
}
