"""The rules table, read off the schemas (sepo/run/schema.py, each game's sepo/games/<game>/config.py): every
config field with a constrained value, its allowed values, and where it matters (every run, some stages, or
the model, game or logger whose schema holds it). `sepo.run.config` applies it before any work.

The table is built when asked (`rules()`), so the penalty terms and games registered at that moment are the
ones the lambdas and the lists of names allow.
"""

from __future__ import annotations

from collections.abc import Callable

from omegaconf import DictConfig

from sepo import games
from sepo.config_rules import FieldRule, Rule, Where, schema_rules
from sepo.errors import ConfigError
from sepo.paths import CONF_DIR
from sepo.run import schema
from sepo.run.schema import DATA, EVAL, EXPLOITER, SEPO, SFT

#: the models a run can name: one per conf/model/<model>.yaml (a new model is its YAML)
MODEL_KINDS = tuple(sorted(p.stem for p in (CONF_DIR / "model").glob("*.yaml")))
#: models built by the code itself; every other language model is loaded from `model.path`
BUILT_MODELS = ("scripted", "tiny", "smollm2")
#: stages that train the model (a scripted agent has nothing to train)
TRAINING_STAGES = ("sft", "sepo", "pipeline", "exploiter")


def _chosen(group: str, name: str) -> Callable[[DictConfig], bool]:
    """Where a group option's schema holds: the run chose that option (`model=tiny`, `game=kuhn`)."""
    return lambda cfg: cfg[group].name == name


def nodes() -> list[tuple[str, type, Where]]:
    """(node, its schema, where its fields matter unless a field says otherwise): the run's own keys, the stage
    nodes, the weights, then every option of the groups whose options differ in their keys."""
    return [
        ("", schema.RunSchema, "all"),
        ("stage", schema.StageSchema, "all"),
        ("eval", schema.EvalSchema, EVAL),
        ("datagen", schema.DatagenSchema, DATA),
        ("sft", schema.SftSchema, SFT),
        ("sepo", schema.SepoSchema, SEPO),
        ("exploiter", schema.ExploiterSchema, EXPLOITER),
        ("lambdas", schema.LambdasSchema, "all"),
        *[("model", s, _chosen("model", name)) for name, s in schema.MODEL_SCHEMAS.items()],
        *[("logger", s, _chosen("logger", name)) for name, s in schema.LOGGER_SCHEMAS.items()],
        *[("game", games.entry(name).schema, _chosen("game", name)) for name in games.names()],
    ]


def field_rules() -> list[FieldRule]:
    """Every leaf of every schema, with its rule (or the reason it has none) and where it applies."""
    rows = []
    for node, node_schema, where in nodes():
        for row in schema_rules(node_schema, node):
            rows.append(FieldRule(row.key, row.rule, row.where or where, row.reason))
    return rows


def rules() -> list[tuple[str | Callable[[DictConfig], bool], str, Rule]]:
    """(where, key, rule) of every field with a rule."""
    return [(row.where, row.key, row.rule) for row in field_rules() if row.rule is not None]


def require(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


def applies(where: str | Callable[[DictConfig], bool], cfg: DictConfig) -> bool:
    if callable(where):
        return where(cfg)
    return where == "all" or cfg.stage.name in where.split()
