#!/usr/bin/env bash
# Installs Machin 0.4.2 (the learner-loop benchmark's reference, issue 18)
# into .cache/machin, apart from the project's Python environment: nothing in
# site-packages changes, and only scripts/bench_learner_loop.py (which puts
# the folder on sys.path) imports it. Idempotent: a stamp names the pinned set,
# and nothing is fetched when it matches.
#
# --no-deps, because Machin's declared dependencies (gym, pytorch-lightning,
# moviepy, matplotlib, torchviz, tensorboardX, ...) serve its RL algorithms,
# environments and plots, not machin.parallel. The benchmark imports only
# machin.parallel (and the two machin.utils modules it uses, logging and
# prepare); what those import at module level is installed here, real and
# pinned: dill (machin.parallel.pickle), psutil and GPUtil
# (machin.parallel.assigner), colorlog (machin.utils.logging).
# See bench_learner_loop.py's import_machin for the two torch names Machin
# 0.4.2 needs that torch 2.15 no longer has.
set -euo pipefail
cd "$(dirname "$0")/.."

target=.cache/machin
pins=(machin==0.4.2 dill==0.4.1 psutil==7.2.2 GPUtil==1.4.0 colorlog==6.12.0)
stamp="$target/.pins"
if [[ -f "$stamp" && "$(cat "$stamp")" == "${pins[*]}" ]]; then
  exit 0
fi
echo "setup: installing ${pins[*]} into $target (the learner-loop benchmark's Machin arm)"
rm -rf "$target"
python3 -m pip install -q --disable-pip-version-check --root-user-action=ignore \
  --no-deps --target "$target" "${pins[@]}"
echo "${pins[*]}" >"$stamp"
