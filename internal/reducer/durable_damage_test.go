package reducer

import (
	"fmt"
	"hash/crc32"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/rlhub/rlhub/internal/safetensors"
	"github.com/rlhub/rlhub/internal/tensor"
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

// TestDurableNonFiniteOptimizerStateIsNotRestored: an optimizer state file
// whose Adam moment holds a NaN (hand-edited, or damaged and its checksum
// recomputed: the file itself is well-formed) was restored as it was, with
// no StateError, and every later step of the model then failed
// step_nonfinite: the model could never step again. A published state is
// always finite (a step that is not is never written), so a non-finite one
// is damage: it is refused like any unreadable state (fresh optimizer,
// StateError, ERROR log) and the model trains on.
func TestDurableNonFiniteOptimizerStateIsNotRestored(t *testing.T) {
	for _, bad := range []float32{float32(math.NaN()), float32(math.Inf(1))} {
		t.Run(fmt.Sprint(bad), func(t *testing.T) {
			e := steppedEnv(t, 3) // versions 2..4, optim-v4 holds the moments of step 3
			path := filepath.Join(e.stateDir, "m", stateFileName(4))
			raw, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			sd, meta, err := decodeState(raw, 4)
			if err != nil {
				t.Fatal(err)
			}
			v := sd.Get("exp_avg_sq/fc.weight")
			if v == nil {
				t.Fatalf("no exp_avg_sq/fc.weight in the state file: %v", sd.Names())
			}
			f, err := v.Float32s()
			if err != nil {
				t.Fatal(err)
			}
			f[1] = bad
			writeStateFile(t, path, sd, meta)
			if err := VerifyStateFile(path); err != nil {
				t.Fatalf("the edited state file is not well-formed: %v", err)
			}

			e.openStore()
			p := e.open(PrimaryConfig{})
			ms := e.model(p)
			if !strings.Contains(ms.StateError, "exp_avg_sq/fc.weight[1]") || ms.OptimizerSteps != 0 {
				t.Fatalf("an optimizer state with %v in exp_avg_sq/fc.weight[1] is restored: optimizer steps %d, state error %q", bad, ms.OptimizerSteps, ms.StateError)
			}
			if !strings.Contains(e.logs.String(), "level=ERROR") {
				t.Fatalf("no ERROR log of the refused state:\n%s", e.logs.String())
			}
			e.steps(p, 4, 4) // it trains on, from a fresh optimizer
			if got := e.model(p); got.Version != 5 || got.OptimizerSteps != 1 {
				t.Fatalf("after one step: version %d, optimizer steps %d; want 5, 1", got.Version, got.OptimizerSteps)
			}
		})
	}
}

// writeStateFile writes sd and meta as an optimizer state file of the
// version meta names, with the checksum the primary records (commit).
func writeStateFile(t *testing.T, path string, sd *tensor.StateDict, meta map[string]string) {
	t.Helper()
	plan, err := safetensors.Plan(sd, nil)
	if err != nil {
		t.Fatal(err)
	}
	var crc uint32
	for _, x := range plan.Order {
		crc = crc32.Update(crc, crcTable, x.Data)
	}
	meta["reducer.crc32c"] = strconv.FormatUint(uint64(crc), 10)
	raw, err := safetensors.Encode(sd, meta)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, raw, 0o644); err != nil {
		t.Fatal(err)
	}
}
