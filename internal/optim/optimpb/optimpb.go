// Package optimpb converts optimizer configurations between internal/optim
// and the wire (rlhub.v1.ReducerOptimizer). It is the one field-by-field
// mapping: the reducer's Register and the ARS run spec both use it, so the
// core package optim stays free of protobuf.
package optimpb

import (
	"github.com/rlhub/rlhub/internal/optim"
	pb "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// FromProto converts o (nil is the zero Config).
func FromProto(o *pb.ReducerOptimizer) optim.Config {
	return optim.Config{Kind: optim.Kind(o.GetKind()), LR: o.GetLr(), WeightDecay: o.GetWeightDecay(),
		Momentum: o.GetMomentum(), Dampening: o.GetDampening(), Nesterov: o.GetNesterov(),
		Beta1: o.GetBeta1(), Beta2: o.GetBeta2(), Eps: o.GetEps(), Alpha: o.GetAlpha(), Centered: o.GetCentered(),
		LRDecay: o.GetLrDecay(), InitialAccumulatorValue: o.GetInitialAccumulatorValue(),
		MomentumDecay: o.GetMomentumDecay(), DecoupledWeightDecay: o.GetDecoupledWeightDecay(),
		Schedule: optim.Schedule{Kind: optim.ScheduleKind(o.GetSchedule()), StepSize: o.GetStepSize(), Gamma: o.GetGamma(),
			TMax: o.GetTMax(), MinLR: o.GetMinLr(), WarmupSteps: o.GetWarmupSteps(), WarmupStart: o.GetWarmupStart()}}
}

// ToProto is the inverse of FromProto.
func ToProto(o optim.Config) *pb.ReducerOptimizer {
	return &pb.ReducerOptimizer{Kind: string(o.Kind), Lr: o.LR, WeightDecay: o.WeightDecay, Momentum: o.Momentum,
		Dampening: o.Dampening, Nesterov: o.Nesterov, Beta1: o.Beta1, Beta2: o.Beta2, Eps: o.Eps, Alpha: o.Alpha,
		Centered: o.Centered, Schedule: string(o.Schedule.Kind), StepSize: o.Schedule.StepSize, Gamma: o.Schedule.Gamma,
		TMax: o.Schedule.TMax, MinLr: o.Schedule.MinLR, WarmupSteps: o.Schedule.WarmupSteps, WarmupStart: o.Schedule.WarmupStart,
		LrDecay: o.LRDecay, InitialAccumulatorValue: o.InitialAccumulatorValue, MomentumDecay: o.MomentumDecay,
		DecoupledWeightDecay: o.DecoupledWeightDecay}
}
