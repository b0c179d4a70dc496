// Package buildinfo reports which rlhub build is running.
package buildinfo

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// Version is set at link time with -ldflags "-X
// github.com/rlhub/rlhub/internal/buildinfo.Version=v1.2.3"; otherwise it
// is derived from the module's build information.
var Version = ""

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
	if v == "" || v == "(devel)" {
		v = "dev"
	}
	if rev != "" {
		v += "+" + rev
	}
	return fmt.Sprintf("rlhub %s (%s %s/%s)", v, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}
