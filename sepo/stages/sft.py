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

Settings: the `sft` node; a model may set its own defaults in `model.sft` (conf/sft/default.yaml reads
them with `oc.select`), and an `sft.<key>=...` override always wins (sepo/config.py checks them before any work).
Data: `<sft.data_dir>/<dataset>/{train,valid}.jsonl`; when missing it is generated with
`sepo.training.sft_data` from the shipped game configs and the `datagen` settings, written to a temporary
directory and renamed into place, so concurrent runs never read half a dataset.

Each example is tokenised by the collator through the chat template: the prompt turns rendered
with the generation prompt, then the assistant content and the end-of-turn token(s) as the model
would generate them. Labels are -100 everywhere except on those answer tokens (end-of-turn
included, so the model learns to stop). A sequence longer than `sft.max_length` loses the start of
its prompt, never its answer. Gemma 4 gets all-zero token type ids (`model.token_type_ids`).

Speed without changing what is learned (`sft.answer_logits_only`, `sft.prefix_sharing`;
sepo/training/sft_batching.py): examples are encoded once, batches are left-padded and the vocabulary
logits are computed on the trained positions only, and on models with plain full attention (tiny)
the prompt prefix shared by a batch's rows of one game runs once per batch. The Trainer's sampler,
batches, steps and loss normalisation are unchanged; tests/test_sft.py checks the loss and every
gradient against transformers' plain path. The agreement's greedy answers are generated in batches
of one prompt prefix sorted by length, the prefix run once (same answers, less padding).
"""

from __future__ import annotations

import csv
import gc
import json
import logging
import math
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from sepo import distributed
from sepo.builders import load_model_and_tokenizer
from sepo.errors import ConfigError
from sepo.files import directory_written_atomically, move_aside, write_text_atomically
from sepo.models import attach_lora, forward_extras, lora_module_names, render_chat
from sepo.profiling import matmul_gflops, matmul_parameters, positions_fed, training_gflop
from sepo.tracking import NO_TRACKING, NullTracker, flatten
from sepo.training.checkpoints import newest_loadable_trainer_checkpoint
from sepo.training.divergence import check_step
from sepo.training.sft_batching import (
    SFTBatchCollator,
    check_prefix_sharing,
    encode_examples,
    greedy_answers,
    sft_trainer_class,
)
from sepo.training.sft_data import manifest_mismatch, read_examples
from sepo.trees import leaves

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------- settings
def model_settable_keys() -> list[str]:
    """The `sft` keys a model may set in `model.sft`: those conf/sft/default.yaml reads with
    `${oc.select:model.sft.<key>,<default>}` (dotted for nested keys, e.g. `lora.r`)."""
    from sepo.paths import CONF_DIR

    raw = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "sft" / "default.yaml"), resolve=False)
    return [key for key, value in leaves(raw).items() if isinstance(value, str) and f"model.sft.{key}," in value]


def sft_settings(cfg: DictConfig) -> DictConfig:
    """The resolved `sft` node (the model's `model.sft` defaults already applied by the YAML's
    `oc.select`, command-line `sft.<key>=` overrides winning), with `lora.target_modules` filled from
    `model.lora.target_modules` when the node leaves it null. Its values were checked before any work
    (sepo/config.py); a `model.sft` key that the `sft` node does not read is an error here, not a
    silently ignored setting.
    """
    override = cfg.model.get("sft") or {}
    override = OmegaConf.to_container(override, resolve=True) if OmegaConf.is_config(override) else dict(override)
    if override:
        allowed = model_settable_keys()
        unknown = [k for k, _ in leaves(override).items() if k not in allowed]
        if unknown:
            raise ConfigError(
                f"model.sft.{unknown[0]} is not an SFT setting a model can set; allowed: {', '.join(allowed)}"
            )
        log.info(
            "sft: model=%s sets its own SFT defaults %s (an sft.<key>=... override wins)",
            cfg.model.name,
            ", ".join(f"{k}={v!r}" for k, v in leaves(override).items()),
        )
    s = OmegaConf.create(OmegaConf.to_container(cfg.sft, resolve=True))
    if s.lora.target_modules is None and not s.full_finetune:  # sepo/config.py checked that the model names them
        s.lora.target_modules = cfg.model.lora.target_modules
    return s


# --------------------------------------------------------------------------- data
def _complete(ds_dir: Path) -> bool:
    return (ds_dir / "train.jsonl").exists() and (ds_dir / "valid.jsonl").exists()


def ensure_dataset(cfg: DictConfig, dataset: str, data_dir: str | Path) -> Path:
    """`<data_dir>/<dataset>/`, generated when missing (atomically: temp dir, then rename).

    Generation uses the shipped game configs (`conf/game/*.yaml`), so a shared cache never holds data
    shaped by one run's game overrides; to train on other data, run `stage=datagen` and point
    `sft.data_dir` at its `out_dir`. Data this stage generated records its datagen settings in
    `<dataset>/manifest.json`; reusing it under other settings (say, a smoke run's few episodes) is
    an error rather than a silent mix-up.
    """
    from sepo.training.sft_data import generate_dataset, load_game_cfg, write_dataset

    data_dir = Path(data_dir)
    ds_dir = data_dir / dataset
    dc = cfg.datagen
    if dataset not in dc.dataset_games:
        raise ConfigError(f"sft.dataset={dataset} is not a datagen dataset; allowed: {', '.join(dc.dataset_games)}")
    caps = dc.get("per_game_cap") or {}
    settings = {
        "dataset": dataset,
        "games": list(dc.dataset_games[dataset]),
        "seed": int(dc.seed),
        "valid_fraction": float(dc.valid_fraction),
        "per_game_cap": caps.get(dataset),
        "episodes_per_opponent": dc.episodes_per_opponent,
        "num_opponents": int(dc.num_opponents),
    }
    if _complete(ds_dir):
        made = ds_dir / "manifest.json"  # written when this stage generated the data (stage datagen writes none here)
        if not made.exists():
            return ds_dir
        old = json.loads(made.read_text())
        diff = [k for k in settings if old.get(k) != settings[k]]
        if diff:
            raise ConfigError(
                f"sft.data_dir={data_dir} holds a {dataset} dataset generated with other datagen settings "
                f"({', '.join(f'{k}: {old.get(k)!r} there, {settings[k]!r} now' for k in diff)}); set sft.data_dir "
                "to another directory or remove that one"
            )
        damage = manifest_mismatch(ds_dir, old.get("files") or {})
        if damage is None:
            return ds_dir
        # generated here from its settings, so it can be generated again, byte for byte
        log.warning("sft: the cached %s dataset in %s is damaged (%s): generating it again", dataset, ds_dir, damage)
        move_aside(ds_dir, "damaged")
    log.info(
        "sft: dataset %s missing under %s; generating it (games %s, seed %s)",
        dataset,
        data_dir,
        settings["games"],
        dc.seed,
    )
    splits = generate_dataset(
        dataset,
        [load_game_cfg(g) for g in settings["games"]],
        int(dc.seed),
        float(dc.valid_fraction),
        caps.get(dataset),
        dc.episodes_per_opponent,
        int(dc.num_opponents),
    )
    with directory_written_atomically(ds_dir) as tmp:  # another job that finishes first: its copy is used
        files = write_dataset(tmp.parent, dataset, splits)
        info = {**settings, "files": files}
        (tmp / "manifest.json").write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    return ds_dir


def subsample(examples: list[dict[str, Any]], count: int | None, seed: int, tag: str) -> list[dict[str, Any]]:
    """A seeded subsample of `count` examples in their file order (all of them when count is None)."""
    if count is None or count >= len(examples):
        return examples
    rng = np.random.default_rng([int(seed), sum(map(ord, tag))])
    keep = np.sort(rng.choice(len(examples), int(count), replace=False))
    return [examples[i] for i in keep]


# --------------------------------------------------------------------------- tokenisation
def end_of_turn_ids(model: Any, tokenizer: Any) -> set[int]:
    """Token ids that end an assistant turn: the generation config's EOS ids and the tokenizer's."""
    gen = getattr(model, "generation_config", None)
    eos = gen.eos_token_id if gen is not None else None
    ids = {eos} if isinstance(eos, int) else set(eos or [])
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids


class ChatSFTCollator:
    """Tokenises chat examples through the chat template and masks the loss to the answer.

    `encode` gives (input ids, labels) of one example: prompt = the chat template of every turn but
    the last with the generation prompt; answer = the last (assistant) turn's content followed by
    what the template writes after it, up to and including the first end-of-turn token. Labels are
    -100 on the prompt (`assistant_only`). Over-long sequences drop tokens from the left of the
    prompt. `__call__` right-pads a batch and adds the all-zero token type ids when `type_ids_key`
    names the model's argument (Gemma 4).
    """

    def __init__(
        self,
        tokenizer: Any,
        model_cfg: Any,
        max_length: int,
        eos_ids: set[int],
        type_ids_key: str | None = None,
        assistant_only: bool = True,
    ):
        self.tokenizer = tokenizer
        self.model_cfg = model_cfg
        self.max_length = int(max_length)
        self.eos_ids = set(eos_ids)
        self.type_ids_key = type_ids_key
        self.assistant_only = assistant_only
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self._warned = False

    def _ids(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def split(self, messages: Sequence[dict[str, str]]) -> tuple[list[int], list[int]]:
        """Prompt ids and answer ids (content + end of turn) of one example."""
        if not messages or messages[-1]["role"] != "assistant":
            raise ValueError("an SFT example must end with an assistant turn")
        messages = [dict(m) for m in messages]
        prompt = render_chat(self.tokenizer, self.model_cfg, messages[:-1], add_generation_prompt=True)
        full = render_chat(self.tokenizer, self.model_cfg, messages, add_generation_prompt=False)
        content = messages[-1]["content"]
        at = full.rfind(content)
        tail = full[at + len(content) :] if at >= 0 else ""
        answer = self._ids(content + tail)
        stop = next((i + 1 for i, t in enumerate(answer) if t in self.eos_ids), None)
        if stop is not None:
            answer = answer[:stop]
        elif self.tokenizer.eos_token_id is not None:  # the template wrote no end-of-turn token: add one
            answer.append(self.tokenizer.eos_token_id)
        return self._ids(prompt), answer

    def encode(self, messages: Sequence[dict[str, str]]) -> tuple[list[int], list[int]]:
        prompt, answer = self.split(messages)
        if len(answer) > self.max_length:  # cannot happen with the games' short answers
            if not self._warned:
                log.warning(
                    "sft: an answer of %d tokens exceeds sft.max_length=%d and is cut", len(answer), self.max_length
                )
                self._warned = True
            answer = answer[: self.max_length]
        budget = self.max_length - len(answer)
        prompt = prompt[len(prompt) - budget :] if len(prompt) > budget else prompt
        prompt = prompt if budget > 0 else []
        labels = ([-100] * len(prompt) if self.assistant_only else list(prompt)) + answer
        return prompt + answer, labels

    def __call__(self, examples: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        encoded = [self.encode(ex["messages"]) for ex in examples]
        width = max(len(ids) for ids, _ in encoded)
        input_ids = torch.full((len(encoded), width), self.pad_id, dtype=torch.long)
        labels = torch.full((len(encoded), width), -100, dtype=torch.long)
        mask = torch.zeros((len(encoded), width), dtype=torch.long)
        for row, (ids, lab) in enumerate(encoded):
            input_ids[row, : len(ids)] = torch.tensor(ids)
            labels[row, : len(lab)] = torch.tensor(lab)
            mask[row, : len(ids)] = 1
        batch = {"input_ids": input_ids, "attention_mask": mask, "labels": labels}
        if self.type_ids_key:
            batch[self.type_ids_key] = torch.zeros_like(input_ids)
        return batch


class ListDataset(torch.utils.data.Dataset):
    def __init__(self, items: list[dict[str, Any]]):
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return self.items[i]


# --------------------------------------------------------------------------- model
def apply_lora(model: Any, s: DictConfig) -> Any:
    """Wrap `model` with LoRA adapters on the modules matched in full by `s.lora.target_modules`."""
    return attach_lora(
        model,
        str(s.lora.target_modules),
        int(s.lora.r),
        int(s.lora.alpha),
        float(s.lora.dropout),
        key="sft.lora.target_modules",
    )


def _type_ids_key(model: Any, model_cfg: Any) -> str | None:
    extras = forward_extras(model, model_cfg, torch.zeros((1, 1), dtype=torch.long))
    return next(iter(extras), None)


# --------------------------------------------------------------------------- tracking and curves
def tracker_callback(tracker: NullTracker, prefix: str = "sft"):
    """A TrainerCallback forwarding every Trainer log dict to `tracker.log` at the optimizer step."""
    from transformers import TrainerCallback

    class TrackerCallback(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if state.is_world_process_zero and logs:
                values = {
                    f"{prefix}/{k}": v
                    for k, v in logs.items()
                    if isinstance(v, (int, float)) and not isinstance(v, bool)
                }
                if values:
                    tracker.log(values, step=int(state.global_step))

    return TrackerCallback()


def divergence_callback():
    """A TrainerCallback that stops SFT at the first non-finite gradient (before the optimizer takes it),
    validation loss, or weight about to be checkpointed (`sepo/training/divergence.py`)."""
    from transformers import TrainerCallback

    class DivergenceCallback(TrainerCallback):
        def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
            check_step(int(state.global_step) + 1, None, model, when="before")

        def on_step_end(self, args, state, control, model=None, **kwargs):
            if control.should_save:  # never write a checkpoint a resume would continue from NaN
                check_step(int(state.global_step), None, model, when="after")

        def on_evaluate(self, args, state, control, metrics=None, **kwargs):
            check_step(int(state.global_step), (metrics or {}).get("eval_loss"), model=kwargs["model"], when="after")

    return DivergenceCallback()


def training_curve(log_history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows {step, epoch, train_loss, valid_loss, learning_rate} from the Trainer's log history."""
    rows: dict[int, dict[str, Any]] = {}
    for entry in log_history:
        step = int(entry.get("step", 0))
        if "loss" in entry or "eval_loss" in entry:
            row = rows.setdefault(
                step,
                {
                    "step": step,
                    "epoch": entry.get("epoch"),
                    "train_loss": None,
                    "valid_loss": None,
                    "learning_rate": None,
                },
            )
            if "loss" in entry:
                row["train_loss"] = float(entry["loss"])
                row["learning_rate"] = entry.get("learning_rate")
            if "eval_loss" in entry:
                row["valid_loss"] = float(entry["eval_loss"])
    return [rows[k] for k in sorted(rows)]


def write_curve(rows: list[dict[str, Any]], out: Path) -> None:
    fields = ["step", "epoch", "train_loss", "valid_loss", "learning_rate"]
    with open(out / "training_curve.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: "" if row[k] is None else row[k] for k in fields})
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for key, label in (("train_loss", "train"), ("valid_loss", "valid")):
        pts = [(r["step"], r[key]) for r in rows if r[key] is not None]
        if pts:
            ax.plot(*zip(*pts), marker="o" if key == "valid_loss" else None, markersize=3, label=label)
    if all(r[k] is None or r[k] > 0 for r in rows for k in ("train_loss", "valid_loss")):
        ax.set_yscale("log")  # the first steps' loss is ~50x the last ones'
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("loss (assistant tokens)")
    ax.set_title("SFT training curve")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "training_curve.png", dpi=100)
    plt.close(fig)


# --------------------------------------------------------------------------- action agreement
def generate_answers(
    model: Any,
    tokenizer: Any,
    model_cfg: Any,
    prompts: list[list[dict[str, str]]],
    batch_size: int,
    max_new_tokens: int,
    share_prefix: bool = False,
    min_shared: int = 16,
) -> list[str]:
    """Greedy answers to chat prompts, cut at the end of turn, in the prompts' order.

    Batched by common prefix and length (sepo/training/sft_batching.py:prompt_batches: little padding); with
    `share_prefix` (needs plain full attention) a batch's shared prefix, a game's rules, runs once.
    """
    eos = end_of_turn_ids(model, tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    ids = [
        tokenizer(render_chat(tokenizer, model_cfg, m, add_generation_prompt=True), add_special_tokens=False)[
            "input_ids"
        ]
        for m in prompts
    ]
    was_training = model.training
    model.eval()
    try:
        rows = greedy_answers(
            model,
            ids,
            eos,
            pad,
            batch_size,
            max_new_tokens,
            share_prefix,
            min_shared,
            extras=lambda x: forward_extras(model, model_cfg, x),
        )
    finally:
        model.train(was_training)
    return [tokenizer.decode(row, skip_special_tokens=True) for row in rows]


def action_agreement(
    model: Any,
    tokenizer: Any,
    model_cfg: Any,
    examples: list[dict[str, Any]],
    actions_by_game: dict[str, list[str]],
    games: dict[str, Any],
    batch_size: int,
    max_new_tokens: int,
    samples: int = 10,
    share_prefix: bool = False,
    min_shared: int = 16,
) -> dict[str, Any]:
    """Parse rate and agreement with the demonstrator of greedy answers to `examples`' prompts.

    An answer parses when the game's `parse_action` finds, on its last non-empty line, one of the
    actions seen for that game in the dataset; it agrees when that action is the demonstrator's.
    """
    answers = generate_answers(
        model,
        tokenizer,
        model_cfg,
        [ex["messages"][:-1] for ex in examples],
        batch_size,
        max_new_tokens,
        share_prefix,
        min_shared,
    )
    per_game: dict[str, dict[str, int]] = {}
    shown = []
    for ex, text in zip(examples, answers):
        action = games[ex["game"]].parse_action(text, actions_by_game[ex["game"]])
        g = per_game.setdefault(ex["game"], {"examples": 0, "parsed": 0, "agree": 0})
        g["examples"] += 1
        g["parsed"] += action is not None
        g["agree"] += action == ex["action"]
        if len(shown) < samples:
            shown.append(
                {"game": ex["game"], "target": ex["messages"][-1]["content"], "answer": text, "parsed": action}
            )
    n = max(len(examples), 1)
    return {
        "examples": len(examples),
        "parse_rate": sum(g["parsed"] for g in per_game.values()) / n,
        "action_agreement": sum(g["agree"] for g in per_game.values()) / n,
        "per_game": {
            k: {**v, "parse_rate": v["parsed"] / v["examples"], "action_agreement": v["agree"] / v["examples"]}
            for k, v in sorted(per_game.items())
        },
        "samples": shown,
    }


# --------------------------------------------------------------------------- the stage
def training_arguments(s: DictConfig, out: Path, has_valid: bool, progress: bool):
    from transformers import TrainingArguments

    return TrainingArguments(
        output_dir=str(out / "checkpoints"),
        per_device_train_batch_size=int(s.per_device_batch_size),
        per_device_eval_batch_size=int(s.eval_batch_size),
        gradient_accumulation_steps=int(s.grad_accum),
        learning_rate=float(s.lr),
        weight_decay=float(s.weight_decay),
        adam_beta1=float(s.adam_beta1),
        adam_beta2=float(s.adam_beta2),
        max_grad_norm=float(s.max_grad_norm),
        optim="adamw_torch",
        lr_scheduler_type=str(s.lr_scheduler),
        warmup_steps=float(s.warmup_ratio),  # a float in [0, 1) is a ratio of the total steps
        num_train_epochs=float(s.epochs),
        max_steps=int(s.max_steps) if s.max_steps is not None else -1,
        eval_strategy="steps" if has_valid else "no",
        eval_steps=int(s.eval_steps),
        save_strategy="steps",
        save_steps=s.save_steps,  # an int: steps; a float in (0, 1): that share of the run's steps
        save_total_limit=s.save_total_limit,
        logging_steps=int(s.logging_steps),
        logging_first_step=True,
        report_to=[],  # the project's tracker gets the logs through tracker_callback
        seed=int(s.seed),
        data_seed=int(s.seed),
        remove_unused_columns=False,  # the collator needs the raw `messages`
        label_names=["labels"],
        bf16=bool(s.bf16),
        activation_checkpointing=bool(s.gradient_checkpointing),
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
    batches = SFTBatchCollator(collator.pad_id, bool(s.prefix_sharing), int(s.prefix_min_tokens))
    return trainer_cls, ListDataset(train_items), ListDataset(valid_items) if valid_items else None, batches


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
    directory = ensure_dataset(cfg, str(s.dataset), s.data_dir)
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

    set_seed(int(s.seed))
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


def train(
    cfg: DictConfig, s: DictConfig, out: Path, data: SftData, built: SftModel, tracker: NullTracker
) -> SftTraining:
    """The transformers Trainer on the chat examples (loss on the answer and its end of turn)."""
    model, tokenizer = built.model, built.tokenizer
    collator = ChatSFTCollator(
        tokenizer,
        cfg.model,
        int(s.max_length),
        end_of_turn_ids(model, tokenizer),
        _type_ids_key(model, cfg.model),
        bool(s.assistant_only_loss),
    )
    trainer_cls, train_ds, valid_ds, data_collator = training_data(
        s, model, cfg.model.name, collator, data.train, data.valid
    )
    last, resumed_step = resume_checkpoint(cfg, out / "checkpoints")
    trainer = trainer_cls(
        model=model,
        args=training_arguments(s, out, bool(data.valid), bool(cfg.eval.get("progress", True))),
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


def throughput(metrics: dict[str, Any], train_ds: Any) -> dict[str, float | None]:
    """The Trainer's own seconds and examples/s, and tokens/s: examples/s x the mean length of the training
    examples (every token of an example counts, also a shared prefix computed once per batch: the rate a
    plain pass would have needed to match)."""
    items = getattr(train_ds, "items", None) or []
    lengths = [len(item["ids"]) for item in items if "ids" in item]
    per_s = metrics.get("train_samples_per_second")
    mean_tokens = sum(lengths) / len(lengths) if lengths else None
    return {
        "train_runtime_s": metrics.get("train_runtime"),
        "examples_per_s": per_s,
        "mean_example_tokens": None if mean_tokens is None else round(mean_tokens, 1),
        "tokens_per_s": None if per_s is None or mean_tokens is None else round(per_s * mean_tokens, 1),
    }


def matmul_share(model: Any, positions: dict[str, int], metrics: dict[str, Any], s: DictConfig) -> dict[str, Any]:
    """The loop's matmul rate (GFLOP/s over the Trainer's seconds) beside the rate this CPU multiplies
    matrices at in the model's dtype, measured now (1 s): how far the loop is from what the machine
    allows. On a GPU, None (`python -m benchmarks gpu` has the device's figures)."""
    seconds = metrics.get("train_runtime")
    weights = model.get_input_embeddings().weight
    if not seconds or weights.device.type != "cpu" or not positions["train"]:
        return {"matmul_gflops": None, "machine_matmul_gflops": None, "matmul_share": None}
    body, _head = matmul_parameters(model.get_base_model() if hasattr(model, "get_base_model") else model)
    achieved = training_gflop(body, positions, bool(s.full_finetune)) / seconds
    machine = matmul_gflops(weights.dtype)
    return {
        "matmul_gflops": round(achieved, 1),
        "machine_matmul_gflops": round(machine, 1),
        "matmul_share": round(achieved / machine, 3),
    }


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

    agreement_set = data.valid_all[: int(s.agreement_examples)] if s.agreement_examples else []
    if not agreement_set:
        return {}
    seen: dict[str, set[str]] = {}
    for ex in data.train_all + data.valid_all:
        seen.setdefault(ex["game"], set()).add(str(ex["action"]))
    actions_by_game = {g: sorted(a) for g, a in seen.items()}
    games = {g: make_game(load_game_cfg(g, cfg.game)) for g in actions_by_game}
    share = bool(s.prefix_sharing) and check_prefix_sharing(model, training=False) is None
    return action_agreement(
        model,
        tokenizer,
        merged_cfg,
        agreement_set,
        actions_by_game,
        games,
        int(s.agreement_batch_size),
        int(s.agreement_max_new_tokens),
        share_prefix=share,
        min_shared=int(s.prefix_min_tokens),
    )


def sft_metrics(
    s: DictConfig, data: SftData, built: SftModel, trained: SftTraining, agreement: dict, seconds: float
) -> dict[str, Any]:
    train_losses = [r["train_loss"] for r in trained.curve if r["train_loss"] is not None]
    return {
        "dataset": str(s.dataset),
        "data_dir": str(data.directory),
        "train_examples": len(data.train),
        "valid_examples": len(data.valid),
        "full_finetune": bool(s.full_finetune),
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


def trainer_epoch(curve: list[dict[str, Any]]) -> float:
    epochs = [r["epoch"] for r in curve if r.get("epoch") is not None]
    return float(epochs[-1]) if epochs and not math.isnan(float(epochs[-1])) else 0.0
