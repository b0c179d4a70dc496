#!/usr/bin/env bash
# Installs what a fresh machine lacks to build, generate and test rlhub.
# Idempotent and quick when everything is present.
set -euo pipefail
cd "$(dirname "$0")/.."

PROTOC_GEN_GO=v1.36.12        # matches google.golang.org/protobuf in go.mod
PROTOC_GEN_GO_GRPC=v1.6.2

if ! command -v protoc >/dev/null; then
  echo "setup: installing protoc (Debian protobuf-compiler)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq protobuf-compiler >/dev/null
fi

if [[ ! -f /usr/include/mujoco/mujoco.h ]]; then
  echo "setup: installing MuJoCo (Debian libmujoco-dev) for the locomotion environments"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq libmujoco-dev >/dev/null
fi

gobin="$(go env GOPATH)/bin"
have_version() { [[ -x "$gobin/$1" ]] && go version -m "$gobin/$1" 2>/dev/null | grep -q "mod.*$2"; }
have_version protoc-gen-go "$PROTOC_GEN_GO" || GOFLAGS= go install "google.golang.org/protobuf/cmd/protoc-gen-go@$PROTOC_GEN_GO"
have_version protoc-gen-go-grpc "$PROTOC_GEN_GO_GRPC" || GOFLAGS= go install "google.golang.org/grpc/cmd/protoc-gen-go-grpc@$PROTOC_GEN_GO_GRPC"

# pip does nothing (and asks no index) when the pinned versions are present.
python3 -m pip install -q --disable-pip-version-check --root-user-action=ignore -r python/requirements-dev.txt
python3 -c 'import torch' 2>/dev/null || {
  echo "setup: installing PyTorch (python/requirements-torch.txt; a few minutes)"
  python3 -m pip install -q --disable-pip-version-check --root-user-action=ignore -r python/requirements-torch.txt
}
go mod download

# Each component that needs more (a Debian package, a Python package, a
# server for its tests) adds one file here, so that set-up stays one
# command and components do not edit each other's lines.
for part in scripts/setup.d/*.sh; do
  [[ -e "$part" ]] || continue
  source "$part"
done
