//go:build mujoco && cgo

package mjenv

import (
	"compress/gzip"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
)

// loadLong reads the gzipped episode records scripts/mujoco_longcheck.py
// writes (DIR/TASK.json.gz). A relative dir is under testdata.
func loadLong(t testing.TB, dir, task string) []longRef {
	t.Helper()
	if !filepath.IsAbs(dir) {
		dir = filepath.Join("testdata", dir)
	}
	f, err := os.Open(filepath.Join(dir, task+".json.gz"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatalf("%s/%s: %v", dir, task, err)
	}
	var refs []longRef
	if err := json.NewDecoder(zr).Decode(&refs); err != nil {
		t.Fatalf("%s/%s: %v", dir, task, err)
	}
	if len(refs) == 0 {
		t.Fatalf("%s/%s: no episodes", dir, task)
	}
	return refs
}

// longRef is one episode recorded by scripts/mujoco_longcheck.py.
type longRef struct {
	reference
	Sync []struct {
		Step          int       `json:"step"`
		Qpos          []float64 `json:"qpos"`
		Qvel          []float64 `json:"qvel"`
		QAccWarmstart []float64 `json:"qacc_warmstart"`
	} `json:"sync"`
}

// replayLong runs one episode from Gymnasium's initial state. With resync,
// at every sync point it restarts from Gymnasium's full state (qpos, qvel,
// the solver's warm start) before applying that step's action.
func replayLong(t *testing.T, e *Env, ref longRef, resync bool) []stepResult {
	t.Helper()
	e.Reset(rand.New(rand.NewPCG(1, 2)))
	obs, err := e.SetState(append(append([]float64(nil), ref.Qpos...), ref.Qvel...))
	if err != nil {
		t.Fatal(err)
	}
	if w, i := maxErr(obs, ref.Obs0); w > refTol {
		t.Errorf("%s episode %d: initial observation[%d] = %v, Gymnasium %v", ref.Task, ref.Episode, i, obs[i], ref.Obs0[i])
	}
	next := 0
	var res []stepResult
	for k, a := range ref.Actions {
		if resync && next < len(ref.Sync) && ref.Sync[next].Step == k {
			// Written without mj_forward: derived quantities such as
			// xpos (Ant's and Humanoid's x before the step) stay those
			// of the last step, as in Gymnasium, where mj_step leaves
			// them one timestep behind qpos.
			s := ref.Sync[next]
			copy(e.data.QPos(), s.Qpos)
			copy(e.data.QVel(), s.Qvel)
			copy(e.data.QAccWarmstart(), s.QAccWarmstart)
			next++
		}
		obs, r, term, trunc := e.Step(a)
		w, at := maxErr(obs, ref.Obs[k])
		res = append(res, stepResult{obsErr: w, obsAt: at, rewErr: relErr(r, ref.Reward[k]),
			flagsMatch: term == ref.Terminated[k] && trunc == ref.Truncated[k]})
	}
	return res
}

// marginContacts lists the tasks whose episodes may differ even with
// restarts, which the test then logs and counts instead of failing:
// Humanoid's geoms have margin 0.001 and collide with each other, and
// MuJoCo 2.2.2 (Debian) and 2.3.7 do not always find the same contacts
// inside the margin. In the 5000-step check of 2026-12-01 (random
// closed-loop policies, limbs flailing) 17 of 229 episodes jumped from
// ~4e-12 to 0.2–100 within a step; in the first, a head–left_hand sphere
// pair entered the margin at step 15: 3 contacts in 2.2.2 against 2 in
// 2.3.7 at the third substep (docs/mujoco.md). The committed 100 steps
// agree throughout. Every other task fails on any deviation.
var marginContacts = map[string]bool{"Humanoid-v5": true}

// TestLongTrajectories replays closed-loop, back-to-back episodes recorded
// from Gymnasium 1.4.0 on MuJoCo 2.3.7 (scripts/mujoco_longcheck.py: every
// episode from Gymnasium's own reset, a random linear policy on the
// normalised observation plus noise, actions beyond the bounds,
// terminations): 300 steps per task (Humanoid 100). Restarting from
// Gymnasium's full state every 25 steps, every observation value and reward
// must agree within refTol at every step, and termination and truncation
// exactly. Without the restarts it logs the first step beyond refTol:
// contact dynamics amplify rounding differences (Ant from ~1e-12 to 1e-7
// in ~140 steps), which a fixed tolerance cannot follow for long.
// $RLHUB_MJ_LONGDIR (an absolute path) replays another recording instead,
// e.g. the 5000-step one of `make mujoco-check`.
func TestLongTrajectories(t *testing.T) {
	dir := os.Getenv("RLHUB_MJ_LONGDIR")
	if dir == "" {
		dir = "long-mujoco-2.3.7"
	}
	for _, name := range Names() {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, name)
			steps, terminated, truncated, worst := 0, 0, 0, 0.0
			free, freeFirst := 0, -1 // episodes agreeing throughout without restarts; earliest divergence
			refs := loadLong(t, dir, name)
			diverged := 0 // episodes beyond refTol even with restarts (marginContacts only)
			for _, ref := range refs {
				for k, r := range replayLong(t, e, ref, true) {
					if r.obsErr > refTol || r.rewErr > refTol || !r.flagsMatch {
						msg := fmt.Sprintf("episode %d, step %d: observation error %.3g (index %d), reward error %.3g, flags match %v; tolerance %g",
							ref.Episode, k, r.obsErr, r.obsAt, r.rewErr, r.flagsMatch, refTol)
						if !marginContacts[name] {
							t.Fatal(msg)
						}
						t.Log(msg)
						diverged++
						break
					}
					worst = max(worst, r.obsErr, r.rewErr)
				}
				agrees := true
				for k, r := range replayLong(t, e, ref, false) {
					if r.obsErr > refTol || r.rewErr > refTol || !r.flagsMatch {
						if freeFirst < 0 || k < freeFirst {
							freeFirst = k
						}
						agrees = false
						break
					}
				}
				if agrees {
					free++
				}
				steps += len(ref.Actions)
				if n := len(ref.Terminated); n > 0 {
					if ref.Terminated[n-1] {
						terminated++
					}
					if ref.Truncated[n-1] {
						truncated++
					}
				}
			}
			if diverged > 0 {
				t.Logf("%d of %d episodes diverge even with restarts (contacts inside the margin, see marginContacts)", diverged, len(refs))
			}
			t.Logf("%d steps in %d episodes (%d terminated, %d truncated), worst error %.3g with restarts every 25 steps;"+
				" without: %d episodes agree throughout, earliest step beyond %g: %d",
				steps, len(refs), terminated, truncated, worst, free, refTol, freeFirst)
		})
	}
}

// BenchmarkReplayLong measures env steps per second on the same policy and
// the same steps as Gymnasium: the committed closed-loop episodes of
// testdata/long-mujoco-2.3.7 (scripts/mujoco_longcheck.py), each from
// Gymnasium's initial state with Gymnasium's recorded actions, back to
// back. scripts/mujoco_speed.py replays the same records through
// Gymnasium and sets the two side by side. Reports steps/s (wall) and
// steps/cpu-s (user + system CPU of the process: what one core delivers,
// less disturbed by other load).
func BenchmarkReplayLong(b *testing.B) {
	for _, name := range Names() {
		b.Run(name, func(b *testing.B) {
			refs := loadLong(b, "long-mujoco-2.3.7", name)
			e := newEnv(b, name)
			state := make([]float64, 0, 512)
			rng := rand.New(rand.NewPCG(1, 2))
			steps := 0
			cpu0 := cpuSeconds(b)
			for b.Loop() {
				for _, ref := range refs {
					e.Reset(rng)
					state = append(append(state[:0], ref.Qpos...), ref.Qvel...)
					if _, err := e.SetState(state); err != nil {
						b.Fatal(err)
					}
					for _, a := range ref.Actions {
						e.Step(a)
					}
					steps += len(ref.Actions)
				}
			}
			cpu := cpuSeconds(b) - cpu0
			b.ReportMetric(float64(steps)/b.Elapsed().Seconds(), "steps/s")
			b.ReportMetric(float64(steps)/cpu, "steps/cpu-s")
		})
	}
}
