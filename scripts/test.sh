#!/usr/bin/env bash
# The README's test command: set up, repo checks, Go tests with the race
# detector, Python tests.
set -euo pipefail
cd "$(dirname "$0")/.."
export GOEXPERIMENT=simd
# As root (CI) pid namespaces are always at hand: the shm liveness tests
# across namespaces must run, not skip.
if [[ "$(id -u)" == 0 ]]; then export RLHUB_REQUIRE_PIDNS=1; fi
scripts/setup.sh
source scripts/gotags.sh   # -tags=mujoco once setup has installed libmujoco-dev
scripts/check.sh
go build -o bin/rlhub ./cmd/rlhub
go test -race -timeout 20m ./...
if compgen -G "python/tests/test_*.py" >/dev/null; then
  # The tests import this checkout's client, not an installed one.
  PYTHONPATH="$PWD/python" RLHUB_BIN="$PWD/bin/rlhub" python3 -m pytest -q python/tests
fi

# Further suites (a wheel in a fresh venv, type checks, a browser test's
# set-up …) add one file each here, run in name order after pytest, so
# components do not edit each other's lines.
for part in scripts/test.d/*.sh; do
  [[ -e "$part" ]] || continue
  echo "test: $part"
  bash "$part"
done
