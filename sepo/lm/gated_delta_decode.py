"""One decode step of Qwen 3.5's Gated DeltaNet in five passes over its recurrent state (`model.lean_delta_decode`).

Why: where flash-linear-attention is missing (a CPU; a GPU whose Triton it refuses, docs/speed.md §4), transformers
decodes the linear-attention layers with `torch_recurrent_gated_delta_rule`, which for one token reads and writes
the fp32 state S (batch x 32 heads x 128 x 128 per layer, most of Qwen 3.5's cache) about fifteen times: it
decays S into a new tensor, multiplies it by k into another, sums that, builds the outer product k deltaᵀ as a
third, adds, multiplies by q into a fourth, sums, and the cache copies the result back. On an H200 that was
half of a CUDA-graph decode step at 128 rows (§4g). The same arithmetic, per head, with a = exp(g):

    kv_mem = a (kᵀ S)        delta = beta (v - kv_mem)        out = a (qᵀ S) + (qᵀ k) delta
    S <- a S + k deltaᵀ

reads S once for both matrix-vector products (k and q stacked, one batched product) and updates it in place
(scale, then a rank-one `baddbmm_`): five passes, no temporaries of S's size. The state is the cache's own
buffer, so the cache's copy back is a no-op. Sums run in another order than the reference's, so results agree
to float rounding (tests/test_gated_delta_decode.py), not bit for bit. Anything but a single-token step on a
given state without gradients goes to transformers' own function.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

_PATCHED = "_sepo_lean_delta_decode"


def lean_recurrent_step(reference: Any) -> Any:
    """`torch_recurrent_gated_delta_rule` with its single-token, no-gradient case done in five passes."""

    def step(
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        g: torch.Tensor,
        beta: torch.Tensor,
        initial_state: torch.Tensor | None = None,
        output_final_state: bool = False,
        use_qk_l2norm_in_kernel: bool = False,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if (
            initial_state is None
            or query.shape[1] != 1
            or torch.is_grad_enabled()
            or kwargs.get("cu_seqlens") is not None
        ):
            return reference(
                query, key, value, g=g, beta=beta, initial_state=initial_state,
                output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, **kwargs,
            )  # fmt: skip
        return _one_token(query, key, value, g, beta, initial_state, output_final_state, use_qk_l2norm_in_kernel)

    setattr(step, _PATCHED, True)
    step.reference = reference
    return step


def _one_token(query, key, value, g, beta, state, output_final_state, l2norm_qk):
    dtype = query.dtype
    batch, _, k_heads, k_dim = key.shape
    v_heads, v_dim = value.shape[-2:]
    if k_heads != v_heads:  # grouped value attention: each query/key head serves consecutive value heads
        query = query.repeat_interleave(v_heads // k_heads, dim=2)
        key = key.repeat_interleave(v_heads // k_heads, dim=2)
    q, k, v = (x[:, 0].float().reshape(batch * v_heads, -1) for x in (query, key, value))
    if l2norm_qk:
        q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + 1e-6)
        k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    q = q / k_dim**0.5
    decay = g[:, 0].float().exp().reshape(-1, 1)
    gate = beta[:, 0].float().reshape(-1, 1)

    state = state.to(torch.float32)
    if not state.is_contiguous():
        state = state.contiguous()
    s = state.view(batch * v_heads, k_dim, v_dim)
    k_s, q_s = torch.bmm(torch.stack((k, q), dim=1), s).unbind(1)  # one read of S for kᵀS and qᵀS
    delta = gate * (v - decay * k_s)
    out = decay * q_s + (q * k).sum(-1, keepdim=True) * delta
    s.mul_(decay[:, :, None]).baddbmm_(k[:, :, None], delta[:, None, :])
    out = out.view(batch, 1, v_heads, v_dim).to(dtype)
    return out, (state if output_final_state else None)


def use_lean_delta_decode() -> bool:
    """Route transformers' Qwen 3.5 decode step through `lean_recurrent_step`, where it runs its own PyTorch
    function (not flash-linear-attention's kernel). Returns whether the lean step is in place."""
    from transformers.models.qwen3_5 import modeling_qwen3_5 as qwen

    current = qwen.torch_recurrent_gated_delta_rule
    if getattr(current, _PATCHED, False):
        return True
    if not _runs_the_pytorch_fallback(current):
        return False  # transformers bound a fast kernel (or changed how it binds one): leave it
    qwen.torch_recurrent_gated_delta_rule = lean_recurrent_step(current)
    return True


def _runs_the_pytorch_fallback(bound: Any) -> bool:
    """Whether transformers' wrapper runs its own PyTorch function: it keeps `is_new_implementation` (False for the
    fallback) among its closure's variables. Unknown wrappers count as fast kernels, so nothing is replaced blindly."""
    return kernel_binding(bound).get("is_new_implementation") is False


def kernel_binding(bound: Any) -> dict[str, Any]:
    """The closure of transformers' `use_kernel_func_from_hub_with_fallback` wrapper behind a module-level kernel
    function (`implementation`, `is_new_implementation`), or {} for anything else. Where the `kernels` package is
    installed (a dependency from transformers 5.25), the function is an `nn.Module` whose `forward` closes over
    the wrapper as `func`, so the binding is read one level down."""
    if isinstance(bound, torch.nn.Module):
        bound = _closure(type(bound).forward).get("func")
    return _closure(bound)


def _closure(fn: Any) -> dict[str, Any]:
    try:
        return dict(inspect.getclosurevars(fn).nonlocals)
    except (TypeError, ValueError):
        return {}
