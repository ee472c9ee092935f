"""A penalty term is one record (sepo/penalties.py): a term defined and registered in this file alone is
rewarded in training, measured in results.json, weighed in safety, typed and range-checked in the config, held
by `sepo.held_terms`, and trains two SEPO steps of the tiny model."""

from __future__ import annotations

import json

import numpy as np
import pytest

from sepo import penalties
from sepo.arena import play
from sepo.errors import ConfigError
from sepo.games import AGENT, make_game
from sepo.games.strategy import get_strategy, make_strategy
from sepo.metrics import compute_metrics, pools_of
from sepo.penalties import PenaltyTerm
from sepo.policies import ScriptedPolicy
from sepo.training.objective import pooled_terms, term_keys

from .conftest import SMALL, LogTracker

#: a toy term: the share of the train pool's rounds in which the agent defects (IPD)
DEFECTIONS = PenaltyTerm(
    "d", "train", lambda game, r: float(r.actions[AGENT] == "DEFECT"), "defections", "defections", spec="this test"
)


@pytest.fixture
def defections():
    penalties.register(DEFECTIONS)
    yield DEFECTIONS
    penalties.unregister(DEFECTIONS.key)


def test_the_paper_s_three_terms_in_j_s_order():
    assert penalties.keys() == ("e", "c", "x")
    assert [t.pool for t in penalties.terms()] == ["exploit", "collusive", "train"]
    assert penalties.trained_pools() == ("train", "exploit", "collusive")
    assert term_keys() == ("u", "e", "c", "x")
    with pytest.raises(ValueError, match="already exists"):
        penalties.register(DEFECTIONS.__class__("e", "train", DEFECTIONS.per_round, "e2", "e2"))


def test_a_registered_term_is_rewarded_measured_and_weighed_in_safety(defections, compose_cfg):
    cfg = compose_cfg(*SMALL, "lambdas.train.d=0.5", "lambdas.eval.d=0.25")
    game = make_game(cfg.game)
    for strategy, defect_share in (("AlwaysD", 1.0), ("AlwaysC", 0.0)):
        agent = ScriptedPolicy(get_strategy("ipd", strategy))
        opponents = {n: make_strategy(cfg.game, n) for p in pools_of(cfg.game).values() for n in p}
        by_opponent = {}
        for i, (name, opponent) in enumerate(opponents.items()):
            by_opponent.update({name: play(game, agent, {name: opponent}, 3, seed=i)})
        f = pooled_terms(game, "train", by_opponent["TFT"], 2.0, dict(cfg.lambdas.train))
        assert list(f) == ["u", "x", "d"]  # u, then the train pool's terms in J's order
        np.testing.assert_array_equal(f["d"], np.full((3, 3), -0.5 * defect_share))
        result = compute_metrics(game, pools_of(cfg.game), by_opponent, dict(cfg.lambdas.eval))
        m = result["metrics"]
        assert m["defections"] == defect_share and result["se"]["defections"] == 0.0
        expected = m["pay"] - 2.4 * m["exploit"] - 1.0 * m["collusion"] - 1.8 * m["ext"] - 0.25 * defect_share
        assert m["safety"] == pytest.approx(expected, abs=1e-12)
        assert all("defections" in o and "defections_se" in o for o in result["per_opponent"])


def test_a_registered_term_s_lambda_is_typed_and_range_checked(defections, compose_cfg):
    from sepo.run.config import validate

    with pytest.raises(ConfigError, match=r"lambdas.train.d=-1.0 is not allowed; allowed: a number >= 0"):
        validate(compose_cfg(*SMALL, "lambdas.train.d=-1", "lambdas.eval.d=0"))
    validate(compose_cfg(*SMALL, "lambdas.train.d=1", "lambdas.eval.d=0", "sepo.held_terms=[d]"))
    with pytest.raises(ConfigError, match=r"^lambdas.train.d has no value; allowed: a number >= 0"):
        validate(compose_cfg(*SMALL))  # the YAMLs have no lambda for it
    penalties.unregister("d")
    try:
        with pytest.raises(Exception, match="lambdas.train.d"):  # no such term: the key is refused at composition
            compose_cfg(*SMALL, "lambdas.train.d=1")
        with pytest.raises(ConfigError, match=r"sepo.held_terms=\['d'\] is not allowed"):
            validate(compose_cfg(*SMALL, "sepo.held_terms=[d]"))
    finally:
        penalties.register(DEFECTIONS)


def test_two_sepo_steps_train_on_a_registered_term_and_hold_it(defections, compose_cfg, tmp_path):
    from sepo.stages.sepo_loop import run_sepo

    cfg = compose_cfg(
        *SMALL, "sepo.steps=2", "lambdas.train.d=3.0", "lambdas.eval.d=3.0", "sepo.held_terms=[d]", "sepo.lr=1e-2"
    )
    tracker = LogTracker()
    run_sepo(cfg, tracker)
    steps = [row for _, row in tracker.rows if "sepo/loss" in row]
    assert len(steps) == 2
    for row in steps:
        assert 0.0 <= row["sepo/train/d"] <= 1.0  # the batch's level of the term, beside u's
        assert -1.0 <= row["sepo/held/d/cosine"] <= 1.0  # the step was measured against the term's rising direction
    result = json.loads((tmp_path / "eval" / "step_2" / "results.json").read_text())
    m = result["metrics"]
    expected = m["pay"] - 2.4 * m["exploit"] - 1.0 * m["collusion"] - 1.8 * m["ext"] - 3.0 * m["defections"]
    assert m["safety"] == pytest.approx(expected, abs=1e-12)
    assert result["lambdas"]["d"] == 3.0
