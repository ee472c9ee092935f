"""Damaged inputs are caught before use, divergence stops a run, and each of these is one line, not a
traceback: the probes of "no silent wrong numbers" as regression tests."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sepo.builders import load_model_and_tokenizer
from sepo.builders.cache import BUILD_INFO
from sepo.builders.tiny import build_tiny
from sepo.errors import InputError
from sepo.models import ModelLoadError
from sepo.training.sft_dataset import ensure_dataset, read_examples

from .conftest import model_cfg

pytestmark = pytest.mark.usefixtures("offline", "one_thread")
ROOT = Path(__file__).resolve().parent.parent

#: a tiny SFT / SEPO run that takes seconds
QUICK_SFT = [
    "stage=sft",
    "model=tiny",
    "logger=none",
    "datagen.episodes_per_opponent=2",
    "sft.max_examples=32",
    "sft.max_valid_examples=16",
    "sft.per_device_batch_size=4",
    "sft.max_steps=3",
    "sft.agreement_examples=4",
    "sft.agreement_max_new_tokens=8",
    "eval.episodes_per_opponent=2",
    "eval.max_new_tokens=8",
    "eval.progress=false",
]


def one_line_error(proc: subprocess.CompletedProcess) -> str:
    lines = [line for line in proc.stderr.strip().splitlines() if line.startswith(("error:", "Traceback"))]
    assert len(lines) == 1, proc.stderr[-3000:]
    assert lines[0].startswith("error: "), proc.stderr[-3000:]
    return lines[0]


def test_a_cut_dataset_is_generated_again_from_its_manifest(compose_cfg, tmp_path):
    """The probe: train.jsonl cut to 100 lines used to train on those 100 examples."""
    cfg = compose_cfg("datagen.episodes_per_opponent=2")
    ds = ensure_dataset(cfg, "kuhn", tmp_path / "data")
    whole = (ds / "train.jsonl").read_bytes()
    (ds / "train.jsonl").write_bytes(b"".join(whole.splitlines(keepends=True)[:100]))
    assert ensure_dataset(cfg, "kuhn", tmp_path / "data") == ds
    assert (ds / "train.jsonl").read_bytes() == whole  # generated again, byte for byte
    assert [p.name for p in (tmp_path / "data").iterdir()] == ["kuhn"]  # the damaged copy is gone


@pytest.mark.parametrize(
    "lines, expected",
    [
        (
            [
                '{"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}], "game": "ipd"}',
                "{oops",
            ],
            ":2: not JSON",
        ),
        (['{"foo": 1}'], ':1: no "messages" list'),
        (["[1, 2]"], ":1: a JSON list, not an object"),
        (
            ['{"messages": [{"role": "user", "content": "x"}, {"role": "user", "content": "y"}], "game": "ipd"}'],
            "the assistant's",
        ),
        ([], "holds no examples"),
    ],
)
def test_a_malformed_dataset_line_is_named_by_file_and_line(tmp_path, lines, expected):
    path = tmp_path / "train.jsonl"
    path.write_text("\n".join(lines) + ("\n" if lines else ""))
    with pytest.raises(InputError, match="allowed: one JSON object per line") as err:
        read_examples(path)
    assert str(path) in str(err.value)
    assert expected in str(err.value)


def test_a_checkpoint_whose_weights_do_not_cover_its_config_is_refused(tiny_dir, tmp_path):
    """The probe: a config naming two more layers than its weights loaded them as random layers."""
    ckpt = tmp_path / "ckpt"
    subprocess.run(["cp", "-r", str(tiny_dir), str(ckpt)], check=True)
    config = json.loads((ckpt / "config.json").read_text())
    config["num_hidden_layers"] += 2
    config.get("layer_types", []).extend(config.get("layer_types", [])[:2])
    (ckpt / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match=r"lacks \d+ weights its config names \(e\.g\. model\.layers\.4\."):
        load_model_and_tokenizer(model_cfg("tiny", path=str(ckpt)), tmp_path, device="cpu")


def test_a_damaged_tiny_build_is_rebuilt(tmp_path):
    """The probe: truncated weights or a deleted tokenizer file failed every tiny run with a traceback."""
    out = build_tiny(model_cfg("tiny"), tmp_path)
    weights = (out / "model.safetensors").read_bytes()
    (out / "model.safetensors").write_bytes(weights[: len(weights) // 2])
    assert build_tiny(model_cfg("tiny"), tmp_path) == out
    assert (out / "model.safetensors").read_bytes() == weights  # the build is deterministic
    (out / "tokenizer.json").unlink()
    build_tiny(model_cfg("tiny"), tmp_path)
    assert (out / "tokenizer.json").exists()
    assert json.loads((out / BUILD_INFO).read_text())["files"]
    load_model_and_tokenizer(model_cfg("tiny"), tmp_path, device="cpu")


@pytest.mark.parametrize("stage", ["sft", "sepo"])
def test_divergence_stops_the_run_at_its_step(cli, tmp_path, stage):
    """The probes: `sft.lr=1e30` and `sepo.lr=1e30` ran on into NaN models and 70-line crashes."""
    if stage == "sft":
        args = [*QUICK_SFT, "sft.lr=1e30"]
    else:
        tiny = build_tiny(model_cfg("tiny"), tmp_path / "cache")
        args = [
            "stage=sepo",
            "model=tiny",
            f"model.path={tiny}",
            "logger=none",
            "sepo.lr=1e30",
            "sepo.trust_region_kl=0",  # tiny's trust region would undo every such step, and nothing diverges
            "sepo.steps=3",
            "sepo.rollouts_per_opponent=2",
            "sepo.max_new_tokens=8",
            "eval.episodes_per_opponent=2",
            "eval.max_new_tokens=8",
            "eval.progress=false",
        ]
    run = tmp_path / "run"
    proc = cli(*args, f"hydra.run.dir={run}", f"paths.cache_dir={tmp_path / 'cache'}")
    assert proc.returncode == 1
    line = one_line_error(proc)
    assert "diverged at step " in line
    assert "FAILED" in line
    assert (run / "FAILED").read_text().startswith("Diverged: diverged at step ")
    assert not (run / "DONE").exists()


@pytest.mark.parametrize(
    "override, key",
    [
        ("eval.temperature=1e-300", "eval.temperature=1e-300"),
        ("eval.episodes_per_opponent=100000000", "at most about"),
        ("paths.cache_dir=/proc/sepo_cache", "the tiny model is built there on first use, and it cannot be written"),
    ],
)
def test_values_that_cannot_work_are_refused_up_front(cli, tmp_path, override, key):
    model = "model=tiny" if "cache_dir" in override else "model=scripted"
    proc = cli("stage=eval", model, "logger=none", override)
    assert proc.returncode == 2
    assert key in one_line_error(proc)
    assert not (tmp_path / "outputs").exists() or not any((tmp_path / "outputs").rglob("*.json"))


def test_analysis_skips_another_projects_results_and_says_so_in_one_line(tmp_path):
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "results.json").write_text(json.dumps([{"accuracy": 0.9}]))
    proc = subprocess.run(
        [sys.executable, "-m", "analysis.tables", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2
    assert "no results.json" in one_line_error(proc)
