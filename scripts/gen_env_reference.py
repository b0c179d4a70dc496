#!/usr/bin/env python3
"""Record reference trajectories from the real Gymnasium environments.

Writes internal/env/testdata/gym_reference.json, which the Go test
internal/env/reference_test.go replays against rlhub's ports.

Each case: gymnasium.make(id) (so the TimeLimit and order checks are the
real ones), reset(seed=0), then the internal state is set explicitly via
env.unwrapped.state (a float64 array, the dtype a reset leaves for all but
Acrobot, whose reset leaves float32). A fixed action sequence is then
applied; some cases' actions were chosen by a simple controller while
recording, but the recorded sequence is what the Go test replays. Per step
the file holds the observation, reward, terminated, truncated and the
unwrapped state afterwards. Floats are written with repr(), so they
round-trip exactly.

Usage: python3 scripts/gen_env_reference.py [OUT]
"""

import json
import math
import sys

import gymnasium as gym
import numpy as np

OUT = sys.argv[1] if len(sys.argv) > 1 else "internal/env/testdata/gym_reference.json"


def f32_actions(values):
    return [np.array([v], dtype=np.float32) for v in values]


def current_obs(env_id, env):
    u = env.unwrapped
    if env_id in ("Pendulum-v1",):
        return u._get_obs()
    if env_id == "Acrobot-v1":
        return u._get_ob()
    return np.array(u.state, dtype=np.float32)


def record(env_id, name, state0, policy, max_steps, extra_after_done=0):
    """Run one case. policy(obs, t) returns the action (int or float32 array).

    Stops at the first terminated/truncated step, then takes
    extra_after_done more steps (Gymnasium allows it; CartPole then pays 0).
    """
    env = gym.make(env_id)
    env.reset(seed=0)
    env.unwrapped.state = np.array(state0, dtype=np.float64)
    obs = current_obs(env_id, env)
    case = {
        "env": env_id,
        "name": name,
        "state0": [float(v) for v in state0],
        "obs0": [float(v) for v in obs],
        "actions": [],
        "steps": [],
    }
    extra = None
    for t in range(max_steps):
        a = policy(obs, t)
        obs, reward, terminated, truncated, _ = env.step(a)
        if isinstance(a, np.ndarray):
            case["actions"].append([float(v) for v in a])
        else:
            case["actions"].append([int(a)])
        case["steps"].append({
            "obs": [float(v) for v in obs],
            "reward": float(reward),
            "terminated": bool(terminated),
            "truncated": bool(truncated),
            "state": [float(v) for v in np.asarray(env.unwrapped.state)],
        })
        if extra is not None:
            extra -= 1
            if extra == 0:
                break
        elif terminated or truncated:
            if extra_after_done == 0:
                break
            extra = extra_after_done
    env.close()
    return case


def record_resets(env_id, seeds):
    """Reset observations for seeds: the state Gymnasium drew and the
    observation it returned (checks the state → observation mapping,
    including dtypes: Acrobot's reset state is float32)."""
    env = gym.make(env_id)
    out = []
    for seed in seeds:
        obs, _ = env.reset(seed=seed)
        out.append({
            "seed": seed,
            "state": [float(v) for v in np.asarray(env.unwrapped.state)],
            "obs": [float(v) for v in obs],
        })
    env.close()
    return out


def main():
    rng = np.random.default_rng(20260711)
    cases = []

    # CartPole-v1.
    def cp_random(obs, t):
        return int(rng.integers(2))

    def cp_balance(obs, t):
        # A PD controller on the pole angle that keeps it up for 500 steps.
        x, xd, th, thd = obs
        return 1 if th + 0.5 * thd + 0.05 * x + 0.1 * xd > 0 else 0

    cases.append(record("CartPole-v1", "random_until_terminated", [0.01, -0.02, 0.03, 0.04], cp_random, 500))
    cases.append(record("CartPole-v1", "push_right_past_termination", [0.0, 0.0, 0.0, 0.0], lambda o, t: 1, 500, extra_after_done=3))
    cases.append(record("CartPole-v1", "cart_leaves_track", [2.3, 1.5, 0.0, 0.0], lambda o, t: 1, 500))
    cases.append(record("CartPole-v1", "balanced_until_truncated", [0.02, 0.0, -0.03, 0.01], cp_balance, 600))

    # Pendulum-v1.
    def pd_random(obs, t):
        return np.array([rng.uniform(-3.0, 3.0)], dtype=np.float32)

    cases.append(record("Pendulum-v1", "random_clipped_actions", [2.5, -0.7], pd_random, 300))
    cases.append(record("Pendulum-v1", "max_speed_and_wrapping", [7.5, 7.9], lambda o, t: np.array([2.0], dtype=np.float32), 60))
    cases.append(record("Pendulum-v1", "negative_angle", [-9.1, -3.0], lambda o, t: np.array([-1.25], dtype=np.float32), 40))

    # MountainCarContinuous-v0.
    def mc_random(obs, t):
        return np.array([rng.uniform(-1.5, 1.5)], dtype=np.float32)

    def mc_pump(obs, t):
        # Push with the velocity: reaches the goal in about 100 steps.
        return np.array([1.0 if obs[1] >= 0 else -1.0], dtype=np.float32)

    def mc_pump_scaled(obs, t):
        # Same, but with in-range and over-range magnitudes mixed.
        mag = [0.75, 1.5, 1.0, 0.3][t % 4]
        return np.array([mag if obs[1] >= 0 else -mag], dtype=np.float32)

    cases.append(record("MountainCarContinuous-v0", "random_until_truncated", [-0.5, 0.0], mc_random, 1200))
    cases.append(record("MountainCarContinuous-v0", "pump_to_goal", [-0.45, 0.0], mc_pump, 999))
    cases.append(record("MountainCarContinuous-v0", "pump_mixed_magnitudes", [-0.55, 0.0], mc_pump_scaled, 999))
    cases.append(record("MountainCarContinuous-v0", "left_wall", [-1.17, -0.06], lambda o, t: np.array([-1.0], dtype=np.float32), 30))
    cases.append(record("MountainCarContinuous-v0", "fast_from_state", [0.3, 0.069], lambda o, t: np.array([0.9], dtype=np.float32), 30))

    # Acrobot-v1.
    def ac_random(obs, t):
        return int(rng.integers(3))

    def ac_pump(obs, t):
        # Torque with the summed joint velocities: swings up within 500 steps.
        return 2 if obs[4] + obs[5] > 0 else 0

    cases.append(record("Acrobot-v1", "random_until_truncated", [0.05, -0.03, 0.02, 0.01], ac_random, 600))
    cases.append(record("Acrobot-v1", "pump_to_goal", [0.01, 0.02, -0.03, 0.04], ac_pump, 600))
    cases.append(record("Acrobot-v1", "fast_wrapping", [3.0, -3.0, 12.0, -27.0], lambda o, t: 1, 40))

    for c in cases:
        last = c["steps"][-1]
        print(f'{c["env"]:26s} {c["name"]:30s} steps={len(c["steps"]):4d} '
              f'terminated={last["terminated"]} truncated={last["truncated"]}', file=sys.stderr)

    resets = {env_id: record_resets(env_id, range(50))
              for env_id in ["CartPole-v1", "Pendulum-v1", "MountainCarContinuous-v0", "Acrobot-v1"]}

    doc = {
        "generator": "scripts/gen_env_reference.py",
        "gymnasium": gym.__version__,
        "numpy": np.__version__,
        "cases": cases,
        "resets": resets,
    }
    with open(OUT, "w") as f:
        json.dump(doc, f, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main()
