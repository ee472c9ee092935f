"""Speed of the SFT stage: `stage=sft game=ipd model=tiny` (the main job's SFT), timed by phase.

    python -m benchmarks.speed.sft_speed [--root DIR] [--repo DIR] [--compare DIR] [--repeats N] [overrides...]

Runs `python main.py stage=sft game=ipd model=tiny logger=none` with this interpreter in the checkout
`--repo` (default: this one) and prints, per run: wall seconds; the Trainer's loop (`train_runtime`:
the optimizer steps with their validation losses and checkpoints); the reload + action agreement;
the evaluation against IPD's pools; trained tokens per second of the Trainer loop (the real,
unpadded tokens of the examples it trained on, steps x batch x their mean length) and the quality
figures of `sft_metrics.json`. Extra arguments are Hydra overrides for both sides, e.g.
`sft.max_steps=60` for a shorter run.

`--threads 1` runs single-threaded: on a shared machine the CPU seconds then barely depend on the
other load (two threads spin-wait for each other when a core is taken), so their ratio is the
robust figure; the default threads give the wall time of a quiet machine.

`--compare DIR` times another checkout (e.g. a clone at an older commit) as well, alternately
(other, this, other, this, ...: `--repeats` pairs), so both see the same drift of a shared
machine, and reports the ratios this / other per pair and their median. Each checkout gets its
own cache (tiny build, data) under `--root`, warmed before the timed runs. The last line printed
is one JSON object: {"runs": [...], "ratios": {...}} (`ratios` only with --compare).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository
STAMP = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\]\[sepo\.sft\]\[INFO\] - (.*)$")


#: the timed command: the main job's SFT stage (the warm-up runs it too, for one step)
SFT_RUN = ["main.py", "stage=sft", "game=ipd", "model=tiny", "logger=none", "eval.progress=false"]


def _git_commit(repo: Path) -> str:
    proc = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=repo, capture_output=True, text=True)
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo, capture_output=True, text=True
    ).stdout.strip()
    return proc.stdout.strip() + ("+changes" if dirty else "")


def _stamps(log: Path) -> dict[str, datetime]:
    """When the stage logged its data line (start) and its agreement line (end of agreement)."""
    out: dict[str, datetime] = {}
    for line in log.read_text().splitlines():
        m = STAMP.match(line)
        if not m:
            continue
        when = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f")
        if m.group(2).startswith("sft: dataset"):
            out.setdefault("start", when)
        elif m.group(2).startswith("sft: step") and "action agreement" in m.group(2):
            out["agreed"] = when
    return out


def mean_tokens(cache_dir: Path, overrides: list[str]) -> tuple[float, int]:
    """Mean token count of the training examples (this checkout's encoding) and the batch size."""
    from sepo.builders import load_model_and_tokenizer
    from sepo.lm.batching import end_of_turn_ids
    from sepo.run.compose import compose_config
    from sepo.stages.sft import sft_settings
    from sepo.training.sft_batching import ChatSFTCollator
    from sepo.training.sft_dataset import ensure_dataset, read_examples, subsample

    cfg = compose_config(
        [
            "stage=sft",
            "game=ipd",
            "model=tiny",
            "logger=none",
            f"paths.cache_dir={cache_dir}",
            "paths.output_dir=/unused",
            *overrides,
        ]
    )
    s = sft_settings(cfg)
    train = subsample(
        read_examples(ensure_dataset(cfg, str(s.dataset), s.data_dir) / "train.jsonl"), s.max_examples, s.seed, "train"
    )
    model, tok = load_model_and_tokenizer(cfg.model, cache_dir, device="cpu")
    collator = ChatSFTCollator(tok, cfg.model, int(s.max_length), end_of_turn_ids(model, tok))
    lengths = [len(collator.encode(ex["messages"])[0]) for ex in train]
    return sum(lengths) / len(lengths), int(s.per_device_batch_size) * int(s.grad_accum)


def _child_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_once(
    repo: Path,
    root: Path,
    cache_dir: Path,
    overrides: list[str],
    tokens_per_example: float,
    batch: int,
    name: str,
    threads: int | None = None,
) -> dict:
    """One timed SFT run in `repo`; its figures."""
    env = {**os.environ, "WANDB_MODE": "disabled", "HYDRA_FULL_ERROR": "1"}
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    run_dir = root / "runs" / f"{name}-{time.strftime('%H%M%S')}"
    started, cpu = time.time(), _child_cpu()
    proc = subprocess.run(
        [
            sys.executable,
            *SFT_RUN,
            f"paths.cache_dir={cache_dir}",
            f"hydra.run.dir={run_dir}",
            *overrides,
        ],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
    )
    wall, cpu = time.time() - started, _child_cpu() - cpu
    if proc.returncode != 0:
        raise RuntimeError(f"the SFT run in {repo} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    metrics = json.loads((run_dir / "sft_metrics.json").read_text())
    found = re.findall(r"'train_runtime': '?([0-9.]+)", proc.stdout + proc.stderr)
    trainer = float(found[-1]) if found else float("nan")
    stamps = _stamps(run_dir / "cli.log")
    agreed = (stamps["agreed"] - stamps["start"]).total_seconds() if len(stamps) == 2 else float("nan")
    steps = int(metrics["global_step"])
    return {
        "name": name,
        "repo": str(repo),
        "commit": _git_commit(repo),
        "threads": threads or "default",
        "seconds": round(wall, 1),
        "cpu_seconds": round(cpu, 1),
        "stage_seconds": metrics.get("seconds"),
        "trainer_seconds": round(trainer, 1),
        "agreement_seconds": round(agreed - float(metrics["train_seconds"]), 1),
        "eval_seconds": round(float(metrics.get("seconds", float("nan"))) - agreed, 1),
        "steps": steps,
        "tokens_per_s": round(steps * batch * tokens_per_example / trainer, 1),
        "valid_loss": metrics["valid_loss"],
        "train_loss": metrics["train_loss"],
        "parse_rate": metrics["parse_rate"],
        "action_agreement": metrics["action_agreement"],
        "eval_parse_rate": (metrics.get("eval") or {}).get("parse_rate"),
        "run_dir": str(run_dir),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, help="where caches and runs go (default: a temporary directory)")
    parser.add_argument("--repo", type=Path, default=ROOT, help="checkout to time (default: this one)")
    parser.add_argument("--compare", type=Path, help="a second checkout timed alternately with --repo")
    parser.add_argument("--repeats", type=int, default=1, help="runs per checkout")
    parser.add_argument(
        "--threads",
        type=int,
        help="OMP_NUM_THREADS of the runs (default: torch's choice); 1 makes "
        "CPU seconds a figure a busy machine hardly changes",
    )
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for every run, e.g. sft.max_steps=60")
    args = parser.parse_args()
    root = args.root or Path(tempfile.mkdtemp(prefix="sft_speed-"))
    root.mkdir(parents=True, exist_ok=True)
    sides = [("other", args.compare.resolve())] if args.compare else []
    sides.append(("this", args.repo.resolve()))
    caches = {name: root / f"cache-{name}" for name, _ in sides}
    for name, repo in sides:  # warm each cache: tiny build and data, outside the timed runs
        subprocess.run(
            [
                sys.executable,
                *SFT_RUN,
                f"paths.cache_dir={caches[name]}",
                f"hydra.run.dir={root / 'runs' / ('warm-' + name)}",
                "sft.max_steps=1",
                "sft.max_examples=16",
                "sft.max_valid_examples=4",
                "sft.agreement_examples=0",
                "sft.evaluate=false",
            ],
            cwd=repo,
            capture_output=True,
            check=True,
            env={**os.environ, "WANDB_MODE": "disabled"},
        )
    tokens, batch = mean_tokens(caches["this"], args.overrides)
    runs = []
    for i in range(args.repeats):
        for name, repo in sides:
            run = run_once(repo, root, caches[name], args.overrides, tokens, batch, name, args.threads)
            runs.append(run)
            print(
                f"{name} ({run['commit']}) run {i + 1}: {run['seconds']:.0f} s wall ({run['cpu_seconds']:.0f} s CPU), "
                f"Trainer {run['trainer_seconds']:.0f} s "
                f"({run['tokens_per_s']:.0f} tokens/s), agreement {run['agreement_seconds']:.0f} s, eval "
                f"{run['eval_seconds']:.0f} s; valid loss {run['valid_loss']:.4f}, parse rate {run['parse_rate']}, "
                f"agreement {run['action_agreement']}",
                file=sys.stderr,
                flush=True,
            )
    result: dict = {"overrides": args.overrides, "runs": runs}
    if args.compare:
        ratios: dict[str, list[float]] = {}
        for other, this in zip(runs[0::2], runs[1::2]):
            for key in ("seconds", "cpu_seconds", "trainer_seconds", "agreement_seconds", "eval_seconds"):
                if other[key] and other[key] == other[key]:
                    ratios.setdefault(key, []).append(round(this[key] / other[key], 3))
        result["ratios"] = {k: {"pairs": v, "median": statistics.median(v)} for k, v in ratios.items()}
        for key, value in result["ratios"].items():
            print(f"this / other, {key}: {value['pairs']} (median {value['median']})", file=sys.stderr)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
