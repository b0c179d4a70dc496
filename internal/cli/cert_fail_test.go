package cli

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestFailedCertWritesNothing: `rlhub cert` that exits non-zero leaves the
// directory as it found it. Before the fix, (a) with ca-key.pem present
// and ca.pem missing it wrote a fresh ca.pem, then refused the key: the
// new CA's key was thrown away and every later run failed with "x509:
// provided PrivateKey doesn't match parent's PublicKey"; (b) a refused
// --no-cn still made a CA.
func TestFailedCertWritesNothing(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	dir := filepath.Join(t.TempDir(), "certs")
	if code, out, errOut := run(t, ctx, "cert", "--dir", dir, "--hosts", "127.0.0.1"); code != 0 {
		t.Fatalf("cert: %d %s %s", code, out, errOut)
	}
	for _, f := range []string{"ca.pem", "server.pem", "server-key.pem", "client.pem", "client-key.pem"} {
		os.Remove(filepath.Join(dir, f)) // ca-key.pem stays
	}
	code, _, errOut := run(t, ctx, "cert", "--dir", dir, "--hosts", "127.0.0.1")
	if code == 0 {
		t.Fatalf("cert over a lone ca-key.pem exited 0")
	}
	if _, err := os.Stat(filepath.Join(dir, "ca.pem")); err == nil {
		code2, _, errOut2 := run(t, ctx, "cert", "--dir", dir, "--hosts", "127.0.0.1")
		t.Errorf("a refused cert (%q) wrote a ca.pem that is not ca-key.pem's; the next run: exit %d %q", errOut, code2, errOut2)
	}

	empty := filepath.Join(t.TempDir(), "certs2")
	if code, _, _ := run(t, ctx, "cert", "--dir", empty, "--no-cn"); code == 0 {
		t.Fatal("--no-cn without --name --client exited 0")
	}
	if ents, _ := os.ReadDir(empty); len(ents) != 0 {
		t.Errorf("a refused --no-cn wrote %d files (%v)", len(ents), ents)
	}
}
