"""`pip install .` (not editable) gives a `sepo` command that runs from any directory (issue 11).

The wheel is built from this checkout and installed without its dependencies into a fresh venv
whose only other path is this interpreter's site-packages (for torch, hydra, ... already here):
the `sepo` it imports must be the installed copy, configs included, not the checkout.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from .conftest import SMALL

ROOT = Path(__file__).resolve().parent.parent


def run(args: list, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, **kwargs)


def _has_setuptools(major: int) -> bool:
    try:
        import setuptools
    except ImportError:
        return False
    return int(setuptools.__version__.split(".")[0]) >= major


def _checkout_files(top: Path, pattern: str) -> list[Path]:
    return [p for p in top.rglob(pattern) if "__pycache__" not in p.parts]


def shipped_from_checkout(root: Path = ROOT) -> list[str]:
    """The wheel paths every checkout file meant for it gets: every module of sepo/, analysis/ and the
    launcher plugin, found on disk (a subpackage added later counts without anyone listing it), and
    every config but the per-machine ones, under sepo/conf/."""
    modules = [p for top in ("sepo", "analysis", "hydra_plugins") for p in _checkout_files(root / top, "*.py")]
    configs = [p for p in _checkout_files(root / "conf", "*.yaml") if p.relative_to(root / "conf").parts[0] != "local"]
    return [p.relative_to(root).as_posix() for p in modules] + [
        "sepo/conf/" + p.relative_to(root / "conf").as_posix() for p in configs
    ]


def clean_copy(dest: Path) -> Path:
    """The files of a fresh clone (tracked, and new ones git does not ignore). A wheel built in the
    checkout itself also packs what an earlier build left in build/lib/, which once hid a module
    the package list left out."""
    listed = run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=ROOT)
    assert listed.returncode == 0, listed.stderr
    for name in filter(None, listed.stdout.split("\0")):
        if (ROOT / name).is_file():  # a tracked file deleted in the working tree is not
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dest / name)
    return dest


def outside_the_checkout() -> dict[str, str]:
    """The environment of a user who installed the wheel: nothing points at this checkout."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PROJECT_ROOT")} | {"WANDB_MODE": "offline"}


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A fresh venv with the wheel installed; returns its bin directory."""
    tmp = tmp_path_factory.mktemp("wheel")
    source = clean_copy(tmp / "source")
    (source / "conf" / "local").mkdir(exist_ok=True)
    (source / "conf" / "local" / "this_machine.yaml").write_text("# per-machine settings\n")
    # build offline with this venv's setuptools when it has a recent one (else pip fetches it)
    offline = ["--no-build-isolation"] if _has_setuptools(68) else []
    built = run([sys.executable, "-m", "pip", "wheel", "--no-deps", *offline, "-w", tmp / "dist", source], cwd=tmp)
    assert built.returncode == 0, built.stderr[-2000:]
    wheel = next((tmp / "dist").glob("sepo-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = sorted(set(shipped_from_checkout(source)) - names)
    assert not missing, f"the wheel lacks {len(missing)} files of the checkout, e.g. {missing[:5]}"
    # the local launcher travels with it: Hydra finds launchers only under hydra_plugins/
    assert "hydra_plugins/sepo_launcher/process_launcher.py" in names
    assert "sepo/conf/hydra/launcher/processes.yaml" in names
    assert not any(n.startswith("sepo/conf/local/") for n in names)
    # nothing else: not tests/, benchmarks/, launch/, main.py or setup.py
    tops = {n.split("/")[0] for n in names}
    assert {top for top in tops if not top.endswith(".dist-info")} == {"sepo", "analysis", "hydra_plugins"}

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
    env = outside_the_checkout()
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
    env = outside_the_checkout()
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


def test_what_the_wheel_must_ship_is_found_on_disk():
    """`pip install .` once shipped no sepo/lm (a hand-written package list had left it out), and every
    language-model run failed with `No module named 'sepo.lm'`. The `installed` fixture checks the wheel
    against this list, which is read from the checkout's tree, so it holds every subpackage."""
    names = shipped_from_checkout()
    assert "sepo/lm/decoding.py" in names
    assert "sepo/builders/tiny.py" in names
    assert "sepo/__main__.py" in names
    assert "sepo/conf/model/tiny.yaml" in names
    assert not any(n.startswith("sepo/conf/local/") for n in names)


def test_the_installed_wheel_runs_a_language_model(installed, tmp_path):
    """The tiny model is built on first use from the installed package (its tokenizer corpus from the
    installed configs) and plays one evaluation episode per opponent, with 8-token answers."""
    done = run(
        [
            installed / "sepo",
            "stage=eval",
            "game=ipd",
            "model=tiny",
            "logger=none",
            "eval.episodes_per_opponent=1",
            "eval.max_new_tokens=8",
            "eval.progress=false",
            f"paths.root_dir={tmp_path}",
        ],
        cwd=tmp_path,
        env=outside_the_checkout(),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (results,) = tmp_path.glob("outputs/runs/*/seed_42/results.json")
    assert (results.parent / "DONE").exists()
    parse_rate = json.loads(results.read_text())["metrics"]["parse_rate"]
    assert isinstance(parse_rate, float) and 0.0 <= parse_rate <= 1.0
    assert list((tmp_path / ".cache").glob("tiny-*/model.safetensors")), "built into paths.cache_dir"


def test_the_installed_wheel_trains_a_sepo_step(installed, tmp_path):
    """One SEPO step of the tiny model from the installed package: rollouts, the update, a checkpoint and its
    evaluation all run from the wheel's modules (sepo/training, sepo/lm) and configs."""
    done = run(
        [installed / "sepo", *SMALL, "sepo.steps=1", "logger=none", f"paths.root_dir={tmp_path}"],
        cwd=tmp_path,
        env=outside_the_checkout(),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (run_dir,) = [p.parent for p in tmp_path.glob("outputs/runs/*/seed_42/DONE")]
    assert json.loads((run_dir / "DONE").read_text())["stage"] == "sepo"
    assert (run_dir / "eval" / "step_1" / "results.json").is_file()
    assert (run_dir / "adapter" / "adapter_model.safetensors").is_file()


SCRIPTED_EVAL = [
    "stage=eval",
    "model=scripted",
    "model.strategy=TFT",
    "game=ipd",
    "logger=none",
    "eval.episodes_per_opponent=1",
    "eval.progress=false",
]


def _python_m_runs_the_cli(installed: Path, module: str, root: Path) -> None:
    """`python -m <module>` behaves as the `sepo` command: one run dir marked DONE, and the same
    one-line refusal (exit 2) for an unknown game."""
    env = outside_the_checkout()
    done = run([installed / "python", "-m", module, *SCRIPTED_EVAL, f"paths.root_dir={root}"], cwd=root, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    (results,) = root.glob("outputs/runs/*/seed_42/results.json")
    assert (results.parent / "DONE").exists()
    refused = run([installed / "python", "-m", module, "game=chess"], cwd=root, env=env)
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines() == [
        "error: game=chess is not a known game; allowed: auction, chicken, ipd, kuhn, neg_v1, neg_v2"
    ]


def test_python_m_sepo_runs_the_command(installed, tmp_path):
    _python_m_runs_the_cli(installed, "sepo", tmp_path)


def test_python_m_sepo_cli_runs_the_command(installed, tmp_path):
    """`python -m sepo.run.cli ...` used to exit 0 having done nothing."""
    _python_m_runs_the_cli(installed, "sepo.run.cli", tmp_path)
