package learner

import (
	"context"
	"errors"
	"fmt"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/reducer"
	"github.com/rlhub/rlhub/internal/store/storerpc"
	"github.com/rlhub/rlhub/internal/tensor"
)

// UseHub makes e train a model through a hub: each learn reads the newest
// version of model from the hub's model store (its tensor "w", F32 [d], is
// the weights) and pushes the share's gradient sum to the hub's reducer as
// {"w": F32 [d]} computed on that version, under client id e.ID. The
// model must be in the store and registered with the reducer (reduction
// "sum" makes a step's gradient the whole batch's). The returned close
// releases the clients.
func (e *Example) UseHub(hub, model string) (close func() error, err error) {
	if model == "" {
		return nil, fmt.Errorf("%w: learner: empty model name", errs.ErrInvalid)
	}
	sc, err := storerpc.NewClient(storerpc.ClientConfig{Addr: hub, Dial: e.Dial})
	if err != nil {
		return nil, err
	}
	rc, err := reducer.NewClient(reducer.ClientConfig{Hub: hub, Dial: e.Dial, ClientID: e.ID})
	if err != nil {
		return nil, errors.Join(err, sc.Close())
	}
	e.Weights = func(ctx context.Context) ([]float32, uint64, uint64, error) {
		snap, err := sc.Get(ctx, model, 0)
		if err != nil {
			return nil, 0, 0, err
		}
		w := snap.Tensors.Get("w")
		if w == nil || len(w.Shape) != 1 {
			return nil, 0, 0, fmt.Errorf("%w: model %q needs a tensor \"w\" of shape [d]", errs.ErrInvalid, model)
		}
		f, err := w.Float32s()
		if err != nil {
			return nil, 0, 0, fmt.Errorf("%w: model %q: %v", errs.ErrInvalid, model, err)
		}
		return f, snap.Version, snap.Life(), nil
	}
	// The life pulled goes with the gradient: a model deleted and pushed
	// again since is not trained with it (docs/reducer.md).
	e.Push = func(ctx context.Context, version, life uint64, grad *tensor.StateDict) error {
		_, err := rc.PushGradLife(ctx, model, version, life, grad)
		return err
	}
	return func() error { return errors.Join(rc.Close(), sc.Close()) }, nil
}
