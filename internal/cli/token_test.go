package cli

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/rlhub/rlhub/internal/dial"
	"github.com/rlhub/rlhub/internal/testkit"
	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// token new writes expiry and quotas (and refuses a scope with an empty
// item), token ls shows them and no secret,
// token revoke removes exactly the named token (and refuses a name that
// is not there, changing nothing); the file stays 0600.
func TestTokenNewListRevoke(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	dir := t.TempDir()
	file := filepath.Join(dir, "tokens")
	for _, args := range [][]string{
		{"--role", "trainer", "--scope", "ppo/", "--name", "ppo", "--expires", "1h", "--max-models", "2", "--max-bytes", "1MiB", "--max-rps", "2.5", "--out", filepath.Join(dir, "ppo.token")},
		{"--role", "reader", "--scope", "*", "--name", "watcher", "--out", filepath.Join(dir, "watcher.token")},
	} {
		if code, out, errOut := run(t, ctx, append([]string{"token", "new", "--append", file}, args...)...); code != 0 {
			t.Fatalf("token new %v: %d %s %s", args, code, out, errOut)
		}
	}
	code, out, errOut := run(t, ctx, "token", "ls", "--file", file)
	secret, _ := os.ReadFile(filepath.Join(dir, "ppo.token"))
	if code != 0 || !regexp.MustCompile(`ppo\s+trainer\s+ppo/\s+20\d\d-\d\d-\d\dT\S+Z\s+models=2 bytes=1048576 rps=2.5`).MatchString(out) ||
		!regexp.MustCompile(`watcher\s+reader\s+\*\s+never\s+-`).MatchString(out) || strings.Contains(out, strings.TrimSpace(string(secret))) {
		t.Fatalf("token ls: %d %q %q", code, out, errOut)
	}
	before, _ := os.ReadFile(file)
	// A scope with an empty item would cover every model: refused, and
	// nothing is appended.
	for _, scope := range []string{"ppo/,", "", "ppo/,,ars/"} {
		if code, out, errOut := run(t, ctx, "token", "new", "--append", file, "--role", "trainer", "--scope", scope, "--name", "typo"); code == 0 || !strings.Contains(errOut, "empty item") {
			t.Fatalf("token new --scope %q: %d %q %q", scope, code, out, errOut)
		}
	}
	if after, _ := os.ReadFile(file); string(after) != string(before) {
		t.Fatal("a refused token new changed the file")
	}
	if code, _, errOut := run(t, ctx, "token", "revoke", "--file", file, "--name", "nobody"); code == 0 || !strings.Contains(errOut, `no token named "nobody"`) {
		t.Fatalf("revoke of an unknown name: %d %q", code, errOut)
	}
	if after, _ := os.ReadFile(file); string(after) != string(before) {
		t.Fatal("a failed revoke changed the file")
	}
	if code, out, errOut := run(t, ctx, "token", "revoke", "--file", file, "--name", "ppo"); code != 0 || !strings.Contains(out, "revoked 1 token") {
		t.Fatalf("revoke: %d %q %q", code, out, errOut)
	}
	after, _ := os.ReadFile(file)
	if strings.Contains(string(after), "name=ppo") || !strings.Contains(string(after), "name=watcher") {
		t.Fatalf("after revoke: %q", after)
	}
	if st, _ := os.Stat(file); st.Mode().Perm() != 0o600 {
		t.Fatalf("token file mode %v after revoke", st.Mode().Perm())
	}
}

// A real `rlhub serve` process that only reloads on SIGHUP: a token
// revoked with `rlhub token revoke` works until the signal, and its open
// watch is cut and its next call refused after it.
func TestServeReloadsTokensOnSIGHUP(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a hub process")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	dir := t.TempDir()
	file := filepath.Join(dir, "tokens")
	tokPath := filepath.Join(dir, "w.token")
	if code, out, errOut := run(t, ctx, "token", "new", "--append", file, "--role", "reader", "--scope", "*", "--name", "w", "--out", tokPath); code != 0 {
		t.Fatalf("token new: %d %s %s", code, out, errOut)
	}
	if code, out, errOut := run(t, ctx, "token", "new", "--append", file, "--role", "admin", "--scope", "*", "--name", "root"); code != 0 {
		t.Fatalf("token new: %d %s %s", code, out, errOut)
	}
	hub := startServeChild(t, "serve --listen 127.0.0.1:0 --data= --auth-reload -1s --auth-tokens "+file)
	addr := hub.Addr()
	cfg, err := dial.Files{TokenFile: tokPath}.Load()
	if err != nil {
		t.Fatal(err)
	}
	conn, err := cfg.GRPC(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	st := rlhubv1.NewModelStoreClient(conn)
	w, err := st.Watch(ctx, &rlhubv1.StoreWatchRequest{Model: "none"})
	if err != nil {
		t.Fatal(err)
	}
	end := make(chan error, 1)
	go func() {
		_, err := w.Recv()
		end <- err
	}()
	if code, out, errOut := run(t, ctx, "token", "revoke", "--file", file, "--name", "w"); code != 0 {
		t.Fatalf("revoke: %d %s %s", code, out, errOut)
	}
	// Without the signal the hub has not looked at the file.
	if _, err := st.List(ctx, &rlhubv1.StoreListRequest{}); err != nil {
		t.Fatalf("before SIGHUP: %v", err)
	}
	hub.Signal(t, syscall.SIGHUP)
	err = testkit.Recv(t, end, 20*time.Second, "the watch to be cut after SIGHUP")
	if status.Code(err) != codes.Unauthenticated || !strings.Contains(err.Error(), "revoked") {
		t.Fatalf("the watch ended with %v", err)
	}
	if _, err := st.List(ctx, &rlhubv1.StoreListRequest{}); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("after SIGHUP: %v", err)
	}
}
