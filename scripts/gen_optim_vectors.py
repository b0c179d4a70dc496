#!/usr/bin/env python3
"""Writes internal/optim/testdata/torch_vectors.json: several steps of real
torch.optim optimizers and lr schedulers on random float32 parameters and
gradients, for internal/optim's tests to replay.

Run from the repository root:  python3 scripts/gen_optim_vectors.py
Needs torch (CI does not: the output is committed). Every optimizer runs its
single-tensor CPU path (foreach=False), the one internal/optim mirrors.
"""
import json
import os

import torch

STEPS = 12
SHAPES = {"layer.weight": [3, 4], "layer.bias": [5]}

# name, Go optim.Config (JSON), torch optimizer factory, torch scheduler factory
CASES = [
    ("sgd", {"kind": "sgd", "lr": 0.1},
     lambda p: torch.optim.SGD(p, lr=0.1, foreach=False), None),
    ("sgd_momentum_dampening_wd", {"kind": "sgd", "lr": 0.05, "momentum": 0.9, "dampening": 0.1, "weight_decay": 0.01},
     lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, dampening=0.1, weight_decay=0.01, foreach=False), None),
    ("sgd_nesterov_wd", {"kind": "sgd", "lr": 0.05, "momentum": 0.8, "nesterov": True, "weight_decay": 0.001},
     lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.8, nesterov=True, weight_decay=0.001, foreach=False), None),
    ("adam", {"kind": "adam", "lr": 0.001},
     lambda p: torch.optim.Adam(p, lr=0.001, foreach=False), None),
    ("adam_wd_betas", {"kind": "adam", "lr": 0.01, "beta1": 0.8, "beta2": 0.99, "eps": 1e-6, "weight_decay": 0.1},
     lambda p: torch.optim.Adam(p, lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1, foreach=False), None),
    ("adamw", {"kind": "adamw", "lr": 0.01},
     lambda p: torch.optim.AdamW(p, lr=0.01, foreach=False), None),
    ("adamw_wd", {"kind": "adamw", "lr": 0.003, "weight_decay": 0.5, "beta1": 0.5},
     lambda p: torch.optim.AdamW(p, lr=0.003, weight_decay=0.5, betas=(0.5, 0.999), foreach=False), None),
    ("rmsprop", {"kind": "rmsprop", "lr": 0.01},
     lambda p: torch.optim.RMSprop(p, lr=0.01, foreach=False), None),
    ("rmsprop_centered_momentum_wd", {"kind": "rmsprop", "lr": 0.01, "alpha": 0.9, "eps": 1e-5, "momentum": 0.7, "centered": True, "weight_decay": 0.05},
     lambda p: torch.optim.RMSprop(p, lr=0.01, alpha=0.9, eps=1e-5, momentum=0.7, centered=True, weight_decay=0.05, foreach=False), None),
    ("sgd_steplr", {"kind": "sgd", "lr": 0.1, "momentum": 0.5, "schedule": {"kind": "step", "step_size": 2, "gamma": 0.5}},
     lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.5, foreach=False),
     lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=2, gamma=0.5)),
    ("adam_cosine", {"kind": "adam", "lr": 0.01, "schedule": {"kind": "cosine", "t_max": 4, "min_lr": 0.001}},
     lambda p: torch.optim.Adam(p, lr=0.01, foreach=False),
     lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=4, eta_min=0.001)),
    ("rmsprop_warmup", {"kind": "rmsprop", "lr": 0.01, "schedule": {"warmup_steps": 4, "warmup_start": 0.25}},
     lambda p: torch.optim.RMSprop(p, lr=0.01, foreach=False),
     lambda o: torch.optim.lr_scheduler.LinearLR(o, start_factor=0.25, end_factor=1.0, total_iters=4)),
    ("adagrad", {"kind": "adagrad", "lr": 0.1},
     lambda p: torch.optim.Adagrad(p, lr=0.1, foreach=False), None),
    ("adagrad_decay_init_wd", {"kind": "adagrad", "lr": 0.05, "lr_decay": 0.01, "initial_accumulator_value": 0.1, "weight_decay": 0.02, "eps": 1e-6},
     lambda p: torch.optim.Adagrad(p, lr=0.05, lr_decay=0.01, initial_accumulator_value=0.1, weight_decay=0.02, eps=1e-6, foreach=False), None),
    ("adamax", {"kind": "adamax", "lr": 0.002},
     lambda p: torch.optim.Adamax(p, lr=0.002, foreach=False), None),
    ("adamax_wd_betas", {"kind": "adamax", "lr": 0.01, "beta1": 0.7, "beta2": 0.95, "eps": 1e-6, "weight_decay": 0.1},
     lambda p: torch.optim.Adamax(p, lr=0.01, betas=(0.7, 0.95), eps=1e-6, weight_decay=0.1, foreach=False), None),
    ("nadam", {"kind": "nadam", "lr": 0.002},
     lambda p: torch.optim.NAdam(p, lr=0.002, foreach=False), None),
    ("nadam_wd_decay", {"kind": "nadam", "lr": 0.01, "beta1": 0.8, "beta2": 0.99, "weight_decay": 0.05, "momentum_decay": 0.01},
     lambda p: torch.optim.NAdam(p, lr=0.01, betas=(0.8, 0.99), weight_decay=0.05, momentum_decay=0.01, foreach=False), None),
    ("nadam_decoupled", {"kind": "nadam", "lr": 0.01, "weight_decay": 0.1, "decoupled_weight_decay": True},
     lambda p: torch.optim.NAdam(p, lr=0.01, weight_decay=0.1, decoupled_weight_decay=True, foreach=False), None),
    ("radam", {"kind": "radam", "lr": 0.001},
     lambda p: torch.optim.RAdam(p, lr=0.001, foreach=False), None),
    ("radam_rectified_wd", {"kind": "radam", "lr": 0.01, "beta2": 0.9, "weight_decay": 0.05},
     lambda p: torch.optim.RAdam(p, lr=0.01, betas=(0.9, 0.9), weight_decay=0.05, foreach=False), None),
    ("radam_decoupled", {"kind": "radam", "lr": 0.01, "beta1": 0.8, "beta2": 0.95, "weight_decay": 0.1, "decoupled_weight_decay": True},
     lambda p: torch.optim.RAdam(p, lr=0.01, betas=(0.8, 0.95), weight_decay=0.1, decoupled_weight_decay=True, foreach=False), None),
    ("nadam_cosine_warmup", {"kind": "nadam", "lr": 0.01, "schedule": {"kind": "cosine", "t_max": 5, "min_lr": 0.002, "warmup_steps": 3, "warmup_start": 0.5}},
     lambda p: torch.optim.NAdam(p, lr=0.01, foreach=False),
     lambda o: torch.optim.lr_scheduler.ChainedScheduler([
         torch.optim.lr_scheduler.LinearLR(o, start_factor=0.5, end_factor=1.0, total_iters=3),
         torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=5, eta_min=0.002)])),
]

# Learning-rate schedules alone: rlhub's Schedule (JSON) and the torch
# scheduler objects it must equal over SCHED_STEPS steps (see
# internal/optim/schedule.go for the composition).
SCHED_STEPS = 300
LinearLR = torch.optim.lr_scheduler.LinearLR
StepLR = torch.optim.lr_scheduler.StepLR
Cos = torch.optim.lr_scheduler.CosineAnnealingLR
Chain = torch.optim.lr_scheduler.ChainedScheduler


def warm(o, start, n):
    return LinearLR(o, start_factor=start, end_factor=1.0, total_iters=n)


SCHEDULES = [
    ("constant", 0.1, {}, None),
    ("warmup", 0.1, {"warmup_steps": 50, "warmup_start": 0.1}, lambda o: warm(o, 0.1, 50)),
    ("warmup_default_start", 3e-4, {"warmup_steps": 7}, lambda o: warm(o, 1.0 / 3, 7)),
    ("step", 0.1, {"kind": "step", "step_size": 30, "gamma": 0.5}, lambda o: StepLR(o, step_size=30, gamma=0.5)),
    ("step_default_gamma", 1.0, {"kind": "step", "step_size": 7}, lambda o: StepLR(o, step_size=7)),
    ("step_warmup", 0.1, {"kind": "step", "step_size": 30, "gamma": 0.5, "warmup_steps": 40, "warmup_start": 0.2},
     lambda o: Chain([warm(o, 0.2, 40), StepLR(o, step_size=30, gamma=0.5)])),
    ("cosine", 0.1, {"kind": "cosine", "t_max": 100}, lambda o: Cos(o, T_max=100)),
    ("cosine_floor", 0.1, {"kind": "cosine", "t_max": 100, "min_lr": 0.01}, lambda o: Cos(o, T_max=100, eta_min=0.01)),
    ("cosine_short", 1e-3, {"kind": "cosine", "t_max": 7, "min_lr": 1e-5}, lambda o: Cos(o, T_max=7, eta_min=1e-5)),
    ("cosine_warmup", 0.1, {"kind": "cosine", "t_max": 100, "warmup_steps": 20, "warmup_start": 0.25},
     lambda o: Chain([warm(o, 0.25, 20), Cos(o, T_max=100)])),
    ("cosine_floor_warmup", 0.1, {"kind": "cosine", "t_max": 100, "min_lr": 0.01, "warmup_steps": 20, "warmup_start": 0.25},
     lambda o: Chain([warm(o, 0.25, 20), Cos(o, T_max=100, eta_min=0.01)])),
    ("cosine_floor_warmup_issue19", 0.625, {"kind": "cosine", "t_max": 4, "min_lr": 0.0625, "warmup_steps": 3, "warmup_start": 0.5},
     lambda o: Chain([warm(o, 0.5, 3), Cos(o, T_max=4, eta_min=0.0625)])),
]


def schedule_lrs(lr, make):
    p = torch.zeros(1, requires_grad=True)
    opt = torch.optim.SGD([p], lr=lr)
    sched = make(opt) if make else None
    out = []
    for _ in range(SCHED_STEPS):
        out.append(opt.param_groups[0]["lr"])
        p.grad = torch.zeros(1)
        opt.step()
        if sched:
            sched.step()
    return out


def tdict(ts):
    return {n: {"shape": list(t.shape), "data": [float(x) for x in t.detach().reshape(-1).tolist()]} for n, t in ts.items()}


def main():
    out = {"torch": torch.__version__, "steps": STEPS, "cases": []}
    import warnings
    warnings.filterwarnings("ignore", category=UserWarning)  # ChainedScheduler's step-order check
    for ci, (name, cfg, make_opt, make_sched) in enumerate(CASES):
        g = torch.Generator().manual_seed(1000 + ci)
        params = {n: torch.randn(s, generator=g, dtype=torch.float32).requires_grad_() for n, s in SHAPES.items()}
        init = tdict(params)
        opt = make_opt(list(params.values()))
        sched = make_sched(opt) if make_sched else None
        grads, wants, lrs = [], [], []
        for _ in range(STEPS):
            gs = {n: torch.randn(s, generator=g, dtype=torch.float32) for n, s in SHAPES.items()}
            for n, p in params.items():
                p.grad = gs[n].clone()
            lrs.append(opt.param_groups[0]["lr"])
            opt.step()
            if sched:
                sched.step()
            grads.append(tdict(gs))
            wants.append(tdict(params))
        out["cases"].append({"name": name, "config": cfg, "params": init, "grads": grads, "want": wants, "lrs": lrs})
    out["schedules"] = [{"name": n, "lr": lr, "schedule": sch, "lrs": schedule_lrs(lr, make)}
                        for n, lr, sch, make in SCHEDULES]
    path = os.path.join("internal", "optim", "testdata", "torch_vectors.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print("wrote", path)


if __name__ == "__main__":
    main()
