"""Why does the payoff-only arm lower Kuhn's exploitability too, and how far must a policy move before
SEPO's exploit term makes a difference? Exact, in table coordinates, from the models' played tables.

For each start (a Kuhn results.json with `played_table`, e.g. each seed's SFT evaluation):

- the cosine of the exact gradient of J with minus the gradient of the exploitability, for SEPO's J and
  for payoff-only's (`lambdas=zero`): near 1 for both means that the first steps of either arm lower
  the exploitability alike;
- the exploitability along each objective's exact ascent (`kuhn_gradient.exact_ascent`, every 0.25 of
  path length, the path measured as the L2 distance walked in P(BET or CALL) coordinates);
- the exploitability of the start with its weakly dominated actions removed (calling a bet with the J,
  folding the K to a bet, checking the K behind a check): what any payoff maximiser gets rid of.

`--optimum RESTARTS` adds the table that maximises each objective (`kuhn_gradient.exact_optimum`) and its
exploitability: where each arm ends if it is trained long enough (minutes).

`--run START RUN` (repeatable) adds each evaluated checkpoint of a SEPO or payoff-only run directory: its
played table's distance from START (the results.json of the model it trained from) and its
`exploit_exact`, so a language model's path can be read against the exact ones.

    python -m benchmarks.kuhn.kuhn_arms --results S1/sft/eval/sft/results.json S2/... \
        [--run S1/sft/eval/sft/results.json S1/sepo --run S1/sft/eval/sft/results.json PAYOFF_ONLY_RUN ...]

Each part runs only when asked (`--run` alone reads the runs in seconds). The last line is a JSON object
{"starts": [...], "runs": [...], "optima": {...}}.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from benchmarks.kuhn.kuhn_gradient import (
    exact_ascent,
    exact_gradients,
    exact_objective,
    exact_optimum,
    played,
    played_point,
    table_of,
)

# information set -> P(BET or CALL) of the action that weakly dominates its alternative (docs/spec.md §1:
# "0b" is the J facing an opening bet, "2p" the K after the opponent's check)
DOMINANT = {"0b": 0.0, "0pb": 0.0, "2b": 1.0, "2pb": 1.0, "2p": 1.0}
OBJECTIVES = {"sepo": [], "payoff_only": ["lambdas=zero"]}


def without_dominated(q: np.ndarray) -> np.ndarray:
    from sepo.games.kuhn.exact import INFOSETS

    out = q.copy()
    for infoset, p in DOMINANT.items():
        out[INFOSETS.index(infoset)] = p
    return out


def start_row(results: Path, configs: dict, length: float) -> dict:
    """The exact figures of one start (see the module docstring)."""
    q, theta = played_point(results)
    row = {"results": str(results), "exploitability": float(exact_objective(table_of(q), configs["sepo"])[1])}
    row["exploitability_without_dominated"] = float(exact_objective(table_of(without_dominated(q)), configs["sepo"])[1])
    for name, cfg in configs.items():
        grad_j, _, grad_x = exact_gradients(theta, cfg)
        cosine = -grad_j @ grad_x / np.linalg.norm(grad_j) / np.linalg.norm(grad_x)
        row[name] = {"cosine_with_minus_grad_exploitability": round(float(cosine), 3)}
        row[name]["ascent_exploitability"] = exact_ascent(q, cfg, step=0.05, length=length)
    return row


def run_rows(run: Path, start: np.ndarray) -> list[dict]:
    """Each evaluated checkpoint of a run: its played table's distance from `start` and its exploit_exact."""
    rows = []
    for results in sorted((run / "eval").glob("step_*/results.json"), key=lambda p: int(p.parent.name[5:])):
        data = json.loads(results.read_text())
        distance = float(np.linalg.norm(played(results) - start))
        rows.append({"checkpoint": results.parent.name, "distance": round(distance, 3)})
        rows[-1]["exploit_exact"] = round(float(data["metrics"]["exploit_exact"]), 4)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", type=Path, nargs="*", default=[], help="Kuhn results.json files (starts)")
    parser.add_argument("--run", type=Path, nargs=2, action="append", default=[], metavar=("START", "RUN"))
    parser.add_argument("--length", type=float, default=2.0, help="path length of the exact ascents")
    parser.add_argument("--optimum", type=int, default=0, metavar="RESTARTS", help="also each objective's argmax")
    args = parser.parse_args()

    from sepo.run.compose import compose_config

    configs = {n: compose_config(["game=kuhn", "model=scripted", "logger=none", *o]) for n, o in OBJECTIVES.items()}
    starts = []
    for results in args.results:
        starts.append(start_row(results, configs, args.length))
        s = starts[-1]
        print(
            f"{results}: exploitability {s['exploitability']:.3f}, without dominated actions "
            f"{s['exploitability_without_dominated']:.3f}"
        )
        for name in OBJECTIVES:
            print(
                f"  {name:12} cosine {s[name]['cosine_with_minus_grad_exploitability']:+.3f}; exploitability every "
                f"0.25 of path: {s[name]['ascent_exploitability']}",
                flush=True,
            )
    runs = []
    for start, run in args.run:
        runs.append({"start": str(start), "run": str(run), "checkpoints": run_rows(run, played(start))})
        print(run, runs[-1]["checkpoints"])
    optima = {n: exact_optimum(cfg, args.optimum) for n, cfg in configs.items()} if args.optimum else {}
    for name, optimum in optima.items():
        print(f"argmax of {name}'s J: exploitability {optimum['exploitability']}, table {optimum['table']}")
    print(json.dumps({"starts": starts, "runs": runs, "optima": optima}))


if __name__ == "__main__":
    main()
