package hub

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rlhub/rlhub/internal/testkit"
)

// TestAddrFileNamesTheBoundPort: a hub started on port 0 writes the port
// it got, so a parent process needs no free-port guess (which races).
func TestAddrFileNamesTheBoundPort(t *testing.T) {
	path := filepath.Join(t.TempDir(), "addr")
	h, err := New(Config{Listen: "127.0.0.1:0", AddrFile: path, Logger: testkit.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if err := h.Start(); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := strings.TrimSpace(string(b)), h.Addr().String(); got != want || strings.HasSuffix(got, ":0") {
		t.Fatalf("address file says %q, the hub listens on %q", got, want)
	}
	if _, err := os.Stat(path + ".tmp"); !os.IsNotExist(err) {
		t.Fatalf("temporary address file left behind: %v", err)
	}
}

// TestAddrFileUnwritableFailsStart: a hub whose address cannot be
// published does not start (and frees its port).
func TestAddrFileUnwritableFailsStart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "no-such-dir", "addr")
	h, err := New(Config{Listen: "127.0.0.1:0", AddrFile: path, Logger: testkit.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if err := h.Start(); err == nil || !strings.Contains(err.Error(), "address file") {
		t.Fatalf("Start with an unwritable address file = %v, want an address-file error", err)
	}
	if h.Addr() != nil {
		t.Fatalf("a hub that failed to start reports address %v", h.Addr())
	}
}

// TestAddrFileOfALaterHubSurvivesAnEarlierStop: when a hub started on the
// same address file after this one (a restart overlapping the old
// process's stop) has written its address there, this hub's stop leaves
// the file alone: it names the later hub, which listens.
func TestAddrFileOfALaterHubSurvivesAnEarlierStop(t *testing.T) {
	path := filepath.Join(t.TempDir(), "addr")
	start := func() *Hub {
		h, err := New(Config{Listen: "127.0.0.1:0", AddrFile: path, Logger: testkit.Logger()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { h.Close() })
		if err := h.Start(); err != nil {
			t.Fatal(err)
		}
		return h
	}
	old := start()
	later := start()
	if err := old.Close(); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("the later hub's address file after the earlier hub stopped: %v", err)
	}
	if got, want := strings.TrimSpace(string(b)), later.Addr().String(); got != want {
		t.Fatalf("address file says %q, the later hub listens on %q", got, want)
	}
	if err := later.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("address file after the hub it names stopped: %v", err)
	}
}
