#!/usr/bin/env bash
# The README's main job. For now: start the embedded hub and make a client
# round trip against it. (Becomes a distributed ARS training run.)
set -euo pipefail
cd "$(dirname "$0")/.."
export GOEXPERIMENT=simd
source scripts/gotags.sh
go build -o bin/rlhub ./cmd/rlhub
data=$(mktemp -d)
bin/rlhub serve --listen 127.0.0.1:7470 --data "$data" &
pid=$!
trap 'kill -INT $pid 2>/dev/null; wait $pid; rm -rf "$data"' EXIT
bin/rlhub ping --hub 127.0.0.1:7470
