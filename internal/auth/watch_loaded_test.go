package auth

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/testkit"
)

// A token file changed between LoadFile and the start of WatchFile (the
// hub opening its store before Start; a clustered hub's whole time as a
// standby) is reloaded at the watcher's first look: WatchFile used to
// compare against the file as it found it, not the version loaded, and
// so never reloaded it.
func TestWatchFileSeesAChangeMadeBeforeItStarted(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tokens")
	tokA, hA, _ := NewToken()
	_, hB, _ := NewToken()
	write := func(s string) {
		if err := os.WriteFile(path+".tmp", []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(path+".tmp", path); err != nil {
			t.Fatal(err)
		}
	}
	write(Line(hA, Principal{Name: "a", Role: Reader, Scopes: []string{""}}) + "\n" +
		Line(hB, Principal{Name: "b", Role: Reader, Scopes: []string{""}}) + "\n")
	v, err := LoadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// `token revoke --name a` before the watcher starts.
	write(Line(hB, Principal{Name: "b", Role: Reader, Scopes: []string{""}}) + "\n")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); v.WatchFile(ctx, path, 20*time.Millisecond, nil, testkit.Logger()) }()
	defer func() { cancel(); <-done }()
	time.Sleep(time.Second) // 50 polls
	if _, err := v.Authenticate(tokA); err == nil {
		t.Fatal("token a, revoked in the file before the watcher started, still authenticates after 50 polls")
	}
}
