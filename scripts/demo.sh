#!/usr/bin/env bash
# The README's main job: a complete distributed training run on real
# locomotion. It
#   1. installs what a fresh machine lacks for MuJoCo: Debian's
#      libmujoco-dev (the physics) and the gymnasium Python package (only
#      its robot model XMLs are used), both skipped when present;
#   2. builds rlhub with the MuJoCo binding;
#   3. runs `rlhub train ars --env HalfCheetah-v5 --workers 2`: an embedded
#      hub on 127.0.0.1 and two worker processes talking to it over gRPC,
#      with the ARS paper's hyperparameters (V2-t, N = 32, b = 4, α = 0.02,
#      ν = 0.03; internal/ars/defaults.go), until the evaluation return
#      reaches the paper's threshold 3430, showing progress and writing
#      runs/demo/{curve.csv,curve.png,policy.safetensors,summary.json};
#   4. evaluates the trained policy on 10 fresh episodes.
# When MuJoCo cannot be installed (no apt-get, not root, no package index)
# it says why and runs the same distributed training on CartPole-v1
# instead. RLHUB_DEMO_ENV=CartPole-v1 asks for that run directly.
set -euo pipefail
cd "$(dirname "$0")/.."
export GOEXPERIMENT=simd

GYMNASIUM=gymnasium==1.4.0 # python/requirements-dev.txt's pin

why_not=""
as_root() {
  if [[ $(id -u) == 0 ]]; then "$@"
  elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then sudo "$@"
  else return 1
  fi
}

mujoco_ready() {
  if [[ ! -f /usr/include/mujoco/mujoco.h ]]; then
    echo "demo: installing MuJoCo (Debian libmujoco-dev)"
    if ! command -v apt-get >/dev/null; then
      why_not="no apt-get to install Debian's libmujoco-dev"; return 1
    fi
    if ! { as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
           as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libmujoco-dev >/dev/null; }; then
      why_not="could not install libmujoco-dev with apt-get (needs root or sudo, and a Debian/Ubuntu release that has it)"; return 1
    fi
  fi
  if ! python3 -c 'import gymnasium' 2>/dev/null; then
    echo "demo: installing the gymnasium Python package (for its robot models)"
    if ! python3 -m pip install -q --disable-pip-version-check --root-user-action=ignore "$GYMNASIUM"; then
      why_not="could not pip install $GYMNASIUM (its robot model XMLs are needed)"; return 1
    fi
  fi
}

envname=${RLHUB_DEMO_ENV:-HalfCheetah-v5}
if [[ $envname == HalfCheetah-v5 ]] && ! mujoco_ready; then
  echo
  echo "demo: MuJoCo is not available: $why_not."
  echo "demo: falling back to the same distributed ARS run on CartPole-v1."
  echo "demo: for the locomotion run install libmujoco-dev (apt-get) and gymnasium (pip), then make demo again."
  echo
  envname=CartPole-v1
fi

source scripts/gotags.sh
go build -o bin/rlhub ./cmd/rlhub
rm -rf runs/demo
case $envname in
  HalfCheetah-v5)
    # The target and every hyperparameter are the env's defaults (the
    # paper's); they are spelled out here so the command says what it runs.
    bin/rlhub --log-level warn train ars --env HalfCheetah-v5 --workers 2 --seed 1 \
      --version V2-t --directions 32 --top 4 --step-size 0.02 --noise 0.03 --target 3430 --out runs/demo
    bin/rlhub eval --policy runs/demo/policy.safetensors --env HalfCheetah-v5 --episodes 10
    ;;
  *)
    bin/rlhub --log-level warn train ars --env "$envname" --workers 2 --seed 1 --target 475 --out runs/demo
    bin/rlhub eval --policy runs/demo/policy.safetensors --env "$envname" --episodes 100
    ;;
esac
