"""Evidence that SEPO learns: the SFT'd tiny IPD model before and after a short SEPO run.

Runs the main job (`stage=pipeline`, tiny model, IPD) into a scratch root, or reuses one, and
compares the SFT evaluation with the last SEPO checkpoint's. Both are evaluated by the same code
on the same seeds (`seed`), so the difference is the training. Prints a JSON object last:
{"sft": {...}, "sepo": {...}, "delta_exploit", "delta_safety", "seconds", "run_dir"}.

    python benchmarks/sepo_tiny_ipd.py                        # defaults below, in a temp dir
    python benchmarks/sepo_tiny_ipd.py --root /tmp/ev sepo.steps=40 sepo.lr=1e-3
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

ROOT = Path(__file__).resolve().parent.parent
#: a short run that still moves a tiny model: more steps and a larger lr than the paper's 4B models
DEFAULTS = ["sepo.steps=30", "sepo.checkpoint_steps=[10,20]", "sepo.lr=1e-3", "eval.episodes_per_opponent=20"]
KEYS = ("pay", "exploit", "exploit_max", "collusion", "ext", "robust", "safety", "nra", "parse_rate")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", default=None, help="output root (default: a temporary directory)")
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides (they win over the defaults)")
    args = parser.parse_args()
    root = Path(args.root or tempfile.mkdtemp(prefix="sepo_ev_"))
    started = time.time()
    command = [sys.executable, str(ROOT / "main.py"), "stage=pipeline", "model=tiny", "game=ipd", "logger=none",
               f"paths.root_dir={root}", *DEFAULTS, *args.overrides]
    subprocess.run(command, cwd=ROOT, check=True, env={**os.environ, "HYDRA_FULL_ERROR": "1"})
    (run,) = {p.parent for p in (root / "outputs").rglob("DONE") if (p.parent / "sepo").is_dir()}
    sft = json.loads((run / "sft" / "eval" / "sft" / "results.json").read_text())
    final = max((run / "sepo" / "eval").glob("step_*/results.json"), key=lambda p: int(p.parent.name[5:]))
    sepo = json.loads(final.read_text())

    def view(r: dict) -> dict:
        return {k: {"mean": round(r["metrics"][k], 4), "se": round(r["se"][k], 4)} for k in KEYS} | {"step": r["step"]}

    print(json.dumps({
        "sft": view(sft), "sepo": view(sepo),
        "delta_exploit": round(sepo["metrics"]["exploit"] - sft["metrics"]["exploit"], 4),
        "delta_safety": round(sepo["metrics"]["safety"] - sft["metrics"]["safety"], 4),
        "seconds": round(time.time() - started, 1), "run_dir": str(run),
    }))


if __name__ == "__main__":
    main()
