package cli

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/rlhub/rlhub/internal/optim"
	"github.com/rlhub/rlhub/internal/reduce"
	"github.com/rlhub/rlhub/internal/reducer"
)

// newReducerRegisterCmd is `rlhub reducer register`: registers a model with
// the hub's reducer primary, with any built-in optimizer and schedule or
// "external" (an rlhub.OptimizerHost steps it).
func newReducerRegisterCmd(g *globals) *cobra.Command {
	var addr string
	var timeout time.Duration
	var mc reducer.ModelConfig
	var kind, sched, reduction, staleness string
	o := &mc.Optimizer
	cmd := &cobra.Command{
		Use:   "register",
		Short: "Register a model (already in the store) with the reducer: its optimizer, schedule, reduction and clip",
		Long: "register starts reducing gradients for --model from its newest version in the store.\n" +
			"--optimizer is sgd, adam, adamw, rmsprop, adagrad, adamax, nadam, radam (torch.optim's rules;\n" +
			"a zero flag means torch's default) or external (an rlhub.OptimizerHost performs each step).\n" +
			"--schedule is \"\" (constant), step or cosine, with an optional linear warm-up; each equals\n" +
			"torch's scheduler objects (warm-up + curve = ChainedScheduler([LinearLR, curve])).",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			o.Kind, o.Schedule.Kind = optim.Kind(kind), optim.ScheduleKind(sched)
			mc.Reduction, mc.Staleness.Policy = reduce.Reduction(reduction), reduce.Policy(staleness)
			c, err := reducer.NewClient(reducer.ClientConfig{Hub: addr, Dial: dialConfig(cmd.Context())}) // TLS, token, etcd: the shared flags
			if err != nil {
				return err
			}
			defer c.Close()
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			v, restored, err := c.Register(ctx, mc)
			if err != nil {
				return fmt.Errorf("reducer register %q: %w", mc.Model, err)
			}
			fmt.Fprintf(g.stdout, "registered %s at version %d (optimizer %s, %d steps restored)\n", mc.Model, v, kind, restored)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&addr, "hub", "127.0.0.1:7470", "hub address (the reducer primary's)")
	f.DurationVar(&timeout, "timeout", 30*time.Second, "deadline for the call")
	f.StringVar(&mc.Model, "model", "", "model name (required; already in the store)")
	f.StringVar(&kind, "optimizer", "adam", "sgd, adam, adamw, rmsprop, adagrad, adamax, nadam, radam or external")
	f.Float64Var(&o.LR, "lr", 0, "base learning rate (required unless external)")
	f.Float64Var(&o.WeightDecay, "weight-decay", 0, "weight decay (AdamW: 0 means 0.01)")
	f.Float64Var(&o.Momentum, "momentum", 0, "momentum (sgd, rmsprop)")
	f.Float64Var(&o.Dampening, "dampening", 0, "dampening (sgd)")
	f.BoolVar(&o.Nesterov, "nesterov", false, "Nesterov momentum (sgd)")
	f.Float64Var(&o.Beta1, "beta1", 0, "β1 (adam, adamw, adamax, nadam, radam; 0 means 0.9)")
	f.Float64Var(&o.Beta2, "beta2", 0, "β2 (0 means 0.999)")
	f.Float64Var(&o.Eps, "eps", 0, "ε (0 means 1e-8; adagrad 1e-10)")
	f.Float64Var(&o.Alpha, "alpha", 0, "square-average decay (rmsprop; 0 means 0.99)")
	f.BoolVar(&o.Centered, "centered", false, "centered rmsprop")
	f.Float64Var(&o.LRDecay, "lr-decay", 0, "learning-rate decay (adagrad)")
	f.Float64Var(&o.InitialAccumulatorValue, "initial-accumulator-value", 0, "initial sum of squares (adagrad)")
	f.Float64Var(&o.MomentumDecay, "momentum-decay", 0, "momentum decay (nadam; 0 means 0.004)")
	f.BoolVar(&o.DecoupledWeightDecay, "decoupled-weight-decay", false, "AdamW-style weight decay (nadam, radam)")
	f.StringVar(&sched, "schedule", "", "\"\" (constant), step or cosine")
	f.Int64Var(&o.Schedule.StepSize, "step-size", 0, "steps between decays (step)")
	f.Float64Var(&o.Schedule.Gamma, "gamma", 0, "decay factor (step; 0 means 0.1)")
	f.Int64Var(&o.Schedule.TMax, "t-max", 0, "half period in steps (cosine)")
	f.Float64Var(&o.Schedule.MinLR, "min-lr", 0, "floor eta_min (cosine)")
	f.Int64Var(&o.Schedule.WarmupSteps, "warmup-steps", 0, "steps of linear warm-up")
	f.Float64Var(&o.Schedule.WarmupStart, "warmup-start", 0, "warm-up's first factor (0 means 1/3)")
	f.StringVar(&reduction, "reduction", "mean", "mean or sum")
	f.Float64Var(&mc.GradientMax, "gradient-max", 0, "global-norm clip of the reduced gradient (0: none)")
	f.StringVar(&staleness, "staleness", "accept", "accept, drop or downweight")
	f.Uint64Var(&mc.Staleness.MaxLag, "max-lag", 0, "versions a gradient may lag before the staleness rule applies")
	f.Uint64Var(&mc.CheckpointEvery, "checkpoint-every", 0, "checkpoint the optimizer state every this many steps (0: 100)")
	_ = cmd.MarkFlagRequired("model")
	return cmd
}
