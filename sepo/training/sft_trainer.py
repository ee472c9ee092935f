"""What the SFT stage hands transformers' Trainer: its arguments from the `sft` settings, and the Trainer class,
datasets and collator of the chosen path (answer-only logits with shared prefixes, or transformers' plain one).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig

from sepo import distributed
from sepo.errors import ConfigError
from sepo.training.sft_batching import (
    ChatSFTCollator,
    ListDataset,
    SFTBatchCollator,
    check_prefix_sharing,
    encode_examples,
    sft_trainer_class,
)

log = logging.getLogger(__name__)


def training_arguments(s: DictConfig, out: Path, has_valid: bool, progress: bool):
    from transformers import TrainingArguments

    return TrainingArguments(
        output_dir=str(out / "checkpoints"),
        per_device_train_batch_size=s.per_device_batch_size,
        per_device_eval_batch_size=s.eval_batch_size,
        gradient_accumulation_steps=s.grad_accum,
        learning_rate=s.lr,
        weight_decay=s.weight_decay,
        adam_beta1=s.adam_beta1,
        adam_beta2=s.adam_beta2,
        max_grad_norm=s.max_grad_norm,
        optim="adamw_torch",
        lr_scheduler_type=s.lr_scheduler,
        warmup_steps=s.warmup_ratio,  # a float in [0, 1) is a ratio of the total steps
        num_train_epochs=s.epochs,
        max_steps=s.max_steps if s.max_steps is not None else -1,
        eval_strategy="steps" if has_valid else "no",
        eval_steps=s.eval_steps,
        save_strategy="steps",
        save_steps=s.save_steps,  # an int: steps; a float in (0, 1): that share of the run's steps
        save_total_limit=s.save_total_limit,
        logging_steps=s.logging_steps,
        logging_first_step=True,
        report_to=[],  # the project's tracker gets the logs through tracker_callback
        seed=s.seed,
        data_seed=s.seed,
        remove_unused_columns=False,  # the collator needs the raw `messages`
        label_names=["labels"],
        bf16=s.bf16,
        activation_checkpointing=s.gradient_checkpointing,
        dataloader_num_workers=0,
        dataloader_pin_memory=torch.cuda.is_available(),
        disable_tqdm=not progress,
    )


def training_data(
    s: DictConfig,
    model: Any,
    model_name: str,
    collator: ChatSFTCollator,
    train: list[dict[str, Any]],
    valid: list[dict[str, Any]],
):
    """(Trainer class, train dataset, eval dataset or None, data collator) for the settings.

    `sft.answer_logits_only`: examples encoded once, left-padded batches whose vocabulary logits
    cover the trained positions only, and with `sft.prefix_sharing` the rows' shared prefixes
    computed once per batch (sepo/training/sft_batching.py; the same loss and gradients up to float rounding).
    Otherwise transformers' plain path: the collator encodes and right-pads, the model computes
    its own loss over every position.
    """
    from transformers import Trainer

    if not s.answer_logits_only:
        return Trainer, ListDataset(train), ListDataset(valid) if valid else None, collator
    if s.prefix_sharing and distributed.world_size() > 1:
        # a shared prefix is a second forward pass per step through the DDP wrapper, which expects one
        log.info(
            "sft: data parallel over %d processes: sft.prefix_sharing off (same loss, one forward per step)",
            distributed.world_size(),
        )
        s.prefix_sharing = False
    if s.prefix_sharing:
        why = check_prefix_sharing(model)
        if why:
            raise ConfigError(
                f"sft.prefix_sharing=true is not exact for model={model_name}: {why}; set sft.prefix_sharing=false"
            )
    started = time.time()
    train_items, valid_items = encode_examples(collator.encode, train), encode_examples(collator.encode, valid)
    log.info(
        "sft: %d examples encoded in %.1f s; logits on the answer positions only%s",
        len(train) + len(valid),
        time.time() - started,
        ", shared prefixes computed once per batch" if s.prefix_sharing else "",
    )
    trainer_cls = sft_trainer_class()
    trainer_cls.type_ids_key = collator.type_ids_key
    batches = SFTBatchCollator(collator.pad_id, s.prefix_sharing, s.prefix_min_tokens, s.pass_cost)
    return trainer_cls, ListDataset(train_items), ListDataset(valid_items) if valid_items else None, batches
