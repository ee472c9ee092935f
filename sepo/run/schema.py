"""The config's schemas: every key of every node (the stages `sepo`, `sft`, `eval`, `datagen`, and
`model`, `game`, `lambdas`) with its type.

The values and their comments stay in the YAML files, each of which names its schema first in its
defaults list (`- schema`, or `- schema_<name>` where a group's options differ in their keys: a game's
rules, a model's build settings), so Hydra composes every node onto these types: a value is converted
to its key's type or refused, and a key outside the schema is refused. The ranges, the rules between
keys and the check that no stage key outside the YAML was added (`check_stage_keys`) stay in
`sepo.run.config`, which also words a refused value's one-line error (`type_error_line`).

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


@dataclass
class LoraSchema:
    """A LoRA adapter: rank, scale, dropout and (SFT) the modules it wraps."""

    r: int = MISSING
    alpha: float = MISSING
    dropout: float = MISSING


@dataclass
class SftLoraSchema(LoraSchema):
    target_modules: str | None = MISSING


@dataclass
class SepoSchema:
    steps: int = MISSING
    seed: int = MISSING
    rollouts_per_opponent: int = MISSING
    rollouts_by_pool: dict[str, int | None] = MISSING
    estimator: str = MISSING
    infoset_samples: int = MISSING
    responder_table_decay: float = MISSING
    penalty_mode: str = MISSING
    credit: str = MISSING
    adv_norm: str = MISSING
    adv_eps: float = MISSING
    adv_scale_decay: float = MISSING
    length_norm: str = MISSING
    exploit_switch_episodes: int = MISSING
    lr: float = MISSING
    lr_schedule: str = MISSING
    lr_final_ratio: float = MISSING
    temperature: float = MISSING
    max_new_tokens: int = MISSING
    aux_episodes: int = MISSING
    beta: float = MISSING
    clip_eps: float = MISSING
    grad_clip: float = MISSING
    optimizer: str = MISSING
    momentum: float = MISSING
    weight_decay: float = MISSING
    reward_scale: float = MISSING
    refresh_steps: int = MISSING
    refresh_kl: float = MISSING
    trust_region_kl: float = MISSING
    line_search_steps: int = MISSING
    held_terms: list[str] = MISSING
    held_average: float = MISSING
    held_level_z: float = MISSING
    held_at_start: list[str] = MISSING
    micro_batch: int = MISSING
    micro_batch_tokens: int = MISSING
    no_grad_micro_batch_tokens: int = MISSING
    generate_batch: int = MISSING
    logprob_chunk: int = MISSING
    checkpoint_steps: list[int] = MISSING
    best_response_every: int = MISSING
    best_response_samples: int = MISSING
    ref_4bit: bool = MISSING
    fold_adapter_for_reads: bool = MISSING
    debug_kill_after_step: int | None = MISSING
    debug_detect_anomaly: bool = MISSING
    lora: LoraSchema = field(default_factory=LoraSchema)


@dataclass
class SftSchema:
    dataset: str | None = MISSING
    data_dir: str = MISSING
    full_finetune: bool = MISSING
    lora: SftLoraSchema = field(default_factory=SftLoraSchema)
    lr: float = MISSING
    lr_scheduler: str = MISSING
    epochs: float = MISSING
    max_steps: int | None = MISSING
    max_examples: int | None = MISSING
    max_valid_examples: int | None = MISSING
    per_device_batch_size: int = MISSING
    grad_accum: int = MISSING
    max_length: int = MISSING
    warmup_ratio: float = MISSING
    weight_decay: float = MISSING
    adam_beta1: float = MISSING
    adam_beta2: float = MISSING
    max_grad_norm: float = MISSING
    bf16: bool = MISSING
    gradient_checkpointing: bool = MISSING
    assistant_only_loss: bool = MISSING
    answer_logits_only: bool = MISSING
    prefix_sharing: bool = MISSING
    prefix_min_tokens: int = MISSING
    pass_cost: float = MISSING
    evaluate: bool = MISSING
    eval_steps: int = MISSING
    eval_batch_size: int = MISSING
    logging_steps: int = MISSING
    save_steps: Any = MISSING
    save_total_limit: int | None = MISSING
    agreement_examples: int = MISSING
    agreement_batch_size: int = MISSING
    agreement_max_new_tokens: int = MISSING
    seed: int = MISSING


@dataclass
class EvalSchema:
    episodes_per_opponent: int = MISSING
    temperature: float = MISSING
    max_new_tokens: int = MISSING
    batch_size: int = MISSING
    action_samples: int = MISSING
    episode_memory_kb: float = MISSING
    phase: str | None = MISSING
    validation_seed: int = MISSING
    progress: bool = MISSING


@dataclass
class DatagenSchema:
    out_dir: str = MISSING
    datasets: list[str] = MISSING
    seed: int = MISSING
    valid_fraction: float = MISSING
    multi_games: list[str] = MISSING
    multi_per_game: int = MISSING
    dataset_games: dict[str, list[str]] = MISSING
    per_game_cap: dict[str, int] = MISSING
    num_opponents: int = MISSING
    episodes_per_opponent: int | None = MISSING


# ------------------------------------------------------------------------------ lambdas
def lambdas_schema() -> type:
    """`lambdas`: a train and an eval weight for every penalty term registered now (sepo/penalties.py), so a
    new term's lambda is a typed key of its own and a key no term has is refused.

    The classes are made anew from the registry, and bound to this module's names (`LambdasSchema`,
    `PenaltyWeightsSchema`): a config typed by them is pickled by that name (a forked worker hands its episodes
    back with their game's config), so the name must find the class."""
    weights = make_dataclass("PenaltyWeightsSchema", [(key, float, MISSING) for key in penalties.keys()])
    schema = make_dataclass(
        "LambdasSchema", [(phase, weights, field(default_factory=weights)) for phase in ("train", "eval")]
    )
    weights.__module__ = schema.__module__ = __name__  # (make_dataclass takes `module=` from Python 3.12)
    globals().update(PenaltyWeightsSchema=weights, LambdasSchema=schema)
    return schema


LambdasSchema = lambdas_schema()


# ------------------------------------------------------------------------------ models
@dataclass
class ScriptedModelSchema:
    name: str = MISSING
    strategy: str | None = MISSING


@dataclass
class LoraTargetsSchema:
    target_modules: str | None = MISSING


@dataclass
class LanguageModelSchema:
    """The keys every language model's YAML has (conf/model/<model>.yaml says what each means)."""

    name: str = MISSING
    path: str | None = MISSING
    revision: str | None = MISSING
    model_class: str = MISSING
    dtype: str = MISSING
    attn_implementation: str | None = MISSING
    trust_remote_code: bool = MISSING
    token_type_ids: bool = MISSING
    thinking: bool = MISSING
    chat_template_kwargs: dict[str, Any] = MISSING
    prefix_cache: bool = MISSING
    prefix_tree: bool = MISSING
    static_cache: bool = MISSING
    decode_graphs: bool = MISSING
    cascade_attention: bool = MISSING
    drop_stopped_rows: float = MISSING
    packed_linears: bool = MISSING
    cpu_workers: int = MISSING
    lora: LoraTargetsSchema = field(default_factory=LoraTargetsSchema)


@dataclass
class HubModelSchema(LanguageModelSchema):
    """A checkpoint read from `path` (a directory or a hub id), never built here."""

    download: bool = MISSING


@dataclass
class QwenModelSchema(HubModelSchema):
    lean_delta_decode: bool = MISSING


@dataclass
class TinyArchitectureSchema:
    pad_vocab_to_multiple_of: int = MISSING
    hidden_size: int = MISSING
    intermediate_size: int = MISSING
    num_hidden_layers: int = MISSING
    num_attention_heads: int = MISSING
    num_key_value_heads: int = MISSING
    head_dim: int = MISSING
    max_position_embeddings: int = MISSING
    rope_theta: float = MISSING
    initializer_range: float = MISSING
    tie_word_embeddings: bool = MISSING


@dataclass
class TinyTokenizerSchema:
    vocab_size: int = MISSING
    min_frequency: int = MISSING


@dataclass
class TinyCorpusSchema:
    games: list[str] = MISSING
    seed: int = MISSING
    episodes_per_opponent: int = MISSING


@dataclass
class TinyModelSchema(LanguageModelSchema):
    """The embedded model: its build settings besides the loading ones."""

    seed: int = MISSING
    architecture: TinyArchitectureSchema = field(default_factory=TinyArchitectureSchema)
    tokenizer: TinyTokenizerSchema = field(default_factory=TinyTokenizerSchema)
    corpus: TinyCorpusSchema = field(default_factory=TinyCorpusSchema)


#: model (conf/model/<model>.yaml) -> its schema, registered as `model/schema_<model>`
MODEL_SCHEMAS = {
    "scripted": ScriptedModelSchema,
    "tiny": TinyModelSchema,
    "smollm2": LanguageModelSchema,
    "gemma4": HubModelSchema,
    "qwen": QwenModelSchema,
}


#: the schema of each stage node, registered as `<stage>/schema` (conf/<stage>/default.yaml names it)
SCHEMAS = {"sepo": SepoSchema, "sft": SftSchema, "eval": EvalSchema, "datagen": DatagenSchema}


def register() -> None:
    """Put the schemas where Hydra's defaults lists find them; idempotent."""
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    for stage, schema in SCHEMAS.items():
        store.store(group=stage, name="schema", node=schema)
    store.store(group="lambdas", name="schema", node=lambdas_schema())
    for name, schema in MODEL_SCHEMAS.items():
        store.store(group="model", name=f"schema_{name}", node=schema)
    for name in games.names():
        store.store(group="game", name=f"schema_{name}", node=games.entry(name).schema)
