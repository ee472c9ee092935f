"""A SEPO checkpoint's evaluation through its LoRA adapter and with the adapter folded into the weights, side by side.

    python -m benchmarks.speed.folded_reads --model-path <sft run>/merged [--model smollm2] [--game kuhn]
                                            [--adapter DIR | --adapter-std 0.002] [--threads 2] [--repeats 1]
                                            [--fidelity-rows 8] [overrides]

What `sepo.fold_adapter_for_reads` buys. The SFT model gets a trained adapter (`--adapter`, e.g. a SEPO
run's `adapter/`), or a fresh one whose B is drawn from N(0, adapter_std) (a zero B would make both passes
the SFT model), then one evaluation of the test episodes (the model's own `eval` settings, exactly as a SEPO
checkpoint is evaluated) runs through the adapter and one with it folded (`sepo.models.adapter_folded`), alternated `--repeats`
times on the same episodes and sampling streams. Prints seconds of each, their ratio, and the metrics of
both. The two play the same real-valued policy in different roundings, and a sampled token that flips
sends an episode elsewhere, so their metrics differ as two evaluations on nearby streams do.

Fidelity, the question a speed-up through rounding must answer: on the demonstrations' validation answers
(`sft.data_dir`'s `<game>/valid.jsonl`, `--fidelity-rows` of them), the mean per-token KL from the exact
policy (the same SFT weights and adapter in float32, the adapter unfolded) to the model's dtype's adapter
pass, to its folded pass, and to the reference (adapter off): folding is faithful when its KL is no larger
than the adapter pass's own rounding.
The last line is JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

from sepo.run.compose import compose_config as compose

METRICS = ("parse_rate", "exploit_exact", "train_payoff", "safety")


def evaluation_seconds(cfg, game, model, tokenizer, folded: bool) -> tuple[float, dict]:
    from sepo.models import adapter_folded
    from sepo.stages.evaluate import evaluate_with_protocol, evaluation_policy

    started = time.perf_counter()
    with adapter_folded(model, folded):
        result = evaluate_with_protocol(cfg, game, evaluation_policy(cfg, model, tokenizer))
    return time.perf_counter() - started, {k: float(v) for k, v in result["metrics"].items() if k in METRICS}


def answer_logprobs(model, tokenizer, rows: list[dict], kind: str) -> torch.Tensor:
    """Log-softmax at every position of each demonstration's answer (its last `answer tokens` positions):
    through the adapter (`kind`="adapter"), folded ("folded"), or with it switched off ("reference")."""
    from sepo.models import adapter_folded

    out = []
    for row in rows:
        text = tokenizer.apply_chat_template(row["messages"], tokenize=False)
        answer = len(tokenizer(row["messages"][-1]["content"], add_special_tokens=False)["input_ids"])
        ids = tokenizer(text, return_tensors="pt", add_special_tokens=False)["input_ids"]
        off = model.disable_adapter() if kind == "reference" else contextlib.nullcontext()
        with torch.no_grad(), adapter_folded(model, kind == "folded"), off:
            out.append(model(input_ids=ids).logits[0, -answer - 2 :].float().log_softmax(-1))
    return torch.cat(out)


def mean_kl(p: torch.Tensor, q: torch.Tensor) -> float:
    return float((p.exp() * (p - q)).sum(-1).mean())


def fidelity(overrides: list[str], rows: list[dict], adapter: str | None, adapter_std: float, seed: int) -> dict:
    """Mean per-token KL from the exact (float32, unfolded) policy to each pass in the model's dtype."""
    passes = {}
    for dtype in ("float32", None):
        with_dtype = overrides + ([f"model.dtype={dtype}"] if dtype else [])
        model, tokenizer = adapted_model(with_dtype, adapter, adapter_std, seed)
        kinds = ("adapter",) if dtype else ("adapter", "folded", "reference")
        passes[dtype or "model"] = {k: answer_logprobs(model, tokenizer, rows, k) for k in kinds}
    exact = passes["float32"]["adapter"]
    return {f"kl_exact_to_{k}": mean_kl(exact, v) for k, v in passes["model"].items()}


def adapted_model(overrides: list[str], adapter: str | None, adapter_std: float, seed: int) -> tuple[Any, Any]:
    """The SFT model with a trained adapter (`adapter`, a SEPO run's `adapter/` or a checkpoint's), else with
    a fresh one whose B is drawn from N(0, adapter_std), the same draw every call."""
    from peft import PeftModel

    from sepo.builders import load_model_and_tokenizer
    from sepo.models import attach_lora
    from sepo.training.objective import sepo_settings

    cfg = compose(overrides)
    s = sepo_settings(cfg)
    base, tokenizer = load_model_and_tokenizer(cfg.model, cfg.paths.cache_dir)
    if adapter:
        return PeftModel.from_pretrained(base, adapter).eval(), tokenizer
    model = attach_lora(base, cfg.model.lora.target_modules, int(s.lora.r), int(s.lora.alpha), 0.0)
    model.eval()
    with torch.no_grad():
        draw = torch.Generator().manual_seed(seed)
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=draw).to(p.dtype) * adapter_std)
    return model, tokenizer


def main() -> None:
    from sepo.games import make_game

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--model-path", required=True, help="a merged SFT model (<sft run>/merged)")
    parser.add_argument("--game", default="kuhn")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--repeats", type=int, default=1, help="evaluations of each kind, alternated (0: fidelity only)"
    )
    parser.add_argument("--adapter", default=None, help="a trained adapter's directory (default: a random one)")
    parser.add_argument("--adapter-std", type=float, default=0.002, help="std of the random adapter's B")
    parser.add_argument("--fidelity-rows", type=int, default=8, help="validation demonstrations scored (0: skip)")
    args, overrides = parser.parse_known_args()
    overrides = [
        f"model={args.model}",
        f"game={args.game}",
        "logger=none",
        "eval.progress=false",
        f"model.path='{Path(args.model_path).resolve()}'",
        *overrides,
    ]
    torch.set_num_threads(args.threads)
    cfg = compose(overrides)
    seed = int(cfg.sepo.seed)
    report: dict[str, Any] = {"game": args.game, "threads": torch.get_num_threads()}
    report["adapter"] = args.adapter or f"random, B ~ N(0, {args.adapter_std})"
    if args.fidelity_rows:
        valid = Path(cfg.sft.data_dir) / args.game / "valid.jsonl"
        if not valid.exists():
            parser.error(f"--fidelity-rows: {valid} is missing (the SFT stage writes it); or pass --fidelity-rows 0")
        rows = [json.loads(line) for line in valid.read_text().splitlines()[: args.fidelity_rows]]
        report["fidelity"] = fidelity(overrides, rows, args.adapter, args.adapter_std, seed)
        print(f"fidelity {report['fidelity']}", file=sys.stderr, flush=True)
    model, tokenizer = adapted_model(overrides, args.adapter, args.adapter_std, seed)
    game = make_game(cfg.game)
    seconds: dict[str, list[float]] = {"adapter": [], "folded": []}
    metrics: dict[str, dict] = {}
    for _ in range(args.repeats):
        for kind in ("adapter", "folded"):
            took, metrics[kind] = evaluation_seconds(cfg, game, model, tokenizer, folded=kind == "folded")
            seconds[kind].append(took)
            print(f"{kind:<8} {took:7.1f} s  {metrics[kind]}", file=sys.stderr, flush=True)
    mean = {k: sum(v) / max(1, len(v)) for k, v in seconds.items()}
    if args.repeats:
        report.update(seconds=seconds, adapter_over_folded=round(mean["adapter"] / mean["folded"], 3), metrics=metrics)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
