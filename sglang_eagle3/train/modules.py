"""Training-time replacements inside a target model, applied for the duration of a ``with`` block.

The engine's MoE block is built for decode batches: its routing op dispatches to a Triton kernel on CUDA
(no autograd, so the router would never learn) and its routed-experts op gathers one expert's full weight
matrices per (token, slot) (a training batch of 32k tokens would materialise tens of GB). ``training_mode``
swaps each ``DeepseekMoE.forward`` for one that routes with the differentiable torch reference and runs the
experts grouped (tokens sorted by expert, one matmul pair per expert): the same function, trainable. It also
records how many tokens each expert received (for DeepSeek-V3's bias-based balancing) and can add dropout on
the residual branches. Every layer that can pick a Triton kernel (``use_triton``) is set to the torch
reference inside the block: those kernels have no backward, and the reference is what the tests pin down.
The model's code and state are untouched; leaving the block restores every method and setting.
"""

from __future__ import annotations

import contextlib
import logging
import types

import torch
import torch.nn as nn
import torch.nn.functional as F

from sglang_eagle3.distributed.parallel_state import get_tp
from sglang_eagle3.kernels.ref import ref_moe_topk

logger = logging.getLogger(__name__)


def grouped_experts_forward(experts: nn.Module, x: torch.Tensor, topk_weights: torch.Tensor,
                            topk_ids: torch.Tensor) -> torch.Tensor:
    """Same result as ``ref_fused_moe``: x [T, H], topk_* [T, k] -> [T, H].

    Counts per expert are added to ``experts.train_load`` (float32 [E]) when that attribute is set.
    """
    T, k = topk_ids.shape
    w13, w2 = experts.w13_weight, experts.w2_weight  # [E, 2I, H], [E, H, I]
    E = w13.shape[0]
    flat = topk_ids.reshape(-1).long()  # [T*k]
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=E)  # [E]
    if getattr(experts, "train_load", None) is not None:
        experts.train_load += counts.float()
    token_of = order // k  # [T*k] token of each sorted (token, slot)
    xs = x[token_of]  # [T*k, H]
    outs = []
    for e, xe in enumerate(xs.split(counts.tolist())):
        gate, up = F.linear(xe, w13[e]).chunk(2, dim=-1)  # [n_e, I] each
        outs.append(F.linear(F.silu(gate) * up, w2[e]))  # [n_e, H]
    y = torch.cat(outs).float() * topk_weights.reshape(-1)[order].float()[:, None]
    out = torch.zeros(T, x.shape[-1], dtype=torch.float32, device=x.device).index_add_(0, token_of, y)
    return out.to(x.dtype)


def moe_training_forward(moe: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``DeepseekMoE.forward`` with differentiable routing and grouped experts: x [..., H] -> [..., H]."""
    shape = x.shape
    x = x.reshape(-1, shape[-1])  # [T, H]
    c = moe.cfg
    weights, ids = ref_moe_topk(moe.gate(x), moe.gate.e_score_correction_bias, top_k=c.num_experts_per_tok,
                                n_group=c.n_group, topk_group=c.topk_group, renormalize=c.norm_topk_prob,
                                routed_scaling_factor=c.routed_scaling_factor)
    if hasattr(moe.experts, "w13_weight"):
        out = grouped_experts_forward(moe.experts, x, weights, ids)
    else:  # INT4 experts (a quantized target in train_draft): inference only, the engine's op is fine
        out = moe.experts(x, weights, ids)
    if moe.shared_experts is not None:
        out = out + moe.shared_experts(x)
    return out.view(shape)


def _moe_blocks(model: nn.Module):
    for name, module in model.named_modules():
        if hasattr(module, "gate") and hasattr(module, "experts") and hasattr(module, "shared_experts"):
            yield name, module


def _dropout_hook(p: float):
    def hook(module, args, output):
        return F.dropout(output, p, training=True) if module.training else output

    return hook


@contextlib.contextmanager
def reference_kernels(*models: nn.Module):
    """Every module with a ``use_triton`` switch runs the torch reference inside the block (restored after)."""
    saved = [(m, m.use_triton) for model in models for m in model.modules() if hasattr(m, "use_triton")]
    try:
        for m, _ in saved:
            m.use_triton = False
        yield
    finally:
        for m, choice in saved:
            m.use_triton = choice


@contextlib.contextmanager
def training_mode(model: nn.Module, dropout: float = 0.0, track_load: bool = False):
    """Grouped MoE (+ per-expert load counts, + residual-branch dropout) inside the block.

    Dropout acts on the output of every layer's attention ``o_proj`` and ``mlp`` (the two residual
    branches) and only while ``model.training`` is True.
    """
    if get_tp().size != 1:
        raise RuntimeError(f"training runs with tensor parallelism 1, got tp_size={get_tp().size}")
    stack = contextlib.ExitStack()
    patched, hooks = [], []
    try:
        stack.enter_context(reference_kernels(model))
        for _, moe in _moe_blocks(model):
            moe.forward = types.MethodType(moe_training_forward, moe)
            if track_load and hasattr(moe.experts, "w13_weight"):
                moe.experts.train_load = torch.zeros(moe.experts.w13_weight.shape[0],
                                                     device=moe.experts.w13_weight.device)
            patched.append(moe)
        if dropout > 0:
            for layer in model.model.layers:
                hooks.append(layer.self_attn.o_proj.register_forward_hook(_dropout_hook(dropout)))
                hooks.append(layer.mlp.register_forward_hook(_dropout_hook(dropout)))
        yield
    finally:
        for moe in patched:
            del moe.forward  # the instance attribute shadowed the class method
            if hasattr(moe.experts, "train_load"):
                del moe.experts.train_load
        for h in hooks:
            h.remove()
        stack.close()


@torch.no_grad()
def update_routing_bias(model: nn.Module, rate: float) -> float | None:
    """DeepSeek-V3's auxiliary-loss-free balancing: after each step, raise the selection bias of experts
    that got fewer tokens than average and lower it for those that got more (bias += rate * sign(mean -
    load)). Returns the max/mean load ratio over layers (1.0 = perfectly balanced), or None without MoE."""
    worst = None
    for _, moe in _moe_blocks(model):
        load = getattr(moe.experts, "train_load", None)
        if load is None or load.sum() == 0:
            continue
        moe.gate.e_score_correction_bias += rate * torch.sign(load.mean() - load)
        ratio = (load.max() / load.mean()).item()
        worst = ratio if worst is None else max(worst, ratio)
        load.zero_()
    return worst
