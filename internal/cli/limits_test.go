package cli

import (
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rlhub/rlhub/internal/optim"
	"github.com/rlhub/rlhub/internal/reducer"
	"github.com/rlhub/rlhub/internal/safetensors"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/store/storerpc"
	"github.com/rlhub/rlhub/internal/tensor"
	"github.com/rlhub/rlhub/internal/testkit"
	"github.com/rlhub/rlhub/internal/wire/bulk"
)

// serveChildEnv makes the test binary act as `rlhub serve` with the
// arguments in the variable (space-separated), for tests that need the hub
// in its own process (its own file-descriptor limit).
const serveChildEnv = "RLHUB_CLI_TEST_SERVE_ARGS"

// startServeChild runs `rlhub serve ARGS --addr-file F` as a child
// process (this test binary, serveChildEnv) and returns once it listens;
// the Proc is SIGKILLed and reaped at cleanup, its output logged if the
// test failed.
func startServeChild(t *testing.T, args string) *testkit.Proc {
	t.Helper()
	addrFile := filepath.Join(t.TempDir(), "addr")
	return testkit.StartProc(t, testkit.ProcConfig{Name: "rlhub " + args, Path: os.Args[0],
		Env: []string{serveChildEnv + "=" + args + " --addr-file " + addrFile}, AddrFile: addrFile})
}

// startLimitedServeChild runs startServeChild, then caps the child's open
// files at nofile (soft and hard, with prlimit(2): the Go runtime raises
// the soft limit to the hard one at start), and returns its address.
func startLimitedServeChild(t *testing.T, nofile uint64, args string) string {
	t.Helper()
	p := startServeChild(t, args)
	lim := unix.Rlimit{Cur: nofile, Max: nofile}
	if err := unix.Prlimit(p.Pid(), unix.RLIMIT_NOFILE, &lim, nil); err != nil {
		t.Fatalf("prlimit: %v", err)
	}
	return p.Addr()
}

// TestHalfOpenDataPlaneConnectionsDoNotLockOut is issue 16's fourth abuse:
// 600 connections that sent the data-plane magic plus part of a request
// used to lock every new client out of a hub with 512 file descriptors,
// for ever. Here a hub limited to 256 descriptors takes 1000 of them from
// one peer (127.0.0.2): it holds at most --max-conns-per-peer, a client
// from another address pushes a model and gradients (gRPC and data plane)
// meanwhile, every half-open connection is closed by the server within
// --frame-timeout, and then the attacking address is served again too.
func TestHalfOpenDataPlaneConnectionsDoNotLockOut(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a hub process and 1000 connections")
	}
	addr := startLimitedServeChild(t, 256, "serve --listen 127.0.0.1:0 --data= --frame-timeout 2s --max-conns-per-peer 100")
	const n = 1000
	attack := make([]net.Conn, 0, n)
	defer func() {
		for _, c := range attack {
			c.Close()
		}
	}()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}, Timeout: 10 * time.Second}
	frame := append(bulk.Hello(""), 1, 20, 0) // a request whose 20-byte method never comes
	frame = append(frame, "rlhub.v1"...)
	for range n {
		c, err := d.Dial("tcp", addr)
		if err != nil {
			t.Fatalf("attacker dial %d: %v", len(attack), err)
		}
		attack = append(attack, c)
		c.Write(frame) // a connection the hub already closed may refuse it
	}

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	useHub(t, ctx, addr, "m")

	closed := 0
	for _, c := range attack {
		_ = c.SetReadDeadline(time.Now().Add(30 * time.Second)) // a hang guard; the deadline is 2s
		_, err := io.Copy(io.Discard, c)
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			break
		}
		closed++
	}
	if closed != n {
		t.Fatalf("the hub closed %d of %d half-open connections", closed, n)
	}
	// The attacker's address is not banned: its places are free again.
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := c.Write(bulk.Hello("")); err != nil {
		t.Fatal(err)
	}
	magic := make([]byte, len(bulk.Magic))
	if _, err := io.ReadFull(c, magic); err != nil || string(magic) != bulk.Magic {
		t.Fatalf("the attacking address after its connections closed: %q, %v", magic, err)
	}
}

// useHub pushes a model to the hub at addr, registers it with the reducer
// and pushes gradients to it (over the data plane when the hub speaks it).
func useHub(t *testing.T, ctx context.Context, addr, name string) {
	t.Helper()
	sc, err := storerpc.NewClient(storerpc.ClientConfig{Addr: addr})
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	model, _ := tensor.NewStateDict(tensor.NewF32("w", 64))
	blob, _ := safetensors.Encode(model, nil)
	if _, err := sc.Push(ctx, store.PushRequest{Name: name, Version: 1, Blob: blob}); err != nil {
		t.Fatalf("a new client's store push during the attack: %v", err)
	}
	rc, err := reducer.NewClient(reducer.ClientConfig{Hub: addr, ClientID: "legit"})
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	if _, _, err := rc.Register(ctx, reducer.ModelConfig{Model: name, Optimizer: optim.Config{Kind: optim.SGD, LR: 0.1}}); err != nil {
		t.Fatalf("a new client's register during the attack: %v", err)
	}
	for i := range 3 {
		if _, err := rc.PushGrad(ctx, name, 0, model); err != nil {
			t.Fatalf("a new client's gradient %d during the attack: %v", i, err)
		}
	}
}
