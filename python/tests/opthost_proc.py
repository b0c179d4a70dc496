"""An optimizer host process for test_opthost.py: python3 opthost_proc.py HUB MODEL CASE.

Serves until killed. CASE picks the optimizer and scheduler (make_case)."""

from __future__ import annotations

import logging
import sys

import torch

import rlhub


def make_net(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))


def make_case(case: str, net: torch.nn.Module):
    if case == "adam_onecycle":
        opt = torch.optim.Adam(net.parameters(), lr=1e-3, weight_decay=1e-4)
        return opt, torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.05, total_steps=40)
    if case == "rprop":
        return torch.optim.Rprop(net.parameters(), lr=0.01), None
    if case == "adafactor":
        opt = torch.optim.Adafactor(net.parameters(), lr=0.01)
        return opt, torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    raise ValueError(case)


def main() -> None:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    hub, model, case = sys.argv[1:4]
    net = make_net()
    opt, sched = make_case(case, net)
    rlhub.OptimizerHost(hub, model, opt, lr_scheduler=sched, module=net).run()


if __name__ == "__main__":
    main()
