"""The `model` node's schemas, one per kind of model (conf/model/<model>.yaml names its own, `- schema_<model>`):
the keys every language model has, a hub checkpoint's, Qwen's, and the embedded tiny model's build settings.
Each field carries its allowed values (`allowed`, sepo/config_rules.py), as in sepo/run/schema.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING

from sepo import games
from sepo.config_rules import (
    SEED,
    allowed,
    even_integer,
    integer,
    mapping,
    names_of,
    non_empty_name,
    one_of,
    optional_name,
    probability,
    real,
    regex,
    unchecked,
)

TORCH_DTYPES = ("auto", "bfloat16_if_fast", "float32", "bfloat16", "float16", "float64")
#: the smallest vocabulary tiny's byte-level BPE can have: its 256 byte tokens and its special and think tokens
TINY_MIN_VOCAB = 256 + 5


@dataclass
class ScriptedModelSchema:
    name: str = unchecked("one of conf/model/, checked by sepo.run.config.check_settings")
    strategy: str | None = unchecked("a strategy of the game, checked by sepo.run.config.check_strategies")


@dataclass
class LoraTargetsSchema:
    target_modules: str | None = allowed(regex(optional=True))


@dataclass
class LanguageModelSchema:
    """The keys every language model's YAML has (conf/model/<model>.yaml says what each means)."""

    name: str = unchecked("one of conf/model/, checked by sepo.run.config.check_settings")
    path: str | None = unchecked("a checkpoint directory or a hub id, checked by sepo.run.config.check_paths")
    revision: str | None = allowed(optional_name("the default branch"))
    model_class: str = allowed(non_empty_name())
    dtype: str = allowed(one_of(*TORCH_DTYPES))
    attn_implementation: str | None = unchecked("transformers' own choices, which it checks when it loads")
    trust_remote_code: bool = MISSING
    token_type_ids: bool = MISSING
    thinking: bool = MISSING
    chat_template_kwargs: dict[str, Any] = allowed(mapping())
    prefix_cache: bool = MISSING
    prefix_tree: bool = MISSING
    static_cache: bool = MISSING
    decode_graphs: bool = MISSING
    cascade_attention: bool = MISSING
    drop_stopped_rows: float = allowed(probability())
    packed_linears: bool = MISSING
    cpu_workers: int = allowed(integer(1, why="the processes evaluations and rollouts are split over on a CPU"))
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
    pad_vocab_to_multiple_of: int = allowed(integer(1))
    hidden_size: int = allowed(integer(1))
    intermediate_size: int = allowed(integer(1))
    num_hidden_layers: int = allowed(integer(1))
    num_attention_heads: int = allowed(integer(1))
    num_key_value_heads: int = allowed(integer(1))
    head_dim: int = allowed(even_integer(2))  # RoPE halves it
    max_position_embeddings: int = allowed(integer(2))
    rope_theta: float = allowed(real(0.0, strict=True))
    initializer_range: float = allowed(real(0.0, strict=True))
    tie_word_embeddings: bool = MISSING


@dataclass
class TinyTokenizerSchema:
    vocab_size: int = allowed(integer(TINY_MIN_VOCAB, why="256 byte tokens and 5 special ones"))
    min_frequency: int = allowed(integer(1))


@dataclass
class TinyCorpusSchema:
    games: list[str] = allowed(lambda: names_of(games.names(), "games"))
    seed: int = allowed(SEED)
    episodes_per_opponent: int = allowed(integer(1))


@dataclass
class TinyModelSchema(LanguageModelSchema):
    """The embedded model: its build settings besides the loading ones."""

    seed: int = allowed(SEED)
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
