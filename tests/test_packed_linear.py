"""Prepacked linear layers (sepo/lm/packed_linear.py): passes without gradients multiply through oneDNN's
blocked copy of a bfloat16 weight. The point is speed with nothing else changed, so every test asserts
equality bit for bit against `F.linear`, and that the copy follows the weight it stands for."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from sepo.lm.packed_linear import can_pack, drop_packed_weights, packed_bytes, use_packed_linears

pytestmark = [
    pytest.mark.usefixtures("one_thread"),
    pytest.mark.skipif(
        not can_pack(torch.zeros(1, dtype=torch.bfloat16)), reason="this CPU's oneDNN has no bfloat16 products"
    ),
]


def bfloat16_layers(bias: bool) -> torch.nn.Sequential:
    torch.manual_seed(0)
    layers = torch.nn.Sequential(torch.nn.Linear(64, 96, bias=bias), torch.nn.Linear(96, 40, bias=bias))
    return layers.to(torch.bfloat16)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", [(1, 64), (33, 64), (3, 7, 64)])
def test_a_packed_product_equals_f_linear_bit_for_bit(bias, shape):
    plain = bfloat16_layers(bias)
    packed = copy.deepcopy(plain)
    assert use_packed_linears(packed) == 2
    x = torch.randn(*shape).to(torch.bfloat16)
    with torch.no_grad():
        assert torch.equal(packed(x), plain(x))
        assert torch.equal(packed(x.transpose(0, -2).contiguous().transpose(0, -2)), plain(x))  # strided rows
    assert packed_bytes(packed) == sum(m.weight.numel() * 2 for m in packed)


def test_a_pass_with_gradients_never_uses_the_copy_and_its_gradient_is_unchanged():
    plain = bfloat16_layers(True)
    packed = copy.deepcopy(plain)
    use_packed_linears(packed)
    x = torch.randn(5, 64).to(torch.bfloat16)
    plain(x).float().square().sum().backward()
    packed(x).float().square().sum().backward()
    assert packed_bytes(packed) == 0  # nothing was packed
    for a, b in zip(plain.parameters(), packed.parameters()):
        assert torch.equal(a.grad, b.grad)


def test_the_copy_follows_a_replaced_or_changed_weight_and_is_freed_on_request():
    layers = bfloat16_layers(False)
    use_packed_linears(layers)
    first = layers[0]
    x = torch.randn(4, 64).to(torch.bfloat16)
    with torch.no_grad():
        layers(x)
        # replaced, as adapter_folded swaps a folded weight in
        first.weight = torch.nn.Parameter(first.weight * 2, requires_grad=False)
        assert torch.equal(first(x), F.linear(x, first.weight))
        first.weight.add_(1.0)  # changed in place, as an optimizer step would
        assert torch.equal(first(x), F.linear(x, first.weight))
    assert packed_bytes(layers) > 0
    drop_packed_weights(layers)
    assert packed_bytes(layers) == 0


def test_float32_layers_are_left_as_they_are():
    layers = bfloat16_layers(False).float()
    use_packed_linears(layers)
    with torch.no_grad():
        layers(torch.randn(3, 64))
    assert packed_bytes(layers) == 0
