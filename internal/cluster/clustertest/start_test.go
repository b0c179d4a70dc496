package clustertest

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// failingTB is a testing.TB whose Fatal ends only the goroutine it is
// called on, as testing's does, and whose cleanups the test runs itself:
// so a test can see what a helper that failed leaves behind.
type failingTB struct {
	testing.TB
	mu       sync.Mutex
	fatal    string
	cleanups []func()
}

func (f *failingTB) Helper() {}

func (f *failingTB) Fatal(args ...any) { f.fail(fmt.Sprint(args...)) }

func (f *failingTB) Fatalf(format string, args ...any) { f.fail(fmt.Sprintf(format, args...)) }

func (f *failingTB) fail(msg string) {
	f.mu.Lock()
	f.fatal = msg
	f.mu.Unlock()
	runtime.Goexit()
}

func (f *failingTB) Cleanup(fn func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.cleanups = append(f.cleanups, fn)
}

// cleanup runs the cleanups registered, last first (testing's order).
func (f *failingTB) cleanup() {
	f.mu.Lock()
	cs := f.cleanups
	f.cleanups = nil
	f.mu.Unlock()
	for i := len(cs) - 1; i >= 0; i-- {
		cs[i]()
	}
}

// An etcd that never serves fails Start, and its process is still killed
// (and waited for) at the test's cleanup: before, the cleanup was
// registered only once the etcd served, so a failed start left the
// process running past the test binary and its waiting goroutine behind.
func TestStartKillsAnEtcdThatNeverServes(t *testing.T) {
	bin, pidFile := t.TempDir(), filepath.Join(t.TempDir(), "pid")
	script := "#!/bin/sh\necho $$ > " + pidFile + "\nexec sleep 600\n"
	if err := os.WriteFile(filepath.Join(bin, "etcd"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	defer func(d time.Duration) { serveTimeout = d }(serveTimeout)
	serveTimeout = 2 * time.Second

	ftb := &failingTB{TB: t}
	done := make(chan struct{})
	go func() { defer close(done); Start(ftb) }()
	<-done
	if !strings.Contains(ftb.fatal, "etcd to serve") {
		t.Fatalf("Start did not fail waiting for etcd to serve: %q", ftb.fatal)
	}
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	ftb.cleanup()
	if err := syscall.Kill(pid, 0); err == nil {
		syscall.Kill(pid, syscall.SIGKILL) // not left behind by this test either
		t.Fatalf("the etcd process (pid %d) is still running after the cleanup", pid)
	}
}
