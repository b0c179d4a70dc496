package shm

import (
	"fmt"

	"github.com/rlhub/rlhub/internal/errs"
)

// Write is a version being written into a slot in place (Begin): the
// caller fills Buf (from a socket, say) and then commits it with its
// CRC-32C, or aborts. Until then the slot's seq is odd and the writer's
// lock is held, so nothing else is published; readers keep reading the
// newest version, which lives in another slot.
type Write struct {
	w              *Writer
	i              int
	s              uint64
	version, epoch uint64
	n              int
	done           bool
}

// Begin claims a slot for version (newer than the last written, else
// *errs.StaleError) of n bytes (at most Capacity, else errs.ErrFull) and
// returns it for writing in place. Exactly one of Commit or Abort must
// follow; until then every other call on w waits.
func (w *Writer) Begin(version, epoch uint64, n int) (*Write, error) {
	w.mu.Lock()
	fail := func(err error) (*Write, error) {
		w.mu.Unlock()
		return nil, err
	}
	if w.mem == nil {
		return fail(errClosed("shm writer"))
	}
	if version <= w.published {
		return fail(staleErr(w.cfg.Name, w.published, version))
	}
	if n < 0 || int64(n) > w.geo.capacity {
		return fail(fmt.Errorf("%w: wsync: blob of %d bytes exceeds the shm slot capacity %d", errs.ErrFull, n, w.geo.capacity))
	}
	i, s, ok := w.claimSlot()
	if !ok {
		return fail(fmt.Errorf("%w: wsync: every shm slot of %s is leased or holds the newest version", errs.ErrAborted, w.cfg.Path))
	}
	startSlot(w.slot(i), version, epoch, n)
	return &Write{w: w, i: i, s: s, version: version, epoch: epoch, n: n}, nil
}

// Progress says that the first n bytes of Buf are final, so that readers
// following the write (docs/shm-layout.md) may copy them before Commit.
// n only grows; call it as the bytes arrive, from the writing goroutine.
func (t *Write) Progress(n int) {
	if !t.done && n > 0 && n <= t.n {
		u64(t.w.slot(t.i), slotWritten).Store(uint64(n))
	}
}

// Buf is the slot's memory for the version's n bytes, valid until Commit
// or Abort (after Commit it holds the published version until the writer
// writes another).
func (t *Write) Buf() []byte { return t.w.slot(t.i)[shmPage : shmPage+t.n] }

// Commit publishes the bytes written into Buf as the version, with crc
// their CRC-32C (Castagnoli), and wakes readers, as Write does.
func (t *Write) Commit(crc uint32) error {
	if t.done {
		return fmt.Errorf("wsync: shm write of version %d already ended", t.version)
	}
	t.done = true
	w := t.w
	defer w.mu.Unlock()
	slot := w.slot(t.i)
	u64(slot, slotVersion).Store(t.version)
	u64(slot, slotEpoch).Store(t.epoch)
	u64(slot, slotLength).Store(uint64(t.n))
	u32(slot, slotCRC).Store(crc)
	u64(slot, slotCreated).Store(uint64(w.cfg.Now().UnixNano()))
	u64(slot, slotSeq).Store(t.s + 2)
	w.published = t.version
	w.newest = t.i
	u64(w.mem, offPublished).Store(t.version)
	u32(w.mem, offNotify).Add(1)
	futexWake(u32(w.mem, offNotify))
	w.next = (t.i + 1) % w.geo.slots
	return nil
}

// Abort ends the write without publishing: the slot is marked empty
// (version and length 0, seq moved on, so a reader that was copying its
// old version retries) and nothing else changes. Safe after Commit (it
// does nothing).
func (t *Write) Abort() {
	if t.done {
		return
	}
	t.done = true
	w := t.w
	defer w.mu.Unlock()
	slot := w.slot(t.i)
	u64(slot, slotVersion).Store(0)
	u64(slot, slotLength).Store(0)
	u64(slot, slotWritten).Store(0)
	u64(slot, slotSeq).Store(t.s + 2)
}
