package cli

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/auth"
)

// TestCertClientFlagsAreNotIgnored: `cert --client` without --name made
// the default server and client certificates, as if --client were not
// given, and --hosts with --name N --client made a client certificate
// naming no host; both exited 0. Both are refused now, before anything
// is written.
func TestCertClientFlagsAreNotIgnored(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--client"}, "--name"},
		{[]string{"--name", "alice", "--client", "--hosts", "10.1.2.3"}, "--hosts"},
	} {
		dir := filepath.Join(t.TempDir(), "certs")
		code, out, errOut := run(t, ctx, append([]string{"cert", "--dir", dir}, c.args...)...)
		if code == 0 || !strings.Contains(errOut, c.want) {
			t.Errorf("cert %v: exit %d, stdout %q, stderr %q; want it refused naming %s", c.args, code, out, errOut, c.want)
		}
		if ents, _ := os.ReadDir(dir); len(ents) != 0 {
			t.Errorf("a refused cert %v wrote %d files (%v)", c.args, len(ents), ents)
		}
	}
	// What is still accepted: --name N --client, and --hosts for a server
	// certificate of one name.
	dir := filepath.Join(t.TempDir(), "certs")
	for _, args := range [][]string{{"--name", "alice", "--client"}, {"--name", "m1", "--hosts", "10.1.2.3"}} {
		if code, out, errOut := run(t, ctx, append([]string{"cert", "--dir", dir}, args...)...); code != 0 {
			t.Errorf("cert %v: exit %d %s %s", args, code, out, errOut)
		}
	}
}

// TestTokenOutRemovedWhenAppendFails: `token new --out X --append F` wrote
// X, then failed to append to F (here a directory) and exited 1 leaving X:
// a token in no token file, and a rerun failed with "file exists". A
// failed command now leaves no X.
func TestTokenOutRemovedWhenAppendFails(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	dir := t.TempDir()
	tokPath := filepath.Join(dir, "worker.token")
	unwritable := filepath.Join(dir, "tokens.d")
	if err := os.Mkdir(unwritable, 0o700); err != nil {
		t.Fatal(err)
	}
	code, _, errOut := run(t, ctx, "token", "new", "--role", "worker", "--scope", "*", "--out", tokPath, "--append", unwritable)
	if code == 0 {
		t.Fatalf("token new --append DIRECTORY exited 0: %q", errOut)
	}
	if b, err := os.ReadFile(tokPath); err == nil {
		t.Errorf("the failed token new (%q) left --out %s holding a token in no token file (%d bytes)", strings.TrimSpace(errOut), tokPath, len(b))
	}
	// The rerun against a writable file works, and its token is in it.
	file := filepath.Join(dir, "tokens")
	if code, out, errOut := run(t, ctx, "token", "new", "--role", "worker", "--scope", "*", "--out", tokPath, "--append", file); code != 0 {
		t.Fatalf("the rerun: exit %d %s %s", code, out, errOut)
	}
	tokens, err := auth.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(tokPath)
	if _, ok := tokens[auth.Hash(strings.TrimSpace(string(b)))]; !ok || len(tokens) != 1 {
		t.Errorf("the token in --out is not the one token of %s (%d tokens)", file, len(tokens))
	}
}

// TestServeClusterFlagsNeedEtcd: serve's cluster flags were accepted and
// ignored by a hub in no cluster (without --etcd or --embedded-etcd), and
// their values not even parsed (--replica-acks bogus served). They are
// refused now, naming the flag and what it needs.
func TestServeClusterFlagsNeedEtcd(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--replica-acks", "bogus"}, "--replica-acks"},
		{[]string{"--replica-acks", "1"}, "--replica-acks"},
		{[]string{"--replica-sync", "fsync"}, "--replica-sync"},
		{[]string{"--replica-transport", "grpc"}, "--replica-transport"},
		{[]string{"--replica-ack-timeout", "1s"}, "--replica-ack-timeout"},
		{[]string{"--replica-fault-backoff", "1s"}, "--replica-fault-backoff"},
		{[]string{"--replica-scrub-every", "1h"}, "--replica-scrub-every"},
		{[]string{"--lease-ttl", "3s"}, "--lease-ttl"},
		{[]string{"--member-id", "h1"}, "--member-id"},
		{[]string{"--cluster", "prod"}, "--cluster"},
		{[]string{"--embedded-etcd-url", "http://127.0.0.1:1"}, "--embedded-etcd-url"},
	} {
		code, errOut := serveOrRefusal(t, nil, c.args...)
		if code == 0 || !strings.Contains(errOut, c.want) || !strings.Contains(errOut, "--embedded-etcd") {
			t.Errorf("serve %v without --etcd: exit %d, stderr %q; want it refused naming %s and --etcd/--embedded-etcd", c.args, code, strings.TrimSpace(errOut), c.want)
		}
	}
}
