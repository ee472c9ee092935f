"""Config validation, run before any heavy work: one table of field checks, then what fields refer to.

- `sepo.run.rules.rules()`: every field a run reads with a constrained value, its allowed values (read off
  the schemas' field metadata), and the stages it matters to (or the condition under which it does), in one
  table; `check` applies a rule.
- `validate`: what fields refer to (a game's strategies, a model's path, the pools) and how fields
  relate (the validation seed differs from the test seed; SFT's prefix sharing needs its answer-only
  logits), which a single field's rule cannot say.

Errors name the key and the allowed values (`ConfigError`, turned into one line with exit 2 by the
task wrapper). What a field means is the comment beside its default in conf/ (tests/test_docs.py
checks every field has one). A strategy listed in two pools is only a warning, because the paper's own
pool table reuses Hard, Fair, FairNeg and NashApx.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue

from sepo import games
from sepo.config_rules import (
    Rule,
    real,
)
from sepo.errors import ConfigError
from sepo.games.strategy import known_strategies, make_strategy, responds_to_agent
from sepo.metrics import POOLS
from sepo.paths import CONF_DIR, can_hold_outputs
from sepo.run.compose import STAGE_NODES
from sepo.run.model_fit import check_model_fit, check_sizes, in_hub_cache
from sepo.run.relations import check_model, check_relations
from sepo.run.rules import BUILT_MODELS, MODEL_KINDS, applies, require, rules
from sepo.run.schema import SEPO, SFT
from sepo.stages import STAGES
from sepo.trees import dotted_keys

log = logging.getLogger(__name__)


class PoolOverlapWarning(UserWarning):
    """A strategy sits in more than one opponent pool."""


def type_error_line(key: str, value: Any) -> str:
    """The one line for a value its key's schema (sepo/run/schema.py) refused at composition: the key's
    rule's words where it has one (its field's metadata), else the schema's type."""
    rule = next((r for _, k, r in rules() if k == key), None)
    shown = value if rule is not None and rule.as_typed else repr(value)
    allowed = rule.allowed if rule is not None else "a value of the key's type (sepo/run/schema.py)"
    return f"{key}={shown} is not allowed; allowed: {allowed}"


#: the words a command line may give a boolean in, quoted or not (Hydra reads unquoted true/false as booleans)
BOOLEAN_WORDS = ("true", "false")


def loose_boolean_override(cfg: DictConfig, overrides: Sequence[str]) -> str | None:
    """The error line for the first override that gives a boolean key a value other than true or false.

    OmegaConf converts "yes", "on", "y" and 1 to true and "no", "off", "n" and 0 to false, so a typed
    boolean never sees what was typed: `model.trust_remote_code=0` would read as a typo of false and work,
    `model.static_cache=yes` as true. transformers takes only a real bool for trust_remote_code; so does this
    project, for every boolean. Overrides Hydra cannot parse are left to Hydra."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        parsed = OverridesParser.create().parse_overrides([o for o in overrides if "=" in o])
    except Exception:  # noqa: BLE001 (Hydra reports what it cannot parse)
        return None
    for override in parsed:
        if override.is_sweep_override() or override.is_delete():
            continue
        key = override.key_or_group.lstrip("+~")
        if not isinstance(OmegaConf.select(cfg, key, default=None), bool):
            continue
        value = override.value()
        if not (isinstance(value, bool) or (isinstance(value, str) and value.strip().lower() in BOOLEAN_WORDS)):
            return f"{key}={value!r} is not allowed; allowed: true or false"
    return None


def check(key: str, value: Any, rule: Rule) -> None:
    """One field against its rule: `key=value is not allowed; allowed: ...` when it fails."""
    shown = value if rule.as_typed else repr(value)
    require(rule.ok(value), f"{key}={shown} is not allowed; allowed: {rule.allowed}")


_ABSENT = object()


def check_rules(cfg: DictConfig) -> None:
    """Every rule that applies, on the keys the config has (a key a model's or game's YAML lacks is read
    by the code with its default)."""
    for where, key, rule in rules():
        if applies(where, cfg):
            try:
                value = OmegaConf.select(cfg, key, default=_ABSENT, throw_on_missing=True)
            except MissingMandatoryValue:
                raise ConfigError(
                    f"{key} has no value; allowed: {rule.allowed} (give it in its YAML or as {key}=...)"
                ) from None
            if value is not _ABSENT:
                check(key, OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value, rule)


def hub_download_hint(repo_id: str, revision: str | None) -> str:
    rev = f" --revision {revision}" if revision else ""
    return (
        f"model.path={repo_id} is not in the Hugging Face cache and model.download=false; allowed: a local copy "
        f"(`hf download {repo_id}{rev}` where the hub is reachable, then model.path=<its directory> or the same "
        "hub id), or model.download=true to fetch it now"
    )


def check_paths(cfg: DictConfig) -> None:
    """Paths a run will read or write, checked before any work (not deep inside a loader)."""
    root = cfg.paths.root_dir
    require(
        can_hold_outputs(root),
        f"paths.root_dir={root} is not allowed; allowed: a writable directory (or one that can be created)",
    )
    cache = Path(cfg.paths.cache_dir)
    name = cfg.model.name
    if name in BUILT_MODELS and name != "scripted" and not cfg.model.get("path"):
        require(
            any(cache.glob(f"{name}-*/sepo_build.json")) or can_hold_outputs(cache),
            f"paths.cache_dir={cache} is not allowed: the {name} model is built there on first use, and it cannot "
            f"be written; allowed: a writable directory (or one holding a {name} build)",
        )
    if applies(SFT, cfg) and not (Path(cfg.sft.data_dir) / cfg.sft.dataset / "train.jsonl").exists():
        require(
            can_hold_outputs(cfg.sft.data_dir),
            f"sft.data_dir={cfg.sft.data_dir} is not allowed: the {cfg.sft.dataset} dataset is generated there "
            "and it cannot be written; allowed: a writable directory, or one holding the dataset",
        )
    if applies(SEPO, cfg):
        adapters = [("sepo.init_adapter", cfg.sepo.init_adapter)] if cfg.sepo.init_adapter else []
        adapters += [(f"sepo.learned_exploiters[{i}]", a) for i, a in enumerate(cfg.sepo.learned_exploiters)]
        for key, adapter in adapters:
            require(
                (Path(str(adapter)).expanduser() / "adapter_config.json").is_file(),
                f"{key}={adapter} is not allowed; allowed: a LoRA adapter's directory (a run's adapter/)",
            )
    path = cfg.model.get("path")
    if path:
        local = Path(str(path)).expanduser()
        looks_like_hub_id = not str(path).startswith((".", "/", "~")) and str(path).count("/") == 1
        require(
            local.is_dir() or looks_like_hub_id,
            f"model.path={path} is not allowed; allowed: an existing checkpoint directory, or a hub id "
            "(org/name) already in the Hugging Face cache",
        )
        if looks_like_hub_id and not local.is_dir() and not cfg.model.get("download", False):
            require(
                in_hub_cache(str(path), cfg.model.get("revision")),
                hub_download_hint(str(path), cfg.model.get("revision")),
            )


def validate_pools(game: str, pools: Any, key: str = "game.pools") -> list[str]:
    """Check pool names; return one warning line per strategy found in several pools."""
    unknown_pools = set(pools) - set(POOLS)
    require(not unknown_pools, f"{key}: unknown pool(s) {sorted(unknown_pools)}; allowed: {', '.join(POOLS)}")
    known = known_strategies(game)
    for pool in POOLS:
        names = list(pools.get(pool) or [])
        for name in names:
            require(name in known, f"{key}.{pool}: unknown {game} strategy {name!r}; allowed: {', '.join(known)}")
        require(len(set(names)) == len(names), f"{key}.{pool} lists a strategy twice: {names}")
    require(bool(pools.get("train")), f"{key}.train must name at least one strategy")
    seen: dict[str, list[str]] = {}
    for pool in ("train", "exploit", "collusive"):
        for name in pools.get(pool) or []:
            seen.setdefault(name, []).append(pool)
    return [f"{name} is in pools {', '.join(p)} of {game}" for name, p in seen.items() if len(p) > 1]


def run_overrides() -> list[str]:
    """The overrides this Hydra run was launched with (a sweep job's own); none outside a Hydra run."""
    from hydra.core.hydra_config import HydraConfig

    try:
        return list(HydraConfig.get().overrides.task)
    except ValueError:
        return []


def validate(cfg: DictConfig, overrides: Sequence[str] | None = None) -> None:
    """Every check, before any work. `overrides` (default: this Hydra run's) must give booleans as true or false."""
    check_settings(cfg, overrides)
    check_paths(cfg)
    check_stage_keys(cfg)
    check_model_fit(cfg)


def check_settings(cfg: DictConfig, overrides: Sequence[str] | None = None) -> None:
    """The checks that need neither the run's paths nor the model's own config: the command line runs them
    on a single run before Hydra starts it (and before torch is imported), so a bad value is refused in
    seconds; `validate` runs them again inside the run."""
    loose = loose_boolean_override(cfg, run_overrides() if overrides is None else overrides)
    require(loose is None, loose or "")
    require(
        cfg.stage.name in STAGES, f"stage={cfg.stage.name} is not a known stage; allowed: {', '.join(sorted(STAGES))}"
    )
    game = cfg.game.name
    require(game in games.names(), f"game={game} is not a known game; allowed: {', '.join(games.names())}")
    require(
        cfg.model.name in MODEL_KINDS, f"model={cfg.model.name} is not a known model; allowed: {', '.join(MODEL_KINDS)}"
    )
    check_rules(cfg)
    check_game(cfg)
    check_strategies(cfg)
    check_model(cfg)
    check_relations(cfg)
    check_sizes(cfg)


def check_stage_keys(cfg: DictConfig) -> None:
    """Every key of a stage node is one of conf/<stage>/default.yaml's: a key a model's stage defaults
    (conf/<stage>/model/<model>.yaml) or a preset adds would be read by nothing, a typo that silently keeps
    the default. It is an error instead."""
    for stage in STAGE_NODES:
        known = set(dotted_keys(OmegaConf.to_container(OmegaConf.load(CONF_DIR / stage / "default.yaml"))))
        for key in dotted_keys(OmegaConf.to_container(cfg[stage], resolve=False)):
            require(
                key in known,
                f"{stage}.{key} is not a key of the {stage} node (set by model={cfg.model.name}'s "
                f"conf/{stage}/model/{cfg.model.name}.yaml, its conf/sepo/model_game/ file, or a preset); "
                f"allowed: {', '.join(sorted(known))}",
            )


def check_game(cfg: DictConfig) -> None:
    """The rules between a game's own keys (its package's `check`; each key's range is a rule of its own)."""
    game = cfg.game
    problem = games.entry(game.name).check(game)
    require(problem is None, problem or "")
    known = known_strategies(game.name)
    for name in game.get("strategy_params") or {}:
        require(
            name in known,
            f"game.strategy_params.{name}: unknown {game.name} strategy {name!r}; allowed: {', '.join(known)}",
        )


def check_strategies(cfg: DictConfig) -> None:
    """Every strategy the game config names exists, sits where it can, and builds with its parameters."""
    game = cfg.game.name
    for line in validate_pools(game, cfg.game.pools):
        warnings.warn(f"pool overlap: {line}", PoolOverlapWarning, stacklevel=3)
        log.warning("pool overlap: %s", line)
    known = known_strategies(game)
    for strategy, weight in cfg.game.demonstrators.items():
        require(
            strategy in known,
            f"game.demonstrators: unknown {game} strategy {strategy!r}; allowed: {', '.join(known)}",
        )
        check(f"game.demonstrators.{strategy}", weight, real(0.0))
    require(
        sum(float(w) for w in cfg.game.demonstrators.values()) > 0,
        f"game.demonstrators={dict(cfg.game.demonstrators)}: no demonstrator can be drawn; allowed: weights >= 0 "
        "with a positive sum",
    )
    for strategy in cfg.game.datagen.get("opponents") or []:
        require(
            strategy in known,
            f"game.datagen.opponents: unknown {game} strategy {strategy!r}; allowed: {', '.join(known)}",
        )
    scripted = [n for n in known if not responds_to_agent(game, n)]  # a best responder needs an agent's table
    for key, names in (
        ("game.demonstrators", list(cfg.game.demonstrators)),
        ("game.datagen.opponents", list(cfg.game.datagen.get("opponents") or [])),
        ("model.strategy", [cfg.model.strategy or cfg.game.reference_strategy] if cfg.model.name == "scripted" else []),
    ):
        for strategy in names:
            require(
                not responds_to_agent(game, strategy),
                f"{key}: {strategy} responds to the agent's own table, so it can "
                f"only sit in game.pools; allowed: {', '.join(scripted)}",
            )
    configured = {n for pool in POOLS for n in cfg.game.pools.get(pool) or []} | set(cfg.game.demonstrators)
    for strategy in sorted(configured):  # builds each with its strategy_params: bad params fail here
        make_strategy(cfg.game, strategy, key="game.pools")
