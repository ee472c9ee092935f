"""Stage `sft`: supervised fine-tuning on the demonstrator data (docs/spec.md §4, stage 1).

`python main.py stage=sft game=<g> model=<m>` trains the model on the game's dataset
(`game.sft_dataset`: `multi` for ipd/auction/neg_v1, `kuhn`, `neg_gt` for neg_v2) with the
transformers `Trainer`, then writes into the run dir:

- `adapter/`      the LoRA adapter (`save_pretrained`); absent for a full fine-tune
- `merged/`       the merged model and its tokenizer (safetensors): `model.path=<run dir>/merged`
                  loads it in later stages
- `checkpoints/`  Trainer checkpoints; `resume=auto` continues from the last one after a crash
- `training_curve.csv` / `.png`  train and validation loss by optimizer step
- `sft_metrics.json`  validation loss, and the action agreement: on (part of) the validation split
                  the merged model answers each prompt greedily; the parse rate is the share of
                  answers whose last non-empty line is an action seen for that game in the dataset,
                  the agreement the share whose action equals the demonstrator's
- `eval/sft/results.json`  the merged model played against every pool by stage eval's code

Settings: the `sft` node; a model may set its own defaults in conf/sft/model/<model>.yaml, and an
`sft.<key>=...` override always wins (sepo/run/config.py checks them before any work).
Where each part lives: the data in `sepo.training.sft_data` (on disk, generated when missing, atomically:
`sepo.training.sft_dataset`); the
tokenisation through the chat template (labels on the answer and its end-of-turn tokens only; a sequence
too long loses the start of its prompt, never its answer) and the fast batches in
`sepo.training.sft_batching`; the Trainer callbacks, the curve and the speed report in
`sepo.training.sft_monitoring`; the action agreement in `sepo.training.sft_agreement`; checkpoints in
`sepo.training.checkpoints`. This module holds the stage: settings, the model, the loop, the export.
"""

from __future__ import annotations

import gc
import json
import logging
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from sepo import distributed
from sepo.builders import load_model_and_tokenizer
from sepo.files import directory_written_atomically, write_text_atomically
from sepo.lm.batching import end_of_turn_ids
from sepo.models import attach_lora, forward_extras, lora_module_names
from sepo.profiling import positions_fed
from sepo.tracking import NO_TRACKING, NullTracker, flatten
from sepo.training.checkpoints import newest_loadable_trainer_checkpoint
from sepo.training.sft_agreement import action_agreement
from sepo.training.sft_batching import (
    ChatSFTCollator,
    check_prefix_sharing,
)
from sepo.training.sft_dataset import ensure_dataset, read_examples, subsample
from sepo.training.sft_monitoring import (
    divergence_callback,
    matmul_share,
    throughput,
    tracker_callback,
    trainer_epoch,
    training_curve,
    write_curve,
)
from sepo.training.sft_trainer import training_arguments, training_data

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------- settings
def sft_settings(cfg: DictConfig) -> Any:
    """The resolved `sft` node as its typed object (a sepo.run.schema.SftSchema; the model's own defaults, conf/sft/model/<model>.yaml, merged
    in by Hydra; command-line `sft.<key>=` overrides winning), with `lora.target_modules` filled from
    `model.lora.target_modules` when the node leaves it null. Its values were checked before any work
    (sepo/run/config.py)."""
    s = OmegaConf.to_object(cfg.sft)
    if s.lora.target_modules is None and not s.full_finetune:  # sepo/run/config.py checked that the model names them
        s.lora.target_modules = cfg.model.lora.target_modules
    return s


# --------------------------------------------------------------------------- model
def apply_lora(model: Any, s: DictConfig) -> Any:
    """Wrap `model` with LoRA adapters on the modules matched in full by `s.lora.target_modules`."""
    return attach_lora(
        model,
        s.lora.target_modules,
        s.lora.r,
        s.lora.alpha,
        s.lora.dropout,
        key="sft.lora.target_modules",
    )


def _type_ids_key(model: Any, model_cfg: Any) -> str | None:
    extras = forward_extras(model, model_cfg, torch.zeros((1, 1), dtype=torch.long))
    return next(iter(extras), None)


# --------------------------------------------------------------------------- the stage
@dataclass
class SftData:
    """The dataset on disk and the examples this run trains and validates on."""

    directory: Path
    train_all: list[dict[str, Any]]  # every training example (the action vocabulary is read from all)
    valid_all: list[dict[str, Any]]  # every validation example (the agreement set is its head)
    train: list[dict[str, Any]]  # the seeded subsample trained on (`sft.max_examples`)
    valid: list[dict[str, Any]]  # the seeded subsample the validation loss is taken on


@dataclass
class SftModel:
    """The model being fine-tuned, and what the metrics say of its parameters."""

    model: Any
    tokenizer: Any
    total_parameters: int
    trainable_parameters: int
    lora_modules: list[str]  # empty for a full fine-tune


@dataclass
class SftTraining:
    """What the Trainer leaves behind."""

    model: Any  # the trained model (still with its adapter under LoRA)
    step: int  # the last optimizer step
    resumed_from_step: int | None
    valid_loss: float | None
    curve: list[dict[str, Any]]  # the loss curve, one row per logged step
    train_loss_mean: float  # the Trainer's mean training loss over the run
    throughput: dict[str, float | None]  # seconds, examples/s, tokens/s, matmul rate (`throughput`, `matmul_share`)


def load_data(cfg: DictConfig, s: DictConfig) -> SftData:
    directory = ensure_dataset(cfg, s.dataset, s.data_dir)
    train_all = read_examples(directory / "train.jsonl")
    valid_all = read_examples(directory / "valid.jsonl")
    train = subsample(train_all, s.max_examples, s.seed, "train")
    valid = subsample(valid_all, s.max_valid_examples, s.seed, "valid")
    log.info(
        "sft: dataset %s from %s: %d/%d train, %d/%d valid examples",
        s.dataset,
        directory,
        len(train),
        len(train_all),
        len(valid),
        len(valid_all),
    )
    return SftData(directory, train_all, valid_all, train, valid)


def build_model(cfg: DictConfig, s: DictConfig) -> SftModel:
    """The model to fine-tune: every weight trainable, or a LoRA adapter on `lora.target_modules`."""
    from transformers import set_seed

    set_seed(s.seed)
    model, tokenizer = load_model_and_tokenizer(cfg.model, cfg.paths.cache_dir)
    total = sum(p.numel() for p in model.parameters())
    if s.full_finetune:
        for p in model.parameters():
            p.requires_grad_(True)
        lora_modules: list[str] = []
    else:
        model = apply_lora(model, s)
        lora_modules = lora_module_names(model)
        if s.gradient_checkpointing:
            model.enable_input_require_grads()
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    log.info(
        "sft: %s, %d trainable of %d parameters%s",
        "full fine-tune" if s.full_finetune else "LoRA",
        trainable,
        total,
        f" ({len(lora_modules)} LoRA modules)" if lora_modules else "",
    )
    return SftModel(model, tokenizer, total, trainable, lora_modules)


def resume_checkpoint(cfg: DictConfig, ckpt_dir: Path) -> tuple[str | None, int | None]:
    """resume=auto: the newest Trainer checkpoint that loads, and its step; resume=never: none (old ones go)."""
    last = newest_loadable_trainer_checkpoint(ckpt_dir)
    if cfg.resume != "auto" and ckpt_dir.exists():
        log.info("sft: resume=%s: removing old checkpoints in %s", cfg.resume, ckpt_dir)
        shutil.rmtree(ckpt_dir)
        last = None
    if not last:
        return None, None
    step = json.loads((Path(last) / "trainer_state.json").read_text())["global_step"]
    log.info("sft: resuming from %s (step %d)", last, step)
    return last, step


def chat_collator(cfg: DictConfig, s: DictConfig, built: SftModel) -> ChatSFTCollator:
    """How the stage tokenises its chat examples (loss on the answer and its end of turn)."""
    model, tokenizer = built.model, built.tokenizer
    return ChatSFTCollator(
        tokenizer,
        cfg.model,
        s.max_length,
        end_of_turn_ids(model, tokenizer),
        _type_ids_key(model, cfg.model),
        s.assistant_only_loss,
    )


def train(
    cfg: DictConfig, s: DictConfig, out: Path, data: SftData, built: SftModel, tracker: NullTracker
) -> SftTraining:
    """The transformers Trainer on the chat examples (loss on the answer and its end of turn)."""
    model = built.model
    trainer_cls, train_ds, valid_ds, data_collator = training_data(
        s, model, cfg.model.name, chat_collator(cfg, s, built), data.train, data.valid
    )
    last, resumed_step = resume_checkpoint(cfg, out / "checkpoints")
    trainer = trainer_cls(
        model=model,
        args=training_arguments(s, out, bool(data.valid), cfg.eval.progress),
        train_dataset=train_ds,
        eval_dataset=valid_ds,
        data_collator=data_collator,
        callbacks=[tracker_callback(tracker), divergence_callback()],
    )
    with positions_fed(model) as positions:
        train_output = trainer.train(resume_from_checkpoint=last)
    step = int(trainer.state.global_step)
    valid_loss = None
    if data.valid:
        at_end = [e["eval_loss"] for e in trainer.state.log_history if "eval_loss" in e and e.get("step") == step]
        valid_loss = float(at_end[-1]) if at_end else float(trainer.evaluate()["eval_loss"])
    curve = training_curve(trainer.state.log_history)
    return SftTraining(
        trainer.model,
        step,
        resumed_step,
        valid_loss,
        curve,
        float(train_output.training_loss),
        {**throughput(train_output.metrics, train_ds), **matmul_share(model, positions, train_output.metrics, s)},
    )


def export_merged(cfg: DictConfig, s: DictConfig, out: Path, trained: SftTraining, built: SftModel) -> DictConfig:
    """Write adapter/ (LoRA) and merged/ (the full model, atomically), free the trained copy, and return the
    model settings that load merged/ as the later stages will."""
    model, tokenizer = trained.model, built.tokenizer
    if not s.full_finetune:
        adapter = out / "adapter"
        shutil.rmtree(adapter, ignore_errors=True)
        model.save_pretrained(adapter)
        tokenizer.save_pretrained(adapter)
        model = model.merge_and_unload()
    merged = out / "merged"
    with directory_written_atomically(merged, replace=True) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    trained.model = built.model = model = None  # every reference, so the memory is free before the reload
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return OmegaConf.create({**OmegaConf.to_container(cfg.model, resolve=True), "path": str(merged), "revision": None})


def measure_agreement(
    cfg: DictConfig, s: DictConfig, data: SftData, model: Any, tokenizer: Any, merged_cfg: DictConfig
) -> dict[str, Any]:
    """Parse rate and action agreement of the merged model's answers on the head of the validation split."""
    from sepo.games import make_game
    from sepo.training.sft_data import load_game_cfg

    agreement_set = data.valid_all[: s.agreement_examples] if s.agreement_examples else []
    if not agreement_set:
        return {}
    seen: dict[str, set[str]] = {}
    for ex in data.train_all + data.valid_all:
        seen.setdefault(ex["game"], set()).add(str(ex["action"]))
    actions_by_game = {g: sorted(a) for g, a in seen.items()}
    games = {g: make_game(load_game_cfg(g, cfg.game, cfg.model.name)) for g in actions_by_game}
    share = s.prefix_sharing and check_prefix_sharing(model, training=False) is None
    return action_agreement(
        model,
        tokenizer,
        merged_cfg,
        agreement_set,
        actions_by_game,
        games,
        s.agreement_batch_size,
        s.agreement_max_new_tokens,
        share_prefix=share,
        min_shared=s.prefix_min_tokens,
    )


def sft_metrics(
    s: DictConfig, data: SftData, built: SftModel, trained: SftTraining, agreement: dict, seconds: float
) -> dict[str, Any]:
    train_losses = [r["train_loss"] for r in trained.curve if r["train_loss"] is not None]
    return {
        "dataset": s.dataset,
        "data_dir": str(data.directory),
        "train_examples": len(data.train),
        "valid_examples": len(data.valid),
        "full_finetune": s.full_finetune,
        "trainable_parameters": built.trainable_parameters,
        "total_parameters": built.total_parameters,
        "lora_modules": built.lora_modules,
        "global_step": trained.step,
        "epochs": float(trainer_epoch(trained.curve)),
        "resumed_from_step": trained.resumed_from_step,
        "train_loss": train_losses[-1] if train_losses else None,
        "train_loss_mean": trained.train_loss_mean,
        "valid_loss": trained.valid_loss,
        "parse_rate": agreement.get("parse_rate"),
        "action_agreement": agreement.get("action_agreement"),
        "agreement": agreement,
        "train_seconds": round(seconds, 2),
        "throughput": trained.throughput,
    }


def report(tracker: NullTracker, metrics: dict[str, Any], out: Path) -> None:
    """Log the SFT figures and write sft_metrics.json (written again at the end, with the evaluation's)."""
    keys = ("valid_loss", "train_loss", "parse_rate", "action_agreement", "global_step")
    summary = {k: metrics[k] for k in keys if metrics[k] is not None}
    tracker.log(flatten("sft", summary), step=metrics["global_step"])
    tracker.summary(flatten("sft", summary))
    log.info(
        "sft: step %d, valid loss %s, parse rate %s, action agreement %s",
        metrics["global_step"],
        metrics["valid_loss"],
        metrics["parse_rate"],
        metrics["action_agreement"],
    )
    speed = metrics["throughput"]
    if speed["train_runtime_s"] is not None:
        log.info(
            "sft: training loop %.0f s, %s examples/s, %s tokens/s%s",
            speed["train_runtime_s"],
            speed["examples_per_s"],
            speed["tokens_per_s"],
            f", {speed['matmul_gflops']} GFLOP/s in matmuls = {speed['matmul_share']:.0%} of this CPU's "
            f"{speed['machine_matmul_gflops']}"
            if speed.get("matmul_share") is not None
            else "",
        )
    write_text_atomically(out / "sft_metrics.json", json.dumps(metrics, indent=2) + "\n")


def evaluate_merged(
    cfg: DictConfig, out: Path, model: Any, tokenizer: Any, merged_cfg: DictConfig, step: int, tracker: NullTracker
) -> dict[str, Any]:
    """The merged model through stage eval's protocol: the SFT row of the tables (eval/sft/results.json)."""
    from sepo.games import make_game
    from sepo.stages.evaluate import evaluate_and_write, evaluation_policy

    policy = evaluation_policy(cfg, model, tokenizer, model_cfg=merged_cfg)
    path = out / "eval" / "sft" / "results.json"
    payload = evaluate_and_write(cfg, make_game(cfg.game), policy, path, stage="sft", checkpoint="final", step=step)
    tracker.log(flatten("eval", payload["metrics"]), step=step)
    tracker.summary(flatten("eval", payload["metrics"]))
    return payload["metrics"]


def run_sft(cfg: DictConfig, tracker: NullTracker = NO_TRACKING) -> dict[str, Any]:
    started = time.time()
    s = sft_settings(cfg)
    out = Path(cfg.paths.output_dir)
    out.mkdir(parents=True, exist_ok=True)

    data = load_data(cfg, s)
    built = build_model(cfg, s)
    trained = train(cfg, s, out, data, built, tracker)  # resume=auto continues from the last Trainer checkpoint
    if not distributed.is_main():  # data parallel: rank 0 alone saves, merges, measures and evaluates
        return {}
    write_curve(trained.curve, out)
    merged_cfg = export_merged(cfg, s, out, trained, built)
    trained_seconds = time.time() - started
    model, tokenizer = load_model_and_tokenizer(merged_cfg, cfg.paths.cache_dir)  # as later stages load it
    agreement = measure_agreement(cfg, s, data, model, tokenizer, merged_cfg)
    metrics = sft_metrics(s, data, built, trained, agreement, trained_seconds)
    report(tracker, metrics, out)
    if s.evaluate:
        metrics["eval"] = evaluate_merged(cfg, out, model, tokenizer, merged_cfg, trained.step, tracker)

    metrics["seconds"] = round(time.time() - started, 2)
    write_text_atomically(out / "sft_metrics.json", json.dumps(metrics, indent=2) + "\n")
    return metrics
