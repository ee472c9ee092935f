"""SEPO's best responders answer a read already made of the same policy instead of reading it again."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from sepo.games.kuhn import exact as K
from sepo.games.kuhn.exact import INFOSETS

from .conftest import run_dirs

#: SEPO on tiny Kuhn poker for one step: the best responders are due at step 0 and at the final checkpoint
KUHN_ONE_STEP = [
    "stage=sepo",
    "model=tiny",
    "game=kuhn",
    "logger=none",
    "sepo.steps=1",
    "sepo.best_response_every=1",
    "sepo.rollouts_per_opponent=2",
    "sepo.max_new_tokens=4",
    "eval.max_new_tokens=4",
    "eval.episodes_per_opponent=2",
    "eval.action_samples=2",
    "eval.temperature=0.8",
    "eval.progress=false",
    "sepo.best_response_samples=2",
]

#: what the SFT run "read": bet with every card, call a bet with the king alone
BET_ALL_CALL_KING = {key: 1.0 if key[1:] in ("", "p") or key[0] == "2" else 0.0 for key in INFOSETS}


@pytest.mark.parametrize("temperature, answered", [(0.8, True), pytest.param(0.7, False, marks=pytest.mark.slow)])
def test_best_responders_answer_the_sft_and_checkpoint_reads_made_alike(cli, tmp_path, tiny_dir, temperature, answered):
    """Step 0 plays the SFT model, whose SFT run read its table (here a table written beside a copy of
    tiny), and the final checkpoint's test evaluation has just read the policy: where those reads were made
    as the responders' own refresh would be (as many answers a state, the same temperature and budget), the
    responders answer them, and the checkpoint saves the answered read, so a resume answers it too; at
    another sampling temperature they read the policy themselves."""
    sft = tmp_path / "sft"
    shutil.copytree(tiny_dir, sft / "merged")
    read = {"bet_or_call": BET_ALL_CALL_KING, "se": dict.fromkeys(INFOSETS, 0.0), "samples_per_state": 2}
    read |= {"rao_blackwellised": 1.0, "temperature": 0.8, "max_new_tokens": 4}
    (sft / "eval" / "sft").mkdir(parents=True)
    (sft / "eval" / "sft" / "results.json").write_text(
        json.dumps({"game": "kuhn", "stage": "sft", "played_table": read})
    )
    proc = cli(
        *KUHN_ONE_STEP,
        f"sepo.temperature={temperature}",
        f"model.path={sft / 'merged'}",
        f"paths.root_dir={tmp_path}",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    log = proc.stdout + proc.stderr
    assert ("step 0  best response answers the SFT evaluation's test read" in log) is answered
    table = {k: np.array([1 - p, p]) for k, p in BET_ALL_CALL_KING.items()}
    assert (f"exploit_exact {K.exploitability(table):.3f} ± 0.000" in log) is answered  # the written table's
    assert ("step 0  best response re-read" in log) is not answered
    assert ("step 1  best response answers the checkpoint's test read" in log) is answered
    (run,) = run_dirs(tmp_path, "DONE")
    saved = json.loads((run / "checkpoints" / "step_1" / "best_response.json").read_text())
    if answered:
        assert saved["step"] == 1
        test_read = json.loads((run / "eval" / "step_1" / "results.json").read_text())["played_table"]
        assert all(abs(saved["table"][k][1] - p) < 1e-6 for k, p in test_read["bet_or_call"].items())
        assert test_read["temperature"] == 0.8 and test_read["max_new_tokens"] == 4  # what the guard compares
    else:  # its own read at step 0, on the policy as it then played: not the SFT run's table
        assert saved["step"] == 0
        assert {k: p[1] for k, p in saved["table"].items()} != BET_ALL_CALL_KING
