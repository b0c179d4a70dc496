package ars

import "github.com/rlhub/rlhub/internal/env"

// RunLocal runs a whole training run sequentially in the calling goroutine
// with one environment from makeEnv, calling each (if non-nil) after every
// iteration. It is the single-process reference the distributed run must
// match bit for bit.
func RunLocal(cfg Config, e env.Env, each func(Report)) (*Trainer, error) {
	t, err := NewTrainer(cfg)
	if err != nil {
		return nil, err
	}
	arch := t.Arch()
	ev := NewEvaluator(e, &arch)
	for !t.Done() {
		it := t.Current()
		tasks := t.Tasks()
		results := make([]Result, len(tasks))
		for i, task := range tasks {
			results[i] = ev.Run(it, task)
		}
		rep, err := t.Finish(results)
		if err != nil {
			return t, err
		}
		if each != nil {
			each(rep)
		}
	}
	return t, nil
}
