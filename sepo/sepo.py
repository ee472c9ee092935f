"""Stage `sepo`: GRPO with per-round advantages and SEPO penalties (SPEC section 4, paper Alg. 1).

Read it top to bottom, cleanrl-style: `run_sepo` loads the SFT model and attaches a fresh LoRA
adapter; every outer iteration plays one rollout batch (all rollouts of all train opponents and all
auxiliary episodes, in lockstep: one generate call per decision point), turns it into per-round
advantages (`sepo.objective`), and takes up to `sepo.refresh_steps` optimizer steps on it.

How SPEC 4.5's "SEPO refresh (5 steps or KL > 0.5)" is read: a rollout batch is reused for at most
`refresh_steps` optimizer steps; after each step the mean KL(pi_theta || pi_old) over the batch's
tokens is estimated, and once it passes `refresh_kl` the next step draws fresh rollouts. A
checkpoint step also ends the batch, so a checkpoint never has to store rollouts and a resumed
run continues exactly as the uninterrupted one would have.

The reference policy is the same model with its adapter disabled (`model.disable_adapter()`);
log-probs of the behaviour, current and reference policies are all taken at the sampling
temperature, over generated tokens only, in chunks of `sepo.logprob_chunk` positions.
"""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from sepo.arena import EpisodeRecord, Match, play_matches
from sepo.errors import ConfigError
from sepo.evaluate import evaluate_policy, pools_of, write_results
from sepo.games import Game, make_game
from sepo.logprobs import token_logprobs
from sepo.models import attach_lora, forward_extras, load_model_and_tokenizer
from sepo.objective import (PENALTY_MODES, Group, per_round_advantages, pooled_rewards, token_loss,
                            train_rewards)
from sepo.policies.base import Decision, DecisionRequest
from sepo.policies.lm import LMPolicy
from sepo.strategies import make_strategy
from sepo.tracking import NullTracker

log = logging.getLogger(__name__)


# ------------------------------------------------------------------------------ settings
def sepo_settings(cfg: DictConfig) -> DictConfig:
    """The resolved `sepo` node (game and model defaults are interpolated in conf/sepo/default.yaml)."""
    s = OmegaConf.create(OmegaConf.to_container(cfg.sepo, resolve=True))
    if s.penalty_mode not in PENALTY_MODES:
        raise ConfigError(f"sepo.penalty_mode={s.penalty_mode}; allowed: {', '.join(PENALTY_MODES)}")
    return s


class RecordingPolicy:
    """Lets the arena drive an LMPolicy while keeping token ids and behaviour log-probs."""

    def __init__(self, policy: LMPolicy):
        self.policy, self.name = policy, policy.name

    def act_batch(self, requests: list[DecisionRequest]) -> list[Decision]:
        return self.policy.act_batch(requests, return_logprobs=True)


# ------------------------------------------------------------------------------ rollouts
@dataclass
class RolloutBatch:
    groups: list[Group]  # groups whose decisions are trained on
    decisions: list[tuple[Decision, float]]  # (decision with token extras, its advantage)
    stats: dict[str, float]


def plan_matches(cfg: DictConfig, s: DictConfig, mode: str) -> tuple[list[Match], dict[str, Any]]:
    """All episodes of one rollout batch, and where each one's record goes.

    Train rollouts use the untagged stream family, auxiliary episodes tagged ones, so the train
    rollouts of a seed are the same whatever the penalty mode and lambdas (ablations compare like
    with like).
    """
    pools = pools_of(cfg.game)
    strategy = {n: make_strategy(cfg.game, n, key="game.pools") for p in pools.values() for n in p}
    n, k = int(s.rollouts_per_opponent), int(s.aux_episodes)
    matches: list[Match] = []
    layout: dict[str, Any] = {"train": {}, "aux": {}, "pooled": {}}

    def add(name: str, index: int, tag: str = "") -> int:
        matches.append(Match(name, strategy[name], index, tag))
        return len(matches) - 1

    for o in pools["train"]:
        layout["train"][o] = [add(o, r) for r in range(n)]
    aux_pools = {p: pools[p] for p in ("exploit", "collusive")}
    if mode == "per_rollout":
        for o in pools["train"]:
            layout["aux"][o] = [{p: {q: [add(q, j, f"aux/{o}/{r}") for j in range(k)] for q in names}
                                 for p, names in aux_pools.items()} for r in range(n)]
    elif mode == "shared":
        for o in pools["train"]:
            layout["aux"][o] = {p: {q: [add(q, j, f"aux/{o}") for j in range(k)] for q in names}
                                for p, names in aux_pools.items()}
    else:  # pooled: auxiliary opponents are rollout groups of their own
        for p, names in aux_pools.items():
            layout["pooled"][p] = {q: [add(q, r, f"pool/{p}") for r in range(n)] for q in names}
    return matches, layout


def collect_rollouts(game: Game, policy: LMPolicy, cfg: DictConfig, s: DictConfig, batch_index: int) -> RolloutBatch:
    mode = s.penalty_mode
    matches, layout = plan_matches(cfg, s, mode)
    batch_seed = int(np.random.SeedSequence([int(cfg.seed), batch_index]).generate_state(1)[0])
    records = play_matches(game, RecordingPolicy(policy), matches, batch_seed,
                           mirrored=bool(cfg.game.get("mirrored", False)), keep_trace=True)
    lambdas, scale = dict(cfg.lambdas.train), float(s.reward_scale) / float(cfg.game.max_payoff)

    def recs(idx: list[int]) -> list[EpisodeRecord]:
        return [records[i] for i in idx]

    def aux_of(tree: dict) -> dict[str, dict[str, list[EpisodeRecord]]]:
        return {p: {q: recs(idx) for q, idx in by_opp.items()} for p, by_opp in tree.items()}

    groups: list[Group] = []
    for o, idx in layout["train"].items():
        group = Group("train", o, recs(idx))
        aux = None
        if mode == "per_rollout":
            aux = [aux_of(tree) for tree in layout["aux"][o]]
        elif mode == "shared":
            aux = [aux_of(layout["aux"][o])] * len(idx)
        group.rewards = train_rewards(game, group, scale, lambdas, mode, aux)
        groups.append(group)
    for p, by_opp in layout["pooled"].items():
        for q, idx in by_opp.items():
            group = Group(p, q, recs(idx))
            group.rewards = pooled_rewards(game, group, scale, lambdas)
            groups.append(group)

    decisions: list[tuple[Decision, float]] = []
    for group in groups:
        group.advantages = per_round_advantages(group.rewards, float(s.adv_eps))
        for r, record in enumerate(group.records):
            for round_index, _request, decision in record.trace:
                decisions.append((decision, float(group.advantages[r, round_index])))
    return RolloutBatch(groups, decisions, rollout_stats(game, groups, records, layout, mode))


def rollout_stats(game: Game, groups: list[Group], records: list[EpisodeRecord], layout: dict, mode: str) -> dict[str, float]:
    """Per-pool u, e, c, x of the batch, as logged to W&B."""
    from sepo.objective import episode_collusion, episode_exploit, episode_externality, payoffs

    train = [ep for g in groups if g.pool == "train" for ep in g.records]
    by_pool: dict[str, dict[str, list[EpisodeRecord]]] = {"exploit": {}, "collusive": {}}
    if mode == "pooled":
        for g in groups:
            if g.pool in by_pool:
                by_pool[g.pool][g.opponent] = g.records
    else:
        for trees in layout["aux"].values():
            for tree in (trees if isinstance(trees, list) else [trees]):
                for p, by_opp in tree.items():
                    for q, idx in by_opp.items():
                        by_pool[p].setdefault(q, []).extend(records[i] for i in idx)
    decisions = sum(ep.decisions for ep in records)
    return {
        "reward": float(np.mean([g.rewards.mean() for g in groups if g.pool == "train"])),
        "train/u": float(payoffs(train, 0).mean()),
        "train/x": float(np.mean([episode_externality(game, ep) for ep in train])),
        "exploit/e": episode_exploit(by_pool["exploit"]),
        "collusive/c": episode_collusion(game, by_pool["collusive"]),
        "parse_rate": sum(ep.parsed for ep in records) / max(decisions, 1),
        "episodes": float(len(records)),
    }


# ------------------------------------------------------------------------------ loss
def reference_logprobs(model: Any, policy: LMPolicy, batch: RolloutBatch, s: DictConfig) -> list[torch.Tensor]:
    """log pi_ref of every decision's tokens: the same model with the adapter switched off."""
    out: list[torch.Tensor] = []
    with torch.no_grad(), model.disable_adapter():
        for part in _micro_batches(len(batch.decisions), int(s.micro_batch)):
            lp, mask = _policy_logprobs(model, policy, [batch.decisions[i][0] for i in part], s)
            out += [row[m.bool()] for row, m in zip(lp, mask)]
    return out


def _micro_batches(n: int, size: int) -> list[range]:
    return [range(i, min(i + size, n)) for i in range(0, n, size)]


def _policy_logprobs(model: Any, policy: LMPolicy, decisions: list[Decision], s: DictConfig
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """[D, L] log-probs of the decisions' generated tokens under `model` as it is now, and their mask."""
    prompts = [d.extras["prompt_ids"].tolist() for d in decisions]
    gens = [d.extras["gen_ids"].tolist() for d in decisions]
    ids, mask, start = policy.pack(prompts, gens)
    lp = token_logprobs(model, ids, mask, start, chunk=int(s.logprob_chunk), temperature=float(s.temperature),
                        **forward_extras(model, policy.model_cfg, ids))
    return lp, mask[:, start:].to(lp.dtype)


def _pad(rows: list[torch.Tensor], width: int) -> torch.Tensor:
    out = torch.zeros(len(rows), width)
    for i, row in enumerate(rows):
        out[i, :len(row)] = row
    return out


def accumulate_gradients(model: Any, policy: LMPolicy, batch: RolloutBatch, ref: list[torch.Tensor],
                         s: DictConfig) -> dict[str, float]:
    """Backward of the batch loss into `.grad` (micro-batches weighted to one mean over decisions)."""
    model.train()
    total = len(batch.decisions)
    sums = {"loss": 0.0, "kl_ref": 0.0, "kl_old": 0.0, "clip_fraction": 0.0}
    for part in _micro_batches(total, int(s.micro_batch)):
        decisions = [batch.decisions[i][0] for i in part]
        lp, mask = _policy_logprobs(model, policy, decisions, s)
        width = lp.shape[1]
        old = _pad([d.extras["logprobs"].float() for d in decisions], width).to(lp)
        reference = _pad([ref[i] for i in part], width).to(lp)
        adv = torch.tensor([batch.decisions[i][1] for i in part], dtype=lp.dtype, device=lp.device)
        loss, stats = token_loss(lp, old, reference, adv, mask, float(s.clip_eps), float(s.beta))
        weight = len(part) / total
        (loss * weight).backward()
        sums["loss"] += loss.item() * weight
        for key, value in stats.items():
            sums[key] += float(value) * weight
    model.eval()
    return sums


def optimisation_step(model: Any, policy: LMPolicy, optimizer: torch.optim.Optimizer, batch: RolloutBatch,
                      ref: list[torch.Tensor], s: DictConfig) -> dict[str, float]:
    """One optimizer step over the whole rollout batch; skipped when the loss or a gradient is not finite."""
    optimizer.zero_grad(set_to_none=True)
    stats = accumulate_gradients(model, policy, batch, ref, s)
    params = [p for p in model.parameters() if p.requires_grad]
    finite = math.isfinite(stats["loss"]) and all(p.grad is None or bool(torch.isfinite(p.grad).all()) for p in params)
    if finite:
        stats["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(params, float(s.grad_clip)))
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    stats["skipped"] = float(not finite)
    return stats


# ------------------------------------------------------------------------------ checkpoints
def save_checkpoint(out: Path, model: Any, optimizer: torch.optim.Optimizer, policy: LMPolicy, step: int,
                    batch_index: int) -> Path:
    ckpt = out / "checkpoints" / f"step_{step}"
    model.save_pretrained(ckpt / "adapter")
    torch.save({"step": step, "batch_index": batch_index, "optimizer": optimizer.state_dict(),
                "torch_rng": torch.get_rng_state(), "policy_rng": policy.generator.get_state()},
               ckpt / "train_state.pt")
    (out / "checkpoints" / "latest").write_text(f"step_{step}\n")
    return ckpt


def load_checkpoint(out: Path, model: Any, optimizer: torch.optim.Optimizer, policy: LMPolicy) -> tuple[int, int]:
    """Restore the latest checkpoint; returns (step, next batch index), or (0, 0) when there is none."""
    pointer = out / "checkpoints" / "latest"
    if not pointer.exists():
        return 0, 0
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    ckpt = out / "checkpoints" / pointer.read_text().strip()
    set_peft_model_state_dict(model, load_file(ckpt / "adapter" / "adapter_model.safetensors"))
    state = torch.load(ckpt / "train_state.pt", weights_only=True)
    optimizer.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["torch_rng"])
    policy.generator.set_state(state["policy_rng"])
    log.info("resumed from %s (step %d)", ckpt, state["step"])
    return int(state["step"]), int(state["batch_index"])


def evaluate_checkpoint(cfg: DictConfig, game: Game, model: Any, tokenizer: Any, step: int, final: bool) -> dict:
    policy = LMPolicy(model, tokenizer, cfg.model, temperature=float(cfg.eval.temperature),
                      max_new_tokens=int(cfg.eval.max_new_tokens), seed=int(cfg.generation_seed),
                      batch_size=int(cfg.eval.batch_size))
    result = evaluate_policy(game, policy, pools_of(cfg.game), dict(cfg.lambdas.eval), int(cfg.eval.episodes_per_opponent),
                             int(cfg.seed), mirrored=bool(cfg.game.get("mirrored", False)), progress=bool(cfg.eval.progress))
    path = Path(cfg.paths.output_dir) / "eval" / f"step_{step}" / "results.json"
    return write_results(path, cfg, result, stage="sepo", checkpoint="final" if final else f"step_{step}", step=step)


# ------------------------------------------------------------------------------ the stage
def run_sepo(cfg: DictConfig, tracker: NullTracker = NullTracker()) -> dict[str, Any]:
    s = sepo_settings(cfg)
    if s.ref_4bit and not torch.cuda.is_available():
        raise ConfigError("sepo.ref_4bit=true needs a CUDA device (bitsandbytes 4-bit); none is available: "
                          "set sepo.ref_4bit=false")
    out = Path(cfg.paths.output_dir)
    torch.manual_seed(int(cfg.seed))
    game = make_game(cfg.game)
    base, tokenizer = load_model_and_tokenizer(cfg.model, cfg.paths.cache_dir)
    model = attach_lora(base, cfg.model.lora.target_modules, int(s.lora.r), int(s.lora.alpha), float(s.lora.dropout))
    policy = LMPolicy(model, tokenizer, cfg.model, temperature=float(s.temperature),
                      max_new_tokens=int(s.max_new_tokens), seed=int(cfg.generation_seed),
                      logprob_chunk=int(s.logprob_chunk))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=float(s.lr),
                                  weight_decay=float(s.weight_decay))
    step, batch_index = load_checkpoint(out, model, optimizer, policy) if cfg.resume == "auto" else (0, 0)
    checkpoints = set(int(k) for k in s.checkpoint_steps) | {int(s.steps)}
    kill_after = s.get("debug_kill_after_step")

    while step < int(s.steps):
        started = time.time()
        batch = collect_rollouts(game, policy, cfg, s, batch_index)
        batch_index += 1
        ref = reference_logprobs(model, policy, batch, s)
        tokens = sum(len(d.extras["gen_ids"]) for d, _ in batch.decisions)
        for _ in range(int(s.refresh_steps)):
            stats = optimisation_step(model, policy, optimizer, batch, ref, s)
            step += 1
            if stats["skipped"]:
                log.warning("step %d: non-finite loss or gradient, update skipped", step)
            tracker.log({**{f"sepo/{k}": v for k, v in {**batch.stats, **stats}.items()},
                         "sepo/tokens_generated": tokens, "sepo/seconds_per_step": time.time() - started}, step=step)
            log.info("step %d  loss %.4f  reward %.3f  kl_old %.4f  clip %.3f", step, stats["loss"],
                     batch.stats["reward"], stats["kl_old"], stats["clip_fraction"])
            started = time.time()
            if step in checkpoints:
                result = evaluate_checkpoint(cfg, game, model, tokenizer, step, final=step == int(s.steps))
                tracker.log({f"eval/{k}": v for k, v in result["metrics"].items()}, step=step)
                save_checkpoint(out, model, optimizer, policy, step, batch_index)
                break
            if kill_after is not None and step == int(kill_after):
                os.kill(os.getpid(), signal.SIGKILL)  # test hook: crash like a preempted job
            if stats["kl_old"] > float(s.refresh_kl) or step >= int(s.steps):
                break

    model.save_pretrained(out / "adapter")
    summary = json.loads((out / "eval" / f"step_{int(s.steps)}" / "results.json").read_text())
    tracker.summary({f"final/{k}": v for k, v in summary["metrics"].items()})
    return summary
