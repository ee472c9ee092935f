"""Does SEPO's objective on IPD ask for more collusion where a model starts? Exact, for the reactive
strategy that a model's evaluation episodes fit.

A language model's IPD policy reads the whole transcript; its evaluation episodes
(`results.json`'s `per_episode` actions, every pool's opponents) fit the closest `endgame` agent of the
gradient check (`benchmarks.estimator.finite_differences`): P(COOPERATE) in the first round, after the
opponent cooperated, after it defected, and in the last round after a cooperation. At that agent the
exact J (dynamic programming over the opponents' Markov chains, the training lambdas) gives:

- each term and the collusion (share of rounds defecting on AlwaysC), beside what the episodes measured,
  so the fit can be judged;
- the rate at which collusion changes along the exact gradient ascent of SEPO's J and of payoff-only's
  (the derivative of collusion along the unit ascent direction in logit coordinates): positive means that
  the objective's first steps from this point buy more collusion;
- the same two rates along the one direction "defect more at every feature alike" (all logits down
  together): a model whose steps shift its overall propensity to cooperate, more than they tell the
  features apart, moves along it;
  and the training lambda_c above which that direction stops raising J;
- with `--optimum`, the endgame agent that maximises each objective (every deterministic agent, then a
  grid of step 0.1 in probability), its collusion and its exploitability;
- with `--exploit-caps 0.25 0.05 ...`, the agent with the highest SEPO J among those whose exploitability is at
  most each cap: whether a target "exploit below X" asks SEPO to give up J, or is met on the way up.

    python -m benchmarks.studies.ipd_reactive --results S1/sft/eval/sft/results.json ... [--optimum]
        [--exploit-caps 0.25 0.05]
        [--move S1/sft/eval/sft/results.json S1/sepo/eval/step_8/results.json ...]

`--move START CHECKPOINT` (repeatable) fits both and gives the checkpoint's move in logit coordinates and its
cosine with the "defect alike" direction (1: every feature's P(COOPERATE) fell alike; -1: rose alike). The last
line is a JSON object {"starts": [...], "moves": [...], "optima": {...}}.
"""

from __future__ import annotations

import argparse
import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.estimator.finite_differences import (
    PARAMETER_NAMES,
    exact_terms,
    finite_difference,
    make_agent,
    opponent_means,
)
from sepo.games.ipd.rules import COOPERATE
from sepo.training.objective import term_keys

OBJECTIVES = {"sepo": [], "payoff_only": ["lambdas=zero"]}
KIND = "endgame"
#: the unit direction in logit coordinates that lowers P(COOPERATE) at every feature alike
ALIKE = -np.ones(len(PARAMETER_NAMES[KIND])) / np.sqrt(len(PARAMETER_NAMES[KIND]))


def fit(results: Path) -> list[float]:
    """The endgame agent's probabilities from an evaluation's episodes: each feature's share of COOPERATE
    (add-half smoothing, so that a feature never seen cooperating still has a finite logit)."""
    counts = np.zeros((len(PARAMETER_NAMES[KIND]), 2))  # feature -> (cooperations, decisions)
    for episode in json.loads(results.read_text())["per_episode"]:
        actions, features = episode["actions"], make_agent(KIND, [0.5] * len(counts), rounds=episode["rounds"])
        for t, (mine, _) in enumerate(actions):
            counts[features.feature(t, actions[t - 1][1] if t else None)] += (mine == COOPERATE, 1)
    return [round(float((c + 0.5) / (n + 1.0)), 4) for c, n in counts]


def collusion(agent, cfg) -> float:
    """The collusive pool's share of rounds the agent defects (J's collusion term is -lambda_c times it)."""
    return float(np.mean([opponent_means(agent, o, cfg.game)["collusive"] for o in cfg.game.pools.collusive]))


def exploit(agent, cfg, terms: dict | None = None) -> float:
    """The exploit pool's mean advantage per round over the agent, each opponent's floored at 0 (the metric's rule)."""
    terms = terms if terms is not None else exact_terms(agent, cfg, cfg.sepo)
    return float(np.mean([max(0.0, terms[f"adv/{o}"]) for o in cfg.game.pools.exploit]))


def objective(agent, cfg, terms: dict | None = None) -> float:
    terms = terms if terms is not None else exact_terms(agent, cfg, cfg.sepo)
    return sum(terms[k] for k in term_keys())


def start_row(results: Path, configs: dict) -> dict:
    data = json.loads(results.read_text())
    probabilities = fit(results)
    agent = make_agent(KIND, probabilities)
    sepo_cfg = configs["sepo"]
    row = {
        "results": str(results),
        "fit": dict(zip(PARAMETER_NAMES[KIND], probabilities)),
        "exact": {
            "collusion": round(collusion(agent, sepo_cfg), 4),
            "exploit": round(exploit(agent, sepo_cfg), 4),
        },
        "measured": {k: round(float(data["metrics"][k]), 4) for k in ("collusion", "exploit")},
    }
    grad_c = -finite_difference(agent, sepo_cfg, sepo_cfg.sepo)["c"] / float(sepo_cfg.lambdas.train.c)
    for name, cfg in configs.items():
        grad_j = finite_difference(agent, cfg, cfg.sepo)["total"]
        row[name] = {
            "J": round(objective(agent, cfg), 4),
            "grad_J": dict(zip(PARAMETER_NAMES[KIND], np.round(grad_j, 4).tolist())),
            "collusion_rate_along_ascent": round(float(grad_c @ grad_j / np.linalg.norm(grad_j)), 4),
            "J_rate_defecting_alike": round(float(grad_j @ ALIKE), 4),
        }
    row["collusion_rate_defecting_alike"] = round(float(grad_c @ ALIKE), 4)
    # J's collusion term is -lambda_c * collusion, so defecting alike stops paying at this training lambda_c
    rate = row["sepo"]["J_rate_defecting_alike"]
    row["lambda_c_where_defecting_alike_stops_paying"] = round(
        float(sepo_cfg.lambdas.train.c) + rate / row["collusion_rate_defecting_alike"], 3
    )
    return row


def move_row(start: Path, checkpoint: Path) -> dict:
    """A checkpoint's move from its start in the fitted agent's logits, and how much of it is 'defect alike'."""
    before, after = make_agent(KIND, fit(start)).theta, make_agent(KIND, fit(checkpoint)).theta
    move = after - before
    return {
        "start": str(start),
        "checkpoint": str(checkpoint),
        "fit": dict(zip(PARAMETER_NAMES[KIND], fit(checkpoint))),
        "logit_move": dict(zip(PARAMETER_NAMES[KIND], np.round(move, 3).tolist())),
        "cosine_with_defecting_alike": round(float(move @ ALIKE / np.linalg.norm(move)), 3),
    }


def endgame_agents(step: float) -> Iterator[tuple[tuple[float, ...], Any]]:
    """Every endgame agent whose four probabilities lie on the grid of `step` (1.0: the 16 deterministic ones)."""
    clip = lambda p: min(max(p, 1e-6), 1 - 1e-6)  # noqa: E731
    grid = np.round(np.arange(0.0, 1.0 + step / 2, step), 6)
    for probabilities in itertools.product(grid, repeat=len(PARAMETER_NAMES[KIND])):
        yield tuple(map(float, probabilities)), make_agent(KIND, [clip(p) for p in probabilities])


def described(cfg, probabilities: tuple[float, ...], agent) -> dict:
    return {
        "J": round(objective(agent, cfg), 4),
        "agent": dict(zip(PARAMETER_NAMES[KIND], probabilities)),
        "collusion": round(collusion(agent, cfg), 4),
        "exploit": round(exploit(agent, cfg), 4),
    }


def optimum(cfg, step: float = 0.1, exploit_cap: float | None = None) -> dict:
    """The endgame agent that maximises J, among those whose exploitability is at most `exploit_cap` (None: all)."""
    best = None
    for probabilities, agent in endgame_agents(step):
        terms = exact_terms(agent, cfg, cfg.sepo)
        # a deterministic agent's probabilities sit 1e-6 from certainty, which moves its exploit by about 1e-5
        if exploit_cap is not None and exploit(agent, cfg, terms) > exploit_cap + 1e-4:
            continue
        j = objective(agent, cfg, terms)
        if best is None or j > best[0]:
            best = (j, probabilities, agent)
    return described(cfg, best[1], best[2]) if best else {}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", type=Path, nargs="+", required=True, help="IPD results.json files (starts)")
    parser.add_argument("--move", type=Path, nargs=2, action="append", default=[], metavar=("START", "CHECKPOINT"))
    parser.add_argument("--optimum", action="store_true", help="also each objective's best endgame agent")
    parser.add_argument("--exploit-caps", type=float, nargs="*", default=[], help="SEPO's best agent under each cap")
    parser.add_argument("--model", default="smollm2", help="the model whose SEPO settings (reward scale) apply")
    args = parser.parse_args()

    from sepo.run.compose import compose_config

    configs = {n: compose_config(["game=ipd", f"model={args.model}", "logger=none", *o]) for n, o in OBJECTIVES.items()}
    starts = []
    for results in args.results:
        starts.append(start_row(results, configs))
        s = starts[-1]
        print(
            f"{results}: fit {s['fit']}; collusion exact {s['exact']['collusion']} (measured "
            f"{s['measured']['collusion']}), exploit exact {s['exact']['exploit']} (measured {s['measured']['exploit']})"
        )
        for name in OBJECTIVES:
            print(
                f"  {name:12} J {s[name]['J']:+.4f}, grad {s[name]['grad_J']}; collusion along the ascent "
                f"{s[name]['collusion_rate_along_ascent']:+.4f}; defecting alike: J "
                f"{s[name]['J_rate_defecting_alike']:+.4f}, collusion {s['collusion_rate_defecting_alike']:+.4f}",
                flush=True,
            )
    moves = [move_row(start, checkpoint) for start, checkpoint in args.move]
    for row in moves:
        print(
            f"{row['checkpoint']}: fit {row['fit']}, cosine with defecting alike {row['cosine_with_defecting_alike']:+.3f}"
        )
    optima = {n: optimum(cfg) for n, cfg in configs.items()} if args.optimum else {}
    for name, best in optima.items():
        print(f"argmax of {name}'s J over endgame agents: {best}")
    capped = {str(cap): optimum(configs["sepo"], exploit_cap=cap) for cap in args.exploit_caps}
    for cap, best in capped.items():
        print(f"argmax of sepo's J over endgame agents with exploit at most {cap}: {best}")
    print(json.dumps({"starts": starts, "moves": moves, "optima": optima, "optima_under_exploit_caps": capped}))


if __name__ == "__main__":
    main()
