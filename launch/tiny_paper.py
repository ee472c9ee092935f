"""The paper's plan for all five games, phase by phase, in one resumable command: on a CPU or on SLURM.

    launch/tiny_paper.sh [--model tiny|smollm2|gemma4|qwen] [--dry-run] [--root DIR] [--seeds 0,1,2]
                         [--games ipd,...] [--arms sepo,payoff_only] [--launch local|slurm] [--jobs 2]
                         [--archive DIR] [--tables-anyway] [overrides]
    launch/paper_plan.sh ...   (the same command, named for the full-size models on a cluster)

`--model M` (default tiny, the embedded model) takes its settings from the preset
`conf/experiment/M_paper.yaml` (and `M_paper_<game>.yaml` where one exists) and writes under
`<root>/M_paper/`: `--model smollm2` is the same plan on SmolLM2-135M-Instruct, a pretrained chat model,
where the Base row means something; `--model gemma4|qwen --launch slurm` is the paper's grid on a cluster.
SFT is trained once per dataset AND seed: the paper trains it once per dataset, but then SFT - Base is one draw
of SFT's training (on SmolLM2's Kuhn two draws of the same data read 0.250 and 0.368 against Base's 0.336), so
every seed s trains its own SFTs (`sft.seed=s`) and its SEPO and payoff-only runs (`sepo.seed=s`) start from
them; `analysis.summary` pairs each SEPO seed with the SFT model it started from, and averages SFT - Base over
the SFT draws. Phases, in order; each is one Hydra sweep through the local launcher (`+launch=local`, `--jobs`
at a time, each job given cores // jobs threads) or SLURM's, under `<root>/M_paper/<phase>/`:
  sft            per seed, the model's three SFTs: `multi` (serves IPD, auction, neg_v1), `kuhn`, `neg_gt`
                 (neg_v2), each evaluated on its own game (`sft/<game>/sft_seed_<s>/`)
  sft_eval       each seed's `multi` SFT evaluated on auction and neg_v1 (the SFT rows of those tables)
  base           the model before any training, on every game
  sepo_<game>    per game and seed, from that seed's SFT: SEPO (the game's lambdas) and payoff-only
                 (`lambdas=zero`; `--arms` picks), every run evaluated on the same test episodes (and the same
                 validation episodes, which choose each run's best checkpoint)
  tables         `python -m analysis.tables` and `python -m analysis.summary` into `<root>/M_paper/tables`
The settings every job shares are the preset `conf/experiment/tiny_paper.yaml`; a game's SEPO runs use
`tiny_paper_<game>.yaml` where one exists (it includes the shared one and adds what was tuned for that game:
IPD, Kuhn). `key=value` arguments are passed to every job after its preset. `--dry-run` prints every job,
one command line each (run alone, it is that job in the same run dir), and runs nothing. Re-running the same
command skips every finished job (its DONE marker) and resumes a SEPO run from its last checkpoint. A phase
with a failed job stops the run before the tables (exit 1) unless --tables-anyway. Prints the wall time of
every phase at the end. `--archive DIR` keeps every finished run's summary under `DIR/<model>_paper/` within a
minute of its finish (launch/archive.py: a few hundred kB a run, for git) and puts them back before the plan
starts, so a plan that outlives its run dirs resumes from what was committed; an SFT trained again that reads
otherwise than its archived draw sends the runs that started from that draw back to run (`drop_stale_runs`).
`python -m analysis.summary DIR/<model>_paper` reads the archive alone.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from launch import archive

ROOT = Path(__file__).resolve().parent.parent

GAMES = ("ipd", "auction", "neg_v1", "neg_v2", "kuhn")
#: game -> the game whose SFT run it starts from (the paper trains `multi` once for IPD, auction, neg_v1)
SFT_RUN_OF = {"ipd": "ipd", "auction": "ipd", "neg_v1": "ipd", "neg_v2": "neg_v2", "kuhn": "kuhn"}
CONF = ROOT / "conf" / "experiment"
#: the arms each game's SEPO phase trains per seed: SEPO with the game's lambdas, and GRPO on the payoff alone
ARMS = ("sepo", "payoff_only")
LAUNCHERS = ("local", "slurm", "submitit_local")
#: an SFT run's dir in its phase: one per dataset (named by the game it is trained under) and SFT seed
SFT_SUBDIR = "${game.name}/sft_seed_${sft.seed}"


def models() -> list[str]:
    """The models with a paper preset (`conf/experiment/<model>_paper.yaml`)."""
    return sorted(p.stem.removesuffix("_paper") for p in CONF.glob("*_paper.yaml"))


def preset_of(model: str, game: str | None = None) -> str:
    """A game's SEPO runs use `experiment/<model>_paper_<game>.yaml` where one exists: the shared preset plus what
    was tuned for that game (steps, schedule, batch reuse); every other phase uses the shared preset."""
    name = f"{model}_paper"
    return f"+experiment={name}_{game}" if game and (CONF / f"{name}_{game}.yaml").exists() else f"+experiment={name}"


@dataclass
class Phase:
    name: str
    overrides: list[str]  # sweep overrides (comma lists expand into jobs, as with `python main.py -m`)
    subdir: str  # hydra.sweep.subdir: one readable directory per job
    preset: str  # the experiment preset of every job of the phase


def phases(
    out: Path, seeds: list[int], games: tuple[str, ...] = GAMES, model: str = "tiny", arms: tuple[str, ...] = ARMS
) -> list[Phase]:
    """The phases for `games` (all five by default; a subset runs only the SFTs those games start from). Every
    seed s trains its own SFTs (`sft.seed=s`), and its SEPO and payoff-only runs (`sepo.seed=s`) start from them."""
    shared_preset = preset_of(model)
    sft_games = sorted({SFT_RUN_OF[g] for g in games})
    shared = [g for g in games if SFT_RUN_OF[g] != g]
    each_seed = ",".join(map(str, seeds))
    plan = [
        Phase("sft", ["stage=sft", f"game={','.join(sft_games)}", f"sft.seed={each_seed}"], SFT_SUBDIR, shared_preset)
    ]
    if shared:
        plan.append(
            Phase(
                "sft_eval",
                [
                    "stage=eval",
                    "eval.phase=sft",
                    f"game={','.join(shared)}",
                    f"sft.seed={each_seed}",
                    f"model.path={sft_model(out, 'ipd', '${sft.seed}')}",
                ],
                SFT_SUBDIR,
                shared_preset,
            )
        )
    plan.append(Phase("base", ["stage=eval", f"game={','.join(games)}"], "${game.name}", shared_preset))
    for game in games:
        plan.append(
            Phase(
                f"sepo_{game}",
                [
                    "stage=sepo",
                    f"game={game}",
                    "lambdas=" + ",".join(game if arm == "sepo" else "zero" for arm in arms),
                    f"sepo.seed={each_seed}",
                    f"model.path={sft_model(out, SFT_RUN_OF[game], '${sepo.seed}')}",
                ],
                "lambdas_${hydra:runtime.choices.lambdas}/sepo_seed_${sepo.seed}",
                preset_of(model, game),
            )
        )
    return plan


def sft_model(out: Path, sft_game: str, seed: str) -> Path:
    """The merged SFT model of one dataset and SFT seed (a number, or an interpolation a sweep fills in)."""
    return out / "sft" / sft_game / f"sft_seed_{seed}" / "merged"


def model_of(text: str) -> str:
    if text not in models():
        raise argparse.ArgumentTypeError(
            f"--model {text!r}: allowed: {', '.join(models())} (a model needs conf/experiment/<model>_paper.yaml)"
        )
    return text


def games_of(text: str) -> tuple[str, ...]:
    games = tuple(g.strip() for g in text.split(",") if g.strip())
    unknown = [g for g in games if g not in GAMES]
    if unknown or not games:
        raise argparse.ArgumentTypeError(f"--games {text!r}: allowed: a comma-separated subset of {','.join(GAMES)}")
    return games


def arms_of(text: str) -> tuple[str, ...]:
    arms = tuple(a.strip() for a in text.split(",") if a.strip())
    if not arms or any(a not in ARMS for a in arms):
        raise argparse.ArgumentTypeError(f"--arms {text!r}: allowed: a comma-separated subset of {','.join(ARMS)}")
    return arms


def sweep_command(phase: Phase, out: Path, jobs: int, overrides: list[str], launch: str = "local") -> list[str]:
    """One phase as one sweep: on this machine `jobs` at a time (`+launch=local`), or submitted to SLURM
    (`+launch=slurm`, which waits for the phase's jobs before the next phase starts from their outputs)."""
    parallel = [f"hydra.launcher.n_jobs={jobs}"] if launch == "local" else []
    return [
        sys.executable,
        "main.py",
        "-m",
        phase.preset,
        f"+launch={launch}",
        *parallel,
        f"hydra.sweep.dir={out / phase.name}",
        f"hydra.sweep.subdir={phase.subdir}",
        *phase.overrides,
        *overrides,
    ]


def expand(phase: Phase, out: Path, overrides: list[str]) -> list[list[str]]:
    """One `python main.py ...` command line per job of the phase (Hydra's own sweep expansion), each
    with the run dir it gets in the sweep, so it can be run alone."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides([*phase.overrides, *overrides])
    lines = []
    for batch in BasicSweeper.split_arguments(parsed, None):
        for job in batch:
            values = dict(o.split("=", 1) for o in job if "=" in o)
            fill = {
                "${game.name}": values.get("game", "ipd"),
                "${hydra:runtime.choices.lambdas}": values.get("lambdas", ""),
                "${sepo.seed}": values.get("sepo.seed", ""),
                "${sft.seed}": values.get("sft.seed", ""),
            }
            subdir = phase.subdir
            job = [a.replace("$\\{", "${").replace("\\}", "}") for a in job]  # the parser's quoting of "${"
            for key, value in fill.items():
                subdir = subdir.replace(key, value)
                job = [a.replace(key, value) if a.startswith("model.path=") else a for a in job]
            lines.append(["python", "main.py", phase.preset, *job, f"hydra.run.dir={out / phase.name / subdir}"])
    return lines


def job_dirs(line: list[str]) -> tuple[Path, Path | None]:
    """(run dir, the model it starts from or None) of one job's command line from `expand`."""
    values = dict(a.split("=", 1) for a in line if "=" in a)
    model = values.get("model.path")
    return Path(values["hydra.run.dir"]), Path(model) if model else None


def resume_from_archive(plan: list[Phase], out: Path, overrides: list[str], kept: Path) -> None:
    """Put the archived runs back into `out` (launch/archive.py), except the SFT models a job still to run
    starts from, which train again."""
    jobs = [job_dirs(line) for phase in plan for line in expand(phase, out, overrides)]
    pending = [
        (run, model)
        for run, model in jobs
        if not any((d / "DONE").is_file() for d in (run, kept / run.relative_to(out)))
    ]
    needed = {model for _, model in pending if model is not None}
    restored, retrained = archive.restore(kept, out, needed)
    retrained += [run.relative_to(out) for run in archive.unmark_modelless(needed)]
    print(
        f"archive {kept}: {len(restored)} finished run(s) put back, {len(pending)} job(s) to run"
        + (f"; trained again for their models: {', '.join(map(str, retrained))}" if retrained else ""),
        file=sys.stderr,
        flush=True,
    )


def drop_stale_runs(plan: list[Phase], out: Path, overrides: list[str], kept: Path) -> list[Path]:
    """The runs put back from the archive whose SFT has since finished again in `out` and reads otherwise than
    its archived finish: they started from another draw of its training, so they leave `out` and the archive
    (`archive.forget`) and run again from the new one, and no table pairs a run with an SFT it did not start
    from. Call it before every phase and before `archive.keep` replaces the SFT's archived copy; returns them."""
    stale = []
    for run, model in (job_dirs(line) for phase in plan for line in expand(phase, out, overrides)):
        if model is None or not (run / "DONE").is_file():
            continue
        sft, copy = model.parent, kept / model.parent.relative_to(out)
        from_archive = archive.same_marker(run, kept / run.relative_to(out))
        sft_again = (sft / "DONE").is_file() and (copy / "DONE").is_file() and not archive.same_marker(sft, copy)
        if from_archive and sft_again and not archive.reads_alike(sft, copy):
            archive.forget(run, kept / run.relative_to(out))
            stale.append(run)
            print(
                f"archive: {sft.relative_to(out)} trained again reads otherwise than its archived draw, so"
                f" {run.relative_to(out)}, which started from that draw, runs again",
                file=sys.stderr,
                flush=True,
            )
    return stale


def failed_jobs(sweep_dir: Path) -> list[str]:
    """The failed jobs the sweep's summary names (the sweep exits 1 when there are any)."""
    summary = sweep_dir / "sweep_summary.json"
    return json.loads(summary.read_text()).get("failed", []) if summary.exists() else []


def run(command: list[str], meanwhile: Callable[[], object] | None = None, every_s: float = 60.0) -> int:
    """Run `command` to its end; `meanwhile`, when given, is called every `every_s` seconds while it runs and once
    after (the archive keeps each run as it finishes: a phase of long jobs can outlast a session)."""
    print("+ " + shlex.join(command), file=sys.stderr, flush=True)
    process = subprocess.Popen(command, cwd=ROOT, env={**os.environ, "HYDRA_FULL_ERROR": "1"})
    while True:
        try:
            code = process.wait(timeout=every_s if meanwhile else None)
            break
        except subprocess.TimeoutExpired:
            meanwhile()
    if meanwhile:
        meanwhile()
    return code


def tables(out: Path) -> int:
    tables_dir = out / "tables"
    return run([sys.executable, "-m", "analysis.tables", str(out), "--out", str(tables_dir)]) or run(
        [sys.executable, "-m", "analysis.summary", str(out), "--out", str(tables_dir / "summary.json")]
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=model_of, default="tiny", help=f"one of {', '.join(models())} (default tiny)")
    parser.add_argument("--dry-run", action="store_true", help="print every job, one command line each; run nothing")
    parser.add_argument(
        "--root",
        type=Path,
        default=Path(os.environ.get("PROJECT_ROOT", ROOT)),
        help="project root: the runs go to <root>/<model>_paper (default: $PROJECT_ROOT or the checkout)",
    )
    parser.add_argument(
        "--seeds",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[0, 1, 2],
        help="seeds, comma-separated (default 0,1,2): each trains its own SFTs (sft.seed) and SEPO runs (sepo.seed)",
    )
    parser.add_argument(
        "--games",
        type=games_of,
        default=GAMES,
        help=f"comma-separated subset of {','.join(GAMES)} (default: all five)",
    )
    parser.add_argument(
        "--arms",
        type=arms_of,
        default=ARMS,
        help=f"the arms of each game's SEPO phase, comma-separated subset of {','.join(ARMS)} (default: both)",
    )
    parser.add_argument(
        "--launch",
        choices=LAUNCHERS,
        default="local",
        help="local: this machine, --jobs at a time; slurm: every phase submitted to SLURM (conf/launch/slurm.yaml)",
    )
    parser.add_argument("--jobs", type=int, default=2, help="local: jobs at a time (each gets cores // jobs threads)")
    parser.add_argument("--tables-anyway", action="store_true", help="write the tables even when a job failed")
    parser.add_argument(
        "--archive",
        type=Path,
        help="keep each finished run's summary under DIR/<model>_paper as it finishes, and resume from it",
    )
    args, overrides = parser.parse_known_args()
    name = f"{args.model}_paper"
    out = args.root.resolve() / name
    overrides = [f"paths.root_dir={args.root.resolve()}", *overrides]

    if args.dry_run:
        for phase in phases(out, args.seeds, args.games, args.model, args.arms):
            jobs = expand(phase, out, overrides)
            print(f"# {phase.name}: {len(jobs)} job(s) -> {out / phase.name}")
            for job in jobs:
                print(shlex.join(job))
        print(f"# tables -> {out / 'tables'}")
        return 0

    plan = phases(out, args.seeds, args.games, args.model, args.arms)
    kept = args.archive.resolve() / name if args.archive else None
    if kept is not None:
        resume_from_archive(plan, out, overrides, kept)
    started, seconds, failures = time.time(), {}, []
    for phase in plan:
        t0 = time.time()
        keep = None
        if kept is not None:
            drop_stale_runs(plan, out, overrides, kept)

            def keep(phase: Phase = phase) -> None:
                drop_stale_runs(plan, out, overrides, kept)
                archive.keep(out / phase.name, kept / phase.name)

        code = run(sweep_command(phase, out, args.jobs, overrides, args.launch), meanwhile=keep)
        seconds[phase.name] = round(time.time() - t0, 1)
        failed = failed_jobs(out / phase.name) or ([f"the sweep itself exited {code}"] if code else [])
        failures += [f"{phase.name}/{name}" for name in failed]
        if failed and phase.name in ("sft", "sft_eval") and not args.tables_anyway:
            break  # nothing downstream can start without its SFT
    if failures and not args.tables_anyway:
        print(
            f"{name}: {len(failures)} job(s) failed, tables not written (--tables-anyway writes them):\n  "
            + "\n  ".join(failures),
            file=sys.stderr,
        )
        return 1
    t0 = time.time()
    code = tables(out)
    seconds["tables"] = round(time.time() - t0, 1)
    total = time.time() - started
    print(f"{name}: {total / 60:.1f} min in all; " + ", ".join(f"{k} {v / 60:.1f} min" for k, v in seconds.items()))
    (out / "tables").mkdir(parents=True, exist_ok=True)
    (out / "tables" / "wall_time.json").write_text(json.dumps({"total_s": round(total, 1), **seconds}, indent=2) + "\n")
    return code


if __name__ == "__main__":
    sys.exit(main())
