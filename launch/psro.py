"""SEPO against the exploiters it meets (PSRO-style), in one resumable command.

    python -m launch.psro --game ipd --sft <SFT run dir or model dir> [--iterations 3] [--sepo-steps 20]
                          [--seeds 0,1,2] [--root DIR] [key=value ...]

Per seed, under `<root>/psro/<game>/seed_<s>/`, one run of `main.py` per directory, in this order:

  exploiter_0/   a learned exploiter (`stage=exploiter`) against the SFT model
  sepo_1/        SEPO from the SFT model, with exploiter_0 in the exploit pool (`sepo.learned_exploiters`)
  exploiter_1/   a fresh exploiter against sepo_1's policy
  sepo_2/        SEPO continuing sepo_1's adapter (`sepo.init_adapter`), exploiters 0 and 1 in the pool
  ...            up to sepo_<k> and exploiter_<k>

Each exploiter is read on its held-out episodes before it joins the pool, so the learned exploitability of
iteration i's policy comes from an exploiter that played no part in training it (docs/spec.md §6). `psro.json`
gathers, per iteration, that learned exploitability ± SE and, as that exploiter's run read them, the policy's pool
exploit and Safety on the test episodes and, on Kuhn, its `exploit_exact`; `<root>/psro/<game>/summary.json` the
same as mean ± SE over the seeds, with the fall from SFT to the last iteration paired by seed. `key=value`
arguments go to every run (`exploiter.*` to the exploiters, `sepo.*` to the SEPO runs, the rest to both). Re-running the command skips every finished run (its
DONE marker) and resumes a killed one from its last checkpoint; a run that fails stops the loop (exit 1).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from sepo.metrics import mean_se

ROOT = Path(__file__).resolve().parent.parent


def exploiter_run(seed_dir: Path, i: int) -> Path:
    return seed_dir / f"exploiter_{i}"


def sepo_run(seed_dir: Path, i: int) -> Path:
    return seed_dir / f"sepo_{i}"


def sft_model(sft: Path) -> Path:
    """The model an SFT run deploys (its merged/), or the directory itself when it is a model."""
    return sft / "merged" if (sft / "merged").is_dir() else sft


def steps(args: argparse.Namespace, seed: str, seed_dir: Path) -> list[tuple[Path, list[str]]]:
    """Every run of one seed, in order: (its directory, its overrides)."""
    game, sft = [f"game={args.game}", f"model={args.model}"], Path(args.sft).absolute()
    extra_exploiter = [o for o in args.overrides if not o.startswith("sepo.")]
    extra_sepo = [o for o in args.overrides if not o.startswith("exploiter.")]
    runs = []
    for i in range(args.iterations + 1):
        victim = sft if i == 0 else sepo_run(seed_dir, i)
        exploiter = [
            "stage=exploiter",
            *game,
            f"model.path={sft_model(sft)}",
            f"exploiter.victim={victim}",
            f"exploiter.seed={seed}",
        ]
        if i:
            pool = [str(exploiter_run(seed_dir, j) / "adapter") for j in range(i)]
            init = [f"sepo.init_adapter={sepo_run(seed_dir, i - 1) / 'adapter'}"] if i > 1 else []
            sepo = [
                "stage=sepo",
                *game,
                f"model.path={sft_model(sft)}",
                f"sepo.seed={int(seed) + 1000 * i}",  # each iteration its own batches
                f"sepo.steps={args.sepo_steps}",
                "sepo.checkpoint_steps=[]",
                f"sepo.learned_exploiters=[{','.join(pool)}]",
                *init,
            ]
            runs.append((sepo_run(seed_dir, i), sepo + extra_sepo))
        runs.append((exploiter_run(seed_dir, i), exploiter + extra_exploiter))
    return runs


def run(directory: Path, overrides: list[str], root: Path) -> int:
    command = [sys.executable, "main.py", *overrides, f"paths.root_dir={root}", f"hydra.run.dir={directory}"]
    print("+", " ".join(command), flush=True)
    return subprocess.call(command, cwd=ROOT)


#: what each iteration's row keeps of its exploiter's results.json: the learned exploitability, the victim's pool
#: figures beside it, and Kuhn's exact value
ROW_KEYS = ("learned_exploit", "pool_exploit", "pool_safety", "exploit_exact")


def summary(args: argparse.Namespace, seed_dir: Path) -> list[dict]:
    """Per iteration: the policy's learned exploitability (from the exploiter trained after it) and, beside it,
    the figures that exploiter's run read of the policy against the game's pools and (Kuhn) exactly."""
    rows = []
    for i in range(args.iterations + 1):
        learned = json.loads((exploiter_run(seed_dir, i) / "results.json").read_text())
        row = {"iteration": i, "policy": "sft" if i == 0 else f"sepo_{i}"}
        row.update({k: learned[k] for key in ROW_KEYS for k in (key, f"{key}_se") if k in learned})
        rows.append(row)
    return rows


def over_seeds(by_seed: dict[str, list[dict]]) -> dict:
    """Each iteration's figures as mean ± SE over seeds, and the fall from the SFT policy to the last iteration's,
    paired by seed (the targets: the learned exploitability falls by more than 2 SE; Kuhn's exploit_exact ends at
    no more than half SFT's)."""
    iterations = range(len(next(iter(by_seed.values()))))
    keys = [k for k in ROW_KEYS if all(k in rows[0] for rows in by_seed.values())]
    out: dict = {
        "seeds": list(by_seed),
        "iterations": [
            {"iteration": i, **{k: mean_se(rows[i][k] for rows in by_seed.values())._asdict() for k in keys}}
            for i in iterations
        ],
    }
    out["fall"] = {k: mean_se(rows[0][k] - rows[-1][k] for rows in by_seed.values())._asdict() for k in keys}
    if "exploit_exact" in keys:
        out["exact_last_over_sft"] = mean_se(
            rows[-1]["exploit_exact"] / rows[0]["exploit_exact"] for rows in by_seed.values()
        )._asdict()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--game", required=True)
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--sft", required=True, help="the SFT run (its merged/) or a model directory to start from")
    parser.add_argument("--iterations", type=int, default=3, help="SEPO phases, each followed by a fresh exploiter")
    parser.add_argument("--sepo-steps", type=int, default=20, help="SEPO steps per iteration")
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--root", default=str(ROOT))
    parser.add_argument("overrides", nargs="*", help="key=value for every run")
    args = parser.parse_args(argv)
    root = Path(args.root).absolute()
    by_seed = {}
    for seed in args.seeds.split(","):
        seed_dir = root / "psro" / args.game / f"seed_{seed}"
        for directory, overrides in steps(args, seed, seed_dir):
            if (directory / "DONE").exists():
                continue
            if run(directory, overrides, root) != 0:
                print(f"psro: {directory} failed; re-run the same command to resume it", file=sys.stderr)
                return 1
        rows = by_seed[seed] = summary(args, seed_dir)
        (seed_dir / "psro.json").write_text(json.dumps(rows, indent=2) + "\n")
        for row in rows:
            print(
                f"seed {seed} {row['policy']}: learned exploit {row['learned_exploit']:.3f} ± {row['learned_exploit_se']:.3f}"
                f"  pool exploit {row['pool_exploit']:.3f} ± {row['pool_exploit_se']:.3f}"
            )
    combined = over_seeds(by_seed)
    (root / "psro" / args.game / "summary.json").write_text(json.dumps(combined, indent=2) + "\n")
    print("fall, SFT to the last iteration (paired by seed): " + "  ".join(
        f"{k} {v['mean']:+.3f} ± {v['se'] or 0:.3f}" for k, v in combined["fall"].items()))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
