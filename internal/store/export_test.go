package store

// SetFileHook lets external tests stop a checkpoint write at a named stage
// ("blob-partial", "blob-renamed", "manifest-partial", "manifest-renamed").
func SetFileHook(cfg *FileConfig, hook func(stage string)) { cfg.hook = hook }
