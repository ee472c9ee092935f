"""Shared fixtures: compose the real config tree, run the real CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

import sepo.cli  # noqa: F401  (registers the run_name resolver)

ROOT = Path(__file__).resolve().parent.parent
CONF = ROOT / "conf"


@pytest.fixture
def compose_cfg(tmp_path):
    """compose_cfg(*overrides) -> the composed DictConfig, writing into tmp_path."""

    def _compose(*overrides: str):
        with initialize_config_dir(str(CONF), version_base="1.3"):
            return compose("config", overrides=[f"paths.output_dir={tmp_path}", f"paths.root_dir={tmp_path}",
                                                "logger=none", *overrides])

    return _compose


@pytest.fixture
def cli(tmp_path):
    """cli(*args) -> CompletedProcess of `python main.py args` with outputs under tmp_path."""

    def _run(*args: str, timeout: int = 600, env: dict[str, str | None] | None = None) -> subprocess.CompletedProcess:
        """`env`: variables to set for this run (None unsets one)."""
        env = {**os.environ, "PROJECT_ROOT": str(tmp_path), "WANDB_MODE": "offline", "HYDRA_FULL_ERROR": "0",
               **(env or {})}
        env = {k: v for k, v in env.items() if v is not None}
        return subprocess.run([sys.executable, str(ROOT / "main.py"), *args], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=timeout)

    return _run


def run_dirs(root: Path, marker: str = "results.json") -> list[Path]:
    return sorted(p.parent for p in (root / "outputs").rglob(marker))


def read_results(root: Path) -> dict:
    (path,) = [p for p in (root / "outputs").rglob("results.json")]
    return json.loads(path.read_text())
