package reducer

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestDurableStateStepCountIsCheckedAgainstTheJournal: the optimizer state
// file's checksum covers its tensors, not its metadata, whose step count
// the restore trusts (Adam's bias correction, the LR schedule): one byte
// flipping the count 3 to 9 was restored as 9 steps with no StateError.
// The journal's step count of that version is now checked against it: a
// mismatch is an unreadable state (fresh optimizer, said so).
func TestDurableStateStepCountIsCheckedAgainstTheJournal(t *testing.T) {
	e := steppedEnv(t, 3) // versions 2..4, optim.steps 3 in optim-v4
	path := filepath.Join(e.stateDir, "m", stateFileName(4))
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	old := []byte(`"optim.steps":"3"`)
	i := strings.Index(string(raw), string(old))
	if i < 0 {
		t.Fatalf("no %s in the state file header", old)
	}
	raw[i+len(old)-2] = '9' // one byte: the step count 3 becomes 9
	if err := os.WriteFile(path, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	verr := VerifyStateFile(path)
	e.openStore()
	p := e.open(PrimaryConfig{})
	ms := e.model(p)
	t.Logf("VerifyStateFile: %v; restored: version %d, optimizer steps %d, state error %q", verr, ms.Version, ms.OptimizerSteps, ms.StateError)
	if ms.OptimizerSteps != 3 && ms.StateError == "" {
		t.Fatalf("a damaged state file (step count 3 flipped to 9) is restored without a StateError: optimizer steps %d (journal says 3), VerifyStateFile %v",
			ms.OptimizerSteps, verr)
	}
}

// TestDurableJournalDamageIsNotTakenForATornTail: a bad frame that reached
// the end of the journal (a length field pointing past it, anywhere; a
// last record whose checksum fails) was taken for a torn append: no copy
// kept aside, every record after it cut for good. A kill tears only the
// record of a step never published, so a journal that stops short of the
// store's newest version at a bad frame is damage: it is kept aside as
// journal.log.damaged and the StateError says so.
func TestDurableJournalDamageIsNotTakenForATornTail(t *testing.T) {
	for _, tc := range []struct {
		name   string
		damage func(b []byte) []byte
	}{
		{"length-of-first-record", func(b []byte) []byte { b[3] ^= 0x01; return b }}, // +16 MiB: past the end
		{"checksum-of-last-record", func(b []byte) []byte { b[len(b)-3] ^= 0x20; return b }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := steppedEnv(t, 3)
			jpath := filepath.Join(e.stateDir, "m", journalName)
			b, err := os.ReadFile(jpath)
			if err != nil {
				t.Fatal(err)
			}
			damaged := tc.damage(append([]byte(nil), b...))
			if err := os.WriteFile(jpath, damaged, 0o644); err != nil {
				t.Fatal(err)
			}
			e.openStore()
			p := e.open(PrimaryConfig{})
			ms := e.model(p)
			after, _ := os.ReadFile(jpath)
			_, asideErr := os.Stat(jpath + ".damaged")
			t.Logf("state error: %q", ms.StateError)
			if asideErr != nil {
				t.Fatalf("journal of %d bytes damaged (not torn: its records reached the store's newest version 4); restore cut it to %d bytes and kept nothing aside (%v)",
					len(damaged), len(after), asideErr)
			}
		})
	}
}
