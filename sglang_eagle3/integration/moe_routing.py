"""MoE routing swap: SGLang's biased grouped top-k (noaux_tc, sigmoid) -> our fused ``moe_topk`` on CUDA.

Patched symbol: ``sglang.srt.layers.moe.topk.biased_grouped_topk`` (0.5.23: an alias of
``biased_grouped_topk_gpu`` on every non-AMX platform). ``select_experts`` looks it up in its module at
call time and calls it only when ``topk_config.use_grouped_topk`` and a ``correction_bias`` is present,
which is exactly DeepSeek-V3/Kimi's ``noaux_tc`` config (``DeepseekV2MoE`` builds its ``TopK`` with
``use_grouped_topk=True, correction_bias=gate.e_score_correction_bias``); the function itself always
scores with sigmoid. Everything else (softmax routers, ``grouped_topk`` without bias, the per-token
``dynamic_expert_bias`` path, the BYPASSED/TRITON_KERNEL TopK output formats used by the FlashInfer
TRT-LLM and triton_kernels MoE backends) never reaches this symbol and keeps SGLang's behaviour.

Inside the wrapper our kernel runs only for CUDA tensors, a 1-D bias, no fused shared-expert slots and a
group layout our kernel accepts; every other call goes to SGLang's original unchanged.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from types import ModuleType

logger = logging.getLogger(__name__)


def resolve_moe_topk() -> Callable:
    """Our routing function, resolved once (at apply time) so later imports cannot swap it.

    NOTE: ``sglang_eagle3.kernels`` exports a function ``moe_topk`` and also has a submodule of the same
    name; importing the submodule after the package rebinds the package attribute to the module. We
    fail loudly if that happened rather than call a module.
    """
    import sglang_eagle3.kernels as kernels

    fn = kernels.__dict__.get("moe_topk")
    if fn is None or isinstance(fn, ModuleType) or not callable(fn):
        raise RuntimeError(
            f"sglang_eagle3.kernels.moe_topk resolved to {fn!r}, not the routing function: the submodule "
            "sglang_eagle3.kernels.moe_topk shadowed it. Import the function before any submodule import.")
    return fn


def supports(gating_output, correction_bias, *, num_expert_group, topk_group, num_fused_shared_experts,
             topk) -> str | None:
    """None when our kernel takes this call, else why SGLang's original keeps it."""
    if not getattr(gating_output, "is_cuda", False):
        return "not a CUDA tensor"
    if correction_bias is None or correction_bias.dim() != 1:
        return "per-token or missing correction bias"
    if num_fused_shared_experts:
        return f"{num_fused_shared_experts} fused shared-expert slot(s)"
    if gating_output.dim() != 2:
        return f"router logits of rank {gating_output.dim()}"
    n_group = num_expert_group or 1
    groups = topk_group or 1
    num_experts = gating_output.shape[1]
    if num_experts % n_group or not 1 <= groups <= n_group:
        return f"group layout E={num_experts}, n_group={n_group}, topk_group={groups}"
    if topk > groups * (num_experts // n_group):
        return f"top_k={topk} exceeds the selectable experts"
    return None


def wrap_biased_grouped_topk(original: Callable, moe_topk: Callable, counters: dict | None = None) -> Callable:
    """Replacement for ``biased_grouped_topk`` with SGLang 0.5.23's exact signature.

    ``counters`` (optional dict) counts calls taken by ours ("ours") and left to SGLang ("sglang").
    ``routed_scaling_factor`` reaches the weights only when SGLang asks for it
    (``apply_routed_scaling_factor_on_output``); otherwise SGLang scales the MoE output later.
    """

    def biased_grouped_topk(hidden_states, gating_output, correction_bias, topk, renormalize,
                            num_expert_group=None, topk_group=None, num_fused_shared_experts=0,
                            routed_scaling_factor=None, apply_routed_scaling_factor_on_output=False):
        why_not = supports(gating_output, correction_bias, num_expert_group=num_expert_group,
                           topk_group=topk_group, num_fused_shared_experts=num_fused_shared_experts, topk=topk)
        if why_not is not None:
            if counters is not None:
                counters["sglang"] = counters.get("sglang", 0) + 1
            return original(hidden_states, gating_output, correction_bias, topk, renormalize,
                            num_expert_group, topk_group, num_fused_shared_experts=num_fused_shared_experts,
                            routed_scaling_factor=routed_scaling_factor,
                            apply_routed_scaling_factor_on_output=apply_routed_scaling_factor_on_output)
        if counters is not None:
            counters["ours"] = counters.get("ours", 0) + 1
        scale = (routed_scaling_factor if apply_routed_scaling_factor_on_output
                 and routed_scaling_factor is not None else 1.0)
        return moe_topk(gating_output, correction_bias, top_k=topk, n_group=num_expert_group or 1,
                        topk_group=topk_group or 1, renormalize=renormalize, routed_scaling_factor=scale)

    return biased_grouped_topk
