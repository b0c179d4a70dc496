#!/usr/bin/env python3
"""Writes internal/ars/testdata/machin_update.json: ARS updates computed with
Machin's arithmetic (machin.frame.algorithms.ars, ARS.update and
_cal_gradient) and real torch optimizers, schedulers and
torch.nn.utils.clip_grad_norm_, for internal/ars's TestUpdateMatchesMachin to
replay through rlhub's trainer.

Run from the repository root:  PYTHONPATH=python python3 scripts/gen_ars_machin_vectors.py
Needs torch and numpy. python/tests/test_ars_machin.py regenerates the cases
and compares them with the committed file.

Machin's update, per iteration (its code, restated):
  rollout_rewards = [r+, r−] (2 × N); keep the directions whose max(r+, r−)
  is ≥ the 100·(1 − b/N) percentile; σ = np.std of the kept 2b rewards; if
  σ is not close to 0 divide the rewards by σ; the gradient of each
  parameter is the mean over kept directions of (r− − r+)·δ, δ being the
  noise table's slice (ν·N(0, 1)), the mean taken in the parameter's dtype;
  then optimizer.step() and (the caller's) lr_scheduler.step().
Machin leaves its clip_grad_norm_(actor.parameters(), gradient_max)
commented out; it is applied here as written there. The noise δ is
rlhub's direction (rlhub.ars_noise, identical to Go's), times ν.
"""
from __future__ import annotations

import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from rlhub import ars_noise  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "internal", "ars", "testdata", "machin_update.json")

OBS, ACT = 5, 2  # a linear policy: P = 10 parameters
P = OBS * ACT
ITERS = 12


def chained(opt, warmup: int, curve):
    """rlhub's schedule semantics: ChainedScheduler([LinearLR, curve])."""
    scheds = []
    if warmup:
        scheds.append(torch.optim.lr_scheduler.LinearLR(opt, start_factor=1 / 3, total_iters=warmup))
    if curve is not None:
        scheds.append(curve(opt))
    if not scheds:
        return None
    return torch.optim.lr_scheduler.ChainedScheduler(scheds) if len(scheds) > 1 else scheds[0]


# name, rlhub optimizer (run spec form), step size, ν, N, b, gradient_max,
# torch optimizer factory (lr = step size), scheduler factory, dtype.
CASES = [
    ("sgd", {"kind": "sgd"}, 0.5, 0.05, 6, 3, 0.0,
     lambda p, lr: torch.optim.SGD(p, lr=lr, foreach=False), lambda o: None, torch.float32),
    ("adam_warmup_cosine_clip", {"kind": "adam", "schedule": {"kind": "cosine", "t_max": 6, "warmup_steps": 2}},
     0.02, 0.03, 8, 4, 0.05,
     lambda p, lr: torch.optim.Adam(p, lr=lr, foreach=False),
     lambda o: chained(o, 2, lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=6)), torch.float32),
    ("rmsprop_momentum_steplr_clip", {"kind": "rmsprop", "momentum": 0.5, "schedule": {"kind": "step", "step_size": 4, "gamma": 0.5}},
     0.01, 0.05, 6, 6, 0.2,
     lambda p, lr: torch.optim.RMSprop(p, lr=lr, momentum=0.5, foreach=False),
     lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=4, gamma=0.5), torch.float32),
    # The paper's step is Machin's update with plain SGD at lr = α/ν on a
    # float64 actor (Machin's noise carries ν, the paper's δ does not).
    ("step_cosine_clip", {"kind": "step", "schedule": {"kind": "cosine", "t_max": 8}}, 0.3, 0.05, 6, 2, 0.4,
     lambda p, lr: torch.optim.SGD(p, lr=lr / 0.05, foreach=False),
     lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=8), torch.float64),
]


def machin_case(name, opt_cfg, alpha, nu, n, b, gmax, make_opt, make_sched, dtype, seed=7):
    rng = np.random.default_rng(sum(map(ord, name)))
    theta0 = rng.normal(0, 0.3, P).astype(np.float32).astype(np.float64)  # float32-representable
    param = torch.nn.Parameter(torch.tensor(theta0, dtype=dtype))
    opt = make_opt([param], alpha)
    sched = make_sched(opt)
    iters = []
    for it in range(ITERS):
        rplus = rng.normal(0, 5, n) + it
        rminus = rng.normal(0, 5, n) + it
        if it == 5:
            rplus[:], rminus[:] = 3.0, 3.0  # σ_R = 0: a zero gradient (an optimizer still steps)
        rr = np.array([rplus, rminus])
        maxr = np.max(rr, axis=0)
        idx = np.arange(maxr.size)[maxr >= np.percentile(maxr, 100 * (1 - (b / n)))]
        # Ties keep more than b (rlhub keeps exactly b); only the σ_R = 0
        # iteration has them here, where the gradient is 0 either way.
        assert len(idx) == b or it == 5, (name, it, idx)
        rr = rr[:, idx]
        var = np.std(rr)
        if not np.isclose(var, 0.0):
            rr = rr / var
        diff = rr[1] - rr[0]  # r− − r+
        deltas = [torch.tensor(nu * ars_noise.direction(P, seed, it * n + int(d))) * float(r) for d, r in zip(idx, diff)]
        param.grad = torch.mean(torch.stack(deltas).to(dtype=dtype), dim=0)
        if gmax > 0:
            torch.nn.utils.clip_grad_norm_([param], gmax)
        opt.step()
        if sched is not None:
            sched.step()
        iters.append({"rplus": rplus.tolist(), "rminus": rminus.tolist(),
                      "theta": param.detach().to(torch.float64).tolist()})
    return {"name": name, "optimizer": opt_cfg, "step_size": alpha, "noise": nu, "directions": n, "top": b,
            "gradient_max": gmax, "seed": seed, "obs_dim": OBS, "act_dim": ACT, "theta0": theta0.tolist(),
            "iterations": iters}


def generate() -> dict:
    return {"torch": torch.__version__, "cases": [machin_case(*c) for c in CASES]}


def main() -> None:
    with open(OUT, "w") as f:
        json.dump(generate(), f, indent=1)
        f.write("\n")
    print("wrote", OUT)


if __name__ == "__main__":
    main()
