"""What a teacher-forced pass keeps for its backward pass, per layer kind and per token, in the paper's
two models at full width: the memory of a SEPO update without a GPU to profile it on.

A SEPO update runs the policy over `sepo.micro_batch` whole decisions (prompt and answer) with LoRA
adapters on every projection and no activation checkpointing, so every decoder layer keeps its
activations until the backward pass. This builds the real architecture at full width with one period of
its layer pattern (Gemma 4: five sliding-window layers and one full-attention layer; Qwen 3.5: three
Gated DeltaNet layers and one full-attention layer), runs one row of random tokens through it with the
project's own LoRA adapters, and counts the bytes of every tensor autograd saves, by the layer that saved
it. The Gated DeltaNet layers run transformers' PyTorch path here as on the GPU without
flash-linear-attention, so their figure is the GPU's. Softmax attention may save more on a CPU than on
a GPU (the math kernel keeps the attention probabilities; FlashAttention does not): read its figure at
two lengths, since a per-token figure that grows with the length is that.

    python -m benchmarks.gpu.saved_activations [--model gemma4 qwen] [--tokens 256 512]
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from typing import Any

from benchmarks.gpu.full_size import GEMMA4_E4B_TEXT, build_model, gemma4_config, qwen35_config
from sepo.run.compose import compose_config

MIB = 2**20


def one_period(arch: str) -> tuple[Any, list[str], int]:
    """The full-width config cut to one period of its layer pattern, that pattern, and the full model's
    layer count of each kind's multiple (the full model repeats the period this many times)."""
    if arch == "gemma4":
        config = gemma4_config("e4b", towers=False)
        period = GEMMA4_E4B_TEXT["layer_types"][:6]
        config.text_config.num_hidden_layers = len(period)
        config.text_config.layer_types = period
        config.text_config.num_kv_shared_layers = 0  # sharing reads a cache; a training pass computes every layer's KV
        return config, period, GEMMA4_E4B_TEXT["num_hidden_layers"] // len(period)
    config = qwen35_config()
    full_layers = config.num_hidden_layers
    config.num_hidden_layers = 4
    config.layer_types = config.layer_types[:4]
    return config, list(config.layer_types), full_layers // 4


def decoder_layers(model: Any) -> list[Any]:
    for module in model.modules():
        layers = getattr(module, "layers", None)
        if layers is not None and len(layers) and "DecoderLayer" in type(layers[0]).__name__:
            return list(layers)
    raise RuntimeError("no decoder layers found")


def saved_bytes_by_layer(model: Any, kinds: list[str], tokens: int, seed: int) -> dict[str, int]:
    """Bytes of the tensors autograd saves in one forward pass of `tokens` random tokens, by layer kind
    ("outside" for embeddings, final norm and the one position's logits); each storage counted once, and
    none that holds a weight (the weights are in memory whether or not a pass keeps them)."""
    import torch

    current = ["outside"]
    for layer, kind in zip(decoder_layers(model), kinds):
        layer.register_forward_pre_hook(lambda _m, _a, kind=kind: current.__setitem__(0, kind))
        layer.register_forward_hook(lambda *_: current.__setitem__(0, "outside"))
    seen = {param.untyped_storage().data_ptr() for param in model.parameters()}  # weights are held anyway
    totals: dict[str, int] = defaultdict(int)

    def pack(tensor: Any) -> Any:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in seen:
            seen.add(storage.data_ptr())
            totals[current[0]] += storage.nbytes()
        return tensor

    vocab = model.get_input_embeddings().num_embeddings
    ids = torch.randint(3, vocab, (1, tokens), generator=torch.Generator().manual_seed(seed))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        model(input_ids=ids, attention_mask=torch.ones_like(ids), logits_to_keep=1)
    return dict(totals)


def measure(arch: str, tokens: list[int], seed: int) -> dict[str, Any]:
    import torch

    from sepo.models import attach_lora
    from sepo.training.objective import sepo_settings

    cfg = compose_config([f"model={arch}", "logger=none"])
    config, kinds, repeats = one_period(arch)
    torch.manual_seed(seed)
    model = build_model(arch, config, "cpu", torch.bfloat16)
    lora = sepo_settings(cfg).lora  # the SEPO stage's adapter, as its update trains it
    model = attach_lora(model, cfg.model.lora.target_modules, int(lora.r), int(lora.alpha), 0.0)
    out: dict[str, Any] = {"layer_pattern": kinds, "pattern_repeats_in_full_model": repeats, "by_tokens": {}}
    for n in tokens:
        totals = saved_bytes_by_layer(model, kinds, n, seed)
        per_kind_layer = {kind: totals.get(kind, 0) / kinds.count(kind) for kind in set(kinds)}
        full_model = sum(per_kind_layer[kind] * kinds.count(kind) * repeats for kind in set(kinds))
        out["by_tokens"][n] = {
            "kib_per_token_per_layer": {kind: round(b / n / 1024, 1) for kind, b in per_kind_layer.items()},
            "mib_per_token_full_model": round(full_model / n / MIB, 3),
            "outside_layers_mib": round(totals.get("outside", 0) / MIB, 1),
        }
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", nargs="+", choices=["gemma4", "qwen"], default=["gemma4", "qwen"])
    p.add_argument("--tokens", nargs="+", type=int, default=[256, 512])
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    print(json.dumps({arch: measure(arch, args.tokens, args.seed) for arch in args.model}, indent=1))


if __name__ == "__main__":
    main()
