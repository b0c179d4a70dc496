// Package buildinfo reports which rlhub build is running.
package buildinfo

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"
)

// Release is the rlhub release this source tree is, shared with the
// Python client: python/rlhub/_version.py's __version__ must equal it
// (TestReleaseMatchesPython). String reports it when neither -ldflags nor
// the module's build information name a version.
const Release = "0.1.0"

// Version is set at link time with -ldflags "-X
// github.com/rlhub/rlhub/internal/buildinfo.Version=v1.2.3"; otherwise it
// is derived from the module's build information.
var Version = ""

// release is the version String reports for v, the one -ldflags or the
// build information gave: v itself when it names a release, else
// Release-dev. Go stamps a binary built from a checkout with a
// pseudo-version of its commit (v0.0.0-DATE-HASH), which names no
// release: the Python client of the same tree says Release.
func release(v string) string {
	if v == "" || v == "(devel)" || strings.HasPrefix(v, "v0.0.0-") {
		return Release + "-dev"
	}
	return v
}

// String returns a one-line description: version, VCS revision, Go version
// and platform.
func String() string {
	v, rev := Version, ""
	if bi, ok := debug.ReadBuildInfo(); ok {
		if v == "" {
			v = bi.Main.Version
		}
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 12 {
				rev = s.Value[:12]
			}
		}
	}
	v = release(v)
	if rev != "" {
		v += "+" + rev
	}
	return fmt.Sprintf("rlhub %s (%s %s/%s)", v, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}
