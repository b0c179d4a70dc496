"""PPO pieces shared by the example's processes: the actor-critic, rollouts
with GAE, and the clipped loss. Plain PyTorch + Gymnasium, no rlhub."""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Tuple

import gymnasium as gym
import numpy as np
import torch
from torch import nn


@dataclasses.dataclass(frozen=True)
class Hyper:
    """Hyper-parameters (tuned for CartPole-v1 on 2 CPU cores)."""

    envs_per_collector: int = 8
    steps: int = 64            # rollout length per env per iteration
    epochs: int = 4
    minibatches: int = 2       # per learner share, per epoch
    lr: float = 1e-3
    gamma: float = 0.99
    lam: float = 0.95
    clip: float = 0.2
    vf_coef: float = 0.5
    ent_coef: float = 0.0
    max_grad_norm: float = 0.5
    hidden: int = 64


class ActorCritic(nn.Module):
    """Separate 2-layer tanh MLPs for the policy logits and the value."""

    def __init__(self, obs_dim: int = 4, n_actions: int = 2, hidden: int = 64):
        super().__init__()
        self.pi = nn.Sequential(nn.Linear(obs_dim, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(),
                                nn.Linear(hidden, n_actions))
        self.v = nn.Sequential(nn.Linear(obs_dim, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(),
                               nn.Linear(hidden, 1))
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.orthogonal_(m.weight, np.sqrt(2))
                nn.init.zeros_(m.bias)
        nn.init.orthogonal_(self.pi[-1].weight, 0.01)
        nn.init.orthogonal_(self.v[-1].weight, 1.0)

    def dist(self, obs: torch.Tensor) -> torch.distributions.Categorical:
        return torch.distributions.Categorical(logits=self.pi(obs))

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.v(obs).squeeze(-1)


class Rollouts:
    """N CartPole envs stepped together; collects T steps and computes GAE."""

    def __init__(self, n: int, seed: int, env_id: str = "CartPole-v1"):
        self.envs = [gym.make(env_id) for _ in range(n)]
        self.obs = np.stack([e.reset(seed=seed + i)[0] for i, e in enumerate(self.envs)]).astype(np.float32)
        self.ep_ret = np.zeros(n)
        self.finished: List[float] = []

    @torch.no_grad()
    def collect(self, net: ActorCritic, h: Hyper, gen: torch.Generator) -> Dict[str, np.ndarray]:
        n, T = len(self.envs), h.steps
        obs = np.zeros((T, n, self.obs.shape[1]), np.float32)
        act = np.zeros((T, n), np.int64)
        logp = np.zeros((T, n), np.float32)
        val = np.zeros((T, n), np.float32)
        rew = np.zeros((T, n), np.float32)
        done = np.zeros((T, n), np.float32)
        for t in range(T):
            o = torch.from_numpy(self.obs)
            d = net.dist(o)
            a = torch.multinomial(d.probs, 1, generator=gen).squeeze(1)
            obs[t], act[t], logp[t], val[t] = self.obs, a.numpy(), d.log_prob(a).numpy(), net.value(o).numpy()
            for i, e in enumerate(self.envs):
                o2, r, term, trunc, _ = e.step(int(a[i]))
                self.ep_ret[i] += r
                if trunc and not term:  # time limit: bootstrap from the state it cut off
                    r += h.gamma * float(net.value(torch.as_tensor(o2, dtype=torch.float32)))
                rew[t, i], done[t, i] = r, float(term or trunc)
                if term or trunc:
                    self.finished.append(self.ep_ret[i])
                    self.ep_ret[i] = 0
                    o2, _ = e.reset()
                self.obs[i] = o2
        last = net.value(torch.from_numpy(self.obs)).numpy()
        adv = np.zeros((T, n), np.float32)
        gae = np.zeros(n, np.float32)
        for t in reversed(range(T)):
            nv = last if t == T - 1 else val[t + 1]
            delta = rew[t] + h.gamma * nv * (1 - done[t]) - val[t]
            gae = delta + h.gamma * h.lam * (1 - done[t]) * gae
            adv[t] = gae
        flat = lambda x: x.reshape(T * n, *x.shape[2:])
        return {"obs": flat(obs), "act": flat(act), "logp": flat(logp), "adv": flat(adv), "ret": flat(adv + val)}

    def take_finished(self) -> List[float]:
        out, self.finished = self.finished, []
        return out


def ppo_loss(net: ActorCritic, mb: Dict[str, torch.Tensor], h: Hyper) -> Tuple[torch.Tensor, Dict[str, float]]:
    """The clipped PPO loss of one minibatch (advantages normalised within it)."""
    d = net.dist(mb["obs"])
    logp = d.log_prob(mb["act"])
    ratio = (logp - mb["logp"]).exp()
    adv = mb["adv"]
    adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    pg = -torch.min(ratio * adv, ratio.clamp(1 - h.clip, 1 + h.clip) * adv).mean()
    vl = 0.5 * ((net.value(mb["obs"]) - mb["ret"]) ** 2).mean()
    ent = d.entropy().mean()
    loss = pg + h.vf_coef * vl - h.ent_coef * ent
    with torch.no_grad():
        kl = ((ratio - 1) - (logp - mb["logp"])).mean()
    return loss, {"pg_loss": pg.item(), "v_loss": vl.item(), "entropy": ent.item(), "approx_kl": kl.item()}
