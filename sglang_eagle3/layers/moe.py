"""DeepSeek-V3 MoE block: noaux_tc router, routed experts (bf16 or INT4 W4A16), shared experts.

TP splits every routed expert along its intermediate dimension (as production engines do at decode sizes),
so each rank holds all E experts with I/tp columns; routed and shared partial sums are all-reduced once.
"""

from __future__ import annotations

import logging

import torch
import torch.nn as nn
import torch.nn.functional as F

from sglang_eagle3 import env, kernels
from sglang_eagle3.config import ModelConfig
from sglang_eagle3.distributed.parallel_state import get_tp, tp_all_reduce
from sglang_eagle3.layers.linear import copy_checked, load_slice, matmul_wt, sharded_loader
from sglang_eagle3.layers.mlp import GatedMLP

logger = logging.getLogger(__name__)

INT4_GROUP = 32


class MoEGate(nn.Module):
    """Router: logits in float32 over all experts (replicated on every rank).

    On CUDA with half-precision x and weight (and autograd off) one GEMM reads the bf16 weight and writes
    float32 logits with float32 accumulation (``torch.mm(..., out_dtype=torch.float32)``): the products of
    two bf16 numbers are exact in float32, so this is the float32 product of the upcast operands up to the
    order of the sums, without the two per-call casts (the weight's is 384 x 7168 per layer at Kimi shapes:
    5.5 MB read, 11 MB written, 11 MB read back by the GEMM). Elsewhere, and where that GEMM is unavailable
    (checked once, eagerly), the operands are upcast as before."""

    def __init__(self, cfg: ModelConfig, dtype=None):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(cfg.n_routed_experts, cfg.hidden_size, dtype=dtype),
                                   requires_grad=False)
        self.weight.weight_loader = sharded_loader(None)
        self.e_score_correction_bias = nn.Parameter(torch.zeros(cfg.n_routed_experts, dtype=torch.float32),
                                                    requires_grad=False)
        self.e_score_correction_bias.weight_loader = sharded_loader(None)

    def forward(self, x: torch.Tensor, use_triton: bool | None = None) -> torch.Tensor:
        """x [T, H] -> router logits float32 [T, E]."""
        w = self.weight
        if x.dim() == 2 and x.shape[0] <= kernels.GEMV_MAX_ROWS and use_triton is not False:
            # Decode/verify: the GEMV kernel, float32 accumulation stored as float32 (same numbers as the
            # upcast product up to the order of the sums), one launch.
            return kernels.gemv(x, w, out_dtype=torch.float32, use_triton=use_triton)
        if (x.is_cuda and x.dtype in (torch.bfloat16, torch.float16) and w.dtype == x.dtype and x.dim() == 2
                and not torch.is_grad_enabled() and _mm_fp32_out_ok(x.device)):
            return torch.mm(x, w.t(), out_dtype=torch.float32)
        return F.linear(x.float(), w.float())


_MM_FP32_OUT: dict[torch.device, bool] = {}


def _mm_fp32_out_ok(device: torch.device) -> bool:
    """Whether torch.mm(bf16, bf16, out_dtype=float32) runs on `device` (torch >= 2.8 on CUDA). Probed once,
    eagerly; under graph capture an unprobed device takes the upcast path rather than probe there."""
    ok = _MM_FP32_OUT.get(device)
    if ok is None:
        if torch.cuda.is_current_stream_capturing():
            return False
        try:
            a = torch.ones(2, 8, dtype=torch.bfloat16, device=device)
            ok = bool(torch.mm(a, a.t(), out_dtype=torch.float32).dtype == torch.float32)
        except (RuntimeError, TypeError) as exc:
            logger.info("router GEMM with float32 output unavailable on %s (%s); upcasting instead", device, exc)
            ok = False
        _MM_FP32_OUT[device] = ok
    return ok


def _expert_loader(kind: str, packed: bool):
    """weight_loader(param, loaded, expert=e, shard="gate"|"up"|"down") for stacked expert tensors.

    gate/up fill the two halves of w13 (rows), each this rank's slice of the intermediate dimension;
    down takes this rank's slice of its input dimension (for packed INT4 the slice is in words/groups,
    which stays aligned because I/tp is a multiple of the group size).
    """

    def loader(param, loaded, expert: int, shard: str, name: str = ""):
        tp = get_tp()
        if kind == "w13":
            half = param.shape[1] // 2
            rows = load_slice(loaded, 0, tp.rank, tp.size)
            dst = param.data[expert, :half] if shard == "gate" else param.data[expert, half:]
        else:
            rows = load_slice(loaded, 1, tp.rank, tp.size)
            dst = param.data[expert]
        copy_checked(dst, rows, name)

    return loader


class RoutedExperts(nn.Module):
    """All E experts' weights stacked: w13 [E, 2I/tp, H] (gate rows, then up rows), w2 [E, H, I/tp].

    With ``int4=True`` the weights stay packed as compressed-tensors ships them:
    w13_weight_packed int32 [E, 2I/tp, H/8] + w13_weight_scale [E, 2I/tp, H/32], and likewise w2.
    """

    def __init__(self, cfg: ModelConfig, dtype=None, int4: bool = False):
        super().__init__()
        tp = get_tp().size
        E, H, I = cfg.n_routed_experts, cfg.hidden_size, cfg.moe_intermediate_size
        if I % tp:
            raise ValueError(f"moe_intermediate_size={I} must be divisible by tp_size={tp}")
        Ip = I // tp
        self.int4 = int4

        def param(shape, dt, kind):
            p = nn.Parameter(torch.empty(*shape, dtype=dt), requires_grad=False)
            p.weight_loader = _expert_loader(kind, int4)
            return p

        if int4:
            if H % INT4_GROUP or Ip % INT4_GROUP:
                raise ValueError(f"INT4 experts need hidden={H} and intermediate/tp={Ip} divisible by "
                                 f"the group size {INT4_GROUP}")
            self.w13_weight_packed = param((E, 2 * Ip, H // 8), torch.int32, "w13")
            self.w13_weight_scale = param((E, 2 * Ip, H // INT4_GROUP), dtype, "w13")
            self.w2_weight_packed = param((E, H, Ip // 8), torch.int32, "w2")
            self.w2_weight_scale = param((E, H, Ip // INT4_GROUP), dtype, "w2")
        else:
            self.w13_weight = param((E, 2 * Ip, H), dtype, "w13")
            self.w2_weight = param((E, H, Ip), dtype, "w2")

    def forward(self, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                use_triton: bool | None = None, add: torch.Tensor | None = None) -> torch.Tensor:
        """Partial sums over this rank's intermediate slice: [T, H] (not yet all-reduced), plus ``add`` [T, H]
        (the shared experts' partial sums) folded into the kernel's final store."""
        if self.int4:
            return kernels.fused_moe_int4(x, self.w13_weight_packed, self.w13_weight_scale, self.w2_weight_packed,
                                          self.w2_weight_scale, topk_weights, topk_ids, INT4_GROUP, add,
                                          use_triton=use_triton)
        return kernels.fused_moe(x, self.w13_weight, self.w2_weight, topk_weights, topk_ids, add,
                                 use_triton=use_triton)


class DeepseekMoE(nn.Module):
    def __init__(self, cfg: ModelConfig, dtype=None, int4_experts: bool = False):
        super().__init__()
        self.cfg = cfg
        self.gate = MoEGate(cfg, dtype)
        self.experts = RoutedExperts(cfg, dtype, int4=int4_experts)
        self.shared_experts = (
            GatedMLP(cfg.hidden_size, cfg.moe_intermediate_size * cfg.n_shared_experts, dtype, reduce=False)
            if cfg.n_shared_experts else None
        )
        self.use_triton: bool | None = None  # None: Triton on CUDA, reference elsewhere (set by the runner)
        self.read_fusions()
        # Otherwise, with a side stream (layers/overlap.py, "shared_down"; set by the model) the shared expert's
        # down projection runs there while this stream routes.
        self.side_stream = None
        # With prefetch_next_moe (layers/overlap.py; set by the model): called with x by inference forwards once
        # the router launch is queued (the next layer's q_a / kv_a then stream into L2 while the experts run).
        self.after_router = None
        # Called with (this block, the expert ids) once a forward has routed (runtime/routing_trace.py, set by the
        # worker under SGLANG_EAGLE3_ROUTING_TRACE).
        self.route_observer = None

    def read_fusions(self) -> None:
        """Launch fusions at inference, from env.NO_FUSE (as MLAAttention.read_fusions)."""
        self.fuse_router_shared = env.fusion_on("router_shared")
        self.fuse_router_topk = env.fusion_on("router_topk")  # the routing too (in router_shared's launch)
        # Or the routing in programs beside the shared expert's down projection (one launch: both read only
        # what router_shared's launch wrote).
        self.fuse_route_down = env.fusion_on("route_shared_down")

    def routing(self) -> kernels.Routing:
        """This layer's noaux_tc routing (bias, top-k, groups, scaling) as the routing kernels take it."""
        c = self.cfg
        return kernels.Routing(self.gate.e_score_correction_bias, c.num_experts_per_tok, c.n_group, c.topk_group,
                               c.norm_topk_prob, c.routed_scaling_factor)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., H] -> [..., H]."""
        shape = x.shape
        x = x.reshape(-1, shape[-1])  # [T, H]
        sh = self.shared_experts
        forked = False
        if (self.fuse_router_shared and sh is not None and x.shape[0] <= kernels.GEMV_MAX_ROWS
                and self.use_triton is not False):
            # Decode/verify: the router and the shared expert's gate/up + SiLU read the same x: one launch,
            # which with router_topk also routes the tokens in its tail.
            route = self.routing() if self.fuse_router_topk else None
            logits, act, *routed = kernels.gemv_pair(x, self.gate.weight, sh.gate_proj.weight,
                                                     w2_up=sh.up_proj.weight, out1_dtype=torch.float32,
                                                     route=route, use_triton=self.use_triton,
                                                     fma=sh.gate_proj.fma)  # the engine's form (fma_for_engine)
            if self.after_router is not None and not torch.is_grad_enabled():
                self.after_router(x)
            if not routed and self.fuse_route_down:  # the routing beside the shared down, one launch
                shared, *routed = kernels.gemv(act, sh.down_proj.weight, route=self.routing(), route_logits=logits,
                                               use_triton=self.use_triton)
            elif self.side_stream is not None and x.is_cuda:
                # Allocated here so it belongs to this stream; act stays referenced until the join below.
                shared = torch.empty_like(x)
                with self.side_stream.fork(x):
                    matmul_wt(act, sh.down_proj.weight, sh.down_proj.use_triton, out=shared)
                forked = True
            else:
                shared = sh.down_proj(act)
        else:
            logits = self.gate(x, self.use_triton)
            if self.after_router is not None and not torch.is_grad_enabled():
                self.after_router(x)
            shared = sh(x) if sh is not None else None  # [T, H]
            routed = ()
        if routed:
            weights, ids = routed  # [T, k] each
        else:
            route = self.routing()
            weights, ids = kernels.moe_topk(logits, route.bias, **route.topk_kwargs(), use_triton=self.use_triton)
        if self.route_observer is not None:
            self.route_observer(self, ids)
        if forked:
            self.side_stream.join(x)
        out = self.experts(x, weights, ids, self.use_triton, add=shared)  # routed + shared, one store
        return tp_all_reduce(out).view(shape)
