"""Do N jobs launched in parallel finish no later than the same N run one after another?

    python -m benchmarks.speed.parallel_jobs [--jobs 2] [--root DIR] [--unshared]

Each job is a small SFT of the tiny model on IPD (640 examples, 40 steps, no evaluation), differing
only in `sft.seed`. The tiny build and the `multi` data are made first, outside the timings. Then:
  sequential  N `python main.py` runs one after another, each at torch's default threads;
  parallel    one `python main.py -m +launch=local hydra.launcher.n_jobs=N` sweep (sepo/run/threads.py:
              every job gets cores // N threads);
  unshared    (--unshared) N plain `python main.py` processes started at once at default threads,
              the oversubscription the launchers avoid (slow: about 10x on 2 cores).
OMP_NUM_THREADS is removed from every job's environment, so the launchers' own share is measured.
The last line is JSON: {"jobs", "cores", "sequential_s", "parallel_s", "ratio", "threads_per_job", ...};
target: ratio = parallel_s / sequential_s <= 1.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository
SMALL_SFT = [
    "stage=sft",
    "game=ipd",
    "model=tiny",
    "logger=none",
    "sft.max_examples=640",
    "sft.max_steps=40",
    "sft.evaluate=false",
    "sft.agreement_examples=0",
]
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


def environment(root: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in THREAD_VARS}
    return {**env, "PROJECT_ROOT": str(root), "WANDB_MODE": "disabled", "HYDRA_FULL_ERROR": "1"}


def main_py(root: Path, *args: str) -> subprocess.Popen:
    flags = [a for a in args if a.startswith("-")]  # Hydra's flags (-m) go before the overrides
    return subprocess.Popen(
        [sys.executable, str(ROOT / "main.py"), *flags, *SMALL_SFT, *[a for a in args if not a.startswith("-")]],
        cwd=ROOT,
        env=environment(root),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_all(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        _, err = proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError(f"a job failed (exit {proc.returncode}):\n{err[-3000:]}")


def timed(procs_factory) -> float:
    started = time.time()
    procs_factory()
    return round(time.time() - started, 1)


def threads_of(root: Path) -> list[int]:
    return [json.loads(p.read_text()).get("torch_threads") for p in sorted(root.rglob("launch_status.json"))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=2, help="jobs per arm (the sweep's n_jobs)")
    parser.add_argument("--root", type=Path, default=None, help="project root (default: a temporary directory)")
    parser.add_argument("--unshared", action="store_true", help="also time N processes at default threads at once")
    args = parser.parse_args()
    root = args.root or Path(tempfile.mkdtemp(prefix="sepo_parallel_"))
    seeds = [str(i) for i in range(args.jobs)]

    wait_all([main_py(root, "sft.max_steps=1", f"hydra.run.dir={root}/warmup")])  # tiny build + data, untimed
    sequential = timed(
        lambda: [wait_all([main_py(root, f"sft.seed={s}", f"hydra.run.dir={root}/seq/{s}")]) for s in seeds]
    )
    parallel = timed(
        lambda: wait_all(
            [
                main_py(
                    root,
                    "-m",
                    "+launch=local",
                    f"hydra.launcher.n_jobs={args.jobs}",
                    f"sft.seed={','.join(seeds)}",
                    "sweep_name=parallel",
                )
            ]
        )
    )
    result = {
        "jobs": args.jobs,
        "cores": os.cpu_count(),
        "sequential_s": sequential,
        "parallel_s": parallel,
        "ratio": round(parallel / sequential, 3),
        "threads_per_job": threads_of(root / "outputs" / "sweeps" / "parallel"),
    }
    if args.unshared:
        result["unshared_s"] = timed(
            lambda: wait_all([main_py(root, f"sft.seed={s}", f"hydra.run.dir={root}/uns/{s}") for s in seeds])
        )
        result["unshared_ratio"] = round(result["unshared_s"] / sequential, 3)
    print(
        f"{args.jobs} jobs on {os.cpu_count()} cores: one after another {sequential:.1f} s, "
        f"in parallel (+launch=local) {parallel:.1f} s, ratio {result['ratio']:.2f} (target <= 1)"
        + (f"; unshared {result['unshared_s']:.1f} s ({result['unshared_ratio']:.1f}x)" if args.unshared else "")
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
