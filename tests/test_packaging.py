"""`pip install .` (not editable) gives a `sepo` command that runs from any directory (issue 11).

The wheel is built from this checkout and installed without its dependencies into a fresh venv
whose only other path is this interpreter's site-packages (for torch, hydra, ... already here):
the `sepo` it imports must be the installed copy, configs included, not the checkout.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def run(args: list, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, **kwargs)


def _has_setuptools(major: int) -> bool:
    try:
        import setuptools
    except ImportError:
        return False
    return int(setuptools.__version__.split(".")[0]) >= major


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A fresh venv with the wheel installed; returns its bin directory."""
    tmp = tmp_path_factory.mktemp("wheel")
    # build offline with this venv's setuptools when it has a recent one (else pip fetches it)
    offline = ["--no-build-isolation"] if _has_setuptools(68) else []
    built = run([sys.executable, "-m", "pip", "wheel", "--no-deps", *offline, "-w", tmp / "dist", ROOT], cwd=tmp)
    assert built.returncode == 0, built.stderr[-2000:]
    wheel = next((tmp / "dist").glob("sepo-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert "sepo/conf/config.yaml" in names
    assert "sepo/conf/game/kuhn.yaml" in names
    # the local launcher travels with it: Hydra finds launchers only under hydra_plugins/
    assert "hydra_plugins/sepo_launcher/process_launcher.py" in names
    assert "sepo/conf/hydra/launcher/processes.yaml" in names
    assert not any(n.startswith("sepo/conf/local/") for n in names)

    venv = tmp / "venv"
    made = run([sys.executable, "-m", "venv", "--without-pip", venv])
    assert made.returncode == 0, made.stderr
    bin_dir = venv / ("Scripts" if os.name == "nt" else "bin")
    done = run(
        [sys.executable, "-m", "pip", "--python", bin_dir / "python", "install", "--no-deps", "--no-index", wheel]
    )
    assert done.returncode == 0, done.stderr[-2000:]
    # the dependencies: this interpreter's site-packages, after the venv's own (a plain path entry, so
    # the checkout's editable-install hook there is not run)
    site = Path(
        run([bin_dir / "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
    )
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return bin_dir


def test_the_installed_command_runs_a_scripted_evaluation_from_any_directory(installed, tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PROJECT_ROOT")} | {"WANDB_MODE": "offline"}
    where = run([installed / "python", "-c", "import sepo.paths as p; print(p.CONF_DIR)"], cwd=tmp_path, env=env)
    assert where.returncode == 0, where.stderr
    assert Path(where.stdout.strip()).is_relative_to(installed.parent), where.stdout

    done = run(
        [
            installed / "sepo",
            "stage=eval",
            "model=scripted",
            "model.strategy=TFT",
            "game=ipd",
            "logger=none",
            "eval.episodes_per_opponent=2",
            "eval.progress=false",
            f"paths.root_dir={tmp_path}",
        ],
        cwd=tmp_path,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = list(tmp_path.glob("outputs/runs/*/seed_42/results.json"))
    assert len(results) == 1
    metrics = json.loads(results[0].read_text())["metrics"]
    assert metrics["collusion"] == 0.0  # TFT never defects on AlwaysC (docs/spec.md §3)


def test_a_users_own_config_directory_is_added_on_the_command_line(installed, tmp_path):
    """`--config-dir DIR` adds a group option the package does not ship (here a lambdas preset)."""
    own = tmp_path / "my_conf"
    (own / "lambdas").mkdir(parents=True)
    (own / "lambdas" / "harsh.yaml").write_text(
        "# my own weights\ntrain: {e: 10.0, c: 5.0, x: 1.0}\neval: {e: 2.4, c: 1.0, x: 1.8}\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PROJECT_ROOT")} | {"WANDB_MODE": "offline"}
    args = [
        "stage=eval",
        "model=scripted",
        "model.strategy=AlwaysD",
        "game=ipd",
        "logger=none",
        "lambdas=harsh",
        "eval.episodes_per_opponent=1",
        "eval.progress=false",
        f"paths.root_dir={tmp_path}",
    ]
    refused = run([installed / "sepo", *args], cwd=tmp_path, env=env)
    assert refused.returncode == 2
    assert "lambdas=harsh" in refused.stderr
    done = run([installed / "sepo", "--config-dir", own, *args], cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    config = next(tmp_path.glob("outputs/runs/*/seed_42/.hydra/config.yaml")).read_text()
    assert "e: 10.0" in config
    assert "c: 5.0" in config
    # a sweep through the installed local launcher: each job's process gets the same --config-dir
    sweep_args = [a.replace("model.strategy=AlwaysD", "model.strategy=AlwaysD,TFT") for a in args]
    swept = run([installed / "sepo", "--config-dir", own, "-m", "+launch=local", *sweep_args], cwd=tmp_path, env=env)
    assert swept.returncode == 0, swept.stderr[-3000:]
    assert "2 done, 0 failed" in swept.stdout, swept.stderr[-3000:]
