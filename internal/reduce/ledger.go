package reduce

import (
	"fmt"
	"slices"

	"github.com/rlhub/rlhub/internal/errs"
)

// Ledger is the primary's exactly-once record of (client, seq) pairs. A
// secondary claims an id under its session before it reduces the gradient;
// a claim is refused while the id is applied or pending anywhere, so a
// retry that lands on another secondary cannot be reduced twice. When a
// session ends (the secondary died or detached) its pending claims are
// released and a retry may claim them again; the primary refuses any later
// forward from the ended session (fencing), so the lost batch can never be
// applied after all.
//
// Per client the ledger remembers at least Window of the newest ids; older
// settled ids collapse into a floor below which every seq counts as
// applied. Not safe for concurrent use.
type Ledger struct {
	window  int
	clients map[string]*clientLog
}

type clientLog struct {
	floor   uint64 // seqs ≤ floor are settled, unless pending in entries
	hasFlr  bool
	entries map[uint64]claim
}

type claim struct {
	applied bool
	session uint64 // owner while pending
}

// NewLedger returns an empty ledger remembering at least window ids per
// client (window < 1 means 4096).
func NewLedger(window int) *Ledger {
	if window < 1 {
		window = 4096
	}
	return &Ledger{window: window, clients: map[string]*clientLog{}}
}

// Claim marks id pending under session. It fails with an error wrapping
// errs.ErrExists when id was already applied (or is below the floor) or is
// pending, in any session.
func (l *Ledger) Claim(id ID, session uint64) error {
	c := l.clients[id.Client]
	if c == nil {
		c = &clientLog{entries: map[uint64]claim{}}
		l.clients[id.Client] = c
	}
	if e, ok := c.entries[id.Seq]; ok {
		if e.applied {
			return fmt.Errorf("%w: duplicate push %v: already applied", errs.ErrExists, id)
		}
		return fmt.Errorf("%w: duplicate push %v: already being reduced", errs.ErrExists, id)
	}
	if c.hasFlr && id.Seq <= c.floor {
		return fmt.Errorf("%w: duplicate push %v: at or below the settled sequence %d", errs.ErrExists, id, c.floor)
	}
	c.entries[id.Seq] = claim{session: session}
	return nil
}

// Release forgets a pending claim of session (the push failed before it was
// reduced) so a retry may claim it. It reports whether it released.
func (l *Ledger) Release(id ID, session uint64) bool {
	c := l.clients[id.Client]
	if c == nil {
		return false
	}
	if e, ok := c.entries[id.Seq]; ok && !e.applied && e.session == session {
		delete(c.entries, id.Seq)
		return true
	}
	return false
}

// CheckPending returns an error wrapping errs.ErrAborted unless every id is
// pending under session: the batch they form may then be applied.
func (l *Ledger) CheckPending(ids []ID, session uint64) error {
	for _, id := range ids {
		c := l.clients[id.Client]
		var e claim
		ok := false
		if c != nil {
			e, ok = c.entries[id.Seq]
		}
		if !ok || e.applied || e.session != session {
			return fmt.Errorf("%w: %v is not pending in session %d", errs.ErrAborted, id, session)
		}
	}
	return nil
}

// MarkApplied settles ids (which CheckPending accepted) as applied.
func (l *Ledger) MarkApplied(ids []ID) {
	for _, id := range ids {
		c := l.clients[id.Client]
		c.entries[id.Seq] = claim{applied: true}
		if len(c.entries) > 2*l.window {
			c.compact(l.window)
		}
	}
}

// EndSession releases every claim pending under session and returns them.
func (l *Ledger) EndSession(session uint64) []ID {
	var out []ID
	for name, c := range l.clients {
		for seq, e := range c.entries {
			if !e.applied && e.session == session {
				delete(c.entries, seq)
				out = append(out, ID{Client: name, Seq: seq})
			}
		}
	}
	slices.SortFunc(out, func(a, b ID) int {
		if a.Client != b.Client {
			if a.Client < b.Client {
				return -1
			}
			return 1
		}
		return int(a.Seq - b.Seq)
	})
	return out
}

// Pending counts claims not yet applied.
func (l *Ledger) Pending() int {
	n := 0
	for _, c := range l.clients {
		for _, e := range c.entries {
			if !e.applied {
				n++
			}
		}
	}
	return n
}

// compact drops the oldest applied entries until keep remain, raising the
// floor to the largest dropped seq. Pending entries are kept whatever their
// seq.
func (c *clientLog) compact(keep int) {
	var applied []uint64
	for seq, e := range c.entries {
		if e.applied {
			applied = append(applied, seq)
		}
	}
	slices.Sort(applied)
	for _, seq := range applied {
		if len(c.entries) <= keep {
			break
		}
		delete(c.entries, seq)
		if !c.hasFlr || seq > c.floor {
			c.floor, c.hasFlr = seq, true
		}
	}
}
