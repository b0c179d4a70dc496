// Package run orchestrates one distributed ARS training run end to end:
// the embedded hub (or a remote one), the worker processes, starting the
// run on the hub's coordinator, following its progress across hub
// restarts, and the outputs (curve.csv, curve.png, policy.safetensors,
// summary.json, config.yaml, run.json) with the summary statistics.
//
// To use it:
//  1. Fill a Config (Spec, Out and a hub or Workers; zero fields mean the
//     documented defaults).
//  2. Run(ctx, cfg) blocks until the run ends, ctx is done, or the hub stays
//     unreachable beyond Config.ReconnectWindow; it returns the Summary it
//     wrote. Observers see every finished iteration exactly once, in order.
//
// The command line (`rlhub train ars`, `rlhub bench ars-paper`) only maps
// flags and run files to a Config.
package run
