#!/usr/bin/env bash
# The repo checks: formatting, vet, module tidiness, proto drift.
set -euo pipefail
cd "$(dirname "$0")/.."
export GOEXPERIMENT=simd
source scripts/gotags.sh
fail=0
unformatted=$(gofmt -l $(git ls-files '*.go' | grep -v '\.pb\.go$') 2>/dev/null || true)
if [[ -n "$unformatted" ]]; then echo "gofmt needed:"; echo "$unformatted"; fail=1; fi
go vet ./... || fail=1
if ! go mod tidy -diff; then
  echo "go mod tidy drift: run 'go mod tidy' and commit the result"; fail=1
fi
scripts/genproto.sh --check || fail=1
exit $fail
