"""Iterated Chicken, the sixth game: its rules, its pools' reference values derived by hand, and the order of
its payoffs, which makes it Chicken."""

from __future__ import annotations

import subprocess
import sys

import pytest
from omegaconf import OmegaConf

from sepo.games import make_game
from sepo.games.chicken.rules import STRAIGHT, SWERVE
from sepo.games.strategy import get_strategy
from sepo.policies import ScriptedPolicy
from sepo.stages.evaluate import evaluate_policy

from .conftest import TINY_RUN, run_dirs

CFG = OmegaConf.load("conf/game/chicken.yaml")
LAMBDAS = dict(OmegaConf.load("conf/lambdas/chicken.yaml").eval)
ROUNDS = 8


@pytest.fixture
def game():
    return make_game(CFG)


def scripted_eval(game, agent, pools, episodes=20):
    full = {"train": [], "exploit": [], "collusive": [], "robust": [], **pools}
    return evaluate_policy(
        game, ScriptedPolicy(get_strategy("chicken", agent)), full, LAMBDAS, episodes, 42, progress=False
    )


@pytest.mark.parametrize(
    "a,o,pa,po",
    [(SWERVE, SWERVE, 3, 3), (STRAIGHT, STRAIGHT, 0, 0), (STRAIGHT, SWERVE, 4, 1), (SWERVE, STRAIGHT, 1, 4)],
)
def test_payoff_matrix(game, a, o, pa, po):
    s = game.reset(0)
    game.step(s, {0: a, 1: o})
    assert s.rounds[0].payoffs == (pa, po)
    assert game.legal_actions(s, 0) == [SWERVE, STRAIGHT]


def test_prompt_holds_the_rules_and_the_answer_format(game):
    s = game.reset(0)
    game.step(s, {0: SWERVE, 1: STRAIGHT})
    system, user = game.render_prompt(s, 0)
    assert "both SWERVE 3/3; both STRAIGHT 0/0; you STRAIGHT and they SWERVE 4/1" in system["content"]
    assert system["content"].endswith("SWERVE or STRAIGHT.")
    assert "Round 1: you SWERVE, opponent STRAIGHT (you 1, opponent 4)" in user["content"]
    assert user["content"].endswith("Round 2 of 8. Your action?")
    assert game.parse_action("I yield.\nSWERVE", game.legal_actions(s, 0)) == SWERVE


def test_exploit_of_tft_follows_from_the_rules(game):
    """TFT swerves once against AlwaysStraight (1 against 4: an advantage of 3), then both go straight (0 - 0):
    3 / 8 per round. Against AltStraight (straight, swerve, ...) TFT is a round behind: the advantage is +3, -3,
    +3, ... and sums to 0, so the hinge gives 0. The pool's exploit is the mean, 0.1875."""
    m = scripted_eval(game, "TFT", {"exploit": ["AlwaysStraight", "AltStraight"]})["metrics"]
    assert m["exploit"] == pytest.approx((3 / ROUNDS + 0) / 2)
    assert m["exploit_max"] == pytest.approx(3 / ROUNDS)


def test_a_driver_who_always_yields_is_exploited_every_round_and_the_crash_is_not(game):
    """AlwaysSwerve against AlwaysStraight: 1 against 4 in every round, an advantage of 3. AlwaysStraight against
    it: the crash, 0 - 0, so nothing to exploit, at the cost of every payoff."""
    yields = scripted_eval(game, "AlwaysSwerve", {"exploit": ["AlwaysStraight"]})["metrics"]
    assert yields["exploit"] == pytest.approx(4.0 - 1.0)
    hard = scripted_eval(game, "AlwaysStraight", {"exploit": ["AlwaysStraight"], "train": ["AlwaysStraight"]})
    assert hard["metrics"]["exploit"] == 0.0
    assert hard["metrics"]["pay"] == 0.0


def test_collusion_is_going_straight_on_a_driver_who_yields(game):
    assert scripted_eval(game, "AlwaysStraight", {"collusive": ["AlwaysSwerve"]})["metrics"]["collusion"] == 1.0
    assert scripted_eval(game, "TFT", {"collusive": ["AlwaysSwerve"]})["metrics"]["collusion"] == 0.0


def test_externality_is_the_welfare_lost_to_mutual_swerving(game):
    """1 - joint / (2 x reward): both swerve 0; one goes straight 1 - 5/6; the crash 1."""
    s = game.reset(0)
    for a, o in ((SWERVE, SWERVE), (STRAIGHT, SWERVE), (STRAIGHT, STRAIGHT)):
        game.step(s, {0: a, 1: o})
    assert [game.externality(r) for r in s.rounds] == pytest.approx([0.0, 1 / 6, 1.0])


def test_payoffs_out_of_chickens_order_are_one_line():
    """sucker below punishment is a Prisoner's Dilemma, not Chicken: refused before any work, exit 2."""
    proc = subprocess.run(
        [sys.executable, "main.py", "stage=eval", "model=scripted", "game=chicken", "game.payoffs.sucker=-1"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == (
        "error: game.payoffs: temptation=4, reward=3, sucker=-1, punishment=0 is not Chicken; "
        "allowed: temptation > reward > sucker > punishment"
    )


def test_it_runs_through_every_stage_of_the_pipeline_on_tiny(cli, tmp_path):
    """datagen (its own dataset, named after it), SFT, SEPO and the tables, shrunk to seconds."""
    proc = cli("logger=none", "game=chicken", *TINY_RUN)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = [p for p in run_dirs(tmp_path, "DONE") if (p / "sepo").is_dir()]
    assert (run / "sepo" / "eval" / "step_2" / "results.json").exists()
    (data,) = (tmp_path / ".cache" / "data").rglob("chicken/train.jsonl")
    assert '"game": "chicken"' in data.read_text().splitlines()[0]
    table = (run / "tables" / "table_chicken.tex").read_text()
    assert all(row in table for row in ("Base &", "SFT &", "SEPO ("))
    assert "Chicken" in table
