"""Evidence that the SFT stage learns: the default SFT of the tiny model on IPD, end to end.

    python -m benchmarks.speed.sft_tiny_ipd [--keep DIR]

Runs `python main.py stage=sft game=ipd model=tiny logger=none` in a temporary project root (tiny
build, `multi` data generated on demand, training with the tiny model's own SFT defaults (conf/sft/model/tiny.yaml), the
merged model's action agreement on the validation split, and the evaluation against IPD's pools),
then prints the run's figures; the last line is JSON:
{"parse_rate", "action_agreement", "valid_loss", "seconds", ...}. Targets: parse rate >= 0.95 and
action agreement >= 0.80 (tests/test_sft.py runs the same check as a `slow` test).
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


def run_benchmark(root: Path, extra: list[str] | None = None) -> dict:
    """Run the default tiny SFT on IPD under `root`; return its figures (raises if the run fails)."""
    root = Path(root)
    env = {**os.environ, "PROJECT_ROOT": str(root), "WANDB_MODE": "disabled", "HYDRA_FULL_ERROR": "1"}
    started = time.time()
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "main.py"),
            "stage=sft",
            "game=ipd",
            "model=tiny",
            "logger=none",
            "eval.progress=false",
            *(extra or []),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    seconds = time.time() - started
    if proc.returncode != 0:
        raise RuntimeError(f"the SFT run failed (exit {proc.returncode}):\n{proc.stderr[-5000:]}")
    (run,) = [p.parent for p in (root / "outputs").rglob("sft_metrics.json")]
    metrics = json.loads((run / "sft_metrics.json").read_text())
    return {
        "parse_rate": metrics["parse_rate"],
        "action_agreement": metrics["action_agreement"],
        "valid_loss": metrics["valid_loss"],
        "seconds": round(seconds, 1),
        "train_seconds": metrics["train_seconds"],
        "train_examples": metrics["train_examples"],
        "steps": metrics["global_step"],
        "agreement_examples": metrics["agreement"]["examples"],
        "per_game": {
            g: {"parse_rate": round(v["parse_rate"], 3), "action_agreement": round(v["action_agreement"], 3)}
            for g, v in metrics["agreement"]["per_game"].items()
        },
        "eval_parse_rate": (metrics.get("eval") or {}).get("parse_rate"),
        "eval_pay": (metrics.get("eval") or {}).get("pay"),
        "run_dir": str(run),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", type=Path, help="project root to keep the run in (default: a temporary directory)")
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides, e.g. sft.epochs=1")
    args = parser.parse_args()
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
        figures = run_benchmark(args.keep, args.overrides)
    else:
        with tempfile.TemporaryDirectory(prefix="sft_tiny_ipd-") as tmp:
            figures = run_benchmark(Path(tmp), args.overrides)
            figures.pop("run_dir")
    ok = figures["parse_rate"] >= 0.95 and figures["action_agreement"] >= 0.80
    print(
        f"tiny SFT on IPD: parse rate {figures['parse_rate']:.3f} (target >= 0.95), action agreement "
        f"{figures['action_agreement']:.3f} (target >= 0.80), valid loss {figures['valid_loss']:.4f}, "
        f"{figures['seconds']:.0f} s -> {'OK' if ok else 'BELOW TARGET'}",
        file=sys.stderr,
    )
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
