package auth

import (
	"context"
	"log/slog"
	"os"
	"syscall"
	"time"
)

// ReloadFile reads path again (the checks of LoadFile) and swaps its
// tokens in (Replace): a removed or changed token's calls in progress are
// cut. A file that fails the checks changes nothing and returns the error.
// It returns the number of tokens loaded and of calls cut.
func (v *Verifier) ReloadFile(path string) (tokens, cut int, err error) {
	s := stamp(path) // before the read: a change after it is seen again
	t, err := ReadFile(path)
	if err != nil {
		v.stats.reloadFailures.Add(1)
		return 0, 0, err
	}
	v.stats.reloads.Add(1)
	v.setLoaded(s)
	return len(t), v.Replace(t), nil
}

// DefaultReloadInterval is how often WatchFile looks at the token file.
const DefaultReloadInterval = 2 * time.Second

// WatchFile reloads path into v when reload receives (the hub's SIGHUP) or
// when the file's identity, size or modification time changes (looked at
// every interval; 0 means DefaultReloadInterval, negative: only on
// reload), until ctx is done. A reload that fails is logged and changes
// nothing: the tokens loaded last stay in force. It polls rather than
// using inotify so that editors that replace the file, bind mounts and
// Kubernetes secret volumes (a symlink swap) are all seen.
func (v *Verifier) WatchFile(ctx context.Context, path string, interval time.Duration, reload <-chan struct{}, log *slog.Logger) {
	if interval == 0 {
		interval = DefaultReloadInterval
	}
	var tick <-chan time.Time
	if interval > 0 {
		t := time.NewTicker(interval)
		defer t.Stop()
		tick = t.C
	}
	// Compared with the version loaded last (LoadFile, ReloadFile), not
	// with the file as it is now: a change made between the load and
	// this watch (a hub opening its store, a clustered hub's time as a
	// standby) is reloaded at the first look.
	last, ok := v.loadedStamp()
	if !ok {
		last = stamp(path)
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-reload:
		case <-tick:
			if s := stamp(path); s == last {
				continue
			}
		}
		last = stamp(path)
		n, cut, err := v.ReloadFile(path)
		if err != nil {
			log.Error("auth: token file not reloaded; the tokens loaded before stay in force", "file", path, "err", err)
			continue
		}
		log.Info("auth: token file reloaded", "file", path, "tokens", n, "calls_cut", cut)
	}
}

// fileStamp identifies a version of a file cheaply.
type fileStamp struct {
	dev, ino uint64
	size     int64
	mtime    int64
}

func stamp(path string) fileStamp {
	st, err := os.Stat(path)
	if err != nil {
		return fileStamp{}
	}
	s := fileStamp{size: st.Size(), mtime: st.ModTime().UnixNano()}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		s.dev, s.ino = uint64(sys.Dev), uint64(sys.Ino)
	}
	return s
}

func (v *Verifier) setLoaded(s fileStamp) {
	v.mu.Lock()
	v.loaded, v.hasLoaded = s, true
	v.mu.Unlock()
}

func (v *Verifier) loadedStamp() (fileStamp, bool) {
	v.mu.RLock()
	defer v.mu.RUnlock()
	return v.loaded, v.hasLoaded
}
