package cli

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// The --etcd-* flags reach the child processes a command starts (the
// workers `train ars` runs), and the RLHUB_ETCD_* environment fills the
// ones not given.
func TestEtcdFlagsCarriedToWorkers(t *testing.T) {
	t.Setenv("RLHUB_ETCD_USER", "from-env")
	f := connFlags{}
	f.etcd.CACert, f.etcd.PasswordFile = "ca.pem", "pw"
	dc, err := f.load()
	if err != nil {
		t.Fatal(err)
	}
	if dc.Etcd.CACert != "ca.pem" || dc.Etcd.User != "from-env" || dc.Etcd.PasswordFile != "pw" {
		t.Fatalf("dial config's etcd security: %+v", dc.Etcd)
	}
	args := f.args()
	for _, want := range [][]string{{"--etcd-cacert", "ca.pem"}, {"--etcd-user", "from-env"}, {"--etcd-password-file", "pw"}} {
		i := slices.Index(args, want[0])
		if i < 0 || i+1 >= len(args) || args[i+1] != want[1] {
			t.Errorf("worker args %v lack %v", args, want)
		}
	}
}

// Every command refuses plaintext etcd off loopback before dialing it,
// says why, and lets --etcd-insecure through; a password is never taken
// on the command line (only the file's name is).
func TestCommandsRefusePlaintextEtcdOffLoopback(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, args := range [][]string{
		{"cluster", "status", "--etcd", "10.9.8.7:2379", "--cluster", "x", "--timeout", "2s"},
		{"model", "ls", "--etcd", "10.9.8.7:2379", "--cluster", "x"},
	} {
		code, _, stderr := run(t, ctx, args...)
		if code == 0 || !strings.Contains(stderr, "not on loopback") || !strings.Contains(stderr, "etcd") {
			t.Errorf("%v: code %d, stderr %q", args, code, stderr)
		}
	}
	pw := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(pw, []byte("secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// Allowed through: the refusal is gone (what is left is etcd not
	// answering at a closed port) and the password is not echoed.
	code, _, stderr := run(t, ctx, "--etcd-insecure", "--etcd-user", "u", "--etcd-password-file", pw,
		"cluster", "status", "--etcd", "10.9.8.7:2379", "--cluster", "x", "--timeout", "1s")
	if code == 0 || strings.Contains(stderr, "not on loopback") || strings.Contains(stderr, "secret") {
		t.Errorf("--etcd-insecure: code %d, stderr %q", code, stderr)
	}
	if code, _, stderr := run(t, ctx, "cluster", "status", "--etcd-password", "x"); code == 0 || !strings.Contains(stderr, "unknown flag") {
		t.Errorf("a password flag exists: code %d, %q", code, stderr)
	}
}
