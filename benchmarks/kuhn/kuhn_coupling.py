"""Which of Kuhn poker's information sets does a language model play as one? Push one, read them all.

The table agent of `benchmarks/kuhn/kuhn_descent.py` has one parameter per information set; a language
model shares its parameters between them, so a step that changes its play at one set may change it at
others. This measures that directly on a checkpoint: from a fresh SEPO adapter (the SEPO stage's own
`build_learner`: LoRA, AdamW at `sepo.lr`), `--steps` policy-gradient steps at ONE information set
only (32 sampled answers each, advantage +-(1 if BET/CALL else 0, minus the batch mean), the loss of
`accumulate_gradients` without its KL term), then the whole played table is read again (K answers per
set, the same sampling seed before and after). Each `--push KEY:up|down` starts again from the checkpoint.

    python -m benchmarks.kuhn.kuhn_coupling --sft-run <kuhn sft run>
    python -m benchmarks.kuhn.kuhn_coupling --sft-run <run> --push 1b:down 1pb:up 0p:up --steps 10 --samples 256

Prints, per push, the table before and after (P(BET or CALL) at the 12 sets) and the exploitability;
the last line is a JSON object {"sft_run", "steps", "lr", "samples", "overrides", "pushes": [...]}.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]  # the repository


def compose_sepo(sft_run: Path, overrides: list[str]):
    from sepo.run.compose import compose_config

    return compose_config(
        ["stage=sepo", "game=kuhn", "model=tiny", "logger=none", f"model.path='{sft_run / 'merged'}'"] + overrides
    )


def read_table(game, policy, samples: int) -> tuple[dict[str, float], float]:
    """P(BET or CALL) at every information set, and the exploitability (the same seed every read)."""
    from sepo.policies.played_table import played_table

    played = played_table(game, policy, samples=samples, seed=7)
    return {key: round(float(p[1]), 4) for key, p in played.table.items()}, round(played.exploitability, 4)


def push(cfg, key: str, sign: float, steps: int, samples: int, batch: int) -> dict:
    """`steps` policy-gradient steps that move information set `key` alone; the table before and after."""
    import torch

    from sepo.games import make_game
    from sepo.games.kuhn.rules import ACTION_INDEX
    from sepo.policies.played_table import infoset_requests
    from sepo.stages.sepo_loop import build_learner
    from sepo.training.objective import sepo_settings
    from sepo.training.rollouts import RolloutBatch
    from sepo.training.update import accumulate_gradients

    s = sepo_settings(cfg)
    torch.manual_seed(int(s.seed))
    learner, game = build_learner(cfg, s), make_game(cfg.game)
    before, x_before = read_table(game, learner.policy, samples)
    request = dict(infoset_requests(game))[key]
    aggressive = next(a for a in request.legal if ACTION_INDEX[a] == 1)
    for step in range(steps):
        answers = learner.policy.act_batch(
            [replace(request, rng=np.random.default_rng([step, i])) for i in range(batch)], return_logprobs=True
        )
        y = np.array([float(d.action == aggressive) for d in answers])
        one_set = RolloutBatch([], answers, sign * (y - y.mean()) / batch, {}, 1.0, {})
        learner.optimizer.zero_grad()
        accumulate_gradients(learner.model, learner.policy, one_set, None, s)  # the SEPO loss; no reference: no KL
        learner.optimizer.step()
    after, x_after = read_table(game, learner.policy, samples)
    return {"key": key, "direction": "up" if sign > 0 else "down", "before": before, "after": after,
            "exploitability": [x_before, x_after]}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sft-run", type=Path, required=True, help="a Kuhn SFT run of tiny (with merged/)")
    parser.add_argument("--push", nargs="+", default=["1b:down", "1pb:up", "0p:up"], help="KEY:up or KEY:down")
    parser.add_argument("--steps", type=int, default=10, help="policy-gradient steps per push")
    parser.add_argument("--samples", type=int, default=256, help="K of each table read")
    parser.add_argument("--batch", type=int, default=32, help="sampled answers per step")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. sepo.lr=5e-4")
    args = parser.parse_args()

    import torch

    from sepo.games.kuhn.exact import INFOSETS

    if args.threads:
        torch.set_num_threads(args.threads)
    wanted = [item.partition(":")[::2] for item in args.push]
    for (key, direction), item in zip(wanted, args.push):
        if key not in INFOSETS or direction not in ("up", "down"):
            parser.error(f"--push {item}: give KEY:up or KEY:down; allowed keys: {', '.join(INFOSETS)}")
    if not (args.sft_run / "merged").is_dir():
        parser.error(f"--sft-run {args.sft_run}: no merged/ checkpoint there (run stage=sft game=kuhn model=tiny)")
    pushes = []
    for key, direction in wanted:
        cfg = compose_sepo(args.sft_run, args.overrides)
        out = push(cfg, key, 1.0 if direction == "up" else -1.0, args.steps, args.samples, args.batch)
        pushes.append(out)
        x0, x1 = out["exploitability"]
        print(
            f"\npushed {key} {direction} for {args.steps} steps (lr {cfg.sepo.lr}): exploitability {x0:.3f} -> {x1:.3f}"
        )
        for k in INFOSETS:
            b, a = out["before"][k], out["after"][k]
            print(f"  {k:4s} {b:.2f} -> {a:.2f}  ({a - b:+.2f}){'   <- pushed' if k == key else ''}", flush=True)
    print(
        json.dumps(
            {
                "sft_run": str(args.sft_run),
                "steps": args.steps,
                "lr": float(cfg.sepo.lr),
                "samples": args.samples,
                "overrides": args.overrides,
                "pushes": pushes,
            }
        )
    )


if __name__ == "__main__":
    main()
