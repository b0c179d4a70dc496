package store

// SetFileHook lets external tests stop a checkpoint write at a named stage
// ("blob-partial", "blob-renamed", "manifest-partial", "manifest-renamed").
func SetFileHook(cfg *FileConfig, hook func(stage string)) { cfg.hook = hook }

// NoSpares makes f write every file new and unlink what it drops, as
// before the pool of spares (the baseline of BenchmarkFilePushInodes).
func NoSpares(f *File) { f.spares = nil }

// Entries is how many model entries s's core holds (with or without
// versions).
func Entries(s *Memory) int {
	s.c.mu.Lock()
	defer s.c.mu.Unlock()
	return len(s.c.models)
}
