package cli

import (
	"bytes"
	"context"
	"net"
	"strings"
	"testing"
	"time"
)

func run(t *testing.T, ctx context.Context, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := Run(ctx, args, &out, &errb)
	return code, out.String(), errb.String()
}

func TestVersion(t *testing.T) {
	code, out, _ := run(t, context.Background(), "version")
	if code != 0 || !strings.HasPrefix(out, "rlhub ") {
		t.Fatalf("version: code %d, out %q", code, out)
	}
}

func TestUnknownCommandFails(t *testing.T) {
	code, _, errOut := run(t, context.Background(), "no-such-command")
	if code == 0 || !strings.Contains(errOut, "unknown command") {
		t.Fatalf("code %d, stderr %q", code, errOut)
	}
}

func TestBadLogLevel(t *testing.T) {
	code, _, errOut := run(t, context.Background(), "--log-level", "loud", "version")
	if code == 0 || !strings.Contains(errOut, "--log-level") {
		t.Fatalf("code %d, stderr %q", code, errOut)
	}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

func TestServeAndPing(t *testing.T) {
	addr := freeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	go func() {
		code, _, _ := run(t, ctx, "serve", "--listen", addr, "--data", t.TempDir())
		done <- code
	}()
	code, out, errOut := run(t, context.Background(), "ping", "--hub", addr, "--timeout", "20s")
	if code != 0 || !strings.Contains(out, "SERVING") {
		t.Errorf("ping: code %d, out %q, err %q", code, out, errOut)
	}
	cancel() // what SIGINT does through main's signal context
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("serve exited %d after cancel", code)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("serve did not stop")
	}
}

func TestPingNoHubFails(t *testing.T) {
	code, _, errOut := run(t, context.Background(), "ping", "--hub", freeAddr(t), "--timeout", "300ms")
	if code == 0 || !strings.Contains(errOut, "health check") {
		t.Fatalf("code %d, stderr %q", code, errOut)
	}
}
