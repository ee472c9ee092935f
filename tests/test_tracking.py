"""W&B offline: a short stage logs its metrics, config and tags, and they read back from the run dir."""

from __future__ import annotations

import json
import subprocess

import pytest

from .conftest import run_dirs, wandb_cli


def test_offline_run_records_metrics_config_and_tags(cli, tmp_path):
    proc = cli("stage=eval", "model=scripted", "logger=wandb", "logger.mode=offline", "eval.episodes_per_opponent=4")
    assert proc.returncode == 0, proc.stderr
    (run,) = run_dirs(tmp_path)
    (wandb_dir,) = list((run / "wandb").glob("offline-run-*"))
    out = subprocess.run(
        [wandb_cli(), "leet", "inspect", "--summary", "--json", str(wandb_dir)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    record = json.loads(out)
    results = json.loads((run / "results.json").read_text())
    assert record["state"] == "finished"
    assert record["name"] == "eval-ipd-scripted-s42"
    assert set(record["tags"]) == {"game:ipd", "model:scripted", "stage:eval"}
    assert record["summary"]["eval/exploit"] == pytest.approx(results["metrics"]["exploit"])
    assert record["summary"]["eval/safety"] == pytest.approx(results["metrics"]["safety"])
    assert "lambdas" in json.dumps(record["config"])
