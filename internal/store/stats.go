package store

import "sort"

// Stats is the store's counters and holdings: the one picture that
// `rlhub model ls`-style tables, RPCs and the metrics adapter
// (internal/metrics) read. It is a copy: the caller owns it.
type Stats struct {
	// Models are the models with at least one retained version, sorted by
	// name.
	Models []ModelStats
	// UnlistedRefused counts pushes refused on a name holding no version
	// then (a stale or conflicting push to a model not yet pushed, or
	// deleted): no entry of Models counts them.
	UnlistedRefused uint64
}

// ModelStats describes one model. Counters count since the store was
// opened (they are not persisted).
type ModelStats struct {
	Name    string
	Version uint64 // newest retained version
	Epoch   uint64 // highest epoch that has landed
	// Retained is how many versions are held; RetainedBytes their blobs'
	// total size; Bytes the newest version's blob size.
	Retained      int
	Bytes         int64
	RetainedBytes int64
	// Pushes counts versions that landed; Refused pushes that failed the
	// version rules (stale, conflicting or fenced off by the epoch).
	Pushes, Refused uint64
	// Reads counts versions handed to or lent to readers (Get, GetIfNewer
	// when newer, WaitNewer, Lend, LendNewer: every pull and every version
	// a watch stream sends); ReadBytes their blobs' total size.
	Reads, ReadBytes uint64
}

// StatsReader is implemented by the stores that count (Memory and File).
type StatsReader interface {
	Stats() Stats
}

var (
	_ StatsReader = (*Memory)(nil)
	_ StatsReader = (*File)(nil)
)

// modelCounters are a model's counters; guarded by core.mu.
type modelCounters struct {
	pushes, refused, reads, readBytes uint64
}

// countReadLocked counts s handed to a reader. c.mu must be held.
func (c *core) countReadLocked(s *Snapshot) {
	if s == nil {
		return
	}
	if m := c.models[s.Name]; m != nil {
		m.count.reads++
		m.count.readBytes += uint64(len(s.Blob))
	}
}

func (c *core) stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := Stats{Models: make([]ModelStats, 0, len(c.models))}
	for name, m := range c.models {
		n := m.newest()
		if n == nil {
			continue
		}
		ms := ModelStats{Name: name, Version: n.Version, Epoch: m.epoch, Retained: len(m.versions), Bytes: int64(len(n.Blob)),
			Pushes: m.count.pushes, Refused: m.count.refused, Reads: m.count.reads, ReadBytes: m.count.readBytes}
		for _, s := range m.versions {
			ms.RetainedBytes += int64(len(s.Blob))
		}
		st.Models = append(st.Models, ms)
	}
	sort.Slice(st.Models, func(i, j int) bool { return st.Models[i].Name < st.Models[j].Name })
	st.UnlistedRefused = c.unlisted.refused
	return st
}

// Stats implements StatsReader.
func (s *Memory) Stats() Stats { return s.c.stats() }

// Stats implements StatsReader.
func (f *File) Stats() Stats { return f.c.stats() }
