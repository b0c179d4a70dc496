package cli

import (
	"log/slog"

	arsrun "github.com/rlhub/rlhub/internal/run"
	"github.com/rlhub/rlhub/internal/tblog"
)

// TensorBoard tags `train ars --tensorboard DIR` writes, each at step =
// iteration (the curve.csv row of the same iteration). The re-evaluation
// on fresh episodes after the target has its own tag, since curve.csv
// gives it the iteration of the evaluation it confirms.
const (
	tbEvalReturn    = "ars/eval_return"
	tbEvalStd       = "ars/eval_std"
	tbConfirmReturn = "ars/confirm_return"
	tbTrainReturn   = "ars/train_return"
	tbStepsPerSec   = "ars/env_steps_per_second"
	tbEpisodes      = "ars/training_episodes"
)

// tensorBoardObserver writes each finished ARS iteration to an event file
// (internal/tblog). Run calls it on its own goroutine, one iteration at a
// time. A write error is logged once and later iterations are skipped:
// TensorBoard output never fails a run.
type tensorBoardObserver struct {
	w      *tblog.Writer
	log    *slog.Logger
	failed bool
}

// OnIteration implements arsrun.Observer.
func (o *tensorBoardObserver) OnIteration(it arsrun.Iteration) {
	if o.failed {
		return
	}
	v := map[string]float64{}
	switch {
	case it.Confirm:
		v[tbConfirmReturn] = it.EvalReturn
	default:
		v[tbStepsPerSec], v[tbEpisodes] = it.StepsPerSecond, float64(it.Episodes)
		if it.HasEval {
			v[tbEvalReturn], v[tbEvalStd] = it.EvalReturn, it.EvalStd
		}
		if it.HasTrain {
			v[tbTrainReturn] = it.TrainReturn
		}
	}
	if err := o.w.Scalars(int64(it.Iteration), v); err != nil {
		o.failed = true
		o.log.Warn("tensorboard: writing stopped", "err", err)
	}
}
