#!/usr/bin/env bash
# The repo checks: formatting, vet, module tidiness, proto drift.
set -euo pipefail
cd "$(dirname "$0")/.."
export GOEXPERIMENT=simd
fail=0
unformatted=$(gofmt -l $(git ls-files '*.go' | grep -v '\.pb\.go$') 2>/dev/null || true)
if [[ -n "$unformatted" ]]; then echo "gofmt needed:"; echo "$unformatted"; fail=1; fi
go vet ./... || fail=1
cp go.mod /tmp/rlhub-go.mod.bak; cp go.sum /tmp/rlhub-go.sum.bak
go mod tidy
if ! cmp -s go.mod /tmp/rlhub-go.mod.bak || ! cmp -s go.sum /tmp/rlhub-go.sum.bak; then
  echo "go mod tidy drift (go.mod/go.sum changed; commit the tidy result)"; fail=1
fi
scripts/genproto.sh --check || fail=1
exit $fail
