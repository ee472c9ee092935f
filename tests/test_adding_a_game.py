"""docs/adding_a_game.md, followed: its files, written from the page into a scratch folder, make a game the
registry finds, whose strategies, reasoning lines, config check and numbers work as the page says."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from sepo import games
from sepo.games.strategy import get_strategy, known_strategies
from sepo.policies import ScriptedPolicy
from sepo.stages.evaluate import evaluate_policy
from sepo.training.reasoning import GENERIC
from sepo.training.sft_data import generate_game_examples
from sepo.training.sft_dataset import dataset_names

PAGE = Path(__file__).resolve().parent.parent / "docs" / "adding_a_game.md"
#: a fenced block whose first line names the file it is: "# sepo/games/<name>/<module>.py" or "# conf/..."
BLOCK = re.compile(r"```(?:python|yaml)\n# (\S+)\n(.*?)```", re.S)


@pytest.fixture(scope="module")
def page_game(tmp_path_factory):
    """The page's files under a scratch folder, its package added to the games' search path for this module."""
    root = tmp_path_factory.mktemp("page")
    files = {path: body for path, body in BLOCK.findall(PAGE.read_text())}
    for path, body in files.items():
        target = root / path.removeprefix("sepo/games/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(body)
    games.__path__.append(str(root))
    games.names.cache_clear()
    yield files, root
    games.__path__.remove(str(root))
    games.names.cache_clear()
    for module in [m for m in sys.modules if m.startswith("sepo.games.stag_hunt")]:
        del sys.modules[module]


def test_the_page_writes_every_file_a_game_needs(page_game):
    files, _ = page_game
    modules = {"rules", "strategies", "reasoning", "config", "__init__"}
    assert {f"sepo/games/stag_hunt/{m}.py" for m in modules} | {
        "conf/game/stag_hunt.yaml",
        "conf/lambdas/stag_hunt.yaml",
    } == set(files)
    assert all((Path("sepo/games/chicken") / f"{m}.py").exists() for m in modules)  # the sixth game, built so


def test_the_registry_finds_the_game_and_it_plays_as_the_page_derives(page_game):
    _, root = page_game
    assert "stag_hunt" in games.names()
    assert "stag_hunt" in dataset_names(OmegaConf.load("conf/datagen/default.yaml"))
    entry = games.entry("stag_hunt")
    assert entry.label == "Stag Hunt"
    assert known_strategies("stag_hunt") == ["AlwaysHare", "AlwaysStag", "Grim", "Random", "TFT"]
    cfg = OmegaConf.load(root / "conf" / "game" / "stag_hunt.yaml")
    game = games.make_game(cfg)
    lambdas = dict(OmegaConf.load(root / "conf" / "lambdas" / "stag_hunt.yaml").eval)
    pools = {"train": ["TFT"], "exploit": ["AlwaysHare"], "collusive": ["AlwaysStag"], "robust": []}
    result = evaluate_policy(game, ScriptedPolicy(get_strategy("stag_hunt", "TFT")), pools, lambdas, 4, 42)
    assert result["metrics"]["exploit"] == pytest.approx(3 / 4)
    assert result["metrics"]["collusion"] == 0.0
    assert result["metrics"]["pay"] == 4.0  # TFT with TFT: the stag every round


def test_its_demonstrators_get_reasons_of_their_own_and_its_check_refuses_another_game(page_game):
    _, root = page_game
    cfg = OmegaConf.load(root / "conf" / "game" / "stag_hunt.yaml")
    examples = generate_game_examples(cfg, 42, None, 4)  # its datagen opponents: TFT, Grim, AlwaysHare, Random
    lines = {ex["messages"][2]["content"].split("\n")[0] for ex in examples}
    assert not lines & {line.format(action=a) for line in GENERIC for a in ("STAG", "HARE")}
    assert "The opponent left the hunt in round 1, so I hunt hares from now on." in lines  # Grim after a hare
    entry = games.entry("stag_hunt")
    assert entry.check(cfg) is None
    prisoners = OmegaConf.merge(cfg, {"payoffs": {"temptation": 5.0}})
    assert entry.check(prisoners).endswith("allowed: reward > temptation >= punishment > sucker")
