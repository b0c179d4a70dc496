package replica

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/testkit"
)

// BenchmarkSnapshotState is the primary's cost of one unit's snapshot
// (the write itself not timed) when one reducer file changed (1 KiB
// rewritten and named), with files
// state files under reducer/ in all: "named" stats the named file only,
// "walk" walks ars/ and reducer/ whole on every unit (what a snapshot did
// before writers named their files; the safety net's walk, every unit).
// It reports, not asserts.
func BenchmarkSnapshotState(b *testing.B) {
	for _, files := range []int{10, 100, 1000} {
		for _, mode := range []string{"named", "walk"} {
			b.Run(fmt.Sprintf("files=%d/%s", files, mode), func(b *testing.B) {
				dir := b.TempDir()
				for i := range files {
					d := filepath.Join(dir, "reducer", fmt.Sprintf("m%d", i%10))
					if err := os.MkdirAll(d, 0o755); err != nil {
						b.Fatal(err)
					}
					if err := os.WriteFile(filepath.Join(d, fmt.Sprintf("f%d", i)), make([]byte, 64), 0o644); err != nil {
						b.Fatal(err)
					}
				}
				src, err := NewSource(SourceConfig{DataDir: dir, Logger: testkit.Logger()})
				if err != nil {
					b.Fatal(err)
				}
				src.fullEvery = time.Hour
				if mode == "walk" {
					src.fullEvery = 0
				}
				snap := func(prev *snapshot) *snapshot {
					src.snapMu.Lock()
					s, err := src.takeSnapshot(prev, true)
					src.snapMu.Unlock()
					if err != nil {
						b.Fatal(err)
					}
					src.mu.Lock()
					frees := src.dropPassed() // no follower: nothing is kept
					src.mu.Unlock()
					for _, m := range frees {
						m.free()
					}
					return s
				}
				prev := snap(nil)
				changed := filepath.Join(dir, "reducer", "m0", "f0")
				buf := make([]byte, 1024)
				b.ResetTimer()
				for i := range b.N {
					b.StopTimer() // the write is the reducer's, not the snapshot's
					buf[0] = byte(i)
					if err := os.WriteFile(changed, buf, 0o644); err != nil {
						b.Fatal(err)
					}
					b.StartTimer()
					src.Changed(changed)
					prev = snap(prev)
				}
				b.ReportMetric(float64(src.stateWalks.Load())/float64(b.N), "walks/op")
			})
		}
	}
}
