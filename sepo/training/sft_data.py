"""The SFT datasets `multi`, `kuhn` and `neg_gt` as chat JSONL (docs/spec.md §2).

Data comes from the same machinery evaluation uses: the arena plays demonstrator episodes in
lockstep against the game's datagen opponents, and every agent decision is rendered with
`game.render_prompt`, so an SFT prompt is byte for byte what the model later sees at evaluation
(information hiding included). The agent is a `DemonstratorPolicy`: at an episode's first decision
it draws one demonstrator by weight from the episode's own rng stream, plays it for the whole
episode and writes a templated reasoning line (`sepo.training.reasoning`) above the action.

One example = one agent decision:
`{"messages": [system, user, assistant], "game", "strategy", "opponent", "episode", "round", "action"}`
where the assistant content is `<reasoning line>\\n<action>`.

Datasets are balanced across their games: each game contributes `min(per_game_cap, smallest game)`
examples, a seeded subsample where a game has more (Auction's 6 x 267 x 5 = 8,010 -> 8,000). The
split is example-level: all examples of a dataset are shuffled with the seed and the last
`round(N * valid_fraction)` go to `valid`. Decisions of one episode can therefore sit in both
splits, as in the paper (its 8,000 -> 6,400 / 1,600 counts are example counts).

Sizes follow the paper's per-game generation table, not its dataset table: `multi` is
3 x 8,000 = 24,000 (19,200 / 4,800) where the dataset table says 31,988 (25,590 / 6,398). The two
tables cannot both hold with 8,000 examples per game, and 31,988 is not a multiple of 3, so it
cannot be "balanced so each game contributes equal examples" either. Kuhn's size is whatever
6 hands x 200 episodes x 5 opponents need (one or two agent decisions a hand, about 7,200),
where the paper's table says 8,000.

The `datagen` stage (`sepo.stages.datagen`) writes them to disk. This module must not import torch:
`stage=datagen` runs on any machine in seconds.
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Iterable
from typing import Any

import numpy as np
from omegaconf import DictConfig, OmegaConf

from sepo import games
from sepo.arena import EpisodeRecord, play
from sepo.errors import ConfigError
from sepo.games import Game, make_game
from sepo.games.strategy import make_strategy, responds_to_agent
from sepo.policies.base import Decision, DecisionRequest, Demonstration
from sepo.training.reasoning import reasoning_line

log = logging.getLogger(__name__)

SPLITS = ("train", "valid")


# ------------------------------------------------------------------------------ configuration
def load_game_cfg(name: str, current: DictConfig | None = None, model: str | None = None) -> DictConfig:
    """The config of game `name`: the run's own `game` node when it is that game (so command-line
    overrides apply), else `conf/game/<name>.yaml` as shipped, with `model`'s own settings for that game
    (`conf/game/model_game/<model>_<name>.yaml`) merged over it where they exist, as the run's composition does."""
    if current is not None and current.name == name:
        return current
    return games.shipped_config(name, None, model_game_settings(name, model))  # an unknown name: entry()'s error


def model_game_settings(name: str, model: str | None) -> dict[str, Any]:
    """`model`'s own settings for game `name` (`conf/game/model_game/<model>_<name>.yaml`), {} where it has none."""
    from sepo.paths import CONF_DIR

    path = CONF_DIR / "game" / "model_game" / f"{model}_{name}.yaml"
    return OmegaConf.to_container(OmegaConf.load(path)) if model and path.exists() else {}


def datagen_opponents(game_cfg: DictConfig, count: int) -> list[str]:
    """`game.datagen.opponents`, or by default the train pool then the exploit pool, deduplicated,
    without strategies that respond to the agent's table (no agent plays here), cut at `count` and
    padded with `game.datagen.random_strategy`.

    Opponents are keyed by name, so the random strategy pads at most once: a game whose train and
    exploit pools hold fewer than `count - 1` distinct strategies gets fewer opponents (logged).
    """
    listed = game_cfg.datagen.opponents
    if listed:
        return list(dict.fromkeys(listed))
    pools = game_cfg.pools
    names = [n for n in dict.fromkeys([*pools.train, *pools.exploit]) if not responds_to_agent(game_cfg.name, n)][
        :count
    ]  # a best responder needs the agent's table
    random_name = game_cfg.datagen.random_strategy
    if len(names) < count and random_name not in names:
        names.append(random_name)
    if len(names) < count:
        log.warning(
            "datagen: %s has only %d distinct datagen opponents (%s), fewer than %d",
            game_cfg.name,
            len(names),
            ", ".join(names),
            count,
        )
    return names


def demonstrator_weights(game_cfg: DictConfig) -> dict[str, float]:
    weights = dict(game_cfg.demonstrators)
    if not weights or any(w < 0 for w in weights.values()) or sum(weights.values()) <= 0:
        raise ConfigError(
            f"game.demonstrators of {game_cfg.name} must give non-negative weights with a positive sum; got {weights}"
        )
    return weights


# ------------------------------------------------------------------------------ the demonstrator agent
class DemonstratorPolicy:
    """Plays, in each episode, one demonstrator drawn by weight; answers with reasoning + action.

    The demonstrator is drawn at the episode's first decision from the episode's own agent rng
    (`request.rng`), and remembered by the identity of the episode's state, so the draw, the
    demonstrator's own randomness and the phrasing all come from that one seeded stream: episodes
    do not depend on how the arena batches them. Each decision keeps the rendered prompt, the
    observation and the strategy in `Decision.demonstration` (the arena's trace carries them out).
    """

    def __init__(self, game: Game, game_cfg: DictConfig, weights: dict[str, float]):
        self.game = game
        self.name = f"demonstrators:{game.name}"
        self.names = list(weights)
        p = np.array([weights[n] for n in self.names], dtype=float)
        self.p = p / p.sum()
        self.strategies = {n: make_strategy(game_cfg, n, key="game.demonstrators") for n in self.names}
        self.reasoning = dict(game_cfg.get("reasoning") or {})  # the game's options for its reasoning lines
        self._episodes: dict[int, tuple[Any, str]] = {}  # id(state) -> (state kept alive, demonstrator)

    def demonstrator(self, request: DecisionRequest) -> str:
        key = id(request.state)
        if key not in self._episodes:
            name = self.names[int(request.rng.choice(len(self.names), p=self.p))]
            self._episodes[key] = (request.state, name)
        return self._episodes[key][1]

    def act_batch(self, requests: list[DecisionRequest]) -> list[Decision]:
        decisions = []
        for r in requests:
            name = self.demonstrator(r)
            obs = r.observation
            messages = [dict(m) for m in r.messages]  # rendered now, before the state moves on
            action = self.strategies[name].act(obs, r.legal, r.rng)
            text = f"{reasoning_line(self.game.name, name, action, obs, r.rng, self.reasoning)}\n{action}"
            decisions.append(
                Decision(
                    action,
                    text=text,
                    demonstration=Demonstration(
                        strategy=name,
                        observation=obs,
                        messages=[*messages, {"role": "assistant", "content": text}],
                    ),
                )
            )
        return decisions


# ------------------------------------------------------------------------------ generation
def play_demonstrators(
    game_cfg: DictConfig, seed: int, episodes_per_opponent: int | None = None, num_opponents: int = 5
) -> tuple[Game, list[EpisodeRecord]]:
    """Play every demonstrator episode of one game (with traces); records in opponent, episode order.

    Episodes are dealt independently (no mirrored pairs, even for Kuhn poker, whose seats still
    alternate hand by hand inside each episode): mirrored deals would only repeat card deals.
    """
    game = make_game(game_cfg)
    episodes = episodes_per_opponent or game_cfg.datagen.episodes_per_opponent
    opponents = {
        n: make_strategy(game_cfg, n, key="game.datagen.opponents") for n in datagen_opponents(game_cfg, num_opponents)
    }
    policy = DemonstratorPolicy(game, game_cfg, demonstrator_weights(game_cfg))
    records = play(game, policy, opponents, episodes, seed, mirrored=False, keep_trace=True)
    return game, records


def examples_from_records(game: Game, records: Iterable[EpisodeRecord]) -> list[dict[str, Any]]:
    """One chat example per agent decision, in play order."""
    return [
        {
            "messages": decision.demonstration.messages,
            "game": game.name,
            "strategy": decision.demonstration.strategy,
            "opponent": record.opponent,
            "episode": record.index,
            "round": int(round_index),
            "action": decision.action,
        }
        for record in records
        for round_index, _request, decision in record.trace
    ]


def generate_game_examples(
    game_cfg: DictConfig, seed: int, episodes_per_opponent: int | None = None, num_opponents: int = 5
) -> list[dict[str, Any]]:
    """All SFT examples of one game (unshuffled, in play order). Same arguments -> same examples."""
    game, records = play_demonstrators(game_cfg, seed, episodes_per_opponent, num_opponents)
    return examples_from_records(game, records)


def _rng(seed: int, *tags: str) -> np.random.Generator:
    """A stream for one purpose (subsample of a game, shuffle of a dataset), fixed by seed and tags."""
    return np.random.default_rng([seed, *(zlib.crc32(t.encode()) for t in tags)])


def build_dataset(
    name: str,
    examples_by_game: dict[str, list[dict[str, Any]]],
    seed: int,
    valid_fraction: float,
    per_game_cap: int | None = None,
) -> dict[str, list[dict[str, Any]]]:
    """Balance, shuffle and split examples of one or more games into {train, valid}.

    Each game keeps `min(per_game_cap, fewest examples of any game)`: a seeded subsample (in play
    order) where it has more. Then the whole dataset is shuffled with the seed and the last
    `round(N * valid_fraction)` examples become `valid`.
    """
    per_game = min(len(v) for v in examples_by_game.values())
    if per_game_cap is not None:
        per_game = min(per_game, per_game_cap)
    pooled: list[dict[str, Any]] = []
    for game, examples in examples_by_game.items():
        if len(examples) > per_game:
            keep = np.sort(_rng(seed, name, game, "subsample").choice(len(examples), per_game, replace=False))
            examples = [examples[i] for i in keep]
        pooled.extend(examples)
    order = _rng(seed, name, "shuffle").permutation(len(pooled))
    shuffled = [pooled[i] for i in order]
    n_valid = int(round(len(shuffled) * valid_fraction))
    return {"train": shuffled[: len(shuffled) - n_valid], "valid": shuffled[len(shuffled) - n_valid :]}


def generate_dataset(
    name: str,
    game_cfgs: list[DictConfig],
    seed: int,
    valid_fraction: float = 0.2,
    per_game_cap: int | None = None,
    episodes_per_opponent: int | None = None,
    num_opponents: int = 5,
) -> dict[str, list[dict[str, Any]]]:
    """Generate one dataset in memory: what `run_datagen` writes, and what the SFT stage generates when its data is missing."""
    by_game = {cfg.name: generate_game_examples(cfg, seed, episodes_per_opponent, num_opponents) for cfg in game_cfgs}
    return build_dataset(name, by_game, seed, valid_fraction, per_game_cap)
