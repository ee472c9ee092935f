"""The stage nodes' schemas: every key of `sepo`, `sft`, `eval` and `datagen` with its type.

The values and their comments stay in `conf/<stage>/default.yaml`, which names its schema first in its
defaults list (`- schema`), so Hydra composes every stage node onto these types: a value is converted to
its key's type or refused. The ranges, the rules between keys and the check that no key outside the YAML
was added (`check_stage_keys`) stay in `sepo.config`, which also words a refused value's one-line error
(`type_error_line`).

A field with two kinds of value (`sft.save_steps`: optimizer steps or a share of the run) is `Any`:
OmegaConf has no unions; its rule checks it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING


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
    weight_decay: float = MISSING
    reward_scale: float = MISSING
    refresh_steps: int = MISSING
    refresh_kl: float = MISSING
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


#: the schema of each stage node, registered as `<stage>/schema` (conf/<stage>/default.yaml names it)
SCHEMAS = {"sepo": SepoSchema, "sft": SftSchema, "eval": EvalSchema, "datagen": DatagenSchema}


def register() -> None:
    """Put the schemas where Hydra's defaults lists find them; idempotent."""
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    for stage, schema in SCHEMAS.items():
        store.store(group=stage, name="schema", node=schema)
