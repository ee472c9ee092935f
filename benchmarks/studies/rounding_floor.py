"""How far a model's own rounding moves its log-probs when its adapter moves by almost nothing.

Why. SEPO's trust region (`sepo.trust_region_kl`), its logged `kl_step` and its `kl_ref` compare an answer's
log-probs at two sets of weights. In bfloat16, a change of the adapter too small to matter still moves many sums
across a rounding boundary, and 30 layers spread those flips to every token, so the two scorings differ by a
floor that a step's size does not set. This measures the floor on one rollout batch of the SEPO stage (its own
`build_learner` and batch builder, so its prompts, sampling and passes are the run's).

It scores the batch in the update's passes at the fresh adapter, then again with every adapter weight moved by
`scale` times a standard normal draw, for each `--scales` entry. For each scale it reports three figures: the
KL per decision the trust region would read (an answer's tokens summed), the mean |change| of a token's
log-prob, and the surrogate gain under the batch's own advantages that the line search tests against 0. A
scale whose move is lost in rounding reads 0 on all three. Passing `model.dtype=float32` shows the same batch
without bfloat16's rounding.

    python -m benchmarks.studies.rounding_floor [--scales 1e-9 1e-6 1e-4 1e-3] [--threads 1] [overrides ...]

The overrides compose a SEPO run (`stage=sepo` is given), e.g. `model=smollm2 game=ipd model.path=<sft>/merged`.
The last line is a JSON object {"overrides", "dtype", "decisions", "tokens", "floor"}.
"""

from __future__ import annotations

import argparse
import json


def measure(cfg, scales: list[float]) -> dict:
    """The floor on one rollout batch of the SEPO run `cfg` composes: per scale, the trust region's KL per
    decision, the mean |change| of a token's log-prob and the surrogate gain, after the move of that scale."""
    import torch

    from sepo.games import make_game
    from sepo.policies.recording import RecordingPolicy
    from sepo.stages.sepo_loop import build_learner
    from sepo.training.objective import sepo_settings
    from sepo.training.passes import scored_passes
    from sepo.training.update import policy_change

    s = sepo_settings(cfg)
    torch.manual_seed(int(s.seed))
    learner, game = build_learner(cfg, s), make_game(cfg.game)
    batch = learner.builder.collect(game, RecordingPolicy(learner.policy), 0, learner.estimator)
    model, policy = learner.model, learner.policy

    def scored() -> list:
        rows: list = [None] * len(batch.decisions)
        with torch.no_grad():
            for part, lp, mask in scored_passes(model, policy, batch.decisions, s, like_update=True):
                for i, row, m in zip(part, lp, mask):
                    rows[i] = row[m.bool()]
        return rows

    before = scored()
    params = [p for p in model.parameters() if p.requires_grad]
    start = [p.detach().clone() for p in params]
    draw = torch.Generator().manual_seed(0)
    noise = [torch.randn(p.shape, generator=draw, dtype=torch.float32) for p in params]
    floor = []
    for scale in scales:
        with torch.no_grad():
            for p, p0, z in zip(params, start, noise):
                p.copy_(p0 + scale * z.to(p.dtype))
        kl, gain = policy_change(model, policy, batch, s, before, batch.advantages)
        per_token = float(torch.cat([(a - b).abs() for a, b in zip(scored(), before)]).mean())
        floor.append({"scale": scale, "kl_per_decision": round(kl, 6), "mean_abs_logprob_change": round(per_token, 6),
                      "surrogate_gain": round(gain, 6)})  # fmt: skip
    compute = str(model.get_input_embeddings().weight.dtype).replace("torch.", "")
    return {"dtype": compute, "decisions": len(before), "tokens": sum(len(b) for b in before), "floor": floor}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scales", type=float, nargs="+", default=[1e-9, 1e-6, 1e-4, 1e-3])
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("overrides", nargs="*", help="Hydra overrides of a SEPO run")
    args = parser.parse_args()

    import torch

    from sepo.run.compose import compose_config

    if args.threads:
        torch.set_num_threads(args.threads)
    out = measure(compose_config(["stage=sepo", "logger=none", *args.overrides]), args.scales)
    for row in out["floor"]:
        print(
            f"scale {row['scale']:g}: KL per decision {row['kl_per_decision']:.5f}, mean |d log p| per token"
            f" {row['mean_abs_logprob_change']:.5f}, gain {row['surrogate_gain']:+.6f}"
        )
    print(json.dumps({"overrides": args.overrides, **out}))


if __name__ == "__main__":
    main()
