#!/usr/bin/env bash
# Runs every fuzz target in the repository briefly (make fuzz; not part of
# CI). FUZZTIME per target, default 10s: FUZZTIME=5m scripts/fuzz.sh.
# Targets are listed with `go test -list '^Fuzz'`, so a new one is picked up
# without editing this file.
set -euo pipefail
cd "$(dirname "$0")/.."
export GOEXPERIMENT=simd
fuzztime=${FUZZTIME:-10s}
failed=0
for pkg in $(go list ./...); do
  for target in $(go test -list '^Fuzz' "$pkg" 2>/dev/null | grep '^Fuzz' || true); do
    echo "== $pkg $target ($fuzztime)"
    if ! go test -run '^$' -fuzz "^${target}\$" -fuzztime "$fuzztime" "$pkg"; then
      failed=1
    fi
  done
done
exit $failed
