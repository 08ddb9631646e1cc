"""kernels.moe_topk without its launch (timing only: the model's numbers are wrong with it): every call returns
the same fixed routing, token t to experts t*k .. t*k + k - 1 (mod E) with equal weights, from tensors made once
per shape outside any graph capture. Against ``moe_topk_const.py`` (the launch kept, its work gone) it prices
what the routing launch alone costs in the step. At T > 1 the tokens' experts are distinct, as uniform routing
would make them (the MoE reads T*k experts; real routing of random weights often fewer).
``bench_verify_graph.py --kernels-from benchmarks/ablations/moe_topk_skip.py``."""

import torch

_FIXED: dict = {}  # (T, top_k, scaling, device) -> (weights, ids); benchmark-only state


def moe_topk(router_logits, correction_bias, *, top_k, n_group, topk_group, renormalize=True,
             routed_scaling_factor=1.0, use_triton: bool | None = None):
    T, E = router_logits.shape
    key = (T, top_k, routed_scaling_factor, router_logits.device)
    if key not in _FIXED:
        assert not torch.cuda.is_current_stream_capturing(), "moe_topk_skip: first call of a shape under capture"
        ids = (torch.arange(T * top_k, device=router_logits.device, dtype=torch.int32) % E).view(T, top_k)
        weights = torch.full((T, top_k), routed_scaling_factor / top_k, device=router_logits.device)
        _FIXED[key] = (weights, ids)
    return _FIXED[key]
