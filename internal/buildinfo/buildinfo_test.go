package buildinfo

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// The Go binary and the Python wheel are one release: the version is
// written in two places (Go cannot embed a file outside its package, and
// the wheel is built from python/ alone), and this test keeps them equal.
func TestReleaseMatchesPython(t *testing.T) {
	b, err := os.ReadFile("../../python/rlhub/_version.py")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^__version__ = "([^"]+)"$`).FindSubmatch(b)
	if m == nil {
		t.Fatal(`python/rlhub/_version.py has no line __version__ = "..."`)
	}
	if got := string(m[1]); got != Release {
		t.Errorf("python/rlhub/_version.py says %q, buildinfo.Release is %q: change both", got, Release)
	}
}

func TestStringNamesRelease(t *testing.T) {
	if s := String(); !strings.HasPrefix(s, "rlhub ") {
		t.Errorf("String() = %q, want it to start with \"rlhub \"", s)
	}
}
