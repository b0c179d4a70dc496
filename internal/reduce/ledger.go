package reduce

import (
	"cmp"
	"fmt"
	"slices"
	"time"

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
// Lost is provisional. EndSession reports each released id once, as lost,
// and remembers it: a retry may claim it again (it is not applied), and
// when that retry is applied MarkApplied reports it as revived, so a
// caller counting lost can take it back. An id lost twice is reported
// once. Per distinct id the ledger therefore settles on exactly one of
// applied or lost (or stays pending).
//
// Per client the ledger remembers at least Window of the newest ids; older
// applied ids collapse into a floor below which every seq counts as
// applied. With a clock (SetClock), a client idle long enough is forgotten
// whole (ForgetIdle): client ids come and go (a restarted learner takes a
// new one), and the ledger must not grow with every id ever seen. Not
// safe for concurrent use.
type Ledger struct {
	window  int
	clients map[string]*clientLog
	now     func() time.Time // SetClock; nil: no client is ever forgotten
}

type clientLog struct {
	floor   uint64 // seqs ≤ floor are applied, unless entries says otherwise
	hasFlr  bool
	entries map[uint64]claim
	used    time.Time // its last claim or applied id (with a clock)
}

// claim is one id's state: pending under session (session ≠ 0, !applied),
// applied, or lost (released by EndSession and not claimed since: session
// 0, !applied, lost). lost stays set while a retry of a lost id is pending,
// so that MarkApplied can report the revival and EndSession does not report
// it lost a second time. Sessions are never 0.
type claim struct {
	applied bool
	lost    bool   // reported lost by EndSession and not applied since
	session uint64 // owner while pending; 0 when not pending
}

func (e claim) pending() bool { return !e.applied && e.session != 0 }

// NewLedger returns an empty ledger remembering at least window ids per
// client (window < 1 means 4096).
func NewLedger(window int) *Ledger {
	if window < 1 {
		window = 4096
	}
	return &Ledger{window: window, clients: map[string]*clientLog{}}
}

// SetClock makes the ledger note when each client last claimed or had an
// id applied, for ForgetIdle. The clients it holds already count as used
// now (a ledger restored at a restart: their idle time starts then).
func (l *Ledger) SetClock(now func() time.Time) {
	l.now = now
	t := now()
	for _, c := range l.clients {
		c.used = t
	}
}

// client returns id's client log, created when create is set, noting its
// use (with a clock).
func (l *Ledger) client(name string, create bool) *clientLog {
	c := l.clients[name]
	if c == nil && create {
		c = &clientLog{entries: map[uint64]claim{}}
		l.clients[name] = c
	}
	if c != nil && l.now != nil {
		c.used = l.now()
	}
	return c
}

// ForgetIdle forgets every client whose last claim or applied id is older
// than before and that has nothing pending (lost ids included: their
// retries, if any, are long past), and returns how many it forgot. A
// retry of a forgotten client's seq is then claimed as new: exactly once
// holds for retries sent within the idle bound, which is far longer than
// any client's retry deadline.
func (l *Ledger) ForgetIdle(before time.Time) int {
	n := 0
	for name, c := range l.clients {
		if !c.used.Before(before) || c.anyPending() {
			continue
		}
		delete(l.clients, name)
		n++
	}
	return n
}

func (c *clientLog) anyPending() bool {
	for _, e := range c.entries {
		if e.pending() {
			return true
		}
	}
	return false
}

// Clients counts the clients remembered.
func (l *Ledger) Clients() int { return len(l.clients) }

// Claim marks id pending under session. It fails with an error wrapping
// errs.ErrExists when id was already applied (or is below the floor), and
// errs.ErrAborted while it is pending, in any session: that attempt may
// still be lost, so the caller should retry later rather than take it as
// applied.
func (l *Ledger) Claim(id ID, session uint64) error {
	c := l.client(id.Client, true)
	e, ok := c.entries[id.Seq]
	switch {
	case ok && e.applied:
		return fmt.Errorf("%w: duplicate push %v: already applied", errs.ErrExists, id)
	case ok && e.pending():
		// Not ErrExists: that tells a client an earlier attempt got
		// through, and this one may yet be lost with its secondary.
		return fmt.Errorf("%w: push %v is being reduced by another attempt; retry later", errs.ErrAborted, id)
	case !ok && c.hasFlr && id.Seq <= c.floor:
		return fmt.Errorf("%w: duplicate push %v: at or below the settled sequence %d", errs.ErrExists, id, c.floor)
	}
	c.entries[id.Seq] = claim{session: session, lost: e.lost} // a lost id stays marked lost until applied
	return nil
}

// Release forgets a pending claim of session (the push failed before it was
// reduced) so a retry may claim it. It reports whether it released.
func (l *Ledger) Release(id ID, session uint64) bool {
	c := l.clients[id.Client]
	if c == nil {
		return false
	}
	e, ok := c.entries[id.Seq]
	if !ok || !e.pending() || e.session != session {
		return false
	}
	if e.lost {
		c.entries[id.Seq] = claim{lost: true} // back to lost: it was counted so once
	} else {
		delete(c.entries, id.Seq)
		if len(c.entries) == 0 && !c.hasFlr {
			// Nothing of this client is remembered: a push refused after
			// its claim (a bad body under a new client id) leaves no entry.
			delete(l.clients, id.Client)
		}
	}
	return true
}

// CheckPending returns an error wrapping errs.ErrAborted unless every id is
// pending under session: the batch they form may then be applied.
func (l *Ledger) CheckPending(ids []ID, session uint64) error {
	seen := make(map[ID]struct{}, len(ids))
	for _, id := range ids {
		// One claim is one gradient: named twice, it would be counted
		// twice and weigh twice in the batch's mean.
		if _, dup := seen[id]; dup {
			return fmt.Errorf("%w: %v is named twice in one batch", errs.ErrInvalid, id)
		}
		seen[id] = struct{}{}
		c := l.clients[id.Client]
		var e claim
		ok := false
		if c != nil {
			e, ok = c.entries[id.Seq]
		}
		if !ok || !e.pending() || e.session != session {
			return fmt.Errorf("%w: %v is not pending in session %d", errs.ErrAborted, id, session)
		}
	}
	return nil
}

// MarkApplied settles ids (which CheckPending accepted) as applied. It
// returns how many of them EndSession had reported lost before (retries
// of lost gradients, now revived).
func (l *Ledger) MarkApplied(ids []ID) (revived int) {
	for _, id := range ids {
		c := l.client(id.Client, false)
		if c.entries[id.Seq].lost {
			revived++
		}
		c.entries[id.Seq] = claim{applied: true}
		if len(c.entries) > 2*l.window {
			c.compact(l.window)
		}
	}
	return revived
}

// EndSession releases every claim pending under session, so that retries
// may claim them, and returns the ones it reports lost: those not reported
// lost before (a retry of a lost id that is lost again is not reported
// twice).
func (l *Ledger) EndSession(session uint64) []ID {
	var out []ID
	for name, c := range l.clients {
		for seq, e := range c.entries {
			if e.pending() && e.session == session {
				c.entries[seq] = claim{lost: true}
				if !e.lost {
					out = append(out, ID{Client: name, Seq: seq})
				}
			}
		}
	}
	slices.SortFunc(out, func(a, b ID) int {
		// Not int(a.Seq - b.Seq): the unsigned difference wraps.
		return cmp.Or(cmp.Compare(a.Client, b.Client), cmp.Compare(a.Seq, b.Seq))
	})
	return out
}

// Pending counts claims not yet applied.
func (l *Ledger) Pending() int {
	n := 0
	for _, c := range l.clients {
		for _, e := range c.entries {
			if e.pending() {
				n++
			}
		}
	}
	return n
}

// compact drops the oldest applied entries until keep remain, raising the
// floor to the largest dropped seq. Pending and lost entries are kept
// whatever their seq (entries override the floor), and the floor never
// passes a pending seq: a pending claim may still be released, forgetting
// its entry, and below the floor its retry would be refused as already
// applied (and, after a restart, which remembers no pending claim, too).
func (c *clientLog) compact(keep int) {
	var applied []uint64
	var lowPending uint64
	hasPending := false
	for seq, e := range c.entries {
		switch {
		case e.applied:
			applied = append(applied, seq)
		case e.pending() && (!hasPending || seq < lowPending):
			lowPending, hasPending = seq, true
		}
	}
	slices.Sort(applied)
	for _, seq := range applied {
		if len(c.entries) <= keep || hasPending && seq > lowPending {
			break
		}
		delete(c.entries, seq)
		if !c.hasFlr || seq > c.floor {
			c.floor, c.hasFlr = seq, true
		}
	}
}

// AppliedSeqs is one client's applied ids as a ledger snapshot records
// them: every seq ≤ Floor (when HasFloor) and each of Seqs.
type AppliedSeqs struct {
	Floor    uint64   `json:"floor,omitempty"`
	HasFloor bool     `json:"has_floor,omitempty"`
	Seqs     []uint64 `json:"seqs,omitempty"`
}

// AddApplied records ids as applied without a claim: the primary rebuilding
// its ledger from a durable journal of applied steps. It overrides any
// claim on them.
func (l *Ledger) AddApplied(ids []ID) {
	for _, id := range ids {
		c := l.client(id.Client, true)
		c.entries[id.Seq] = claim{applied: true}
		if len(c.entries) > 2*l.window {
			c.compact(l.window)
		}
	}
}

// Applied returns the applied ids per client (sorted seqs): what a restart
// must remember. Pending and lost claims are not included: a restart ends
// every session.
func (l *Ledger) Applied() map[string]AppliedSeqs {
	out := make(map[string]AppliedSeqs, len(l.clients))
	for name, c := range l.clients {
		a := AppliedSeqs{Floor: c.floor, HasFloor: c.hasFlr}
		for seq, e := range c.entries {
			if e.applied {
				a.Seqs = append(a.Seqs, seq)
			}
		}
		slices.Sort(a.Seqs)
		if a.HasFloor || len(a.Seqs) > 0 {
			out[name] = a
		}
	}
	return out
}

// RestoreApplied adds a snapshot Applied returned (after a round trip
// through a journal) to the ledger.
func (l *Ledger) RestoreApplied(snap map[string]AppliedSeqs) {
	for name, a := range snap {
		c := l.client(name, true) // idle from now on: a restart starts its clock
		if a.HasFloor && (!c.hasFlr || a.Floor > c.floor) {
			c.floor, c.hasFlr = a.Floor, true
		}
		for _, seq := range a.Seqs {
			c.entries[seq] = claim{applied: true}
		}
		if len(c.entries) > 2*l.window {
			c.compact(l.window)
		}
	}
}
