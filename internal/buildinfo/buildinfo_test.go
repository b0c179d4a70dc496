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

// A binary built from a checkout is stamped by Go with a pseudo-version of
// its commit, which names no release: it reports Release-dev, as the
// Python client of the same tree reports Release. A release tag or an
// -ldflags version is reported as it is.
func TestReleaseOfPseudoVersions(t *testing.T) {
	for in, want := range map[string]string{
		"":                                   Release + "-dev",
		"(devel)":                            Release + "-dev",
		"v0.0.0-20261205092954-59546a6daccd": Release + "-dev",
		"v0.0.0-20261205092954-59546a6daccd+dirty": Release + "-dev",
		"v0.1.0": "v0.1.0",
		"v1.2.3": "v1.2.3",
	} {
		if got := release(in); got != want {
			t.Errorf("release(%q) = %q, want %q", in, got, want)
		}
	}
}
