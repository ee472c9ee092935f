"""The IPD's strategies (docs/spec.md §2): the reactive strategies of repeated two-action games
(`sepo.games.matrix`) under the IPD's names, as opponents, robust-pool variants and demonstrators."""

from __future__ import annotations

from sepo.games import matrix
from sepo.games.strategy import register

NAMES = {
    matrix.TitForTat: ("TFT", "TitForTat"),
    matrix.GenerousTFT: ("GenerousTFT",),
    matrix.MixedTFT: ("Mixed",),
    matrix.NoisyTFT: ("NoisyTFT",),  # at a 10% flip it would equal the train opponent Mixed in distribution
    matrix.SuspiciousTFT: ("SuspiciousTFT",),
    matrix.Grim: ("Grim", "GrimTrigger"),
    matrix.AlwaysHard: ("AlwaysD", "AlwaysDefect"),
    matrix.AlternateHard: ("AltD",),
    matrix.AlwaysKind: ("AlwaysC", "AlwaysCooperate"),
    matrix.UniformRandom: ("Random",),
}
for strategy, names in NAMES.items():
    register("ipd", *names)(strategy)
