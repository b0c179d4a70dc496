package cli

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/cluster/clustertest"
	"github.com/rlhub/rlhub/internal/testkit"
)

// TestServeAddrFileDoesNotOutliveTheHub: --addr-file is how a launcher
// learns where the hub listens. After a clean stop (SIGINT: serve's
// context cancelled) it must not still name the dead address, and a
// serve that fails to listen must not leave an earlier run's address
// there for the launcher to read as its own.
func TestServeAddrFileDoesNotOutliveTheHub(t *testing.T) {
	t.Run("single", func(t *testing.T) { testAddrFile(t, "--data", "") })
	t.Run("cluster", func(t *testing.T) {
		// A cluster member writes the file itself (replica.Node.Run).
		e := clustertest.Start(t)
		testAddrFile(t, "--data", t.TempDir(), "--etcd", e.Endpoint, "--cluster", "addr", "--lease-ttl", "1s", "--log-level", "error")
	})
}

func testAddrFile(t *testing.T, mode ...string) {
	addrFile := filepath.Join(t.TempDir(), "addr")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	go func() {
		code, _, _ := run(t, ctx, append([]string{"serve", "--listen", "127.0.0.1:0", "--addr-file", addrFile}, mode...)...)
		done <- code
	}()
	var first string
	testkit.Eventually(t, 30*time.Second, "serve to write its address", func() bool {
		b, err := os.ReadFile(addrFile)
		first = strings.TrimSpace(string(b))
		return err == nil && strings.HasSuffix(string(b), "\n")
	})
	cancel()
	if code := testkit.Recv(t, done, 30*time.Second, "serve to stop"); code != 0 {
		t.Fatalf("serve exited %d", code)
	}
	if b, err := os.ReadFile(addrFile); err == nil {
		t.Errorf("after a clean stop the address file still says %q (the hub there is gone)", strings.TrimSpace(string(b)))
	}

	// A second serve on the same file whose --listen is taken fails to
	// start: the file must not name the first hub's address.
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	os.WriteFile(addrFile, []byte(first+"\n"), 0o644) // as the first run left it
	code, _, errOut := run(t, context.Background(), append([]string{"serve", "--listen", busy.Addr().String(), "--addr-file", addrFile}, mode...)...)
	if code == 0 {
		t.Fatal("serve on a taken port exited 0")
	}
	if b, err := os.ReadFile(addrFile); err == nil {
		t.Errorf("serve failed (%s) but the address file says %q: a launcher reads a dead hub's address", strings.TrimSpace(errOut), strings.TrimSpace(string(b)))
	}
}
