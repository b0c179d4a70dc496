#!/usr/bin/env bash
# The README's main job: a complete distributed training run. `rlhub train
# ars` starts an embedded hub on 127.0.0.1 and two worker processes that
# talk to it over gRPC, trains CartPole-v1 with ARS until the evaluation
# return reaches 475, and writes runs/demo/{curve.csv,curve.png,
# policy.safetensors,summary.json}. Then the trained policy is evaluated
# on 100 fresh episodes.
set -euo pipefail
cd "$(dirname "$0")/.."
export GOEXPERIMENT=simd
source scripts/gotags.sh
go build -o bin/rlhub ./cmd/rlhub
rm -rf runs/demo
bin/rlhub --log-level warn train ars --env CartPole-v1 --workers 2 --seed 1 --target 475 --out runs/demo
bin/rlhub eval --policy runs/demo/policy.safetensors --env CartPole-v1 --episodes 100
