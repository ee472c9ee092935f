"""Linear layers that multiply through a prepacked copy of their weight when no gradient is taken.

torch's bfloat16 `F.linear` on a CPU hands the weight to oneDNN in its plain row-major layout, and oneDNN
reorders it into its blocked layout at every call. Reordering once and keeping the blocked copy took the 211
products of one SmolLM2 decoding step at 32 rows from 49 to 35 ms (2 threads, AVX512-BF16; a whole Kuhn
evaluation 1.06x faster: docs/speed.md §5h). The blocked product is oneDNN's own, so its outputs equal
`F.linear`'s bit for bit in bfloat16 (tested); in float32 torch multiplies through another library and the
two differ in the last bits, so float32 layers are left as they are.

Only passes without gradients use the copy (decoding, prompt processing, the reference pass, the played
table's scores): the copy has no backward. A copy is made on a layer's first such pass and remade when its
weight is replaced (a LoRA adapter folded into the weights for an evaluation) or changed in place; it costs
the layer's weight again in memory, so callers about to take a step with gradients drop every copy first
(`drop_packed_weights`), and the update's peak stays what it was.
"""

from __future__ import annotations

import functools
import types
import weakref
from typing import Any

import torch
import torch.nn.functional as F

#: rows oneDNN is told to expect when it picks the blocked layout: a decoding step's; among hints of 1, 32 and
#: 1,024, 32 was within 5% of the fastest at 1, 32 and 1,024 rows (products timed alone, 2 threads)
ROWS_HINT = 32


def can_pack(weight: torch.Tensor) -> bool:
    """oneDNN's prepacked product serves this weight: a bfloat16 tensor on a CPU whose oneDNN runs bfloat16."""
    return weight.device.type == "cpu" and weight.dtype == torch.bfloat16 and onednn_bfloat16()


@functools.cache
def onednn_bfloat16() -> bool:
    """This build and CPU multiply bfloat16 through oneDNN (asked once: every product of every step asks)."""
    return (
        torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
        and torch.ops.mkldnn._is_mkldnn_bf16_supported()  # else F.linear takes another path, with other roundings
    )


def packed_forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """`F.linear`, through the weight's blocked copy where no gradient is taken."""
    weight = self.weight
    if (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)) or x.dtype != weight.dtype:
        return F.linear(x, weight, self.bias)
    if not can_pack(weight):
        return F.linear(x, weight, self.bias)
    held = self.__dict__.get("_packed")
    if held is None or held[0]() is not weight or held[1] != weight._version:
        packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), ROWS_HINT)
        held = (weakref.ref(weight), weight._version, packed)
        self.__dict__["_packed"] = held
    return torch.ops.mkldnn._linear_pointwise(x, held[2], self.bias, "none", [], "")


def use_packed_linears(model: Any) -> int:
    """Route every plain `nn.Linear` of `model` (a LoRA layer's base layer included) through
    `packed_forward`; returns how many. Layers of other types (4-bit, LoRA wrappers) keep their own."""
    layers = [m for m in model.modules() if type(m) is torch.nn.Linear]
    for layer in layers:
        layer.forward = types.MethodType(packed_forward, layer)
    return len(layers)


def drop_packed_weights(model: Any) -> None:
    """Free every layer's blocked copy (they are remade on the next pass without gradients)."""
    for module in model.modules():
        module.__dict__.pop("_packed", None)


def packed_bytes(model: Any) -> int:
    """Memory the blocked copies hold now."""
    total = 0
    for module in model.modules():
        held = module.__dict__.get("_packed")
        if held is not None:
            total += held[2].numel() * held[2].element_size()
    return total
