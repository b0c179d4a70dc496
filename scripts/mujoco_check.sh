#!/usr/bin/env bash
# The full trajectory check of the Go MuJoCo tasks against Gymnasium's own
# v5 environments (make mujoco-check; not in CI, which replays the committed
# 300-step recording in TestLongTrajectories).
#
# Gymnasium runs on pip's mujoco 2.3.7, the release whose physics equals
# Debian's libmujoco 2.2.2 on these models (docs/mujoco.md; PyPI has no
# 2.2.2 wheel for Python 3.11), in its own virtualenv so the system's
# packages stay as they are. STEPS steps per task (default 5000) are
# recorded by scripts/mujoco_longcheck.py and replayed by
# TestLongTrajectories: 1e-7 at every step, restarting from Gymnasium's full
# state every 25 steps, and the free-running agreement logged per task.
set -euo pipefail
cd "$(dirname "$0")/.."
export GOEXPERIMENT=simd
source scripts/gotags.sh
STEPS=${STEPS:-5000}
VENV=${RLHUB_MJ_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/rlhub/venv-mujoco-2.3.7}
if ! "$VENV/bin/python" -c 'import mujoco, gymnasium, imageio; assert mujoco.__version__ == "2.3.7"' 2>/dev/null; then
	python3 -m venv --system-site-packages "$VENV"
	"$VENV/bin/pip" install -q 'gymnasium[mujoco]==1.4.0' 'mujoco==2.3.7'
fi
OUT=$(mktemp -d "${TMPDIR:-/tmp}/rlhub-mujoco-check.XXXXXX")
trap 'rm -rf "$OUT"' EXIT
echo "Debian libmujoco: $(dpkg-query -W -f='${Version}' libmujoco-dev 2>/dev/null || echo unknown);" \
	"Gymnasium's: $("$VENV/bin/python" -c 'import mujoco; print(mujoco.__version__)')"
"$VENV/bin/python" scripts/mujoco_longcheck.py --steps "$STEPS" --out "$OUT"
RLHUB_MJ_LONGDIR="$OUT" go test -count=1 -run 'TestLongTrajectories' -v ./internal/env/mjenv/ | grep -E 'long_test|^(---|ok|FAIL|PASS)'
