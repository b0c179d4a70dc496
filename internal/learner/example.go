package learner

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"sync"
	"time"

	"github.com/rlhub/rlhub/internal/dial"
	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/tensor"
)

// Example is a complete data-parallel learner for linear regression with a
// squared loss. The task info carries the weights ("w": list of numbers);
// each share of a batch holds "x" (F32 [n, d]) and "y" (F32 [n]), and
// optionally "row" (I64 [n], the rows' ids). OnLearn returns, for its rows:
//
//	grad      Σ (x·w − y) x over its rows (d numbers: a sum, so the shares'
//	          gradients add up to the whole batch's)
//	loss_sum  Σ ½ (x·w − y)²
//	rows      the "row" ids it processed (empty without a "row" tensor)
//	learner   its id
//	learner_step, task_id   the batch metadata "step" and the task id:
//	          the same on every learner, so they merge to one value
//
// The fault fields make it misbehave on purpose, for tests and drills.
type Example struct {
	// ID is reported in the info.
	ID string
	// Dial is how Config and UseHub connect to the hub (TLS, token); the
	// zero value is plaintext.
	Dial dial.Config
	// BatchSize is the demand; 0 means 32.
	BatchSize int64
	// Delay is slept (ctx-aware) before each learn.
	Delay time.Duration
	// BadInfo returns loss_sum as a string: malformed against the others.
	BadInfo bool
	// Events, when set, receives one line per event ("start TASK",
	// "learn-begin START ROWS", "learn-end START ROWS") for tests that
	// watch a learner process.
	Events io.Writer
	// Weights, when set, supplies the weights, their model version and
	// its life (store.Snapshot.Life; 0: unknown) for each learn (for
	// example the newest version from the model store); the task info's
	// "w" is then not needed.
	Weights func(ctx context.Context) (w []float32, version, life uint64, err error)
	// Push, when set, receives each share's gradient sum as an F32 tensor
	// "w" [d] computed on the given version of the given life (for
	// example a reducer client's PushGradLife); its error fails the
	// share. The info then also carries "pushed": true and "version".
	Push func(ctx context.Context, version, life uint64, grad *tensor.StateDict) error

	mu sync.Mutex
	w  []float32 // current task's weights
}

// Config returns a learner Config that serves this example.
func (e *Example) Config(hub string) Config {
	return Config{Hub: hub, Dial: e.Dial, ID: e.ID, Resources: map[string]string{"kind": "example"},
		OnStart: e.OnStart, OnDemand: e.OnDemand, OnLearn: e.OnLearn}
}

func (e *Example) event(format string, args ...any) {
	if e.Events != nil {
		fmt.Fprintf(e.Events, format+"\n", args...)
	}
}

// OnStart reads the weights from info["w"].
func (e *Example) OnStart(ctx context.Context, taskID string, info map[string]any) error {
	if e.Weights != nil {
		e.event("start %s", taskID)
		return nil
	}
	raw, ok := info["w"].([]any)
	if !ok || len(raw) == 0 {
		return fmt.Errorf("%w: task info needs \"w\", a non-empty list of numbers", errs.ErrInvalid)
	}
	w := make([]float32, len(raw))
	for i, v := range raw {
		f, ok := v.(float64)
		if !ok {
			return fmt.Errorf("%w: task info w[%d] is %T, not a number", errs.ErrInvalid, i, v)
		}
		w[i] = float32(f)
	}
	e.mu.Lock()
	e.w = w
	e.mu.Unlock()
	e.event("start %s", taskID)
	return nil
}

// OnDemand asks for BatchSize rows of dimension len(w).
func (e *Example) OnDemand(ctx context.Context, taskID string) (Demand, error) {
	e.mu.Lock()
	d := len(e.w)
	e.mu.Unlock()
	if e.Weights != nil {
		w, _, _, err := e.Weights(ctx)
		if err != nil {
			return Demand{}, err
		}
		d = len(w)
	}
	bs := e.BatchSize
	if bs == 0 {
		bs = 32
	}
	return Demand{BatchSize: bs, Fields: map[string]any{"dim": d}}, nil
}

// OnLearn computes the share's gradient sum and loss sum.
func (e *Example) OnLearn(ctx context.Context, t *LearnTask) (map[string]any, error) {
	e.event("learn-begin %d %d", t.RowStart, t.Rows)
	if e.Delay > 0 {
		tm := time.NewTimer(e.Delay)
		select {
		case <-ctx.Done():
			tm.Stop()
			return nil, context.Cause(ctx)
		case <-tm.C:
		}
	}
	e.mu.Lock()
	w := e.w
	e.mu.Unlock()
	var version, life uint64
	if e.Weights != nil {
		var err error
		if w, version, life, err = e.Weights(ctx); err != nil {
			return nil, err
		}
	}
	grad, loss, err := LinearGrad(t.Batch, w)
	if err != nil {
		return nil, err
	}
	if e.Push != nil {
		g32 := make([]float32, len(grad))
		for i, x := range grad {
			g32[i] = float32(x)
		}
		sd, err := tensor.NewStateDict(tensor.FromFloat32s("w", []int64{int64(len(g32))}, g32))
		if err != nil {
			return nil, err
		}
		if err := e.Push(ctx, version, life, sd); err != nil {
			return nil, fmt.Errorf("push gradient of rows [%d,%d): %w", t.RowStart, t.RowStart+t.Rows, err)
		}
	}
	rows := []any{}
	if rt := t.Batch.Get("row"); rt != nil {
		if rt.DType != tensor.I64 || len(rt.Shape) != 1 {
			return nil, fmt.Errorf("%w: \"row\" must be I64 [n], got %v%v", errs.ErrInvalid, rt.DType, rt.Shape)
		}
		for i := 0; i < len(rt.Data); i += 8 {
			var v int64
			for b := 7; b >= 0; b-- {
				v = v<<8 | int64(rt.Data[i+b])
			}
			rows = append(rows, float64(v))
		}
	}
	g := make([]any, len(grad))
	for i, x := range grad {
		g[i] = x
	}
	step, _ := strconv.ParseInt(t.Metadata["step"], 10, 64) // an integer: it comes back as one
	var lossVal any = loss
	if e.BadInfo {
		lossVal = "not-a-number"
	}
	e.event("learn-end %d %d", t.RowStart, t.Rows)
	info := map[string]any{
		"grad": g, "loss_sum": lossVal, "rows": rows, "learner": e.ID,
		"learner_step": step, "task_id": t.TaskID,
	}
	if e.Push != nil {
		info["pushed"], info["version"] = true, int64(version)
	}
	return info, nil
}

// LinearGrad returns Σ (x·w − y) x and Σ ½ (x·w − y)² over the rows of
// batch ("x" F32 [n, len(w)], "y" F32 [n]), accumulated in float64.
func LinearGrad(batch *tensor.StateDict, w []float32) ([]float64, float64, error) {
	xt, yt := batch.Get("x"), batch.Get("y")
	if xt == nil || yt == nil {
		return nil, 0, fmt.Errorf("%w: batch needs tensors \"x\" and \"y\"", errs.ErrInvalid)
	}
	d := int64(len(w))
	if len(w) == 0 {
		return nil, 0, fmt.Errorf("%w: no weights (task not started?)", errs.ErrInvalid)
	}
	if len(xt.Shape) != 2 || xt.Shape[1] != d || len(yt.Shape) != 1 || yt.Shape[0] != xt.Shape[0] {
		return nil, 0, fmt.Errorf("%w: want x [n, %d] and y [n], got x %v and y %v", errs.ErrInvalid, d, xt.Shape, yt.Shape)
	}
	x, err := xt.Float32s()
	if err != nil {
		return nil, 0, fmt.Errorf("%w: x: %v", errs.ErrInvalid, err)
	}
	y, err := yt.Float32s()
	if err != nil {
		return nil, 0, fmt.Errorf("%w: y: %v", errs.ErrInvalid, err)
	}
	grad := make([]float64, d)
	var loss float64
	for i := range y {
		row := x[int64(i)*d : int64(i+1)*d]
		var p float64
		for j, v := range row {
			p += float64(v) * float64(w[j])
		}
		r := p - float64(y[i])
		loss += 0.5 * r * r
		for j, v := range row {
			grad[j] += r * float64(v)
		}
	}
	return grad, loss, nil
}
