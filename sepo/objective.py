"""The SEPO objective (SPEC section 4): per-round rewards, per-round advantages, the token loss.

Everything here is a pure function of episode records and tensors, so each piece can be tested
on its own; `sepo/sepo.py` wires them into the training loop.

Rewards come in groups: the n rollouts against one opponent are normalised together, round by
round. Three penalty modes (`sepo.penalty_mode`):

- `shared`: the paper's Algorithm 1. One penalty P per train opponent, estimated from auxiliary
  episodes shared by its rollouts. It is the same for every rollout of the group, so the per-round
  normalisation removes it exactly: zero gradient. Kept as the ablation that shows this.
- `per_rollout`: the paper's text. Rollout r gets its own e_r, c_r from its own auxiliary episodes
  against the exploit and collusive pools, and x_r from its own episode; these differ across the
  group and so survive normalisation.
- `pooled`: the unbiased gradient of J_SEPO. Auxiliary episodes are rollouts too, each pool's
  episodes rewarded per round for their own term and normalised within their own opponent group.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from sepo.arena import EpisodeRecord
from sepo.games.base import AGENT, OPPONENT, Game

PENALTY_MODES = ("shared", "per_rollout", "pooled")


@dataclass
class Group:
    """Rollouts normalised together: `records[r]` is rollout r against opponent `opponent`."""

    pool: str
    opponent: str
    records: list[EpisodeRecord]
    rewards: np.ndarray | None = None  # [n, T]
    advantages: np.ndarray | None = None  # [n, T]


def payoffs(records: Sequence[EpisodeRecord], player: int) -> np.ndarray:
    return np.array([[r.payoffs[player] for r in ep.rounds] for ep in records], dtype=float)


def episode_exploit(records_by_opponent: dict[str, list[EpisodeRecord]]) -> float:
    """e for a set of auxiliary episodes: per opponent max(0, mean advantage), averaged."""
    if not records_by_opponent:
        return 0.0
    terms = []
    for eps in records_by_opponent.values():
        adv = payoffs(eps, OPPONENT) - payoffs(eps, AGENT)
        terms.append(max(0.0, float(adv.mean())))
    return float(np.mean(terms))


def episode_collusion(game: Game, records_by_opponent: dict[str, list[EpisodeRecord]]) -> float:
    """c for a set of auxiliary episodes: per opponent share of collusive rounds, averaged."""
    if not records_by_opponent:
        return 0.0
    return float(np.mean([np.mean([game.collusive(r) for ep in eps for r in ep.rounds])
                          for eps in records_by_opponent.values()]))


def episode_externality(game: Game, record: EpisodeRecord) -> float:
    return float(np.mean([game.externality(r) for r in record.rounds]))


def train_rewards(game: Game, group: Group, scale: float, lambdas: dict[str, float], mode: str,
                  aux: list[dict[str, dict[str, list[EpisodeRecord]]]] | None = None) -> np.ndarray:
    """Per-round rewards [n, T] of one train-opponent group.

    `aux[r]` holds rollout r's auxiliary episodes as {"exploit": {opp: [eps]}, "collusive": {...}}
    (per_rollout); in shared mode every entry is the same object (one set per train opponent).
    """
    u = payoffs(group.records, AGENT) * scale
    le, lc, lx = (float(lambdas[k]) for k in ("e", "c", "x"))
    if mode == "pooled":
        x_round = np.array([[game.externality(r) for r in ep.rounds] for ep in group.records])
        return u - lx * x_round
    if mode == "shared":
        shared = aux[0]
        x = np.mean([episode_externality(game, ep) for ep in group.records])
        penalty = le * scale * episode_exploit(shared["exploit"]) + lc * episode_collusion(game, shared["collusive"]) + lx * x
        return u - penalty
    if mode == "per_rollout":
        penalty = np.array([
            le * scale * episode_exploit(a["exploit"]) + lc * episode_collusion(game, a["collusive"])
            + lx * episode_externality(game, ep)
            for a, ep in zip(aux, group.records)
        ])
        return u - penalty[:, None]
    raise ValueError(f"sepo.penalty_mode={mode!r}; allowed: {', '.join(PENALTY_MODES)}")


def pooled_rewards(game: Game, group: Group, scale: float, lambdas: dict[str, float]) -> np.ndarray:
    """Per-round rewards of an exploit or collusive group in `pooled` mode."""
    if group.pool == "exploit":
        return -float(lambdas["e"]) * scale * (payoffs(group.records, OPPONENT) - payoffs(group.records, AGENT))
    if group.pool == "collusive":
        return -float(lambdas["c"]) * np.array([[float(game.collusive(r)) for r in ep.rounds] for ep in group.records])
    raise ValueError(f"no pooled reward for pool {group.pool!r}")


def per_round_advantages(rewards: np.ndarray, eps: float = 1e-8) -> np.ndarray:
    """A[r, t] = (reward[r, t] - mean_t) / (std_t + eps) across the rollouts of one group.

    std is the unbiased sample std (as torch.std in common GRPO code); a group of one rollout, or
    one whose rewards are all equal at round t, gets A = 0 there, never NaN.
    """
    n = rewards.shape[0]
    if n < 2:
        return np.zeros_like(rewards)
    centred = rewards - rewards.mean(axis=0, keepdims=True)
    return centred / (rewards.std(axis=0, ddof=1, keepdims=True) + eps)


def token_loss(logp: torch.Tensor, logp_old: torch.Tensor, logp_ref: torch.Tensor, advantage: torch.Tensor,
               mask: torch.Tensor, clip_eps: float, beta: float) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO-clipped surrogate + beta * one-sided KL, per decision, averaged over decisions.

    Shapes: logp*, mask [D, L] (D decisions, L generated positions, mask 1 on real tokens);
    advantage [D] (the round's advantage of the rollout the decision belongs to). Each decision's
    token losses are averaged over its tokens, then decisions are averaged, so the scale does not
    depend on the number of opponents, rollouts, rounds or answer lengths.
    """
    ratio = torch.exp(logp - logp_old)
    adv = advantage[:, None]
    surrogate = -torch.minimum(ratio * adv, torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps) * adv)
    kl_ref = torch.clamp(logp - logp_ref, min=0.0)
    per_token = surrogate + beta * kl_ref
    tokens = mask.sum(dim=1).clamp(min=1)
    loss = ((per_token * mask).sum(dim=1) / tokens).mean()
    with torch.no_grad():
        log_ratio = logp - logp_old
        stats = {
            "kl_ref": ((kl_ref * mask).sum() / mask.sum().clamp(min=1)),
            # KL(pi_theta || pi_old) from tokens sampled by pi_old: E_old[r log r - (r - 1)], r = pi_theta/pi_old
            # (unbiased and non-negative per token); drives the early refresh of SPEC 4.5
            "kl_old": (((ratio * log_ratio - (ratio - 1)) * mask).sum() / mask.sum().clamp(min=1)),
            "clip_fraction": ((((ratio - 1).abs() > clip_eps).float() * mask).sum() / mask.sum().clamp(min=1)),
        }
    return loss, stats
