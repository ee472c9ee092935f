"""What the SFT stage watches while the Trainer runs and reports after: its log lines sent to the
tracker, a stop on a non-finite loss, the training curve (train and validation loss by optimizer step),
and the loop's speed (examples and tokens per second, its matmul rate beside the machine's).
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from sepo.profiling import matmul_gflops, matmul_parameters, training_gflop
from sepo.training.divergence import check_step


def tracker_callback(tracker: Any, prefix: str = "sft"):
    """A TrainerCallback forwarding every Trainer log dict to `tracker.log` at the optimizer step (`tracker`:
    the run's, `sepo.tracking`; the library never imports the run layer)."""
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


def trainer_epoch(curve: list[dict[str, Any]]) -> float:
    epochs = [r["epoch"] for r in curve if r.get("epoch") is not None]
    return float(epochs[-1]) if epochs and not math.isnan(float(epochs[-1])) else 0.0


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
    achieved = training_gflop(body, positions, s.full_finetune) / seconds
    machine = matmul_gflops(weights.dtype)
    return {
        "matmul_gflops": _three_figures(achieved),
        "machine_matmul_gflops": _three_figures(machine),
        "matmul_share": _three_figures(achieved / machine),
    }


def _three_figures(value: float) -> float:
    """Three significant figures: a small model on a slow machine reaches a few MFLOP/s, which a fixed
    number of decimals would print as 0."""
    return float(f"{value:.3g}")
