"""Text the tiny model's tokenizer is trained on: the games' own prompts and plausible answers.

The embedded `tiny` model has no pretrained tokenizer (nothing can be downloaded), so its byte-level
BPE is trained on exactly the text it will read and write: the system and user prompts of scripted
episodes of every available game, plus answers shaped like the ones SFT teaches (a short reasoning
line, then the action alone on the last line). Merges then cover the game vocabulary, prompts stay
short in tokens, and the build needs nothing from outside.

The games it covers are listed (`model.corpus.games`), so a new game leaves tiny's tokenizer, and every
result of tiny, as they were until it is added there: its text is then encoded in shorter pieces.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
from omegaconf import DictConfig

from sepo import games
from sepo.arena import play
from sepo.games import Game, make_game
from sepo.games.strategy import get_strategy, known_strategies, responds_to_agent
from sepo.policies.base import Decision, DecisionRequest
from sepo.policies.scripted import ScriptedPolicy

#: Fallback reasoning lines, filled with the action, for when `sepo.training.reasoning` (the SFT data's own
#: reasoning lines) is not there; the tokenizer only needs the words answers are made of.
REASONING = (
    "Given the history so far, {action} gives me the best expected payoff.",
    "The opponent's past moves suggest that {action} is the safest choice this round.",
    "I weigh my payoff against the risk of being exploited, so I choose {action}.",
    "Considering what the opponent has done, I will play {action}.",
    "Looking at my total so far and the rules, {action} is a good response.",
)


def _reasoning(game: str, strategy: str, action: str, obs: dict[str, Any], rng: np.random.Generator) -> str:
    try:
        from sepo.training.reasoning import reasoning_line
    except ModuleNotFoundError as err:
        if err.name != "sepo.training.reasoning":
            raise
        return REASONING[int(rng.integers(len(REASONING)))].format(action=action)
    return reasoning_line(game, strategy, action, obs, rng)


class _Recorder:
    """Wraps a scripted policy and keeps every prompt it is asked together with an answer."""

    def __init__(self, inner: ScriptedPolicy, rng: np.random.Generator, out: list[str]):
        self.inner, self.rng, self.out = inner, rng, out
        self.name = f"recorder:{inner.name}"

    def act_batch(self, requests: list[DecisionRequest]) -> list[Decision]:
        decisions = self.inner.act_batch(requests)
        for request, decision in zip(requests, decisions):
            for message in request.messages:
                self.out.append(message["content"])
            line = _reasoning(
                request.game.name, self.inner.strategy.name, decision.action, request.observation, self.rng
            )
            self.out.append(f"{line}\n{decision.action}")
        return decisions


def game_configs(names, conf_dir) -> list[DictConfig]:
    """The configs (`conf/game/<name>.yaml`) of the games the corpus covers, in the corpus's order."""
    return [games.shipped_config(name, conf_dir) for name in names]


def _strategies(game_cfg: DictConfig) -> list[str]:
    """The registered strategies a game's config names (pools and demonstrators), sorted; not those
    that respond to an agent's table (`BestResponse`): scripted episodes have no agent table."""
    known = {n for n in known_strategies(game_cfg.name) if not responds_to_agent(game_cfg.name, n)}
    named = {n for pool in game_cfg.pools.values() for n in pool}
    named |= set(game_cfg.demonstrators)
    return sorted(named & known)


def game_texts(game: Game, game_cfg: DictConfig, episodes: int, seed: int) -> list[str]:
    """Prompts and answers of scripted episodes: every named strategy as the agent against every one."""
    names = _strategies(game_cfg)
    opponents = {n: get_strategy(game.name, n) for n in names}
    out: list[str] = []
    rng = np.random.default_rng(seed)
    mirrored = game_cfg.mirrored
    for name in names:
        agent = _Recorder(ScriptedPolicy(get_strategy(game.name, name)), rng, out)
        play(game, agent, opponents, episodes, seed, mirrored=mirrored)
    return out


def build_corpus(corpus_cfg: Any, conf_dir) -> list[str]:
    """The tokenizer's training texts: unique, in a fixed order, so training is deterministic."""
    texts: list[str] = []
    for game_cfg in game_configs(corpus_cfg.games, conf_dir):
        texts += game_texts(make_game(game_cfg), game_cfg, corpus_cfg.episodes_per_opponent, corpus_cfg.seed)
    return list(dict.fromkeys(texts))


def corpus_digest(texts: list[str]) -> str:
    h = hashlib.sha256()
    for t in texts:
        h.update(t.encode())
        h.update(b"\0")
    return h.hexdigest()
