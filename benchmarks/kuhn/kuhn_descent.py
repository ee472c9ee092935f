"""How many fresh rollout batches does SEPO's estimator need to lower Kuhn's exploitability?

The language model's Kuhn runs lower `exploit_exact` slowly (docs/results.md section 1). Is that the
model, or the estimator? This trains the ideal learner instead: `kuhn_gradient.TableAgent` (one logit
per information set, 12 parameters, nothing shared between them), starting at the SFT model's played
table, through the very batch code of a SEPO step (`BatchBuilder`: Kuhn's pools, shared deals, credit,
leave-one-out baseline, batch scale, lagged exploit switch), one fresh batch per step, Adam on the
batch's update sum_d A_d * d log pi(a_d) / d theta, the best responder re-solved from the exact table
every `sepo.best_response_every` steps. What it reaches in N steps is what N batches of that estimator
can give; a language model, whose parameters every state shares, does not do better per batch.

    python -m benchmarks.kuhn.kuhn_descent --results <kuhn sft eval>/results.json
    python -m benchmarks.kuhn.kuhn_descent --results R --steps 40 80 400 --lrs 0.01 0.03 0.1 --seeds 0 1 2 3 4
    python -m benchmarks.kuhn.kuhn_descent --results R 'game.pools.exploit=[BestResponse]' --lrs 0.1  # the responder alone

(Hydra overrides go before the list options.) Prints, per (lr, schedule, steps), the final exploitability and
the change of J at the training lambdas (both exact, from expected values) as mean ± SE over seeds; the
last line is a JSON object {"start": {...}, "runs": [...], "cells": [...]}.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from analysis.summary import over_seeds
from benchmarks.kuhn.kuhn_gradient import TableAgent, exact_objective, played_point

ROOT = Path(__file__).resolve().parents[2]  # the repository


def compose_kuhn(seed: int, overrides: list[str]):
    from sepo.run.compose import compose_config

    return compose_config(["game=kuhn", "model=scripted", "logger=none", f"sepo.seed={seed}", *overrides])


def descend(theta0: np.ndarray, cfg, steps: int, lr: float, schedule: str) -> np.ndarray:
    """`steps` SEPO updates of the table agent, one fresh batch each; returns the final logits."""
    import torch

    from sepo.games import make_game
    from sepo.training.lr_schedule import learning_rate, set_learning_rate
    from sepo.training.objective import EstimatorState, sepo_settings
    from sepo.training.rollouts import BatchBuilder

    s = sepo_settings(cfg)
    game, builder = make_game(cfg.game), BatchBuilder(cfg, s)
    state = EstimatorState(scale_decay=float(s.adv_scale_decay), switch_episodes=int(s.exploit_switch_episodes))
    responders = [r for r in builder.strategies.values() if getattr(r, "responds_to_agent", False)]
    theta = torch.tensor(theta0, dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.Adam([theta], lr=lr)
    for step in range(steps):
        agent = TableAgent(theta.detach().numpy().copy())
        if step % int(s.best_response_every) == 0:
            for responder in responders:
                responder.respond_to(agent.table())
        batch = builder.collect(game, agent, step, state)
        update = batch.advantages @ np.stack([d.score for d in batch.decisions])
        set_learning_rate(optimizer, learning_rate(lr, schedule, step, steps, 0.0))
        optimizer.zero_grad()
        theta.grad = -torch.from_numpy(update)  # ascent on the surrogate, as the loss's gradient at ratio 1
        optimizer.step()
    return theta.detach().numpy()


def spread(stat: dict, sign: str = "") -> str:
    """mean ± SE of `analysis.summary.over_seeds` (no SE for one seed)."""
    return f"{stat['mean']:{sign}.3f}" + (f" ± {stat['se']:.3f}" if stat["se"] is not None else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", required=True, help="a Kuhn results.json with played_table (the start)")
    parser.add_argument("--steps", type=int, nargs="+", default=[40, 80, 400], help="run lengths (fresh batches)")
    parser.add_argument("--lrs", type=float, nargs="+", default=[0.01, 0.03, 0.1], help="Adam rates (table logits)")
    parser.add_argument("--schedules", nargs="+", default=["constant", "cosine"], help="sepo.lr_schedule values")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="sepo.seed of each run")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. 'game.pools.exploit=[BestResponse]'")
    args = parser.parse_args()

    _, theta0 = played_point(args.results)
    j0, x0 = exact_objective(TableAgent(theta0).table(), compose_kuhn(0, args.overrides))
    print(f"start (the SFT model's played table): exploitability {x0:.4f}, J {j0:+.4f}; half: {x0 / 2:.4f}")
    runs, cells = [], []
    for lr in args.lrs:
        for schedule in args.schedules:
            for steps in args.steps:
                finals = []
                for seed in args.seeds:
                    cfg = compose_kuhn(seed, args.overrides)
                    j, x = exact_objective(TableAgent(descend(theta0, cfg, steps, lr, schedule)).table(), cfg)
                    finals.append({"exploitability": float(x), "delta_J": float(j - j0)})
                    runs.append({"lr": lr, "schedule": schedule, "steps": steps, "seed": seed, **finals[-1]})
                x, dj = (over_seeds([f[k] for f in finals]) for k in ("exploitability", "delta_J"))
                below = int(sum(f["exploitability"] < x0 / 2 for f in finals))  # numpy bools otherwise
                cells.append({"lr": lr, "schedule": schedule, "steps": steps, "exploitability": x, "delta_J": dj})
                cells[-1]["seeds_below_half"] = below
                print(
                    f"lr {lr:<6g} {schedule:8} {steps:5d} batches: exploitability {spread(x)}  ΔJ {spread(dj, '+')}  "
                    f"below half in {below}/{len(finals)} seeds",
                    flush=True,
                )
    print(
        json.dumps(
            {
                "start": {"exploitability": float(x0), "J": float(j0)},
                "overrides": args.overrides,
                "runs": runs,
                "cells": cells,
            }
        )
    )


if __name__ == "__main__":
    main()
