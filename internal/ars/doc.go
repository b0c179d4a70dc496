// Package ars is the pure core of Augmented Random Search (Mania, Guy &
// Recht 2018, Algorithm 2): counter-based noise, running state statistics
// with a parallel merge, the V1/V2/V1-t/V2-t update, linear and MLP
// policies, rollouts and the run state machine. It has no goroutines, no
// clocks and no network: given a Config, a run is a deterministic function
// of its seed. The hub's coordinator (package arsrpc) drives a Trainer and
// workers run Evaluator tasks.
//
// A run, step by step:
//  1. NewTrainer(cfg) sets θ_0 (zeros for the linear policy) and empty
//     statistics (μ_0 = 0, Σ_0 = I).
//  2. Tasks() lists the iteration's work: N direction tasks (each the two
//     rollouts θ ± νδ_d, δ_d = Direction(seed, j·N + d)), plus E
//     evaluation episodes every K iterations.
//  3. Workers run each task with an Evaluator on Current() (θ and the
//     filter frozen for the iteration) and return Results.
//  4. Finish(results) evaluates, stops at the target, or updates θ with the
//     top b directions, merges the statistics in direction order and
//     advances; PolicyOf().Encode() is the new version to publish.
package ars
