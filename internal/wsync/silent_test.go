package wsync

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/testkit"
)

// silentHub is a real listener on 127.0.0.1 that accepts connections,
// writes first (each connection) and then holds them open, reading and
// discarding, as a SIGSTOPped or wedged hub does.
func silentHub(t *testing.T, first []byte) string {
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
				_, _ = c.Write(first)
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
		{"silent", nil},
		{"preface-only", []byte{0, 0, 0, 0x4, 0, 0, 0, 0, 0}},
	} {
		t.Run(hub.name, func(t *testing.T) {
			conn, err := grpc.NewClient(silentHub(t, hub.first), grpc.WithTransportCredentials(insecure.NewCredentials()))
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
