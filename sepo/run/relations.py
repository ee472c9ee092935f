"""The checks between fields, after each field's own rule (`sepo.run.rules`): what a model's settings need of
each other and of the stage, and how the stages' settings relate (the validation seed is not the test seed,
SFT's prefix sharing needs its answer-only logits, a dataset names games the run can play, ...).
"""

from __future__ import annotations

import logging

from omegaconf import DictConfig

from sepo.builders.smollm2 import gguf_path
from sepo.games.strategy import known_strategies
from sepo.run.rules import BUILT_MODELS, MODEL_KINDS, TRAINING_STAGES, applies, require
from sepo.run.schema import SEPO, SFT
from sepo.training.options import EXACT_VALUE_GAMES
from sepo.training.sft_dataset import dataset_names

log = logging.getLogger(__name__)


def check_model(cfg: DictConfig) -> None:
    """The agent can do what the stage asks of it, and a language model says where it comes from."""
    if cfg.stage.name in TRAINING_STAGES:
        require(
            cfg.model.name != "scripted",
            f"model=scripted is not allowed with stage={cfg.stage.name}: {cfg.stage.name} trains a language "
            f"model; allowed: model={', '.join(m for m in MODEL_KINDS if m != 'scripted')}",
        )
    if cfg.model.name == "scripted":
        strategy, known = cfg.model.strategy or cfg.game.reference_strategy, known_strategies(cfg.game.name)
        require(
            strategy in known,
            f"model.strategy: unknown {cfg.game.name} strategy {strategy!r}; allowed: {', '.join(known)}",
        )
    elif cfg.model.name == "smollm2" and not cfg.model.get("path"):
        gguf_path()  # the package it is built from is installed (else one line naming the install command)
    elif cfg.model.name not in BUILT_MODELS:
        require(
            bool(cfg.model.get("path")),
            f"model.path is not set for model={cfg.model.name}; set model.path to "
            "a local checkpoint directory (or a hub id already in the Hugging Face cache)",
        )
    require(
        not (cfg.model.get("prefix_tree") and not cfg.model.get("prefix_cache")),
        f"model.prefix_tree=true needs plain full attention (model.prefix_cache=true), which model={cfg.model.name} "
        "does not declare; allowed: model.prefix_tree=false",
    )
    require(
        not (cfg.model.get("cascade_attention") and not cfg.model.get("prefix_cache")),
        f"model.cascade_attention=true needs plain full attention (model.prefix_cache=true), which model={cfg.model.name} "
        "does not declare; allowed: model.cascade_attention=false",
    )
    require(
        not (cfg.model.get("cascade_attention") and cfg.model.get("attn_implementation") not in (None, "sdpa")),
        f"model.cascade_attention=true runs on SDPA, not model.attn_implementation={cfg.model.get('attn_implementation')}; "
        "allowed: model.attn_implementation=null or sdpa, or model.cascade_attention=false",
    )
    require(
        not (cfg.model.get("decode_graphs") and not cfg.model.get("static_cache")),
        "model.decode_graphs=true replays decode steps on a preallocated cache; allowed: model.static_cache=true "
        "with it, or model.decode_graphs=false",
    )
    require(
        not (cfg.model.get("decode_graphs") and cfg.model.get("cascade_attention")),
        "model.decode_graphs=true and model.cascade_attention=true: cascade attention runs on a CPU, graphs on a GPU; "
        "allowed: one of them false",
    )
    drop = cfg.model.get("drop_stopped_rows", 0) or 0
    require(
        not (drop and not cfg.model.get("prefix_cache")),
        f"model.drop_stopped_rows={drop} needs plain full attention (model.prefix_cache=true), which model={cfg.model.name} "
        "does not declare; allowed: model.drop_stopped_rows=0",
    )
    require(
        not (drop and cfg.model.get("decode_graphs")),
        f"model.drop_stopped_rows={drop} and model.decode_graphs=true: graphs replay whole batches; allowed: "
        "model.drop_stopped_rows=0 or model.decode_graphs=false",
    )


def check_relations(cfg: DictConfig) -> None:
    """Rules between fields (and between a field and this machine) that no single field's rule can say."""
    episodes = cfg.eval.episodes_per_opponent
    if cfg.game.get("mirrored"):
        require(
            episodes % 2 == 0,
            f"eval.episodes_per_opponent={episodes} is not allowed for game={cfg.game.name} (episodes "
            "are dealt in seat-swapped pairs); allowed: an even integer >= 2",
        )
    if applies(SEPO, cfg):
        check_sepo_relations(cfg)
    if cfg.model.name == "tiny":
        arch = cfg.model.architecture
        require(
            arch.num_attention_heads % arch.num_key_value_heads == 0,
            f"model.architecture.num_attention_heads={arch.num_attention_heads} is not allowed with "
            f"num_key_value_heads={arch.num_key_value_heads}: grouped-query attention shares each key/value head "
            "among the same number of query heads; allowed: a multiple of model.architecture.num_key_value_heads",
        )
    if applies(SFT, cfg):
        check_sft_relations(cfg)


def check_sepo_relations(cfg: DictConfig) -> None:
    """What the SEPO stage's settings need of each other, of the game and of this machine."""
    require(
        cfg.eval.validation_seed != cfg.seed,
        f"eval.validation_seed={cfg.eval.validation_seed} is not allowed with seed={cfg.seed}; allowed: any "
        "other seed (the checkpoint is chosen on validation episodes kept apart from the reported ones)",
    )
    if cfg.sepo.ref_4bit:
        import torch

        require(
            torch.cuda.is_available(),
            "sepo.ref_4bit=true needs a CUDA device (bitsandbytes 4-bit) and none is available; "
            "allowed: sepo.ref_4bit=false",
        )
    require(
        cfg.sepo.estimator != "exact_values" or cfg.game.name in EXACT_VALUE_GAMES,
        f"sepo.estimator=exact_values is not allowed for game={cfg.game.name} (it values actions from Kuhn "
        f"poker's rules); allowed: game={'|'.join(EXACT_VALUE_GAMES)}, or sepo.estimator=rollouts",
    )
    require(
        not cfg.sepo.held_terms or cfg.sepo.adv_norm == "batch",
        f"sepo.held_terms={list(cfg.sepo.held_terms)} is not allowed with sepo.adv_norm={cfg.sepo.adv_norm} "
        "(a held term's gradient is its own advantages under the batch's one scale); allowed: "
        "sepo.adv_norm=batch, or sepo.held_terms=[]",
    )
    require(
        set(cfg.sepo.held_at_start) <= set(cfg.sepo.held_terms),
        f"sepo.held_at_start={list(cfg.sepo.held_at_start)} names terms that sepo.held_terms="
        f"{list(cfg.sepo.held_terms)} does not hold; allowed: a subset of sepo.held_terms",
    )
    if cfg.sepo.lora.dropout != 0.0:
        log.warning(
            "sepo.lora.dropout=%s: the training pass then differs from the sampling pass, so the "
            "importance ratio is not 1 on a fresh batch (docs/spec.md §4.3 uses 0)",
            cfg.sepo.lora.dropout,
        )


def check_sft_relations(cfg: DictConfig) -> None:
    """What the SFT stage's settings need of each other and of the model."""
    sft = cfg.sft
    datasets = dataset_names(cfg.datagen)
    require(
        sft.dataset in datasets,
        f"sft.dataset={sft.dataset} is not allowed: it is not a datagen dataset (the data SFT trains on is "
        f"generated by datagen.dataset_games, or a game's own); allowed: {', '.join(datasets)}",
    )
    require(
        sft.full_finetune or bool(sft.lora.target_modules) or bool((cfg.model.get("lora") or {}).get("target_modules")),
        f"model={cfg.model.name} names no LoRA targets; allowed: a regex over module names in "
        "model.lora.target_modules or sft.lora.target_modules, or sft.full_finetune=true",
    )
    require(
        not (sft.prefix_sharing and not sft.answer_logits_only),
        "sft.prefix_sharing=true needs sft.answer_logits_only=true (its batch layout); allowed: "
        "sft.prefix_sharing=false, or sft.answer_logits_only=true",
    )
    require(
        not (sft.prefix_sharing and sft.gradient_checkpointing),
        "sft.prefix_sharing=true needs sft.gradient_checkpointing=false (checkpointed layers drop "
        "the KV cache the shared prefix lives in); allowed: one of the two false",
    )
