"""How much of one SEPO batch's gradient is J's gradient, and how much is noise, at a fixed policy.

A SEPO step follows one rollout batch's gradient. Whether a step can be expected to raise J depends on how
that gradient compares with the expected one: at a fixed policy (the SFT model, or any checkpoint), this
draws K independent batches exactly as the loop does (`BatchBuilder.collect`, fresh chance events each),
takes each batch's gradient of the SEPO loss (ratio 1: the gradient of J's estimate, scaled) and reports

- the mean pairwise cosine between two batches' gradients (about 0: each batch's gradient is mostly noise);
- the signal-to-noise ratio ||mean g||^2 / (mean ||g_k - mean g||^2): above 1, one batch points along J's
  gradient more than across it;
- per term (u, e, c, x, and the KL pull when beta > 0), the norm of its mean gradient and its cosine with the
  total, so one term that dominates or opposes the others shows;
- each batch's gradient against the mean of the others (independent of it), and the AdamW step the first
  batch would take against the same: Adam divides each coordinate by its own scale, which can turn a step
  from the gradient's direction.

    python -m benchmarks.studies.sepo_signal --model-path <sft run>/merged --batches 8 [overrides ...]

The last line is a JSON object with these figures.
"""

from __future__ import annotations

import argparse
import json
import math
import time

import numpy as np
import torch

from sepo.games import make_game
from sepo.policies.recording import RecordingPolicy
from sepo.run.compose import compose_config
from sepo.stages.sepo_loop import build_learner
from sepo.training.objective import sepo_settings, term_keys
from sepo.training.passes import reference_logprobs
from sepo.training.update import accumulate_gradients


def flat_gradient(params: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([p.grad.detach().reshape(-1).clone() for p in params])


def gradient_of(learner, batch, ref, s, advantages: np.ndarray | None = None, beta: float | None = None):
    """The flat gradient of the batch loss, with other advantages or another beta when given."""
    saved_adv, saved_beta = batch.advantages, s.beta
    if advantages is not None:
        batch.advantages = advantages
    if beta is not None:
        s.beta = beta
    params = [p for p in learner.model.parameters() if p.requires_grad]
    learner.optimizer.zero_grad(set_to_none=False)
    for p in params:
        p.grad = torch.zeros_like(p)
    accumulate_gradients(learner.model, learner.policy, batch, ref, s)
    batch.advantages, s.beta = saved_adv, saved_beta
    return flat_gradient(params)


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    denom = float(a.norm() * b.norm())
    return float(a @ b) / denom if denom > 0 else 0.0


def adam_step_direction(learner, gradient: torch.Tensor, s) -> torch.Tensor:
    """The first AdamW step a fresh optimizer takes on `gradient` (after the loop's gradient clip)."""
    params = [p for p in learner.model.parameters() if p.requires_grad]
    start = [p.detach().clone() for p in params]
    clipped = gradient * min(1.0, float(s.grad_clip) / max(float(gradient.norm()), 1e-12))
    optimizer = torch.optim.AdamW(params, lr=float(s.lr), weight_decay=float(s.weight_decay))
    offset = 0
    for p in params:
        p.grad = clipped[offset : offset + p.numel()].view_as(p).clone()
        offset += p.numel()
    optimizer.step()
    step = torch.cat([(p.detach() - p0).reshape(-1) for p, p0 in zip(params, start)])
    with torch.no_grad():
        for p, p0 in zip(params, start):
            p.copy_(p0)
    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-path", required=True)
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--game", default="ipd")
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--root", default="/tmp/sepo_signal")
    parser.add_argument("overrides", nargs="*", help="config overrides (e.g. seed=101 sepo.seed=101)")
    args = parser.parse_args()

    cfg = compose_config(
        [
            f"model={args.model}",
            f"game={args.game}",
            "stage=sepo",
            f"model.path='{args.model_path}'",  # quoted: run dirs are named by overrides (a=b,c=d)
            f"paths.root_dir={args.root}",
            f"paths.output_dir={args.root}/run",
            "logger=none",
            *args.overrides,
        ]
    )
    s = sepo_settings(cfg)
    torch.manual_seed(int(s.seed))
    game = make_game(cfg.game)
    learner = build_learner(cfg, s)
    started = time.time()
    # the pools' best responders (Kuhn's exploit pool) answer the policy as it plays, as at the loop's step 0
    best_response = learner.best_response.refresh(game, learner.policy, 0) if learner.best_response.due(0) else {}

    totals, per_term, kl_pulls, objectives, exploit_reads = [], {k: [] for k in term_keys()}, [], [], []
    for k in range(args.batches):
        batch = learner.builder.collect(game, RecordingPolicy(learner.policy), 10_000 + k, learner.estimator)
        ref = reference_logprobs(learner.model, learner.policy, batch, s, learner.ref_model)
        objectives.append(float(batch.stats["objective"]))
        if "exploit_exact" in batch.stats:
            exploit_reads.append(float(batch.stats["exploit_exact"]))
        totals.append(gradient_of(learner, batch, ref, s))
        for term in term_keys():
            if term in batch.unscaled:
                per_term[term].append(
                    gradient_of(learner, batch, ref, s, advantages=batch.unscaled[term] / batch.scale, beta=0.0)
                )
        if ref is not None and float(s.beta) > 0:
            zero = np.zeros_like(batch.advantages)
            kl_pulls.append(gradient_of(learner, batch, ref, s, advantages=zero))
        print(
            f"batch {k + 1}/{args.batches}: objective {objectives[-1]:.3f}, |g| {float(totals[-1].norm()):.4g}",
            flush=True,
        )

    g = torch.stack(totals)
    mean = g.mean(dim=0)
    noise = float(((g - mean) ** 2).sum(dim=1).mean())
    pairs = [cosine(g[i], g[j]) for i in range(len(g)) for j in range(i + 1, len(g))]
    terms = {}
    for term, grads in per_term.items():
        if grads:
            m = torch.stack(grads).mean(dim=0)
            terms[term] = {"mean_norm": float(m.norm()), "cosine_with_total": cosine(m, mean)}
    if kl_pulls:
        m = torch.stack(kl_pulls).mean(dim=0)
        terms["kl_ref"] = {"mean_norm": float(m.norm()), "cosine_with_total": cosine(m, mean)}
    others = [(g.sum(dim=0) - g[k]) / (len(g) - 1) for k in range(len(g))]  # each batch against the rest
    adam = adam_step_direction(learner, g[0], s)
    result = {
        "model_path": args.model_path,
        "batches": args.batches,
        "objective_mean": float(np.mean(objectives)),
        "objective_sd": float(np.std(objectives, ddof=1)) if len(objectives) > 1 else None,
        "gradient_norm_mean": float(g.norm(dim=1).mean()),
        "mean_gradient_norm": float(mean.norm()),
        "snr": float(mean.norm() ** 2) / noise if noise > 0 else math.inf,
        "pairwise_cosine_mean": float(np.mean(pairs)) if pairs else None,
        "pairwise_cosine_se": float(np.std(pairs, ddof=1) / math.sqrt(len(pairs))) if len(pairs) > 1 else None,
        "one_batch_cosine_with_the_others": float(np.mean([cosine(g[k], others[k]) for k in range(len(g))])),
        "adam_step_cosine_with_the_others": cosine(adam, others[0]),
        "sgd_step_cosine_with_the_others": cosine(g[0], others[0]),
        "terms": terms,
        # the best responders' read, or (sepo.estimator=exact_values) the tables the batches read
        "exploit_exact": best_response.get("best_response/exploit_exact", exploit_reads[0] if exploit_reads else None),
        "seconds": round(time.time() - started, 1),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
