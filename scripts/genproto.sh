#!/usr/bin/env bash
# Regenerates the Go and Python stubs from proto/rlhub/v1/*.proto.
#   scripts/genproto.sh          write into the tree
#   scripts/genproto.sh --check  generate into a temp dir, fail on any diff
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$(go env GOPATH)/bin:$PATH"
check=0
[[ "${1:-}" == "--check" ]] && check=1

out=.
pyout=python/rlhub/_proto
if (( check )); then
  tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
  out=$tmp/go; pyout=$tmp/py
  mkdir -p "$out" "$pyout"
fi
mkdir -p "$pyout"

protos=(proto/rlhub/v1/*.proto)
protoc -I proto \
  --go_out="$out" --go_opt=module=github.com/rlhub/rlhub \
  --go-grpc_out="$out" --go-grpc_opt=module=github.com/rlhub/rlhub \
  "${protos[@]}"

# Python stubs: grpcio-tools bundles its own protoc matching the protobuf
# runtime; imports are rewritten to be package-relative.
python3 -m grpc_tools.protoc -I proto --python_out="$pyout" --grpc_python_out="$pyout" --pyi_out="$pyout" "${protos[@]}"
find "$pyout" -name '*.py' -o -name '*.pyi' | xargs sed -i -E 's/^from rlhub\.v1 import/from rlhub._proto.rlhub.v1 import/'
touch "$pyout/__init__.py" "$pyout/rlhub/__init__.py" "$pyout/rlhub/v1/__init__.py"

if (( check )); then
  fail=0
  for f in $(cd "$out" && find . -name '*.go'); do
    if ! cmp -s "$out/$f" "./$f"; then echo "proto drift: $f differs from generated"; fail=1; fi
  done
  for f in $(find proto -name '*.pb.go'); do
    [[ -f "$out/$f" ]] || { echo "proto drift: $f has no .proto"; fail=1; }
  done
  if ! diff -r -q -x __pycache__ "$pyout" python/rlhub/_proto; then echo "proto drift: python stubs"; fail=1; fi
  exit $fail
fi
