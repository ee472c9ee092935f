"""Whether a random-weight model's sampler and its teacher-forced pass agree on the log-probs of the
tokens it sampled: the premise of SEPO's first ratio on a fresh batch, which should be exactly 1.

SEPO's update divides the policy's teacher-forced log-probs by those the sampler recorded while it drew
each token (cached decode, one position at a time). Both are the same function in exact arithmetic, so
on a fresh batch every ratio is 1 and nothing is clipped. On an H200 a full-size random Gemma 4 clipped
86% of them (Qwen 3.5: none). This measures, per model, on rows of random prompt tokens:

- `sampled_vs_forced`: the sampler's recorded log-probs against a teacher-forced pass, both in the
  model's bfloat16 (what SEPO's first update sees);
- `bf16_vs_fp32`: the teacher-forced pass in bfloat16 against the same weights in float32 (how much of
  the model's output is rounding);

each as the mean and largest |difference| and the share of tokens whose ratio leaves [1 - clip, 1 + clip].
Gemma 4 is measured as transformers initialises it and tempered (`temper_attention_logits`).

    python -m benchmarks.gpu.logprob_agreement [--model gemma4 qwen] [--shape full|narrow] [--device cuda]

`--shape narrow` keeps the full depth and layer pattern at a width a CPU runs in seconds.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from benchmarks.gpu.full_size import GEMMA4_E4B_TEXT, QWEN35_4B_TEXT, build_model, gemma4_config, qwen35_config

#: full depth and layer pattern, a CPU's width: enough depth for rounding to compound as at full size
NARROW = {
    "gemma4": dict(
        vocab_size=4096,
        vocab_size_per_layer_input=4096,
        hidden_size=256,
        intermediate_size=1024,
        hidden_size_per_layer_input=32,
        num_attention_heads=4,
        num_key_value_heads=1,
    ),
    "qwen": dict(
        vocab_size=4096,
        hidden_size=256,
        intermediate_size=1024,
        num_attention_heads=4,
        num_key_value_heads=1,
        linear_num_key_heads=4,
        linear_num_value_heads=8,
        linear_key_head_dim=32,
        linear_value_head_dim=32,
    ),
}


def model_config(arch: str, shape: str) -> Any:
    """The published shape, or the same depth, pattern and head sizes at `NARROW`'s width."""
    if shape == "full":
        return gemma4_config("e4b", towers=False) if arch == "gemma4" else qwen35_config()
    if arch == "gemma4":
        from transformers import Gemma4Config, Gemma4TextConfig

        return Gemma4Config(text_config=Gemma4TextConfig(**{**GEMMA4_E4B_TEXT, **NARROW["gemma4"]}))
    from transformers import Qwen3_5TextConfig

    return Qwen3_5TextConfig(**{**QWEN35_4B_TEXT, **NARROW["qwen"]})


def disagreement(a: Any, b: Any, clip: float) -> dict[str, float]:
    """Mean and largest |a - b| of two log-prob tensors, and the share of exp(a - b) outside 1 +- clip."""
    d = (a - b).double()
    return {
        "mean_abs": round(float(d.abs().mean()), 5),
        "max_abs": round(float(d.abs().max()), 5),
        "clipped": round(float(((d.exp() - 1).abs() > clip).double().mean()), 4),
    }


def sampled(model: Any, ids: Any, new_tokens: int) -> tuple[Any, Any]:
    """`new_tokens` tokens per row drawn by the project's sampler (temperature 1, no EOS), and the
    log-probs it recorded while drawing them, [rows, new_tokens]."""
    import torch
    from transformers import LogitsProcessorList

    from sepo.lm.sampling import PLAIN_SAMPLING, RowSampler

    sampler = RowSampler(range(ids.shape[0]), temperature=1.0, logprob_temperature=1.0)
    model.generation_config.eos_token_id = None
    with torch.no_grad():
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=new_tokens,
            do_sample=False,
            logits_processor=LogitsProcessorList([sampler]),
            pad_token_id=0,
            **PLAIN_SAMPLING,
        )
    return out, torch.stack(sampler.logprobs, dim=1)


def forced(model: Any, ids: Any, start: int) -> Any:
    """The project's teacher-forced log-probs of every token from `start` on."""
    import torch

    from sepo.lm.logprobs import token_logprobs

    with torch.no_grad():
        return token_logprobs(model, ids, torch.ones_like(ids), start).cpu()


def measure(arch: str, shape: str, temper: bool, args: argparse.Namespace) -> dict[str, Any]:
    import torch

    torch.manual_seed(args.seed)
    model = build_model(arch, model_config(arch, shape), args.device, torch.bfloat16, temper=temper)
    vocab = model.config.get_text_config().vocab_size
    prompt = torch.randint(
        3, vocab, (args.rows, args.prompt_tokens), generator=torch.Generator().manual_seed(args.seed)
    )
    ids, recorded = sampled(model, prompt.to(args.device), args.new_tokens)
    bf16 = forced(model, ids, args.prompt_tokens)
    fp32 = forced(model.float(), ids, args.prompt_tokens)
    del model
    return {
        "arch": arch,
        "shape": shape,
        "tempered": temper,
        "sampled_vs_forced": disagreement(recorded.float(), bf16, args.clip),
        "bf16_vs_fp32": disagreement(bf16, fp32, args.clip),
        "forced_logprob_mean": round(float(bf16.mean()), 3),
    }


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", nargs="+", choices=["gemma4", "qwen"], default=["gemma4", "qwen"])
    p.add_argument("--shape", choices=["full", "narrow"], default="full", help="full: the published shapes")
    p.add_argument("--device", default="cuda")
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--prompt-tokens", type=int, default=400, help="Kuhn's prompts run to ~430 tiny tokens")
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--clip", type=float, default=0.2, help="SEPO's clip range (conf/sepo/default.yaml: clip_eps)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    rows = []
    for arch in args.model:
        for temper in (False, True) if arch == "gemma4" else (False,):
            rows.append(measure(arch, args.shape, temper, args))
            print(json.dumps(rows[-1]), flush=True)
    return rows


if __name__ == "__main__":
    main()
