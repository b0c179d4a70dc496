#!/usr/bin/env bash
# A rolling upgrade between two builds (internal/replica TestRollingUpgrade):
# BASE (a git revision: the build running now) and this checkout, each a
# hub of one cluster on a real etcd, each killed in turn.
# `make compat BASE=REV`. Not in CI: it builds a second tree. Builds older
# than `serve --addr-file` (before 2026-12-01) cannot be started by it.
set -euo pipefail
cd "$(dirname "$0")/.."
export GOEXPERIMENT=simd
source scripts/gotags.sh
if [[ -z "${BASE:-}" ]]; then
  echo "compat: set BASE to the revision of the build to upgrade from (make compat BASE=REV)" >&2
  exit 2
fi
base=$(git rev-parse --verify "$BASE^{commit}")
dir=$(mktemp -d)
trap 'git worktree remove --force "$dir/src" >/dev/null 2>&1 || true; rm -rf "$dir"' EXIT
git worktree add --detach -q "$dir/src" "$base"
(cd "$dir/src" && go build -o "$dir/rlhub-base" ./cmd/rlhub)
echo "compat: $(git rev-parse --short "$base") (base) and this checkout ($(git rev-parse --short HEAD), with its working tree)"
RLHUB_COMPAT_BASE_BIN="$dir/rlhub-base" go test -race -count=1 -run '^TestRollingUpgrade$' -v ./internal/replica/
