#!/usr/bin/env bash
# ARS results for docs/benchlog/2026-11-30-sessions-1-4.md (issue 7). Builds bin/rlhub and runs:
#   1. CartPole-v1 to a 475 evaluation return on seeds 1..10 (2 worker
#      processes), then `rlhub eval` of each policy on 100 fresh episodes;
#   2. LQR on seeds 1..5: the trained gain's exact average cost relative
#      to the Riccati optimum;
#   3. scaling: the same fixed-budget runs with 1 and 2 worker processes
#      (REPS repetitions each, median wall time and worker CPU time),
#      checking that the policy files are byte-identical.
# SCALE_ONLY=1 skips 1 and 2.
# Output: a markdown-ish report on stdout; runs under runs/bench/.
set -euo pipefail
cd "$(dirname "$0")/.."
export GOEXPERIMENT=simd
source scripts/gotags.sh
go build -o bin/rlhub ./cmd/rlhub
REPS=${REPS:-3}
out=runs/bench
rm -rf "$out"; mkdir -p "$out"
echo "load: $(uptime)"
echo
if [[ -z "${SCALE_ONLY:-}" ]]; then
echo "### CartPole-v1, target 475, seeds 1..10, 2 worker processes"
for s in $(seq 1 10); do
  d=$out/cartpole-$s
  bin/rlhub --log-level warn train ars --env CartPole-v1 --workers 2 --seed "$s" --target 475 --out "$d" --no-progress >/dev/null
  ev=$(bin/rlhub eval --policy "$d/policy.safetensors" --episodes 100 | head -1)
  python3 - "$d/summary.json" "$ev" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
print(f"seed {s['seed']:2d}: {s['stop_reason']:6s} eval {s['final_eval_mean']:.1f} ± {s['final_eval_std']:.1f} "
      f"after {s['iterations']} iterations, policy from {s['policy_training_episodes']} training episodes, "
      f"{s['env_steps']} steps, {s['wall_seconds']:.3f} s | 100 fresh episodes: {sys.argv[2].split(': ',1)[1]}")
PY
done
echo
echo "### LQR, default budget (4000 episodes), seeds 1..5, 2 worker processes"
for s in $(seq 1 5); do
  d=$out/lqr-$s
  bin/rlhub --log-level warn train ars --env LQR --workers 2 --seed "$s" --out "$d" --no-progress >/dev/null
  python3 - "$d/summary.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
print(f"seed {s['seed']}: relative cost {s['lqr_relative_cost']:.4f} after {s['training_episodes']} episodes, "
      f"{s['env_steps']} steps, {s['wall_seconds']:.3f} s")
PY
done
fi
echo
echo "### Scaling 1 -> 2 worker processes (median of $REPS)"
scale() { # name, args...
  local name=$1; shift
  for w in 1 2; do
    for r in $(seq 1 "$REPS"); do
      bin/rlhub --log-level warn train ars --workers "$w" --out "$out/scale-$name-w$w-r$r" --no-progress "$@" >/dev/null
    done
  done
  python3 - "$out" "$name" "$REPS" <<'PY'
import json, sys, statistics, hashlib
out, name, reps = sys.argv[1], sys.argv[2], int(sys.argv[3])
res, digests = {}, set()
for w in (1, 2):
    walls, cpus, hubs, steps = [], [], [], None
    for r in range(1, reps + 1):
        d = f"{out}/scale-{name}-w{w}-r{r}"
        s = json.load(open(f"{d}/summary.json"))
        walls.append(s["wall_seconds"]); steps = s["env_steps"]
        cpus.append(s["worker_cpu_seconds"]); hubs.append(s["train_process_cpu_seconds"])
        digests.add(hashlib.sha256(open(f"{d}/policy.safetensors", "rb").read()).hexdigest())
    res[w] = (statistics.median(walls), steps, statistics.median(cpus), statistics.median(hubs))
for w, (wall, steps, cpu, hub) in res.items():
    print(f"{name}: {w} worker(s): {steps} steps in {wall:.3f} s median -> {steps / wall:,.0f} steps/s; "
          f"worker CPU {cpu:.3f} s ({steps / cpu:,.0f} steps per worker-CPU-s), hub+client CPU {hub:.3f} s")
print(f"{name}: speed-up {res[1][0] / res[2][0]:.2f}x; policy files identical across all runs: {len(digests) == 1}")
PY
}
# Defaults (small iterations: coordination-bound) and N = 256 directions
# (about 0.1-0.25 M env steps per iteration: compute-bound).
scale cartpole --env CartPole-v1 --seed 1 --max-episodes 8000 --eval-every 1000
scale cartpole-n256 --env CartPole-v1 --seed 1 --directions 256 --top 128 --max-episodes 40960 --eval-every 1000
scale lqr --env LQR --seed 1 --max-episodes 8000 --eval-every 1000
scale lqr-n256 --env LQR --seed 1 --directions 256 --max-episodes 40960 --eval-every 1000
echo
echo "load: $(uptime)"
