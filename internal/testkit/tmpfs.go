package testkit

import (
	"os"
	"os/exec"
	"testing"
)

// SmallTmpfs mounts a tmpfs of size (mount(8)'s size=, e.g. "16m") on a
// new temporary directory and returns it: a file system that fills up,
// as a disk or a container's /dev/shm does. It is unmounted when the test
// ends, after whatever the test started later has stopped (cleanups run
// in reverse). It needs root: otherwise the test is skipped, saying so.
func SmallTmpfs(t testing.TB, size string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mounting a small tmpfs (a file system that fills up) needs root")
	}
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size, "tmpfs", dir).CombinedOutput(); err != nil {
		t.Fatalf("mount a %s tmpfs on %s: %v: %s", size, dir, err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", dir, err, out)
		}
	})
	return dir
}
