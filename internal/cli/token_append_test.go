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

// TestTokenAppendAfterLineWithoutNewline: a token file whose last line
// has no newline (written by hand, `printf`, an editor that strips the
// final newline) must still get the new token on a line of its own.
// Before the fix the new line was glued onto the old one: the old
// reader token became the new admin token's role and name, and the new
// token was in no line at all.
func TestTokenAppendAfterLineWithoutNewline(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	dir := t.TempDir()
	file := filepath.Join(dir, "tokens")
	tokPath := filepath.Join(dir, "reader.token")
	if code, out, errOut := run(t, ctx, "token", "new", "--append", file, "--role", "reader", "--scope", "*", "--name", "watcher", "--out", tokPath); code != 0 {
		t.Fatalf("token new: %d %s %s", code, out, errOut)
	}
	raw, _ := os.ReadFile(file)
	if err := os.WriteFile(file, []byte(strings.TrimRight(string(raw), "\n")), 0o600); err != nil {
		t.Fatal(err)
	}
	adminPath := filepath.Join(dir, "admin.token")
	if code, out, errOut := run(t, ctx, "token", "new", "--append", file, "--role", "admin", "--scope", "*", "--name", "root", "--out", adminPath); code != 0 {
		t.Fatalf("token new: %d %s %s", code, out, errOut)
	}
	tokens, err := auth.ReadFile(file)
	if err != nil {
		t.Fatalf("the token file no longer parses: %v", err)
	}
	secret := func(p string) string { b, _ := os.ReadFile(p); return strings.TrimSpace(string(b)) }
	reader, ok := tokens[auth.Hash(secret(tokPath))]
	if !ok || reader.Role.String() != "reader" || reader.Name != "watcher" {
		t.Errorf("the reader token is now %+v (present %v); want role reader, name watcher", reader, ok)
	}
	if _, ok := tokens[auth.Hash(secret(adminPath))]; !ok {
		t.Errorf("the new admin token is in no line of the file: %d tokens", len(tokens))
	}
}

// TestTokenNameIsPrintable: token names reach token ls, model ls's OWNER
// column and the logs; one holding a terminal escape is refused.
func TestTokenNameIsPrintable(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	file := filepath.Join(t.TempDir(), "tokens")
	code, _, errOut := run(t, ctx, "token", "new", "--append", file, "--role", "reader", "--scope", "*", "--name", "evil\x1b[2J")
	if code == 0 || !strings.Contains(errOut, "unprintable") {
		t.Fatalf("token new --name with an escape: exit %d, %q", code, errOut)
	}
	if b, err := os.ReadFile(file); err == nil && len(b) > 0 {
		t.Fatalf("the refused token was written: %q", b)
	}
}
