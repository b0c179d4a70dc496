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
	"github.com/rlhub/rlhub/internal/safetensors"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/tensor"
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

// TestServeAddrFileAfterAKillNamesNoDeadHub: a hub SIGKILLed runs no
// cleanup, so its address file still names it. The serve started after
// it on the same --data and --addr-file must take that address away
// before it opens the data (recovery reads every retained version, and
// may fail: here a version damaged on disk stops it), not only once it
// listens: else a launcher reads the killed hub's address as the new
// one's for the whole recovery, and for good when the start fails.
func TestServeAddrFileAfterAKillNamesNoDeadHub(t *testing.T) {
	data := t.TempDir()
	st, err := store.OpenFile(store.FileConfig{Dir: filepath.Join(data, "store"), Logger: testkit.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	sd, _ := tensor.NewStateDict(tensor.NewF32("w", 16))
	blob, err := safetensors.Encode(sd, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Push(context.Background(), store.PushRequest{Name: "m", Version: 1, Blob: blob}); err != nil {
		t.Fatal(err)
	}
	st.Close()

	addrFile := filepath.Join(t.TempDir(), "addr")
	args := []string{"--log-level", "warn", "serve", "--listen", "127.0.0.1:0", "--data", data, "--addr-file", addrFile}
	killed := testkit.StartProc(t, testkit.ProcConfig{Name: "hub", AddrFile: addrFile, Args: args})
	killed.Kill()
	if _, err := os.Stat(addrFile); err != nil {
		t.Fatalf("the killed hub's address file: %v (a kill removes nothing)", err)
	}
	// Damage, not debris of the kill: the next start refuses the store.
	v1 := filepath.Join(data, "store", store.VersionFile("m", 1))
	raw, err := os.ReadFile(v1)
	if err != nil {
		t.Fatal(err)
	}
	raw[len(raw)-1] ^= 0xff
	if err := os.WriteFile(v1, raw, 0o644); err != nil {
		t.Fatal(err)
	}

	next := testkit.StartProc(t, testkit.ProcConfig{Name: "hub", Args: args})
	if ps := next.Wait(t, 30*time.Second); ps.ExitCode() == 0 || !strings.Contains(next.Output(), "CRC32C") {
		t.Fatalf("serve on a damaged store: %v, want it refused naming the damage:\n%s", ps, next.Output())
	}
	if b, err := os.ReadFile(addrFile); err == nil {
		t.Errorf("serve failed to open its data, but the address file still names the killed hub, %q: a launcher takes it for this one's", strings.TrimSpace(string(b)))
	}
}
