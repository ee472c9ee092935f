"""Stage `sft` (sepo/stages/sft.py): the loss mask, LoRA on the real architectures, outputs, the CLI, resume.

Everything runs on tiny random-weight models built offline (the tiny Qwen3-style model, and the tiny
Gemma 4 / Qwen 3.5 checkpoints of tests/test_models.py), on data generated with few episodes.
The learning check (tiny on IPD reaches the parse-rate and agreement targets) is marked slow;
`python -m benchmarks.speed.sft_tiny_ipd` runs the same thing as a script.
"""

from __future__ import annotations

import json
import re
import shutil

import pytest
import torch
from safetensors import safe_open

from sepo.builders import load_model_and_tokenizer
from sepo.errors import ConfigError
from sepo.lm.batching import end_of_turn_ids
from sepo.run.config import validate
from sepo.run.task import run_task
from sepo.stages.sft import run_sft, sft_settings
from sepo.training.sft_batching import (
    ChatSFTCollator,
    SFTBatchCollator,
    check_prefix_sharing,
    encode_examples,
    first_predicted,
    length_runs,
    prefix_groups,
    sft_logits,
    token_cross_entropy,
)
from sepo.training.sft_dataset import ensure_dataset, read_examples
from sepo.training.sft_monitoring import training_curve

from .conftest import model_cfg

pytestmark = [
    pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning"),
    pytest.mark.usefixtures("offline"),
]

#: end-of-turn token text written after the answer by each chat template
END_OF_TURN = {"tiny": "<|im_end|>", "gemma4": "<turn|>", "qwen": "<|im_end|>"}
#: small data and short runs: few demonstrator episodes, few examples, no evaluation unless asked
QUICK = [
    "datagen.episodes_per_opponent=3",
    "sft.max_steps=2",
    "sft.max_examples=8",
    "sft.max_valid_examples=4",
    "sft.agreement_examples=4",
    "sft.agreement_max_new_tokens=8",
    "sft.evaluate=false",
    "eval.progress=false",
]
#: the tiny model's own SFT defaults (conf/sft/model/tiny.yaml) are larger; `sft.<key>=` overrides win over them
TINY_QUICK = ["sft.per_device_batch_size=2", "sft.agreement_examples=4"]


class RecordingTracker:
    def __init__(self):
        self.logs, self.summaries = [], {}

    def log(self, values, step=None):
        self.logs.append((dict(values), step))

    def summary(self, values):
        self.summaries.update(values)

    def finish(self, exit_code=0):
        pass


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory):
    """One cache (tiny build, generated data) for every test of this module."""
    return tmp_path_factory.mktemp("sft_cache")


@pytest.fixture(scope="module")
def example(shared_cache):
    from sepo.run.compose import compose_config

    cfg = compose_config(
        [
            "paths.output_dir=/unused",
            f"paths.cache_dir={shared_cache}",
            "datagen.episodes_per_opponent=3",
        ]
    )
    ds = ensure_dataset(cfg, "multi", shared_cache / "data" / "seed_42")
    examples = read_examples(ds / "valid.jsonl")
    return next(ex for ex in examples if ex["game"] == "ipd" and ex["round"] >= 3)


# --------------------------------------------------------------------------- settings and data
def test_a_models_own_sft_defaults_are_merged_over_the_sft_node(compose_cfg):
    s = sft_settings(compose_cfg("stage=sft", "model=tiny"))
    assert s.full_finetune is True
    assert s.lr == pytest.approx(2e-3)  # the tiny model's own defaults
    assert s.max_length == 512
    assert s.warmup_ratio == 0.05
    assert s.dataset == "multi"  # the sft node's
    s = sft_settings(compose_cfg("stage=sft", "model=tiny", "sft.lr=1e-4", "sft.max_examples=32"))
    assert s.lr == pytest.approx(1e-4)
    assert s.max_examples == 32  # a command-line override wins over the model's defaults
    s = sft_settings(compose_cfg("stage=sft", "model=qwen", "game=kuhn"))
    assert (s.lora.r, s.lora.alpha, s.lora.dropout, s.lr, s.per_device_batch_size, s.grad_accum, s.epochs) == (
        32,
        64,
        0.05,
        2e-5,
        2,
        4,
        3,
    )
    assert s.lora.target_modules == model_cfg("qwen").lora.target_modules
    assert s.dataset == "kuhn"
    assert sft_settings(compose_cfg("stage=sft", "model=qwen", "game=neg_v2")).dataset == "neg_gt"
    # a key that a model's own defaults (or a preset) add would be read by nothing: an error, not a silent default
    with pytest.raises(
        ConfigError, match=r"sft\.learning_rate is not a key of the sft node .*conf/sft/model/tiny\.yaml"
    ):
        validate(compose_cfg("stage=sft", "model=tiny", "+sft.learning_rate=1"))
    with pytest.raises(ConfigError, match=r"sft\.lora\.rank is not a key of the sft node"):
        validate(compose_cfg("stage=sft", "model=smollm2", "+sft.lora.rank=8"))


def test_missing_dataset_is_generated_once_and_atomically(compose_cfg, tmp_path):
    cfg = compose_cfg("datagen.episodes_per_opponent=2")
    ds = ensure_dataset(cfg, "kuhn", tmp_path / "data")
    assert sorted(p.name for p in ds.iterdir()) == ["manifest.json", "train.jsonl", "valid.jsonl"]
    assert [p.name for p in (tmp_path / "data").iterdir()] == ["kuhn"]  # no temporary directory left behind
    stamp = (ds / "train.jsonl").stat().st_mtime_ns
    assert ensure_dataset(cfg, "kuhn", tmp_path / "data") == ds
    assert (ds / "train.jsonl").stat().st_mtime_ns == stamp
    assert {ex["game"] for ex in read_examples(ds / "train.jsonl")} == {"kuhn"}
    # data made with other datagen settings (e.g. a smoke run's few episodes) is never reused silently
    with pytest.raises(ConfigError, match="episodes_per_opponent: 2 there, 5 now"):
        ensure_dataset(compose_cfg("datagen.episodes_per_opponent=5"), "kuhn", tmp_path / "data")


# --------------------------------------------------------------------------- the collator
@pytest.mark.parametrize("name", ["tiny", "gemma4", "qwen"])
def test_loss_mask_covers_only_the_answer_and_end_of_turn(name, arch_dirs, example):
    model, tok = load_model_and_tokenizer(model_cfg(name, path=str(arch_dirs[name])), arch_dirs[name], device="cpu")
    cfg = model_cfg(name)
    collator = ChatSFTCollator(
        tok, cfg, 512, end_of_turn_ids(model, tok), "mm_token_type_ids" if name == "gemma4" else None
    )
    answer = example["messages"][-1]["content"]
    ids, labels = collator.encode(example["messages"])
    trained = [t for t, lab in zip(ids, labels) if lab != -100]
    assert [lab for lab in labels if lab != -100] == trained
    assert tok.decode(trained) == answer + END_OF_TURN[name]
    n_prompt = labels.index(next(lab for lab in labels if lab != -100))
    assert all(lab == -100 for lab in labels[:n_prompt])
    assert all(lab != -100 for lab in labels[n_prompt:])
    from sepo.models import render_chat

    assert tok.decode(ids[:n_prompt]) == render_chat(tok, cfg, example["messages"][:-1])  # the generation prompt

    # too long: the prompt loses its start, the answer stays whole
    short = ChatSFTCollator(tok, cfg, len(trained) + 5, end_of_turn_ids(model, tok))
    ids2, labels2 = short.encode(example["messages"])
    assert len(ids2) == len(trained) + 5
    assert ids2[-len(trained) :] == trained
    assert ids2[:5] == ids[n_prompt - 5 : n_prompt]
    assert labels2 == [-100] * 5 + trained

    batch = collator([example, {"messages": example["messages"][:1] + [example["messages"][-1]]}])
    assert batch["input_ids"].shape == batch["labels"].shape == batch["attention_mask"].shape
    assert batch["attention_mask"][1].sum() < batch["attention_mask"][0].sum()
    assert (batch["labels"][batch["attention_mask"] == 0] == -100).all()  # padding is never trained on
    if name == "gemma4":
        assert not batch["mm_token_type_ids"].any()
        assert batch["mm_token_type_ids"].shape == batch["input_ids"].shape
    else:
        assert set(batch) == {"input_ids", "attention_mask", "labels"}


def test_training_curve_rows_merge_train_and_valid_losses():
    history = [
        {"loss": 2.0, "learning_rate": 0.1, "epoch": 0.5, "step": 1},
        {"eval_loss": 1.5, "epoch": 0.5, "step": 1},
        {"loss": 1.0, "learning_rate": 0.05, "epoch": 1.0, "step": 2},
        {"train_runtime": 3.0, "step": 2},
    ]
    rows = training_curve(history)
    assert [(r["step"], r["train_loss"], r["valid_loss"]) for r in rows] == [(1, 2.0, 1.5), (2, 1.0, None)]


# --------------------------------------------------------------------------- fast batches (sepo/training/sft_batching.py)
@pytest.fixture(scope="module")
def mixed_examples(shared_cache):
    """Validation examples of the three `multi` games, interleaved (a mixed batch, as the sampler makes them)."""
    from sepo.run.compose import compose_config

    cfg = compose_config(
        [
            "paths.output_dir=/unused",
            f"paths.cache_dir={shared_cache}",
            "datagen.episodes_per_opponent=3",
        ]
    )
    examples = read_examples(ensure_dataset(cfg, "multi", shared_cache / "data" / "seed_42") / "valid.jsonl")
    by_game = {}
    for ex in examples:
        by_game.setdefault(ex["game"], []).append(ex)
    assert sorted(by_game) == ["auction", "ipd", "neg_v1"]
    rows = [ex for group in zip(*(v[:4] for v in by_game.values())) for ex in group]  # 4 of each game
    first_round = next(ex for ex in by_game["ipd"] if ex["round"] == 1)
    return rows + [first_round, first_round, by_game["ipd"][-1]]  # a duplicate prompt, an odd one out


def _loss_and_grads(model, fn):
    model.zero_grad()
    loss = fn()
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize(
    "name,share,min_shared,pass_cost",
    [
        ("tiny", False, 16, 0),
        ("tiny", True, 16, 0),
        # every group's rows in passes by length, each pass reading the group's one prefix
        pytest.param("tiny", True, 16, 1, marks=pytest.mark.slow),
        ("tiny", True, 150, 0),
        ("gemma4", False, 16, 0),
        ("qwen", False, 16, 0),
    ],
)
def test_fast_batches_give_the_plain_loss_and_gradients(name, share, min_shared, pass_cost, arch_dirs, mixed_examples):
    """Left padding, logits on the answer positions only, (tiny) shared prefixes and passes split by length
    change the work, not the function: the loss and every gradient equal transformers' plain ones within
    float rounding, normalised by a whole accumulated batch's token count (num_items_in_batch) as well as
    by the mean."""
    # float32 (Gemma 4 and Qwen 3.5 load as bf16): bf16 rounds a sum differently in another order
    model, tok = load_model_and_tokenizer(
        model_cfg(name, path=str(arch_dirs[name]), dtype="float32"), arch_dirs[name], device="cpu"
    )
    model.train()
    for p in model.parameters():
        p.requires_grad_(True)
    key = "mm_token_type_ids" if name == "gemma4" else None
    collator = ChatSFTCollator(tok, model_cfg(name), 512, end_of_turn_ids(model, tok), key)
    plain = collator(mixed_examples)
    # min_shared=150: the twin prompts share all but their last token; their group's rests (that token +
    # the answer) are narrower than the batch's longest answer span
    fast = SFTBatchCollator(collator.pad_id, share, min_shared, pass_cost)(
        encode_examples(collator.encode, mixed_examples)
    )
    trained = int(plain["labels"][:, 1:].ne(-100).sum())
    assert int(fast["labels"].ne(-100).sum()) == trained  # the Trainer's token count is unchanged
    if share and min_shared == 16:  # three games' rules: three shared groups (the odd row in a plain one)
        assert len(fast["groups"]) >= 3
        assert len(fast["prefixes"]) >= 3 and sum("prefix" in g for g in fast["groups"]) >= 3
        if pass_cost:  # some group's rows went in several passes, each reading the one prefix
            assert sum("prefix" in g for g in fast["groups"]) > len(fast["prefixes"])
    if share and min_shared == 150:
        assert min(g["input_ids"].shape[1] for g in fast["groups"]) < fast["labels"].shape[1]
    assert sorted(torch.cat([g["rows"] for g in fast["groups"]]).tolist()) == list(range(len(mixed_examples)))
    for count in (None, 2 * trained):  # mean; or a sum over a larger accumulated batch
        extra = {} if count is None else {"num_items_in_batch": torch.tensor(count)}
        loss0, grads0 = _loss_and_grads(model, lambda extra=extra: model(**plain, **extra).loss)
        loss1, grads1 = _loss_and_grads(
            model,
            lambda extra=extra: token_cross_entropy(
                sft_logits(model, fast, key), fast["labels"], extra.get("num_items_in_batch")
            ),
        )
        assert loss1.item() == pytest.approx(loss0.item(), abs=1e-5, rel=1e-5)
        assert grads1.keys() == grads0.keys()
        for n, g in grads0.items():
            assert torch.isfinite(grads1[n]).all(), n
            torch.testing.assert_close(grads1[n], g, atol=1e-5, rtol=1e-4, msg=lambda m, n=n: f"{n}: {m}")


def test_prefix_groups_cover_every_row_once_and_keep_its_answer_positions():
    rows = [[1, 2, 3, 4, 5, 6], [9, 9, 9], [1, 2, 3, 7, 8], [1, 2, 3, 4, 5, 9], [1, 2, 4]]
    limits = [4, 2, 3, 2, 2]  # the first predicted position of each row
    groups = prefix_groups(rows, limits, 3)
    assert sorted(r for members, _ in groups for r in members) == list(range(len(rows)))
    assert groups == [([0, 2, 3], 2), ([1], 2), ([4], 2)]  # shares 3 tokens, capped at row 3's limit 2
    for members, p in groups:
        assert all(rows[m][:p] == rows[members[0]][:p] and p <= limits[m] for m in members)
    assert prefix_groups(rows, limits, 4) == [([0, 3], 2), ([1], 2), ([2], 3), ([4], 2)]
    assert first_predicted([-100, -100, 5, 6]) == 1
    assert first_predicted([-100, -100]) == 1
    # the batch: targets of the kept logits are the labels shifted by one, rows aligned on the right
    batch = SFTBatchCollator(0, True, 3)(
        [{"ids": r, "labels": [-100] * (lim + 1) + r[lim + 1 :]} for r, lim in zip(rows, limits)]
    )
    assert batch["labels"].tolist() == [
        [-100, -100, 6, -100],
        [-100] * 4,
        [-100, -100, 8, -100],
        [4, 5, 9, -100],
        [-100] * 4,
    ]
    assert [g["rows"].tolist() for g in batch["groups"]] == [[0, 2, 3], [1, 4]]


def test_length_runs_cut_sorted_rows_where_the_padding_saved_outweighs_a_pass():
    members, lengths = [10, 11, 12, 13, 14], [5, 100, 6, 98, 7]
    assert length_runs(members, lengths, 50, 0) == [members]  # no cost given: one pass, as without splitting
    assert length_runs(members, lengths, 50, 1e9) == [members]  # a pass dearer than any padding
    assert length_runs(members, lengths, 50, 1e4) == [[10, 12, 14], [11, 13]]  # short ones, long ones
    runs = length_runs(members, lengths, 50, 1)
    assert sorted(m for run in runs for m in run) == members and len(runs) >= 4


def test_prefix_sharing_is_refused_where_it_would_not_be_exact(arch_dirs, compose_cfg, tmp_path, shared_cache):
    from peft import LoraConfig, get_peft_model

    tiny, _ = load_model_and_tokenizer(model_cfg("tiny", path=str(arch_dirs["tiny"])), arch_dirs["tiny"], device="cpu")
    assert check_prefix_sharing(tiny) is None
    lora = get_peft_model(tiny, LoraConfig(r=2, lora_alpha=4, lora_dropout=0.1, target_modules=["q_proj"]))
    assert "dropout" in check_prefix_sharing(lora)
    for name in ("gemma4", "qwen"):  # sliding-window / shared-KV layers; linear attention
        model, _ = load_model_and_tokenizer(model_cfg(name, path=str(arch_dirs[name])), arch_dirs[name], device="cpu")
        assert check_prefix_sharing(model) is not None, name
    with pytest.raises(ConfigError, match="sft.gradient_checkpointing=false"):
        validate(compose_cfg("stage=sft", "model=tiny", "sft.gradient_checkpointing=true"))
    with pytest.raises(ConfigError, match="sft.answer_logits_only=true"):
        validate(compose_cfg("stage=sft", "model=tiny", "sft.answer_logits_only=false"))
    cfg = compose_cfg(
        "stage=sft",
        "model=qwen",
        f"model.path={arch_dirs['qwen']}",
        f"paths.cache_dir={shared_cache}",
        *QUICK,
        "sft.prefix_sharing=true",
    )
    with pytest.raises(ConfigError, match="sft.prefix_sharing=true is not exact for model=qwen"):
        run_sft(cfg)


@pytest.mark.slow  # 30 s to 3 min on 2 cores, beside faster tests of the same path
def test_fast_and_plain_training_follow_the_same_curve(compose_cfg, tmp_path, shared_cache):
    """The Trainer end to end: the same batches, steps, losses (gradient accumulation included) and
    validation loss with the fast batches as with transformers' plain path."""
    common = [
        "stage=sft",
        "model=tiny",
        f"paths.cache_dir={shared_cache}",
        *QUICK,
        "sft.max_steps=3",
        "sft.max_examples=24",
        "sft.max_valid_examples=12",
        "sft.per_device_batch_size=4",
        "sft.grad_accum=2",
        "sft.logging_steps=1",
        "sft.eval_batch_size=8",
    ]
    curves = {}
    for mode in ("plain", "fast"):
        flags = (
            ["sft.answer_logits_only=false", "sft.prefix_sharing=false"]
            if mode == "plain"
            else ["sft.answer_logits_only=true", "sft.prefix_sharing=true"]
        )
        out = tmp_path / mode
        run_sft(compose_cfg(*common, *flags, f"paths.output_dir={out}"))
        metrics = json.loads((out / "sft_metrics.json").read_text())
        rows = (out / "training_curve.csv").read_text().splitlines()[1:]
        curves[mode] = ([float(r.split(",")[2]) for r in rows if r.split(",")[2]], metrics["valid_loss"])
    (plain, valid0), (fast, valid1) = curves["plain"], curves["fast"]
    assert len(plain) == len(fast) == 3
    assert fast == pytest.approx(plain, abs=1e-4)
    assert valid1 == pytest.approx(valid0, abs=1e-4)


# --------------------------------------------------------------------------- LoRA on the real architectures
@pytest.mark.parametrize("name", ["gemma4", "qwen"])
def test_lora_sft_on_real_architectures_saves_adapter_and_reloadable_merged_model(
    name, arch_dirs, compose_cfg, tmp_path, shared_cache
):
    cfg = compose_cfg(
        "stage=sft",
        f"model={name}",
        f"model.path={arch_dirs[name]}",
        f"paths.cache_dir={shared_cache}",
        *QUICK,
        "sft.lr=1e-2",
        "sft.logging_steps=1",
    )
    tracker = RecordingTracker()
    run_sft(cfg, tracker)
    metrics = json.loads((tmp_path / "sft_metrics.json").read_text())
    assert metrics["global_step"] == 2
    assert metrics["full_finetune"] is False
    assert metrics["valid_loss"] > 0
    speed = metrics["throughput"]  # the training loop's rate, in examples and in their tokens
    assert speed["tokens_per_s"] == pytest.approx(speed["examples_per_s"] * speed["mean_example_tokens"], rel=1e-3)
    # beside the CPU's rate, measured in the run; no order between them is asserted: where the CPU emulates
    # bfloat16, its 2048-square product can run slower than the model's small ones (seen: 0.139 vs 0.299)
    assert speed["matmul_gflops"] > 0 and speed["machine_matmul_gflops"] > 0
    # all three are rounded to three figures, each off by at most 0.5% (a leading 1.00), so the share and the ratio
    # of the two rates differ by at most 1.005 * 1.005 / 0.995 - 1 = 1.52%
    assert speed["matmul_share"] == pytest.approx(speed["matmul_gflops"] / speed["machine_matmul_gflops"], rel=2e-2)

    # the Trainer's logs reach the project's tracker at their optimizer step
    assert [step for values, step in tracker.logs if "sft/loss" in values] == [1, 2]
    assert any("sft/eval_loss" in values for values, _ in tracker.logs)
    assert tracker.summaries["sft/valid_loss"] == pytest.approx(metrics["valid_loss"])

    # LoRA sits exactly on the language model's q/k/v/o (and Qwen 3.5's linear-attention projections)
    regex = model_cfg(name).lora.target_modules
    base, _ = load_model_and_tokenizer(model_cfg(name, path=str(arch_dirs[name])), arch_dirs[name], device="cpu")
    expected = {n for n, m in base.named_modules() if isinstance(m, torch.nn.Linear) and re.fullmatch(regex, n)}
    assert set(metrics["lora_modules"]) == expected
    assert expected
    with safe_open(str(tmp_path / "adapter" / "adapter_model.safetensors"), "pt") as f:
        keys = list(f.keys())
    adapted = {re.sub(r"\.lora_[AB]\.weight$", "", k).removeprefix("base_model.model.") for k in keys}
    assert adapted == expected
    for n in adapted:
        assert not any(word in n for word in ("vision", "visual", "audio", "mlp")), n
        assert n.rsplit(".", 1)[-1] in {"q_proj", "k_proj", "v_proj", "o_proj", "in_proj_qkv", "out_proj"}

    # the merged model reloads through model.path, differs from the base in adapted weights only, and generates
    merged, tok = load_model_and_tokenizer(model_cfg(name, path=str(tmp_path / "merged")), tmp_path, device="cpu")
    assert type(merged).__name__ == type(base).__name__
    base_sd, merged_sd = base.state_dict(), merged.state_dict()
    changed = {k for k in base_sd if not torch.equal(base_sd[k], merged_sd[k])}
    assert changed
    assert all(k.removesuffix(".weight") in expected for k in changed)
    from sepo.training.sft_agreement import generate_answers

    answers = generate_answers(merged, tok, model_cfg(name), [[{"role": "user", "content": "Your move?"}]] * 2, 2, 4)
    assert len(answers) == 2
    assert (tmp_path / "training_curve.csv").exists()
    assert (tmp_path / "training_curve.png").exists()


# --------------------------------------------------------------------------- the CLI and resume
def test_tiny_sft_through_the_cli_writes_every_output(cli, tmp_path, shared_cache):
    # hydra.run.dir: the overrides would name a run dir longer than a file name may be
    proc = cli(
        "stage=sft",
        "game=ipd",
        "model=tiny",
        "logger=none",
        f"paths.cache_dir={shared_cache}",
        f"hydra.run.dir={tmp_path}/outputs/runs/sft",
        "datagen.episodes_per_opponent=3",
        "sft.max_examples=32",
        "sft.max_valid_examples=16",
        "sft.per_device_batch_size=2",
        "sft.max_steps=4",
        "sft.agreement_examples=8",
        "sft.agreement_max_new_tokens=16",
        "eval.episodes_per_opponent=2",
        "eval.max_new_tokens=16",
        "eval.progress=false",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = [p.parent for p in (tmp_path / "outputs").rglob("DONE")]
    assert (run / "merged" / "model.safetensors").exists()
    assert (run / "merged" / "tokenizer.json").exists()
    assert not (run / "adapter").exists()  # tiny is fully fine-tuned: no adapter
    assert list((run / "checkpoints").glob("checkpoint-4"))
    results = json.loads((run / "eval" / "sft" / "results.json").read_text())
    assert (results["stage"], results["checkpoint"], results["step"], results["model"]) == ("sft", "final", 4, "tiny")
    assert results["episodes"] == 2 * 10
    assert 0.0 <= results["metrics"]["parse_rate"] <= 1.0
    metrics = json.loads((run / "sft_metrics.json").read_text())
    assert metrics["train_examples"] == 32
    assert metrics["agreement"]["examples"] == 8
    assert 0.0 <= metrics["parse_rate"] <= 1.0
    assert 0.0 <= metrics["action_agreement"] <= 1.0
    assert metrics["eval"] == results["metrics"]
    header = (run / "training_curve.csv").read_text().splitlines()[0]
    assert header == "step,epoch,train_loss,valid_loss,learning_rate"


def test_interrupted_run_resumes_from_its_last_checkpoint(compose_cfg, tmp_path, shared_cache):
    common = [
        "stage=sft",
        "model=tiny",
        f"paths.cache_dir={shared_cache}",
        *QUICK,
        *TINY_QUICK,
        "sft.save_steps=1",
        "sft.eval_steps=1",
        "sft.logging_steps=1",
    ]
    run_task(compose_cfg(*common, "sft.max_steps=4"))
    first = json.loads((tmp_path / "sft_metrics.json").read_text())
    assert first["global_step"] == 4
    assert first["resumed_from_step"] is None
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["checkpoint-3", "checkpoint-4"]

    # as after a crash at step 3: no DONE, the checkpoints up to step 3 on disk
    (tmp_path / "DONE").unlink()
    shutil.rmtree(tmp_path / "checkpoints" / "checkpoint-4")
    with pytest.raises(SystemExit):  # resuming it under other settings is refused (tests/test_run_dir_safety.py)
        run_task(compose_cfg(*common, "sft.max_steps=4", "sft.lr=1e-6"))
    run_task(compose_cfg(*common, "sft.max_steps=4", "resume=auto"))
    second = json.loads((tmp_path / "sft_metrics.json").read_text())
    assert second["resumed_from_step"] == 3
    assert second["global_step"] == 4
    state = json.loads((tmp_path / "checkpoints" / "checkpoint-4" / "trainer_state.json").read_text())
    assert state["global_step"] == 4
    train_steps = [e["step"] for e in state["log_history"] if "loss" in e]
    assert train_steps == [1, 2, 3, 4]  # steps 1-3 come from the first run's checkpoint, 4 from the resumed run

    (tmp_path / "DONE").unlink()  # the newest checkpoint damaged (weights cut in half): resume from the one before
    weights = next((tmp_path / "checkpoints" / "checkpoint-4").glob("*.safetensors"))
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    run_task(compose_cfg(*common, "sft.max_steps=4", "resume=auto"))
    assert json.loads((tmp_path / "sft_metrics.json").read_text())["resumed_from_step"] == 3

    (tmp_path / "DONE").unlink()
    run_task(compose_cfg(*common, "sft.max_steps=2", "resume=never"))  # never: old checkpoints are discarded
    third = json.loads((tmp_path / "sft_metrics.json").read_text())
    assert third["resumed_from_step"] is None
    assert third["global_step"] == 2


def test_a_share_of_the_run_as_save_steps_checkpoints_every_fifth(compose_cfg, tmp_path, shared_cache):
    """Tiny's default save_steps 0.2: a checkpoint every fifth of the run, whatever its length, so a kill
    loses at most a fifth of it."""
    run_task(
        compose_cfg(
            "stage=sft",
            "model=tiny",
            f"paths.cache_dir={shared_cache}",
            *QUICK,
            *TINY_QUICK,
            "sft.max_steps=10",
            "sft.eval_steps=5",
            "sft.save_total_limit=null",
        )
    )
    assert compose_cfg("model=tiny").sft.save_steps == 0.2
    assert sorted(int(p.name.split("-")[1]) for p in (tmp_path / "checkpoints").iterdir()) == [2, 4, 6, 8, 10]


# --------------------------------------------------------------------------- learning (slow)
@pytest.mark.slow
def test_default_tiny_sft_on_ipd_learns_the_demonstrators(tmp_path):
    from benchmarks.speed.sft_tiny_ipd import run_benchmark

    figures = run_benchmark(tmp_path)
    assert figures["parse_rate"] >= 0.95, figures
    assert figures["action_agreement"] >= 0.80, figures


def test_the_training_loops_matmul_work_counts_every_position_fed_in_its_mode():
    """Positions fed in training mode carry forward and backward work (x3 with every weight training),
    those of an evaluation pass the forward's alone: 2 FLOP per decoder weight and position."""
    from sepo.profiling import positions_fed, training_gflop

    model = torch.nn.Sequential(torch.nn.Embedding(10, 4))
    model.get_input_embeddings = lambda: model[0]
    with positions_fed(model) as positions:
        model.train()
        model(torch.zeros(3, 7, dtype=torch.long))
        model.eval()
        model(torch.zeros(2, 5, dtype=torch.long))
    assert positions == {"train": 21, "eval": 10}
    model(torch.zeros(1, 4, dtype=torch.long))  # after the block: not counted
    assert positions == {"train": 21, "eval": 10}
    assert training_gflop(10**9, positions, full_finetune=False) == 4 * 21 + 2 * 10
    assert training_gflop(10**9, positions, full_finetune=True) == 6 * 21 + 2 * 10
