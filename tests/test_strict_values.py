"""Values that once ran to DONE, or ran code, where they should have been refused in one line.

- A boolean is true or false: `model.trust_remote_code='false'` once read as true (`bool("false")`) and ran
  the code a checkpoint ships; "no", "off" and 0 were read as false and "maybe" as true.
- A value that is only wrong for the model (its LoRA targets, attention kernel, positions) is refused before
  the run dir holds any settings, so the corrected command is not refused as "other settings".
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from sepo.run.cli import check_values

#: a checkpoint's own code: transformers imports it only with trust_remote_code=true (it leaves a mark)
REMOTE_CODE = """
import os
from pathlib import Path

Path(os.environ["SEPO_REMOTE_CODE_MARK"]).write_text("the checkpoint's code ran")

from transformers import Qwen3Config, Qwen3ForCausalLM


class ShippedConfig(Qwen3Config):
    pass


class ShippedModel(Qwen3ForCausalLM):
    config_class = ShippedConfig
"""


@pytest.fixture(scope="module")
def remote_code_checkpoint(tiny_dir, tmp_path_factory) -> Path:
    """The tiny model, with an auto_map pointing at code shipped beside its weights."""
    out = tmp_path_factory.mktemp("remote") / "checkpoint"
    shutil.copytree(tiny_dir, out)
    config = json.loads((out / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": "shipped.ShippedConfig", "AutoModelForCausalLM": "shipped.ShippedModel"}
    (out / "config.json").write_text(json.dumps(config))
    (out / "shipped.py").write_text(REMOTE_CODE)
    return out


#: every spelling a user might type for "no" (and one for "yes"), and what it must become
REFUSED = ["no", "off", "0", "n", "'no'", "yes", "on", "1", "maybe", "''"]
FALSE = ["false", "False", "FALSE", "'false'", '"False"']


@pytest.mark.parametrize("spelling", REFUSED + FALSE)
def test_a_boolean_is_true_or_false_or_refused(spelling):
    error = check_values(["stage=eval", "model=tiny", f"model.trust_remote_code={spelling}"])
    if spelling in FALSE:
        assert error is None
    else:
        assert error is not None and error.startswith("error: model.trust_remote_code="), error
        assert error.endswith("allowed: true or false"), error


def test_remote_code_runs_only_when_asked_with_true(cli, tmp_path, remote_code_checkpoint):
    """The issue's command, end to end, against a checkpoint that ships code: 'false' runs the model without
    the code, true runs the code (so this test can fail), and the refused spellings run nothing."""
    mark = tmp_path / "mark"
    env = {"SEPO_REMOTE_CODE_MARK": str(mark), "HF_HOME": str(tmp_path / "hf_home")}
    common = ["stage=eval", "game=ipd", "model=tiny", "eval.episodes_per_opponent=1", "eval.max_new_tokens=4"]
    common += ["logger=none", f"model.path={remote_code_checkpoint}"]

    refused = cli(*common, "model.trust_remote_code=no", env=env)
    assert refused.returncode == 2 and "allowed: true or false" in refused.stderr
    assert not mark.exists()

    plain = cli(*common, "model.trust_remote_code='false'", env=env)
    assert plain.returncode == 0, plain.stderr[-2000:]
    assert not mark.exists(), "trust_remote_code='false' ran the checkpoint's code"
    assert list((tmp_path / "outputs").rglob("DONE"))

    cli(*common, "model.trust_remote_code=true", env=env)
    assert mark.exists(), "the checkpoint's code should run with trust_remote_code=true: this test could not fail"


def test_a_value_refused_for_the_model_leaves_no_settings_behind(cli, tmp_path):
    """attn_implementation=foo was refused inside the stage, blaming model.path, after the run dir had recorded
    its settings: the corrected command was then refused as "an unfinished run with other settings"."""
    run_dir = tmp_path / "run"
    common = ["stage=eval", "game=ipd", "model=tiny", "eval.episodes_per_opponent=1", "eval.max_new_tokens=4"]
    common += ["logger=none", f"hydra.run.dir={run_dir}"]
    for bad, key in (
        ("model.attn_implementation=foo", "model.attn_implementation=foo"),
        ("model.lora.target_modules=nomatch", "model.lora.target_modules='nomatch'"),
        (f"model.path={tmp_path}", f"model.path={tmp_path}"),
    ):
        proc = cli(*common, bad, "stage=sepo" if "lora" in bad else "stage=eval")
        assert proc.returncode == 2, proc.stderr[-2000:]
        assert key in proc.stderr.strip().splitlines()[-1], proc.stderr[-2000:]
        assert not (run_dir / "run_settings.yaml").exists()
    fixed = cli(*common)
    assert fixed.returncode == 0, fixed.stderr[-2000:]
    assert (run_dir / "DONE").exists()


def test_a_value_refused_inside_the_stage_leaves_the_run_dir_as_it_was(cli, tmp_path, tiny_dir):
    """A checkpoint whose tokenizer has no chat template is refused when the stage loads it, after the run
    recorded its settings: the launch takes its records away with it, so the corrected command runs."""
    no_template = tmp_path / "no_template"
    shutil.copytree(tiny_dir, no_template)
    (no_template / "chat_template.jinja").unlink()
    run_dir = tmp_path / "run"
    common = ["stage=eval", "game=ipd", "model=tiny", "eval.episodes_per_opponent=1", "eval.max_new_tokens=4"]
    common += ["logger=none", f"hydra.run.dir={run_dir}"]
    refused = cli(*common, f"model.path={no_template}")
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert "has no chat template" in refused.stderr.strip().splitlines()[-1]
    assert not run_dir.exists(), sorted(p.name for p in run_dir.iterdir())
    fixed = cli(*common, f"model.path={tiny_dir}")
    assert fixed.returncode == 0, fixed.stderr[-2000:]
