"""IPD strategies (docs/spec.md §2): opponents, robust-pool variants and demonstrators."""

from __future__ import annotations

from typing import Any

from sepo.config_rules import probability
from sepo.games.ipd.rules import COOPERATE, DEFECT
from sepo.games.strategy import Strategy, register


def _last_opp(obs: dict[str, Any]) -> str | None:
    return obs["history"][-1]["opp"] if obs["history"] else None


@register("ipd", "TFT", "TitForTat")
class TitForTat(Strategy):
    """Cooperate first, then copy the other player's last action."""

    def act(self, obs, legal, rng):
        return _last_opp(obs) or COOPERATE


@register("ipd", "GenerousTFT")
class GenerousTFT(Strategy):
    """TFT that forgives a defection with probability `forgive` (1/3)."""

    PARAMS = {"forgive": probability()}

    def __init__(self, forgive: float = 1.0 / 3.0):
        self.forgive = forgive

    def act(self, obs, legal, rng):
        last = _last_opp(obs)
        if last == DEFECT and rng.random() >= self.forgive:
            return DEFECT
        return COOPERATE


@register("ipd", "Mixed")
class MixedTFT(Strategy):
    """TFT that plays a uniformly random action 20% of the time."""

    PARAMS = {"noise": probability()}

    def __init__(self, noise: float = 0.2):
        self.noise = noise

    def act(self, obs, legal, rng):
        if rng.random() < self.noise:
            return legal[int(rng.integers(len(legal)))]
        return _last_opp(obs) or COOPERATE


@register("ipd", "NoisyTFT")
class NoisyTFT(Strategy):
    """TFT whose intended action is flipped 30% of the time (robust pool; docs/spec.md §2: at 10% it would equal
    the train opponent Mixed in distribution)."""

    PARAMS = {"flip": probability()}

    def __init__(self, flip: float = 0.3):
        self.flip = flip

    def act(self, obs, legal, rng):
        intended = _last_opp(obs) or COOPERATE
        if rng.random() < self.flip:
            return DEFECT if intended == COOPERATE else COOPERATE
        return intended


@register("ipd", "SuspiciousTFT")
class SuspiciousTFT(Strategy):
    """TFT that opens with DEFECT (robust pool)."""

    def act(self, obs, legal, rng):
        return _last_opp(obs) or DEFECT


@register("ipd", "Grim", "GrimTrigger")
class Grim(Strategy):
    """Cooperate until the other player defects once, then defect for ever."""

    def act(self, obs, legal, rng):
        return DEFECT if any(h["opp"] == DEFECT for h in obs["history"]) else COOPERATE


@register("ipd", "AlwaysD", "AlwaysDefect")
class AlwaysDefect(Strategy):
    def act(self, obs, legal, rng):
        return DEFECT


@register("ipd", "AltD")
class AlternateDefect(Strategy):
    """D, C, D, C, ... by round index."""

    def act(self, obs, legal, rng):
        return DEFECT if obs["round"] % 2 == 0 else COOPERATE


@register("ipd", "AlwaysC", "AlwaysCooperate")
class AlwaysCooperate(Strategy):
    def act(self, obs, legal, rng):
        return COOPERATE


@register("ipd", "Random")
class RandomIPD(Strategy):
    def probs(self, obs, legal):
        return {a: 1.0 / len(legal) for a in legal}
