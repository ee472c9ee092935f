"""The next GPU session's one command, `bash benchmarks/gpu/session.sh graphs`, rehearsed on a CPU with tiny
random models (slow: about a minute). A GPU session has minutes of device time and one call is all it can
afford to lose, so every step of the command must run here first: the graph-decode benchmark of each model
(Qwen with both recurrent steps), the tests, a saved checkpoint and `main.py stage=eval` in both arms."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from .conftest import ROOT

pytestmark = pytest.mark.slow


def test_the_graphs_part_runs_every_step(tmp_path):
    env = {
        **os.environ,
        "OUT": str(tmp_path / "out"),
        "WHEELS": "none",
        "SAVE_ARGS": "--tiny --device cpu",
        "GRAPH_ARGS": "--tiny --device cpu --prompt-tokens 20 --steps 3",
        "GRAPH_BATCHES": "2",
        "GRAPH_EVALS": "gemma4",
        "EVAL_S": "300",
        "OMP_NUM_THREADS": "1",
    }
    # the session writes its checkpoints and runs under /tmp/sepo_*: a fresh place for them
    script = (ROOT / "benchmarks" / "gpu" / "session.sh").read_text()
    script = script.replace("/tmp/sepo_", f"{tmp_path}/sepo_")
    (tmp_path / "session.sh").write_text(script)
    proc = subprocess.run(
        ["bash", str(tmp_path / "session.sh"), "graphs"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900
    )
    log = (tmp_path / "out" / "session.log").read_text()
    assert proc.returncode == 0, proc.stderr[-2000:]
    ends = [line for line in log.splitlines() if "] end " in line]
    assert len(ends) == 7 and all(": rc 0 after" in line for line in ends), ends
    lean = {}
    for name in ("gemma4", "qwen", "qwen-reference"):
        report = json.loads((tmp_path / "out" / f"graph-decode-{name}.jsonl").read_text().splitlines()[-1])
        assert all(row["eager"]["ms_per_step"] > 0 for row in report["batches"]), report
        lean[name] = report["lean_delta_decode"]
    assert lean == {"gemma4": False, "qwen": True, "qwen-reference": False}
    for arm in ("dynamic", "graphs"):
        result = json.loads((tmp_path / "out" / f"eval_gemma4_{arm}.json").read_text())
        assert result["episodes"] > 0
