#!/usr/bin/env python3
"""Gymnasium's own steps per second (wall and CPU time) for the classic-control environments
that internal/env ports, as the baseline for BenchmarkStep in
docs/benchlog/2026-11-30-sessions-1-4.md. Same protocol as the Go benchmark: gymnasium.make (with
its wrappers), random valid actions from a fixed table, reset when an
episode ends (included in the time), one process, one thread.

Usage: python3 scripts/bench_gym_envs.py [SECONDS_PER_ENV]
"""

import sys
import time

import gymnasium as gym
import numpy as np

SECONDS = float(sys.argv[1]) if len(sys.argv) > 1 else 2.0


def bench(env_id):
    env = gym.make(env_id)
    rng = np.random.default_rng(1)
    space = env.action_space
    if isinstance(space, gym.spaces.Discrete):
        acts = [int(a) for a in rng.integers(space.n, size=1024)]
    else:
        acts = [rng.uniform(space.low, space.high).astype(np.float32) for _ in range(1024)]
    env.reset(seed=1)
    steps, start, cpu0 = 0, time.perf_counter(), time.process_time()
    while True:
        for a in acts:
            _, _, term, trunc, _ = env.step(a)
            if term or trunc:
                env.reset()
        steps += len(acts)
        elapsed = time.perf_counter() - start
        if elapsed >= SECONDS:
            return steps / elapsed, steps / (time.process_time() - cpu0)


for env_id in ["Acrobot-v1", "CartPole-v1", "MountainCarContinuous-v0", "Pendulum-v1"]:
    wall, cpu = bench(env_id)
    print(f"{env_id:26s} {wall:12.0f} steps/s {cpu:12.0f} steps/cpu-s")
