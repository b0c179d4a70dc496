package run

import (
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"

	"github.com/rlhub/rlhub/internal/ars"
	"github.com/rlhub/rlhub/internal/atomicfile"
	"github.com/rlhub/rlhub/internal/env"
	"github.com/rlhub/rlhub/internal/mujoco"
)

// Summary is OUT/summary.json.
type Summary struct {
	Env           string            `json:"env"`
	Seed          uint64            `json:"seed"`
	Workers       int               `json:"workers"`
	RunID         string            `json:"run_id"`
	Model         string            `json:"model"`
	PolicyVersion uint64            `json:"policy_version"`
	Hyper         map[string]string `json:"hyperparameters"`
	// Protocol is the evaluation protocol that produced the evaluations
	// and the stop: "paper" (every 10 iterations, 100 episodes) or "fast"
	// (the per-environment defaults); EvalEvery × EvalEpisodesEach are
	// the values used.
	Protocol         string `json:"protocol"`
	EvalEvery        uint32 `json:"eval_every"`
	EvalEpisodesEach uint32 `json:"eval_episodes_each"`
	// Reason is why the run ended: "target", "budget", a failure's
	// reason (such as "diverged: …"), or "interrupted" when Run's context
	// ended before the run did.
	Reason string `json:"stop_reason"`
	// ReachedTarget: the stopping rule fired (an evaluation reached the
	// target). TargetHeld: the re-evaluation on ConfirmEpisodes fresh
	// episodes that followed also reached it.
	ReachedTarget   bool     `json:"reached_target"`
	TargetHeld      *bool    `json:"target_held,omitempty"`
	ConfirmEpisodes int64    `json:"confirm_episodes,omitempty"`
	Target          *float64 `json:"target,omitempty"`
	Iterations      uint64   `json:"iterations"`
	Episodes        int64    `json:"training_episodes"`
	PolicyEpisodes  int64    `json:"policy_training_episodes"`
	EvalEpisodes    int64    `json:"eval_episodes"`
	Steps           int64    `json:"env_steps"`
	WallSeconds     float64  `json:"wall_seconds"`
	StepsPerSecond  float64  `json:"env_steps_per_second"`
	// HubReconnects counts the times the client got the hub back after
	// it was unreachable (a restart): a broken progress stream that
	// delivered again, or a call (start run, pull policy) that went
	// through after failed attempts. One outage counts once however many
	// attempts it took; a restart the client never noticed (between two
	// of its calls) does not count.
	HubReconnects int `json:"hub_reconnects"`
	// CPU time (user + system) of the worker processes started by this
	// run, and of this process (the embedded hub and the client).
	WorkerCPUSeconds        float64 `json:"worker_cpu_seconds"`
	TrainCPUSeconds         float64 `json:"train_process_cpu_seconds"`
	StepsPerWorkerCPUSecond float64 `json:"env_steps_per_worker_cpu_second"`
	// FinalEvalMean ± FinalEvalStd is the result the run reports: the
	// re-evaluation on fresh episodes after a stop at the target, else the
	// last evaluation.
	FinalEvalMean *float64 `json:"final_eval_mean,omitempty"`
	FinalEvalStd  *float64 `json:"final_eval_std,omitempty"`
	// BestEvalMean is the best regular evaluation (re-evaluations aside).
	BestEvalMean *float64 `json:"best_eval_mean,omitempty"`
	// LQRRelativeCost is J(M)/J* − 1 for a V1/V1-t policy on LQR: the
	// exact average cost of the trained gain relative to the Riccati
	// optimum.
	LQRRelativeCost *float64 `json:"lqr_relative_cost,omitempty"`
	// LQRUnstable: the trained gain does not stabilise the LQR system (its
	// average cost is infinite, which JSON cannot hold); LQRRelativeCost is
	// then absent.
	LQRUnstable bool `json:"lqr_unstable,omitempty"`
	// Optimizer is how θ moved (the run spec's optimizer with its
	// defaults: kind "step" is the paper's update) and GradientMax its
	// clipping (0: none).
	Optimizer   *OptimizerFile `json:"optimizer"`
	GradientMax float64        `json:"gradient_max"`
	// MuJoCo and MuJoCoLibrary are the MuJoCo release and the library file
	// it was loaded from (internal/mujoco Version, Library) of the worker
	// processes this run started, which run this binary: Debian's
	// libmujoco 2.2.2 or, for a build after scripts/mujoco_fast.sh, the
	// pip wheel's 2.3.7. Recorded whatever the env; empty for a build
	// without MuJoCo, and for a run that started no workers (Workers 0:
	// its workers are other processes, whose build this one cannot see).
	MuJoCo        string `json:"mujoco,omitempty"`
	MuJoCoLibrary string `json:"mujoco_library,omitempty"`
	// Filters: the final filter statistics of each key of a Dict
	// observation space (absent for a flat one).
	Filters map[string]KeyFilter `json:"filters,omitempty"`
}

// KeyFilter is one observation key's mean/std filter in summary.json.
type KeyFilter struct {
	Count float64   `json:"count"`
	Mean  []float64 `json:"mean"`
	Std   []float64 `json:"std"`
}

// ReadSummary reads DIR/summary.json.
func ReadSummary(dir string) (Summary, error) {
	var sum Summary
	raw, err := os.ReadFile(filepath.Join(dir, "summary.json"))
	if err != nil {
		return sum, err
	}
	return sum, json.Unmarshal(raw, &sum)
}

// LQRRelativeCost returns J(M)/J* − 1 for a linear policy on the raw LQR
// state (V1, V1-t), or nil when it does not apply.
func LQRRelativeCost(p *ars.Policy) (*float64, error) {
	if p.Env != "LQR" || !p.Arch.Linear() || p.Version.Normalises() {
		return nil, nil
	}
	c, err := env.LQRAverageCost(p.Theta)
	if err != nil {
		return nil, err
	}
	r := c/env.LQROptimalCost() - 1
	return &r, nil
}

func summarise(r *runner, model string, pol *ars.Policy) Summary {
	rows := r.rows
	last := rows[len(rows)-1]
	s := Summary{
		Env: r.spec.Env, Seed: r.spec.Seed, Workers: r.cfg.Workers, RunID: r.runID, Model: model,
		PolicyVersion: last.P.Version, Reason: last.P.Reason, ReachedTarget: last.P.Reason == "target",
		Protocol: r.protocol, EvalEvery: r.spec.EvalEvery, EvalEpisodesEach: r.spec.EvalEpisodes,
		Iterations: last.P.Iteration + 1, Episodes: last.P.Episodes, EvalEpisodes: last.P.EvalEpisodes,
		PolicyEpisodes: last.P.PolicyEpisodes,
		Steps:          last.P.Steps, WallSeconds: last.Wall, HubReconnects: r.reconnects,
		Hyper: map[string]string{
			"version":    pol.Version.String(),
			"directions": strconv.Itoa(pol.Hyper.Directions),
			"top":        strconv.Itoa(pol.Hyper.Top),
			"step_size":  strconv.FormatFloat(pol.Hyper.StepSize, 'g', -1, 64),
			"noise":      strconv.FormatFloat(pol.Hyper.Noise, 'g', -1, 64),
			"shift":      strconv.FormatFloat(pol.Hyper.Shift, 'g', -1, 64),
			"hidden":     fmt.Sprint(pol.Arch.Hidden),
		},
		Optimizer: optimizerFile(r.spec.Optimizer), GradientMax: r.spec.GradientMax,
	}
	if p := last.P; p.Done && p.Reason != "target" && p.Reason != "budget" {
		// A failure entry (diverged, stopped): Iteration is the iteration
		// that did not finish, and the policy is θ after every finished
		// iteration's update, trained on all the training episodes.
		s.Iterations, s.PolicyEpisodes = p.Iteration, p.Episodes
	}
	if r.cfg.Workers > 0 {
		s.MuJoCo, s.MuJoCoLibrary = mujoco.Version(), mujoco.Library()
	}
	if r.spec.UseTarget {
		t := r.spec.Target
		s.Target = &t
	}
	if len(pol.ObsKeys) > 0 {
		s.Filters = map[string]KeyFilter{}
		for _, k := range pol.Stats.ByKey(pol.ObsKeys) {
			s.Filters[k.Name] = KeyFilter{Count: k.Count, Mean: k.Mean, Std: k.Std()}
		}
	}
	if last.Wall > 0 {
		s.StepsPerSecond = float64(last.P.Steps) / last.Wall
	}
	if rel, _ := LQRRelativeCost(pol); rel != nil && math.IsInf(*rel, 1) {
		s.LQRUnstable = true // an unstable gain: +Inf, not a JSON number
	} else {
		s.LQRRelativeCost = rel
	}
	var confirm *Row
	for i, row := range rows {
		p := row.P
		if !p.HasEval {
			continue
		}
		if p.Confirm {
			confirm = &rows[i]
			continue
		}
		m, sd := p.EvalMean, p.EvalStd
		s.FinalEvalMean, s.FinalEvalStd = &m, &sd
		if s.BestEvalMean == nil || m > *s.BestEvalMean {
			b := m
			s.BestEvalMean = &b
		}
	}
	if confirm != nil {
		p := confirm.P
		m, sd := p.EvalMean, p.EvalStd
		s.FinalEvalMean, s.FinalEvalStd = &m, &sd
		held := s.Target != nil && m >= *s.Target
		s.TargetHeld = &held
		s.ConfirmEpisodes = int64(r.spec.ConfirmEpisodes)
	}
	return s
}

var curveHeader = []string{"iteration", "policy_version", "policy_training_episodes", "training_episodes", "eval_episodes", "env_steps", "wall_seconds", "hub_seconds", "eval_mean", "eval_std", "sigma_r", "train_return", "confirm"}

func curveRecord(r Row) []string {
	p := r.P
	em, es := "", ""
	if p.HasEval {
		em, es = formatG(p.EvalMean), formatG(p.EvalStd)
	}
	return []string{strconv.FormatUint(p.Iteration, 10), strconv.FormatUint(p.Version, 10), strconv.FormatInt(p.PolicyEpisodes, 10), strconv.FormatInt(p.Episodes, 10),
		strconv.FormatInt(p.EvalEpisodes, 10), strconv.FormatInt(p.Steps, 10), formatG(r.Wall), formatG(p.ElapsedSeconds), em, es, formatG(p.SigmaR),
		formatG(p.TrainReturn), strconv.FormatBool(p.Confirm)}
}

// curveKey names a curve.csv row: the re-evaluation shares its
// iteration number with the evaluation it confirms.
type curveKey struct {
	iteration uint64
	confirm   bool
}

// readCurveWalls reads the wall_seconds of an earlier curve.csv's rows
// and the largest of them; a missing or torn file gives what it holds.
func readCurveWalls(path string) (map[curveKey]float64, float64) {
	f, err := os.Open(path)
	if err != nil {
		return nil, 0
	}
	defer f.Close()
	rd := csv.NewReader(f)
	rd.FieldsPerRecord = len(curveHeader)
	walls, most := map[curveKey]float64{}, 0.0
	for {
		rec, err := rd.Read()
		if err != nil {
			return walls, most
		}
		it, err1 := strconv.ParseUint(rec[0], 10, 64)
		w, err2 := strconv.ParseFloat(rec[6], 64)
		confirm, err3 := strconv.ParseBool(rec[12])
		if err1 != nil || err2 != nil || err3 != nil {
			continue // the header
		}
		walls[curveKey{it, confirm}] = w
		most = max(most, w)
	}
}

// curveFile is OUT/curve.csv, appended to as iterations arrive (so an
// interrupted run leaves its curve) and flushed after every row.
type curveFile struct {
	f      *os.File
	w      *csv.Writer
	closed bool
}

func createCurve(path string) (*curveFile, error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	c := &curveFile{f: f, w: csv.NewWriter(f)}
	c.w.Write(curveHeader)
	c.w.Flush()
	return c, c.w.Error()
}

func (c *curveFile) append(r Row) error {
	c.w.Write(curveRecord(r))
	c.w.Flush()
	return c.w.Error()
}

// close flushes and closes the file; safe to call twice.
func (c *curveFile) close() error {
	if c == nil || c.closed {
		return nil
	}
	c.closed = true
	c.w.Flush()
	return errors.Join(c.w.Error(), c.f.Sync(), c.f.Close())
}

func writeOutputs(dir string, blob []byte, rows []Row, sum Summary) error {
	if err := atomicfile.Write(filepath.Join(dir, "policy.safetensors"), blob); err != nil {
		return err
	}
	if err := plotCurve(filepath.Join(dir, "curve.png"), rows, sum); err != nil {
		return err
	}
	b, err := json.MarshalIndent(sum, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.Write(filepath.Join(dir, "summary.json"), append(b, '\n'))
}

// writeFileFrom creates path and fills it with write.
func writeFileFrom(path string, write func(io.Writer) (int64, error)) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	_, err = write(f)
	return errors.Join(err, f.Close())
}

// outputNames are the files a run writes into OUT (and OUT/hub, its
// embedded hub's state).
var outputNames = []string{"run.json", "config.yaml", "curve.csv", "curve.png", "policy.safetensors", "summary.json", "hub"}

// runRecord is OUT/run.json: where the run lives, for OutResume.
type runRecord struct {
	// Hub is the address given as Config.Hub; "" for an embedded hub
	// (reopened on OUT/hub).
	Hub     string `json:"hub"`
	RunID   string `json:"run_id"`
	Model   string `json:"model"`
	Started string `json:"started"`
}

func writeRunRecord(dir string, rec *runRecord) error {
	b, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.Write(filepath.Join(dir, "run.json"), append(b, '\n'))
}

// prepareOut makes Out ready for cfg.OutMode and returns the record of
// the run to resume (nil for a new run).
func prepareOut(cfg *Config) (*runRecord, error) {
	dir := cfg.Out
	var earlier []string
	for _, n := range outputNames {
		if _, err := os.Lstat(filepath.Join(dir, n)); err == nil {
			earlier = append(earlier, n)
		}
	}
	switch cfg.OutMode {
	case OutFresh:
		if len(earlier) > 0 {
			return nil, fmt.Errorf("%s holds an earlier run (%v): choose another --out, or give --resume to continue it or --overwrite to replace it", dir, earlier)
		}
	case OutOverwrite:
		for _, n := range earlier {
			if err := os.RemoveAll(filepath.Join(dir, n)); err != nil {
				return nil, err
			}
		}
	case OutResume:
		raw, err := os.ReadFile(filepath.Join(dir, "run.json"))
		if err != nil {
			return nil, fmt.Errorf("--resume: %s has no run to continue: %w", dir, err)
		}
		var rec runRecord
		if err := json.Unmarshal(raw, &rec); err != nil || rec.RunID == "" {
			return nil, fmt.Errorf("--resume: %s/run.json is not a run record", dir)
		}
		if rec.Hub == "" && cfg.Hub != "" {
			return nil, fmt.Errorf("--resume: the run in %s ran on an embedded hub; resume it without --hub", dir)
		}
		return &rec, nil
	}
	return nil, os.MkdirAll(dir, 0o755)
}
