"""The SEPO estimator (docs/spec.md §4.2) and the token loss (4.3), as pure functions.

The objective is J = s*u - lambda_e*s*e - lambda_c*c - lambda_x*x (s = reward_scale / max_payoff).
Each term is an expectation over the policy's OWN episodes against one pool, so its gradient can only
flow through the decisions of those episodes: u and x through the train-pool episodes, e through the
exploit-pool episodes, c through the collusive-pool episodes. Hence the default (`pooled`) estimator:

1. a group of n episodes per opponent of every pool, sharing chance events and the opponent's
   random stream (built in `sepo.training.rollouts`), so that they differ only by the policy's sampling;
2. per-round term rewards f[r, t] by pool (`pooled_terms`);
3. credit: the return-to-go G[r, t] = sum_{t' >= t} f[r, t'] (`credit_returns`);
4. a per-round leave-one-out baseline across the group: A[r, t] = G[r, t] - mean_{r' != r} G[r', t]
   (`leave_one_out`), unbiased because the other rollouts do not depend on rollout r's actions;
5. weights 1/|pool| * 1/n * 1/T per group, and ONE batch-level scale taken from earlier batches
   (`EstimatorState`), so that at importance ratio 1 the update is grad J up to one positive number.

The paper's two variants (`per_rollout`, `shared`, in `paper_terms`), its per-round credit
(`credit=round`) and its per-group, per-round normalisation (`adv_norm=group_round`) stay as
ablations; `benchmarks/estimator/finite_differences.py` measures what each of them does to the expected update.

Everything here works on numpy arrays of shape [n, T] (n rollouts of a group, T rounds) and on
episode records; `sepo.training.rollouts` wires it to the arena, `sepo.stages.sepo_loop` to the model.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from sepo import penalties
from sepo.arena import EpisodeRecord
from sepo.games.base import AGENT, Game
from sepo.training.options import ADV_NORMS, CREDITS

log = logging.getLogger(__name__)

#: |log pi_theta - log pi_old| beyond which the importance ratio is held (as verl does): exp overflows
#: float32 above 88.7, and an infinite ratio times a zero advantage is NaN, which would end the run for a
#: token whose every term is zero. Past the limit a token's gradient is 0: with a positive advantage the
#: clip has long held it there anyway; with a negative one it would be e^20 times the score, a step the
#: gradient clip would cut to its norm whatever the rest of the batch said.
LOG_RATIO_LIMIT = 20.0


def sepo_settings(cfg: DictConfig) -> Any:
    """The resolved `sepo` node as its typed object (a sepo.run.schema.SepoSchema; game and model defaults are interpolated in
    conf/sepo/default.yaml); its values were checked before any work (sepo/run/config.py)."""
    return OmegaConf.to_object(cfg.sepo)


# --------------------------------------------------------------------------- term rewards
def payoffs(records: Sequence[EpisodeRecord], player: int) -> np.ndarray:
    """[n, T] per-round payoffs of `player` (raw game units)."""
    return np.array([[r.payoffs[player] for r in ep.rounds] for ep in records], dtype=float)


def term_keys() -> tuple[str, ...]:
    """The terms of J as the estimator splits it: the payoff u, then every penalty term (sepo/penalties.py)."""
    return ("u", *penalties.keys())


def pooled_terms(
    game: Game,
    pool: str,
    records: Sequence[EpisodeRecord],
    scale: float,
    lambdas: dict[str, float],
    hinge_on: bool = True,
) -> dict[str, np.ndarray]:
    """Per-round rewards f[r, t] of one group in `pooled` mode, term by term (docs/spec.md §4.2 step 2).

    On the train pool u = s*payoff_t; on every pool, each term measured there, -lambda_k*s_k*k_t. A hinged
    term's reward (exploit: max(0, .) per opponent) is 0 while the opponent's running value is <= 0
    (`hinge_on`: the gradient of max(0, .)).
    """
    if pool not in penalties.trained_pools():
        raise ValueError(f"no SEPO reward for pool {pool!r}")
    f = {"u": scale * payoffs(records, AGENT)} if pool == penalties.TRAIN_POOL else {}
    for term in penalties.of_pool(pool):
        on = 1.0 if hinge_on or not term.hinged else 0.0
        f[term.key] = -on * term.weight(lambdas, scale) * term.rounds(game, records)
    return f


def paper_terms(
    game: Game,
    records: Sequence[EpisodeRecord],
    scale: float,
    lambdas: dict[str, float],
    mode: str,
    aux: list[dict[str, dict[str, list[EpisodeRecord]]]],
) -> dict[str, np.ndarray]:
    """Per-round rewards of a train group in the paper's modes: u_t minus an episode-level penalty.

    `aux[r]` holds rollout r's auxiliary episodes by pool, {"exploit": {opp: [episodes]}, "collusive": {...}}.
    `per_rollout` (the paper's text): rollout r's penalties come from its own auxiliary episodes, and a
    train-pool term (x) from its own episode. `shared` (the paper's Algorithm 1): every entry of `aux` is the
    same set, and a train-pool term is the group's mean, so the penalty is one number per group: it cancels in
    any baseline. The auxiliary episodes are never trained on, so their terms cannot have a gradient here
    (docs/spec.md §4.1).
    """
    if mode not in ("per_rollout", "shared"):
        raise ValueError(f"sepo.penalty_mode={mode!r} has no paper penalty; allowed: per_rollout, shared")
    n, T = len(records), len(records[0].rounds)
    column = lambda v: np.repeat(v[:, None], T, axis=1)  # noqa: E731  (an episode-level value in every round)
    f = {"u": scale * payoffs(records, AGENT)}
    for term in penalties.terms():
        if term.pool == penalties.TRAIN_POOL:
            own = np.array([term.of_opponent(game, [ep]) for ep in records])
            values = own if mode == "per_rollout" else np.full(n, np.mean(own))
        else:
            values = np.array([term.level(game, a[term.pool]) for a in aux])
        f[term.key] = column(-term.weight(lambdas, scale) * values)
    return f


# --------------------------------------------------------------------------- credit and baseline
def credit_returns(f: np.ndarray, credit: str) -> np.ndarray:
    """G[r, t]: the return-to-go sum_{t' >= t} f[r, t'] (a decision at round t moves rounds t..T-1),
    or the paper's per-round credit f[r, t] itself (myopic: docs/spec.md §4.1)."""
    if credit == "return_to_go":
        return np.flip(np.cumsum(np.flip(f, axis=1), axis=1), axis=1)
    if credit == "round":
        return f.copy()
    raise ValueError(f"sepo.credit={credit!r}; allowed: {', '.join(CREDITS)}")


def leave_one_out(G: np.ndarray) -> np.ndarray:
    """A[r, t] = G[r, t] - mean over r' != r of G[r', t]; needs n >= 2 rollouts.

    Including r itself in the mean would shrink the expected update by (n - 1)/n.
    """
    n = G.shape[0]
    if n < 2:
        raise ValueError("a leave-one-out baseline needs at least 2 rollouts per group (sepo.rollouts_per_opponent)")
    # as the mean of pairwise differences, so that tied rollouts give exactly 0 (no rounding residue)
    return (G[:, None, :] - G[None, :, :]).sum(axis=1) / (n - 1)


def group_round_normalise(G: np.ndarray, eps: float) -> np.ndarray:
    """The paper's advantage: (G - mean_t) / (std_t + eps) across the group's rollouts, per round.

    std is the sample std (ddof 1); a round where all rollouts tie gets 0, never NaN. Dividing by the
    group's own std erases lambda and makes each pool weigh by its decision count (an ablation).
    """
    if G.shape[0] < 2:
        return np.zeros_like(G)
    centred = G - G.mean(axis=0, keepdims=True)
    return centred / (G.std(axis=0, ddof=1, keepdims=True) + eps)


def group_advantages(f: np.ndarray, credit: str, adv_norm: str, eps: float) -> np.ndarray:
    """A[r, t] of one group from its per-round rewards, before the pool weights and the batch scale."""
    G = credit_returns(f, credit)
    if adv_norm == "batch":
        return leave_one_out(G)
    if adv_norm == "group_round":
        return group_round_normalise(G, eps)
    raise ValueError(f"sepo.adv_norm={adv_norm!r}; allowed: {', '.join(ADV_NORMS)}")


# --------------------------------------------------------------------------- running statistics
@dataclass
class EstimatorState:
    """What the estimator carries from batch to batch (saved in every checkpoint, so resume is exact).

    - `adv_scale`: a running mean of earlier batches' std of A, the ONE number a batch's advantages
      are divided by (`adv_norm=batch`). Dividing by the batch's own std would not be a pure rescale:
      that std correlates with the estimate (per-parameter distortion 0.58-1.83x, docs/spec.md §4.2).
    - `exploit_adv`: per exploit opponent, the per-episode advantages (opp - agent, per round) of the
      most recent `switch_episodes` episodes of earlier batches. The exploit term of an opponent is
      switched on while their mean is > 0 (and until that much history exists): the gradient of
      max(0, adv) without the current batch's noise smearing the kink.
    """

    scale_decay: float = 0.9
    switch_episodes: int = 32
    adv_scale: float | None = None
    exploit_adv: dict[str, list[float]] = field(default_factory=dict)
    #: `sepo.estimator=exact_values`: the previous batch's played table (information set -> P(bet or call)), which
    #: the next batch's best responder and max(0, .) switches answer, independent of that batch's own samples
    table: dict[str, float] | None = None

    def exploit_on(self, opponent: str) -> bool:
        history = self.exploit_adv.get(opponent, [])
        return len(history) < self.switch_episodes or float(np.mean(history)) > 0.0

    def record_exploit(self, opponent: str, episode_advantages: Sequence[float]) -> None:
        history = self.exploit_adv.setdefault(opponent, []) + [float(a) for a in episode_advantages]
        self.exploit_adv[opponent] = history[-self.switch_episodes :]

    def scale_for(self, batch_std: float) -> float:
        """The divisor of this batch: earlier batches' running std (this batch's own for the first)."""
        return batch_std if self.adv_scale is None else self.adv_scale

    def record_std(self, batch_std: float) -> None:
        """Fold this batch's std of A into the running mean; a batch of all ties (std 0) says nothing."""
        if not batch_std > 0.0:
            return
        if self.adv_scale is None:
            self.adv_scale = batch_std
        else:
            self.adv_scale = self.scale_decay * self.adv_scale + (1.0 - self.scale_decay) * batch_std

    def to_dict(self) -> dict[str, Any]:
        return {
            "adv_scale": self.adv_scale,
            "exploit_adv": {k: list(v) for k, v in self.exploit_adv.items()},
            **({"table": dict(self.table)} if self.table is not None else {}),
        }

    def load(self, state: dict[str, Any]) -> None:
        self.adv_scale = state.get("adv_scale")
        self.exploit_adv = {k: [float(a) for a in v] for k, v in (state.get("exploit_adv") or {}).items()}
        table = state.get("table")
        self.table = {k: float(v) for k, v in table.items()} if table is not None else None


# --------------------------------------------------------------------------- the update
def token_loss(
    logp: torch.Tensor,
    logp_old: torch.Tensor,
    logp_ref: torch.Tensor | None,
    advantage: torch.Tensor,
    mask: torch.Tensor,
    clip_eps: float,
    beta: float,
    kl_tokens: float | None = None,
    answer_tokens: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO-clipped surrogate summed over each decision's tokens, divided by `answer_tokens`, and SUMMED
    over decisions, plus beta * max(0, log pi_theta - log pi_ref) averaged over all generated tokens of
    the batch.

    `answer_tokens=None` divides each answer by its own length (the paper's token mean, `sepo.length_norm
    = answer`); a number divides every answer by that constant (`budget`: the generation budget). Only
    the constant keeps the gradient that of J when answers differ in length with the action: the
    token mean weighs answer y by 1/|y|, so a state's value offset c (every decision there shares it)
    adds c * p(1 - p) * (1/|y_a| - 1/|y_b|) to the logit of a against b, a drift toward the longer answer
    in losing states and the shorter one in winning states (docs/results.md, Kuhn poker).

    Shapes: logp*, mask [D, L] (D decisions, L generated positions, mask 1 on real tokens);
    advantage [D]: each decision's advantage, which already carries the 1/|pool|, 1/n, 1/T weights
    and the batch scale, so at ratio 1 the surrogate's gradient is -sum_d A_d * grad log pi(y_d) /
    answer_tokens (or the token mean of grad log pi). `kl_tokens` is the number of generated tokens of
    the whole batch (micro-batches add up to one mean); default: this call's tokens. Neither term's
    scale depends on how many opponents there are. `logp_ref=None` (beta = 0: the reference pass is skipped) drops the KL
    term and its statistic.
    """
    real = mask.bool()
    ratio = torch.exp(torch.clamp(logp - logp_old, -LOG_RATIO_LIMIT, LOG_RATIO_LIMIT))
    adv = advantage[:, None]
    surrogate = -torch.minimum(ratio * adv, torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps) * adv)
    kl_ref = torch.clamp(logp - logp_ref, min=0.0) if logp_ref is not None else torch.zeros_like(logp)
    tokens = mask.sum(dim=1).clamp(min=1) if answer_tokens is None else float(answer_tokens)
    denominator = float(kl_tokens) if kl_tokens else float(mask.sum().clamp(min=1))
    policy_loss = (masked(surrogate, real).sum(dim=1) / tokens).sum()
    kl_sum = masked(kl_ref, real).sum()
    kl_loss = kl_sum / denominator
    loss = policy_loss + beta * kl_loss
    with torch.no_grad():
        n_tok = mask.sum().clamp(min=1)
        stats = {
            "policy_loss": policy_loss.detach(),
            **({"kl_ref": kl_sum.detach() / n_tok} if logp_ref is not None else {}),
            "kl_old": masked(old_policy_kl(logp, logp_old), real).sum() / n_tok,
            "clip_fraction": masked(((ratio - 1).abs() > clip_eps).float(), real).sum() / n_tok,
        }
    return loss, stats


def masked(values: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """`values` at real positions, exactly 0 elsewhere: padded positions hold whatever the pass computed
    there (`sepo.lm.logprobs.token_logprobs`), and NaN x 0 is NaN, so multiplying by the mask is not enough."""
    return torch.where(real, values, torch.zeros((), dtype=values.dtype, device=values.device))


def old_policy_kl(logp: torch.Tensor, logp_old: torch.Tensor) -> torch.Tensor:
    """Per-token KL(pi_theta || pi_old) estimate from tokens sampled by pi_old: r log r - (r - 1), r = pi_theta/pi_old.

    Unbiased and non-negative per token; drives the refresh of docs/spec.md §4.3.
    """
    log_ratio = torch.clamp(logp - logp_old, -LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
    ratio = torch.exp(log_ratio)
    return ratio * log_ratio - (ratio - 1)
