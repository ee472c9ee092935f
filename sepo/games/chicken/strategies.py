"""Chicken's strategies (docs/spec.md §2): the reactive strategies of repeated two-action games
(`sepo.games.matrix`) under Chicken's names, as opponents, robust-pool variants and demonstrators."""

from __future__ import annotations

from sepo.games import matrix
from sepo.games.strategy import register

NAMES = {
    matrix.TitForTat: ("TFT", "TitForTat"),
    matrix.GenerousTFT: ("GenerousTFT",),
    matrix.MixedTFT: ("Mixed",),
    matrix.NoisyTFT: ("NoisyTFT",),
    matrix.SuspiciousTFT: ("SuspiciousTFT",),
    matrix.Grim: ("Grim", "GrimTrigger"),
    matrix.AlwaysHard: ("AlwaysStraight", "Hawk"),
    matrix.AlternateHard: ("AltStraight",),
    matrix.AlwaysKind: ("AlwaysSwerve", "Dove"),
    matrix.UniformRandom: ("Random",),
}
for strategy, names in NAMES.items():
    register("chicken", *names)(strategy)
