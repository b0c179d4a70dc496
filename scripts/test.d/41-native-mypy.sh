#!/usr/bin/env bash
# mypy --strict on the Python package (issue 20). The modules listed are
# clean and must stay clean; the others (store, wsync, grads, learner, …)
# join the list as they are made clean — `mypy --strict rlhub` in python/
# shows what is left. Generated stubs are exempt (pyproject.toml).
set -euo pipefail
cd "$(dirname "$0")/../../python"
clean=(rlhub/__init__.py rlhub/_version.py rlhub/torchrl.py rlhub/ray.py)
python3 -m mypy --strict --follow-imports=silent --no-incremental "${clean[@]}"
