"""Stage `datagen`: sizes, determinism, mixture, parse-back, prompts, reasoning lines, CLI, no torch."""

from __future__ import annotations

import hashlib
import json
import math
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf

from sepo import games
from sepo.games import AGENT
from sepo.stages.datagen import episode_strategies, run_datagen
from sepo.training.reasoning import reasoning_case, reasoning_line
from sepo.training.sft_data import (
    build_dataset,
    datagen_opponents,
    examples_from_records,
    generate_dataset,
    generate_game_examples,
    load_game_cfg,
    play_demonstrators,
)
from sepo.training.sft_dataset import ensure_dataset

ROOT = Path(__file__).resolve().parent.parent
GAMES = games.names()
SEED = 42


@pytest.fixture(scope="module")
def full():
    """Every game at its default size: {game: (game, records, examples)} (about 35k decisions, ~3 s)."""
    out = {}
    for name in GAMES:
        game, records = play_demonstrators(load_game_cfg(name), SEED)
        out[name] = (game, records, examples_from_records(game, records))
    return out


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


# ------------------------------------------------------------------------------ sizes
def test_ipd_default_size_is_8x200x5_and_splits_80_20(full):
    _, records, examples = full["ipd"]
    assert len(records) == 200 * 5
    assert len(examples) == 8 * 200 * 5 == 8000
    splits = build_dataset("ipd_only", {"ipd": examples}, SEED, valid_fraction=0.2)
    assert (len(splits["train"]), len(splits["valid"])) == (6400, 1600)
    # the split is a partition of the examples
    key = lambda ex: (ex["opponent"], ex["episode"], ex["round"])  # noqa: E731
    assert sorted(map(key, splits["train"] + splits["valid"])) == sorted(map(key, examples))


def test_default_generation_sizes(full):
    sizes = {g: len(full[g][2]) for g in GAMES}
    assert sizes["auction"] == 6 * 267 * 5 == 8010
    assert sizes["neg_v1"] == 4 * 400 * 5 == 8000
    assert sizes["neg_v2"] == 4 * 200 * 5 == 4000
    # Kuhn: 6 hands x 200 x 5 = 6000 hands, one or two agent decisions each
    assert 6000 < sizes["kuhn"] < 12000
    per_hand = Counter((ex["opponent"], ex["episode"], ex["round"]) for ex in full["kuhn"][2])
    assert len(per_hand) == 6000
    assert set(per_hand.values()) == {1, 2}


def test_multi_is_balanced_and_capped_per_game(full):
    by_game = {g: full[g][2] for g in ("ipd", "auction", "neg_v1")}
    splits = build_dataset("multi", by_game, SEED, valid_fraction=0.2, per_game_cap=8000)
    assert (len(splits["train"]), len(splits["valid"])) == (19200, 4800)
    assert Counter(ex["game"] for s in splits.values() for ex in s) == {"ipd": 8000, "auction": 8000, "neg_v1": 8000}
    # a smaller cap, and no cap (balanced to the smallest game)
    capped = build_dataset("multi", by_game, SEED, 0.2, per_game_cap=100)
    assert Counter(ex["game"] for s in capped.values() for ex in s) == {"ipd": 100, "auction": 100, "neg_v1": 100}
    small = {"ipd": by_game["ipd"][:50], "auction": by_game["auction"]}
    assert len(sum(build_dataset("x", small, SEED, 0.2).values(), [])) == 100


def test_default_datagen_opponents_are_train_then_exploit_padded():
    expected = {
        "ipd": ["TFT", "GenerousTFT", "Mixed", "Grim", "AlwaysD"],
        "auction": ["Truthful", "Conservative", "Shaded", "Adaptive", "Aggressive"],
        "neg_v1": ["Fair", "Balanced", "Concede", "Hard", "Selfish"],
        "neg_v2": ["FairNeg", "TFTNeg", "ConcedeNeg", "GreedyNeg", "HardballNeg"],
        "kuhn": ["NashApx", "TightP", "LooseA", "AlwaysBet", "RandomLegal"],
    }
    for game, names in expected.items():
        assert datagen_opponents(load_game_cfg(game), 5) == names
    short = OmegaConf.merge(load_game_cfg("ipd"), {"pools": {"train": ["TFT"], "exploit": ["AlwaysD", "TFT"]}})
    assert datagen_opponents(short, 5) == ["TFT", "AlwaysD", "Random"]  # random pads once only
    listed = OmegaConf.merge(load_game_cfg("ipd"), {"datagen": {"opponents": ["Grim", "AltD"]}})
    assert datagen_opponents(listed, 5) == ["Grim", "AltD"]


# ------------------------------------------------------------------------------ mixture
@pytest.mark.parametrize("game", GAMES)
def test_demonstrator_mixture_matches_weights(full, game):
    """Episode-level frequencies within 4 binomial standard errors of the configured weights."""
    weights = dict(load_game_cfg(game).demonstrators)
    total = sum(weights.values())
    episodes = episode_strategies(full[game][2])
    n = sum(episodes.values())
    assert n == len(full[game][1])
    assert set(episodes) <= set(weights)
    for name, w in weights.items():
        p = w / total
        se = math.sqrt(p * (1 - p) / n)
        assert abs(episodes.get(name, 0) / n - p) <= 4 * se + 1e-12, (game, name, episodes.get(name, 0), n, p)


def test_one_demonstrator_per_episode(full):
    for game in GAMES:
        per_episode = defaultdict(set)
        for ex in full[game][2]:
            per_episode[(ex["opponent"], ex["episode"])].add(ex["strategy"])
        assert all(len(s) == 1 for s in per_episode.values()), game


# ------------------------------------------------------------------------------ content
@pytest.mark.parametrize("game", GAMES)
def test_every_answer_parses_back_to_its_action(full, game):
    g, records, examples = full[game]
    legals = [request.legal for record in records for _, request, _ in record.trace]  # play order
    assert len(legals) == len(examples)
    for ex, legal in zip(examples, legals):
        answer = ex["messages"][2]["content"]
        assert [m["role"] for m in ex["messages"]] == ["system", "user", "assistant"]
        assert ex["action"] in legal
        assert answer.split("\n")[-1] == ex["action"]
        assert g.parse_action(answer, legal) == ex["action"]


@pytest.mark.parametrize("game", GAMES)
def test_prompts_are_render_prompt_of_the_replayed_state(full, game):
    """Replay each episode from its seed and both players' actions; at every agent decision the
    example's system and user turns must equal `game.render_prompt(state, AGENT)` (so information
    hiding is exactly the evaluation prompt's). 40 episodes per opponent keep it fast."""
    g, records, examples = full[game]
    by_episode = defaultdict(list)
    for ex in examples:
        by_episode[(ex["opponent"], ex["episode"])].append(ex)
    checked = 0
    for record in records:
        if record.index >= 40:
            continue
        state = g.reset(record.seed, mirror=record.mirror)
        pending = iter(by_episode[(record.opponent, record.index)])
        for rnd in record.rounds:
            queues = {p: list(a) if isinstance(a, tuple) else [a] for p, a in enumerate(rnd.actions)}
            hand = state.round_index
            while not g.is_over(state) and state.round_index == hand:
                movers = g.to_act(state)
                if AGENT in movers:
                    ex = next(pending)
                    assert ex["messages"][:2] == g.render_prompt(state, AGENT)
                    assert ex["round"] == hand
                    assert ex["action"] == queues[AGENT][0]
                    checked += 1
                g.step(state, {p: queues[p].pop(0) for p in movers})
        assert next(pending, None) is None
    assert checked > 0


@pytest.mark.parametrize("game", GAMES)
def test_reasoning_lines_are_short_specific_and_varied(full, game):
    _, records, examples = full[game]
    first_lines = [ex["messages"][2]["content"].split("\n") for ex in examples]
    assert all(len(parts) == 2 for parts in first_lines)
    lengths = [len(parts[0]) for parts in first_lines]
    assert max(lengths) < 220
    assert 40 <= float(np.median(lengths)) <= 120
    assert len({parts[0] for parts in first_lines}) >= 20  # not a degenerate dataset
    for record in records:  # every configured demonstrator gets a reason of its own rule
        for _, _, decision in record.trace:
            case = reasoning_case(
                game, decision.demonstration.strategy, decision.action, decision.demonstration.observation
            )
            assert case != "generic", (game, decision.demonstration.strategy, decision.action)


def test_reasoning_follows_strategy_action_and_history():
    rng = np.random.default_rng(0)
    obs = {
        "round": 1,
        "rounds": 8,
        "history": [{"own": "COOPERATE", "opp": "COOPERATE", "own_payoff": 3, "opp_payoff": 3}],
    }
    assert reasoning_case("ipd", "TFT", "COOPERATE", obs) == "reciprocate"
    obs["history"][0]["opp"] = "DEFECT"
    assert reasoning_case("ipd", "TFT", "DEFECT", obs) == "retaliate"
    assert reasoning_case("ipd", "GenerousTFT", "COOPERATE", obs) == "forgive"
    assert reasoning_case("ipd", "Grim", "DEFECT", obs) == "punish"
    # an action the rule cannot produce gets a neutral line, never a wrong reason
    assert reasoning_case("ipd", "AlwaysD", "COOPERATE", obs) == "generic"
    assert reasoning_line("ipd", "AlwaysD", "COOPERATE", obs, rng).endswith("COOPERATE.")
    assert reasoning_case("ipd", "SomeNewStrategy", "DEFECT", obs) == "generic"


# ------------------------------------------------------------------------------ determinism
def test_same_seed_gives_byte_identical_files(compose_cfg, tmp_path):
    def build(sub: str, seed: int = SEED) -> Path:
        cfg = compose_cfg(
            "stage=datagen",
            "datagen.episodes_per_opponent=6",
            f"datagen.seed={seed}",
            f"datagen.out_dir={tmp_path / sub}",
        )
        run_datagen(cfg)
        return tmp_path / sub

    a, b, c = build("a"), build("b"), build("c", seed=SEED + 1)
    files = sorted(p.relative_to(a) for p in a.rglob("*.jsonl"))
    assert [str(f) for f in files] == [
        f"{d}/{s}.jsonl" for d in ("kuhn", "multi", "neg_gt") for s in ("train", "valid")
    ]
    for f in files:
        assert (a / f).read_bytes() == (b / f).read_bytes()
    assert any((a / f).read_bytes() != (c / f).read_bytes() for f in files)
    ma, mb = (json.loads((d / "manifest.json").read_text()) for d in (a, b))
    for m in (ma, mb):
        m.pop("timing")
        for info in m["games"].values():
            info.pop("seconds")
    assert ma == mb
    # the SFT stage's own generation (a dataset missing under sft.data_dir) writes the very same bytes
    cfg = compose_cfg("stage=datagen", "datagen.episodes_per_opponent=6")
    for name in ("multi", "kuhn"):
        made = ensure_dataset(cfg, name, tmp_path / "made_by_sft")
        for split in ("train", "valid"):
            assert (made / f"{split}.jsonl").read_bytes() == (a / name / f"{split}.jsonl").read_bytes()


def test_episodes_do_not_depend_on_which_opponents_are_played():
    cfg = load_game_cfg("ipd")
    alone = OmegaConf.merge(cfg, {"datagen": {"opponents": ["Grim"]}})
    together = generate_game_examples(cfg, SEED, episodes_per_opponent=10)
    assert generate_game_examples(alone, SEED, episodes_per_opponent=10) == [
        ex for ex in together if ex["opponent"] == "Grim"
    ]


def test_generate_dataset_api_on_demand():
    splits = generate_dataset("neg_gt", [load_game_cfg("neg_v2")], SEED, valid_fraction=0.25, episodes_per_opponent=4)
    assert (len(splits["train"]), len(splits["valid"])) == (60, 20)  # 4 rounds x 4 episodes x 5 opponents


# ------------------------------------------------------------------------------ the stage
def test_cli_end_to_end_writes_datasets_manifest_and_done(cli, tmp_path):
    proc = cli("stage=datagen", "logger=none", f"paths.root_dir={tmp_path}", "datagen.episodes_per_opponent=4")
    assert proc.returncode == 0, proc.stderr[-3000:]
    (done,) = list((tmp_path / "outputs").rglob("DONE"))
    data = done.parent / "data"
    manifest = json.loads((data / "manifest.json").read_text())
    assert manifest["seed"] == SEED
    assert manifest["timing"]["examples_per_second"] > 0
    expected_games = {"multi": {"ipd", "auction", "neg_v1"}, "kuhn": {"kuhn"}, "neg_gt": {"neg_v2"}}
    for name, info in manifest["datasets"].items():
        for split, f in info["files"].items():
            path = data / f["path"]
            assert hashlib.sha256(path.read_bytes()).hexdigest() == f["sha256"]
            records = lines(path)
            assert len(records) == f["examples"]
            assert {r["game"] for r in records} == expected_games[name]
            assert sum(sum(c.values()) for c in info["counts"][split].values()) == len(records)
        n = info["examples"]
        assert info["files"]["valid"]["examples"] == round(0.2 * n)
    # multi: 4 episodes x 5 opponents; Neg v1 (4 rounds) is the smallest game: 80 examples each
    assert manifest["datasets"]["multi"]["examples"] == 3 * 80
    assert "examples/s" in proc.stdout + proc.stderr


def test_datagen_does_not_import_torch():
    code = (
        "import sys\nfrom sepo.training.sft_data import generate_dataset, load_game_cfg\n"
        "generate_dataset('multi', [load_game_cfg(g) for g in ('ipd', 'kuhn')], 42, episodes_per_opponent=2)\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_ipd_can_open_every_line_with_the_opponents_last_move():
    """game.reasoning.name_the_last_move: after the first round every demonstrator's line, a history-blind one
    (AlwaysD, a random draw) as much as TFT's, opens with what the opponent did last; the first round's does not,
    and off, the lines are those of the shipped data."""
    history = [{"own": "COOPERATE", "opp": "DEFECT", "own_payoff": 0.0, "opp_payoff": 5.0}]
    on = {"name_the_last_move": True}
    for strategy, action in [
        ("AlwaysD", "DEFECT"),
        ("Random", "COOPERATE"),
        ("TFT", "DEFECT"),
        ("AlwaysC", "COOPERATE"),
    ]:
        line = reasoning_line("ipd", strategy, action, {"history": history}, np.random.default_rng(0), on)
        plain = reasoning_line("ipd", strategy, action, {"history": history}, np.random.default_rng(0))
        assert line == "Last round they defected. " + plain
    cooperated = [{**history[0], "opp": "COOPERATE"}]
    assert reasoning_line("ipd", "AlwaysD", "DEFECT", {"history": cooperated}, np.random.default_rng(0), on).startswith(
        "Last round they cooperated. "
    )
    first = reasoning_line("ipd", "AlwaysD", "DEFECT", {"history": []}, np.random.default_rng(0), on)
    assert first == reasoning_line("ipd", "AlwaysD", "DEFECT", {"history": []}, np.random.default_rng(0))
    assert reasoning_case("ipd", "TFT", "DEFECT", {"history": history}, on) == "retaliate"


def test_kuhn_can_name_a_bet_after_ones_own_check():
    """game.reasoning.name_the_check: facing a bet after one's own check (1pb) gets lines of its own, each
    opening with "I checked", which no other spot's line does; off, it shares the opening bet's lines."""
    from sepo.games import entry

    obs = {"card": "Q", "betting": ["PASS", "BET"]}
    assert reasoning_case("kuhn", "NashApprox", "CALL", obs) == "Q_facing_CALL"
    assert reasoning_case("kuhn", "NashApprox", "CALL", obs, {"name_the_check": True}) == "Q_checkbet_CALL"
    opening = {"card": "Q", "betting": ["BET"]}
    assert reasoning_case("kuhn", "NashApprox", "CALL", opening, {"name_the_check": True}) == "Q_facing_CALL"
    kuhn = entry("kuhn").reasoning.phrases
    for case, lines in kuhn.items():
        assert all(line.startswith("I checked") == ("checkbet" in case) for line in lines), case
    assert {c.replace("checkbet", "facing") for c in kuhn if "checkbet" in c} == {c for c in kuhn if "facing" in c}


def test_kuhn_can_keep_one_phrasing_per_case():
    """game.reasoning.phrasings=k keeps each case's first k lines (SEPO then trains on answers whose wording says
    less); 0 keeps them all."""
    from sepo.games import entry

    obs = {"card": "K", "betting": []}
    first = entry("kuhn").reasoning.phrases["K_open_BET"][0]
    rng = np.random.default_rng(0)
    one = {
        reasoning_line("kuhn", "NashApprox", "BET", obs, rng, {"phrasings": 1, "name_the_check": False})
        for _ in range(20)
    }
    assert one == {first}
    every = {reasoning_line("kuhn", "NashApprox", "BET", obs, rng, {"phrasings": 0}) for _ in range(40)}
    assert every == set(entry("kuhn").reasoning.phrases["K_open_BET"]) and len(every) > 1


def test_a_models_own_game_settings_shape_its_data_and_its_prompts_alike(compose_cfg, tmp_path):
    """conf/game/model_game/smollm2_ipd.yaml: smollm2's IPD prompts state the opponent's last move, in its runs and
    in the SFT data it generates, which lives beside tiny's (no such settings) in a directory of its own; the other
    games of `multi` keep their shipped configs."""
    assert compose_cfg("model=smollm2", "game=ipd").game.state_last_move is True
    assert compose_cfg("model=smollm2", "game=kuhn").game.name == "kuhn"
    assert compose_cfg("model=tiny", "game=ipd").game.state_last_move is False
    assert load_game_cfg("ipd", model="smollm2").state_last_move is True
    assert load_game_cfg("ipd", model="tiny") == load_game_cfg("ipd")
    assert load_game_cfg("auction", model="smollm2") == load_game_cfg("auction")
    data = tmp_path / "data"
    made = {
        model: ensure_dataset(compose_cfg(f"model={model}", "datagen.episodes_per_opponent=3"), "multi", data)
        for model in ("tiny", "smollm2")
    }
    assert (made["tiny"].name, made["smollm2"].name) == ("multi", "multi-smollm2")
    prompts = {m: [ex for ex in lines(d / "train.jsonl") if ex["game"] == "ipd"] for m, d in made.items()}
    later = [ex["messages"][1]["content"] for ex in prompts["smollm2"] if ex["round"] > 0]
    assert later and all("The opponent's last move: " in p for p in later)
    assert not any("The opponent's last move" in ex["messages"][1]["content"] for ex in prompts["tiny"])
    auction = {m: [ex for ex in lines(d / "train.jsonl") if ex["game"] == "auction"] for m, d in made.items()}
    assert auction["tiny"] == auction["smollm2"]
    # generated again, each model finds its own copy (the manifest records the settings that shaped it)
    manifest = json.loads((made["smollm2"] / "manifest.json").read_text())
    assert manifest["model_game_settings"] == {"ipd": {"state_last_move": True}}
    assert (
        ensure_dataset(compose_cfg("model=smollm2", "datagen.episodes_per_opponent=3"), "multi", data)
        == made["smollm2"]
    )
