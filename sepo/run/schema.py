"""The config's schemas: every key of every node (the run's own keys and `paths`, the stages `sepo`, `sft`,
`eval`, `datagen`, `exploiter`, and `model` (sepo/run/model_schemas.py), `game` (each game's package), `lambdas`, `logger`,
`stage`) with its type and its allowed values.

The values and their comments stay in the YAML files. conf/config.yaml names the run's schema (`RunSchema`)
first in its defaults list, and each group's YAML names its own (`- schema`, or `- schema_<name>` where a
group's options differ in their keys: a game's rules, a model's build settings, a logger), so Hydra
composes every node onto these types: a value is converted to its key's type or refused, and a key outside
the schema is refused.

A field's allowed values are its metadata (`allowed(rule)`, sepo/config_rules.py), and the one-line errors
come from there: `sepo.run.rules.rules()` reads them off these classes, with the stages where each node
matters. A field with no rule says why (`unchecked(reason)`): another check covers it, or any value will do.
A boolean needs none: true or false is all it can hold. The rules between keys and the check that no stage
key outside the YAML was added (`check_stage_keys`) are in `sepo.run.config` and `sepo.run.relations`.

Booleans: OmegaConf converts "yes", "on" and 1 to true; the command line's booleans are held to
true/false by `sepo.run.config.loose_boolean_override` before any run.

A field with two kinds of value (`sft.save_steps`: optimizer steps or a share of the run) is `Any`:
OmegaConf has no unions; its rule checks it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, make_dataclass
from typing import Any

from omegaconf import MISSING

from sepo import games, penalties
from sepo.config_rules import (
    SEED,
    Rule,
    allowed,
    distinct_names_of,
    even_integer,
    integer,
    named_integers,
    named_lists,
    names_of,
    non_empty_name,
    one_of,
    optional_integers_of,
    optional_name,
    real,
    step_list,
    steps_or_share,
    strings,
    temperature,
    unchecked,
)
from sepo.run.model_schemas import MODEL_SCHEMAS
from sepo.training.options import (
    ADV_NORMS,
    CREDITS,
    ESTIMATORS,
    EXPLOITER_OBJECTIVES,
    LENGTH_NORMS,
    LR_SCHEDULES,
    PENALTY_MODES,
)

#: the stages a key matters to (`where` of a field's rule; a node's own is in sepo.run.rules.nodes())
EVAL, DATA, SFT = "eval sft sepo pipeline exploiter", "datagen sft pipeline", "sft pipeline"
SEPO, EXPLOITER = "sepo pipeline exploiter", "exploiter"  # the exploiter trains with SEPO's machinery
LOGGER_MODES = ("offline", "online", "disabled")
#: transformers' learning-rate schedules that need no settings beyond the warm-up (`sft.lr_scheduler`)
SFT_SCHEDULERS = (
    "linear",
    "cosine",
    "cosine_with_restarts",
    "polynomial",
    "constant",
    "constant_with_warmup",
    "inverse_sqrt",
)
#: a field whose value names a directory: `check_paths` (sepo/run/config.py) checks each one a run writes to
A_DIRECTORY = "a directory, checked by sepo.run.config.check_paths where a run reads or writes it"
#: a node of the root that a config group fills: its keys are typed and ruled by its group's schema
GROUP_NODE = "a group's node, composed onto the group's own schema"
#: `game_lambdas`: the game's own weights, which a run reads only through `lambdas` (conf/lambdas/zero.yaml)
GAME_WEIGHTS = "the game's own weights, read only through lambdas (conf/lambdas/zero.yaml), whose rules check them"


def penalty_keys() -> list[str]:
    return list(penalties.keys())


# ------------------------------------------------------------------------------ the run
@dataclass
class PathsSchema:
    root_dir: str = unchecked(A_DIRECTORY)
    output_dir: str = unchecked(A_DIRECTORY)
    cache_dir: str = unchecked(A_DIRECTORY)


@dataclass
class RunSchema:
    """The root: the run's own keys, then one node per config group (each composed onto its group's schema)."""

    seed: int = allowed(SEED)
    generation_seed: int = allowed(SEED)
    resume: str = allowed(one_of("auto", "never"))
    sweep_name: str = unchecked("names the sweep's directory; any name will do")
    paths: PathsSchema = field(default_factory=PathsSchema)
    stage: Any = unchecked(GROUP_NODE)
    game: Any = unchecked(GROUP_NODE)
    lambdas: Any = unchecked(GROUP_NODE)
    game_lambdas: Any = unchecked(GAME_WEIGHTS)
    model: Any = unchecked(GROUP_NODE)
    datagen: Any = unchecked(GROUP_NODE)
    sft: Any = unchecked(GROUP_NODE)
    eval: Any = unchecked(GROUP_NODE)
    sepo: Any = unchecked(GROUP_NODE)
    exploiter: Any = unchecked(GROUP_NODE)
    logger: Any = unchecked(GROUP_NODE)


@dataclass
class StageSchema:
    name: str = unchecked("one of conf/stage/, checked by sepo.run.config.check_settings")


@dataclass
class NoLoggerSchema:
    name: str = unchecked("one of conf/logger/")


@dataclass
class WandbLoggerSchema(NoLoggerSchema):
    mode: str = allowed(one_of(*LOGGER_MODES))
    project: str = allowed(non_empty_name())
    entity: str | None = allowed(optional_name("your default"))
    group: str = allowed(non_empty_name())
    tags: list[str] = allowed(strings())


#: logger (conf/logger/<logger>.yaml) -> its schema, registered as `logger/schema_<logger>`
LOGGER_SCHEMAS = {"none": NoLoggerSchema, "wandb": WandbLoggerSchema}


# ------------------------------------------------------------------------------ the stages
@dataclass
class LoraSchema:
    """A LoRA adapter: rank, scale, dropout and (SFT) the modules it wraps."""

    r: int = allowed(integer(1))
    alpha: float = allowed(real(0.0, strict=True))
    dropout: float = allowed(real(0.0, high=1.0))


@dataclass
class SftLoraSchema(LoraSchema):
    target_modules: str | None = allowed(optional_name("the model's model.lora.target_modules"))


@dataclass
class SepoSchema:
    steps: int = allowed(integer(1))
    seed: int = allowed(SEED)
    rollouts_per_opponent: int = allowed(
        integer(2, why="the leave-one-out baseline compares each rollout with the others of its group")
    )
    rollouts_by_pool: dict[str, int | None] = allowed(
        lambda: optional_integers_of(penalties.trained_pools(), 2, "pools")
    )
    estimator: str = allowed(one_of(*ESTIMATORS))
    infoset_samples: int = allowed(integer(2, why="the leave-one-out baseline compares each answer with the others"))
    responder_table_decay: float = allowed(real(0.0, high=1.0, high_closed=True))
    penalty_mode: str = allowed(one_of(*PENALTY_MODES))
    credit: str = allowed(one_of(*CREDITS))
    adv_norm: str = allowed(one_of(*ADV_NORMS))
    adv_eps: float = allowed(real(0.0, strict=True))
    adv_scale_decay: float = allowed(real(0.0, high=1.0))
    length_norm: str = allowed(one_of(*LENGTH_NORMS))
    exploit_switch_episodes: int = allowed(integer(1))
    lr: float = allowed(real(0.0, strict=True))
    lr_schedule: str = allowed(one_of(*LR_SCHEDULES))
    lr_final_ratio: float = allowed(real(0.0, high=1.0, high_closed=True))
    temperature: float = allowed(temperature(greedy=False))
    max_new_tokens: int = allowed(integer(1))
    aux_episodes: int = allowed(integer(1))
    beta: float = allowed(real(0.0))
    clip_eps: float = allowed(real(0.0, strict=True))
    grad_clip: float = allowed(real(0.0, strict=True))
    optimizer: str = allowed(one_of("adamw", "sgd"))
    momentum: float = allowed(real(0.0, high=1.0))
    weight_decay: float = allowed(real(0.0))
    reward_scale: float = allowed(real(0.0, strict=True))
    refresh_steps: int = allowed(integer(1))
    refresh_kl: float = allowed(real(0.0, strict=True))
    trust_region_kl: float = allowed(real(0.0))
    line_search_steps: int = allowed(integer(0))
    held_terms: list[str] = allowed(lambda: distinct_names_of(penalty_keys(), "penalty terms"))
    held_average: float = allowed(real(0.0, high=1.0))
    held_level_z: float = allowed(real(0.0))
    held_at_start: list[str] = allowed(lambda: distinct_names_of(penalty_keys(), "penalty terms"))
    micro_batch: int = allowed(integer(1))
    micro_batch_tokens: int = allowed(integer(0))
    no_grad_micro_batch_tokens: int = allowed(integer(0))
    generate_batch: int = allowed(integer(0))
    logprob_chunk: int = allowed(integer(1))
    checkpoint_steps: list[int] = allowed(step_list())
    best_response_every: int = allowed(integer(1))
    best_response_samples: int = allowed(integer(2))
    ref_4bit: bool = MISSING
    fold_adapter_for_reads: bool = MISSING
    debug_kill_after_step: int | None = allowed(integer(1, optional=True))
    debug_detect_anomaly: bool = MISSING
    init_adapter: str | None = unchecked(A_DIRECTORY)
    learned_exploiters: list[str] = unchecked(A_DIRECTORY)
    lora: LoraSchema = field(default_factory=LoraSchema)


@dataclass
class SftSchema:
    dataset: str | None = allowed(
        Rule(lambda v: isinstance(v, str) and v != "", "a dataset name (game.sft_dataset names each game's)")
    )
    data_dir: str = unchecked(A_DIRECTORY)
    full_finetune: bool = MISSING
    lora: SftLoraSchema = field(default_factory=SftLoraSchema)
    lr: float = allowed(real(0.0, strict=True))
    lr_scheduler: str = allowed(one_of(*SFT_SCHEDULERS))
    epochs: float = allowed(real(0.0, strict=True))
    max_steps: int | None = allowed(integer(1, optional=True))
    max_examples: int | None = allowed(integer(1, optional=True))
    max_valid_examples: int | None = allowed(integer(1, optional=True))
    per_device_batch_size: int = allowed(integer(1))
    grad_accum: int = allowed(integer(1))
    max_length: int = allowed(integer(1))
    warmup_ratio: float = allowed(real(0.0, high=1.0))
    weight_decay: float = allowed(real(0.0))
    adam_beta1: float = allowed(real(0.0, high=1.0))
    adam_beta2: float = allowed(real(0.0, high=1.0))
    max_grad_norm: float = allowed(real(0.0, strict=True))
    bf16: bool = MISSING
    gradient_checkpointing: bool = MISSING
    assistant_only_loss: bool = MISSING
    answer_logits_only: bool = MISSING
    prefix_sharing: bool = MISSING
    prefix_min_tokens: int = allowed(integer(1))
    pass_cost: float = allowed(real(0.0))
    evaluate: bool = MISSING
    eval_steps: int = allowed(integer(1))
    eval_batch_size: int = allowed(integer(1))
    logging_steps: int = allowed(integer(1))
    save_steps: Any = allowed(steps_or_share())
    save_total_limit: int | None = allowed(integer(1, optional=True))
    agreement_examples: int = allowed(integer(0))
    agreement_batch_size: int = allowed(integer(1))
    agreement_max_new_tokens: int = allowed(integer(1))
    seed: int = allowed(SEED)


@dataclass
class EvalSchema:
    episodes_per_opponent: int = allowed(integer(1))
    temperature: float = allowed(temperature(greedy=True))
    max_new_tokens: int = allowed(integer(1))
    batch_size: int = allowed(integer(0))
    action_samples: int = allowed(integer(2))
    episode_memory_kb: float = allowed(real(0.0, strict=True))
    phase: str | None = allowed(one_of(None, "sft"), where="all")
    validation_seed: int = allowed(SEED, where=SEPO)
    progress: bool = MISSING


@dataclass
class DatagenSchema:
    out_dir: str = unchecked(A_DIRECTORY)
    datasets: list[str] = allowed(strings())  # each one a key of datagen.dataset_games (checked when building)
    seed: int = allowed(SEED)
    valid_fraction: float = allowed(real(0.0, strict=True, high=1.0), where="all")
    multi_games: list[str] = allowed(lambda: names_of(games.names(), "games"))
    multi_per_game: int = allowed(integer(1))
    dataset_games: dict[str, list[str]] = allowed(lambda: named_lists(games.names(), "games"))
    per_game_cap: dict[str, int] = allowed(named_integers(1))
    num_opponents: int = allowed(integer(1))
    episodes_per_opponent: int | None = allowed(integer(1, optional=True))


@dataclass
class ExploiterSchema:
    """A learned exploiter (`stage=exploiter`). It trains with the SEPO stage's machinery (`sepo.*`), but for the
    keys below that `sepo` also has, which replace those (`sepo.stages.exploiter.exploiter_settings`)."""

    victim: str | None = unchecked("checked by sepo.training.victims.resolve_victim when the stage starts")
    base: str | None = unchecked("checked by sepo.training.victims.resolve_exploiter_base when the stage starts")
    objective: str = allowed(one_of(*EXPLOITER_OBJECTIVES))
    groups: int = allowed(integer(1))
    eval_episodes: int = allowed(even_integer(2))
    checkpoint_steps: list[int] = allowed(step_list())
    seed: int = allowed(SEED)
    steps: int = allowed(integer(1))
    optimizer: str = allowed(one_of("adamw", "sgd"))
    lr: float = allowed(real(0.0, strict=True))
    lr_schedule: str = allowed(one_of(*LR_SCHEDULES))
    beta: float = allowed(real(0.0))
    trust_region_kl: float = allowed(real(0.0))
    refresh_steps: int = allowed(integer(1))
    temperature: float = allowed(temperature(greedy=False))
    credit: str = allowed(one_of(*CREDITS))
    lora: LoraSchema = field(default_factory=LoraSchema)


# ------------------------------------------------------------------------------ lambdas
def lambdas_schema() -> type:
    """`lambdas`: a train and an eval weight for every penalty term registered now (sepo/penalties.py), so a
    new term's lambda is a typed key of its own and a key no term has is refused.

    The classes are made anew from the registry, and bound to this module's names (`LambdasSchema`,
    `PenaltyWeightsSchema`): a config typed by them is pickled by that name (a forked worker hands its episodes
    back with their game's config), so the name must find the class."""
    weights = make_dataclass("PenaltyWeightsSchema", [(key, float, allowed(real(0.0))) for key in penalties.keys()])
    schema = make_dataclass(
        "LambdasSchema", [(phase, weights, field(default_factory=weights)) for phase in ("train", "eval")]
    )
    weights.__module__ = schema.__module__ = __name__  # (make_dataclass takes `module=` from Python 3.12)
    globals().update(PenaltyWeightsSchema=weights, LambdasSchema=schema)
    return schema


LambdasSchema = lambdas_schema()


#: the schema of each stage node, registered as `<stage>/schema` (conf/<stage>/default.yaml names it)
SCHEMAS = {
    "sepo": SepoSchema,
    "sft": SftSchema,
    "eval": EvalSchema,
    "datagen": DatagenSchema,
    "exploiter": ExploiterSchema,
}


def register() -> None:
    """Put the schemas where Hydra's defaults lists find them; idempotent."""
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    store.store(name="schema", node=RunSchema)
    store.store(group="stage", name="schema", node=StageSchema)
    for stage, schema in SCHEMAS.items():
        store.store(group=stage, name="schema", node=schema)
    store.store(group="lambdas", name="schema", node=lambdas_schema())
    for group, schemas in (("model", MODEL_SCHEMAS), ("logger", LOGGER_SCHEMAS)):
        for name, schema in schemas.items():
            store.store(group=group, name=f"schema_{name}", node=schema)
    for name in games.names():
        store.store(group="game", name=f"schema_{name}", node=games.entry(name).schema)
