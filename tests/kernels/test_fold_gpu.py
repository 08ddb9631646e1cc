"""Launch folds into the skinny GEMM on the GPU at one Kimi-K2.5 TP=8 rank's shapes: the decoder layer's
input RMSNorm (with its residual add) folded into MLA's q_a [1536] + kv_a [576] launch over K = 7168, for
decode and verify rows (T = 1..8, 16); a CUDA graph replay of the fold; a small Kimi-shaped model's logits
with the fold on and off. The MoE routing in the tail of the router [384] + shared expert [256] launch:
bit-identical to the routing kernel on the launch's logits, eager and in a graph replay, and its cost. MLA's
rotary launch in programs of W_UK's (rope_wuk): bit-identical to the two launches, at the kernels and in the
model. The checks are shared with the interpreter run (fold_checks.py).

Outputs come from a poisoned allocator (test_kernels_gpu.poison_allocator), so an element the kernel never
writes is NaN, which no bound accepts.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from fold_checks import (  # noqa: E402
    EPS,
    _rope_wuk_rotary,
    check_input_norm_fold,
    check_input_norm_fold_model,
    check_rope_beside_gemv,
    check_route_beside_gemv,
    check_router_topk_fold,
    rope_wuk_inputs,
)
from test_kernels_gpu import poison_allocator  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

HIDDEN, Q_LORA, KV_A = 7168, 1536, 512 + 64
EXPERTS, SHARED_INTER = 384, 256
TOP_K, ROUTED_SCALE = 8, 2.827


@pytest.mark.parametrize("residual", [True, False])
@pytest.mark.parametrize("T", [1, 2, 3, 4, 5, 8, 16])
def test_input_norm_fold_q_a_kv_a(T, residual):
    """The tensor-core fold at its launcher's own config (split-K over K = 7168; fma=False, since the CUDA-core pair
    takes this shape by default: test_kernels_gpu.py test_gemv_fma_pair_norm), against float64 products of the
    normed stream; the new residual bit-identical to torch's h + residual; row 0 as at T=1; counters reset."""
    poison_allocator()
    check_input_norm_fold(T, Q_LORA, KV_A, HIDDEN, residual=residual, device="cuda", seed=T + 10 * residual,
                          fma=False)


@pytest.mark.parametrize("config", [
    {"BLOCK_N": 32, "BLOCK_K": 64, "SPLIT": 1, "num_warps": 4, "num_stages": 8},  # one program streams all of K
    {"BLOCK_N": 32, "BLOCK_K": 64, "SPLIT": 7, "num_warps": 4, "num_stages": 8},
    {"BLOCK_N": 16, "BLOCK_K": 128, "SPLIT": 3, "num_warps": 4, "num_stages": 3},
])
@pytest.mark.parametrize("T", [1, 4, 8])
def test_input_norm_fold_configs(T, config):
    """Other splits and tiles (a strided h: a column slice of a wider tensor)."""
    poison_allocator()
    check_input_norm_fold(T, Q_LORA, KV_A, HIDDEN, device="cuda", seed=100 + T, config=config, strided=True)


@pytest.mark.parametrize("T", [1, 4])
def test_input_norm_fold_router_shared_shape(T):
    """The fold with a float32 first output and a gated second (the router and shared expert's gate/up of
    the post-attention norm: not wired into the model, but the kernel takes it)."""
    poison_allocator()
    check_input_norm_fold(T, EXPERTS, SHARED_INTER, HIDDEN, device="cuda", seed=200 + T, router=True)


def _capture(step):
    """(CUDA graph of step(), its outputs): step runs once eagerly first (compiles outside the capture)."""
    step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = step()
    return graph, outs


def _replay_equals_eager(graph, outs_g, step, names) -> None:
    """Replays the graph on the inputs as they are now and checks each output against an eager step()."""
    graph.replay()
    torch.cuda.synchronize()
    for name, a, b in zip(names, outs_g, step(), strict=True):
        assert torch.equal(a, b), f"{name}: replay differs from eager"


@pytest.mark.parametrize("fma", [None, False], ids=["cuda_core", "tensor_core"])
def test_input_norm_fold_graph_replay_equals_eager(fma):
    """The fold captured in a CUDA graph, in the CUDA-core pair (the default at this shape) and in the tensor-core
    kernel (split-K counters reset in the launch, no memset): replays on new h and residual equal eager calls,
    twice in a row."""
    from sglang_eagle3 import kernels

    T = 4
    g = torch.Generator(device="cuda").manual_seed(5)
    h = torch.randn(T, HIDDEN, device="cuda", generator=g).bfloat16()
    res = torch.randn(T, HIDDEN, device="cuda", generator=g).bfloat16()
    nw = torch.rand(HIDDEN, device="cuda", generator=g).bfloat16() + 0.5
    w1 = torch.randn(Q_LORA, HIDDEN, device="cuda", generator=g).bfloat16() / HIDDEN ** 0.5
    w2 = torch.randn(KV_A, HIDDEN, device="cuda", generator=g).bfloat16() / HIDDEN ** 0.5

    def step():
        return kernels.gemv_pair(h, w1, w2, norm_weight=nw, eps=EPS, residual=res, fma=fma)

    graph, outs_g = _capture(step)
    for _ in range(2):
        h.copy_(torch.randn_like(h))
        res.copy_(torch.randn_like(res))
        _replay_equals_eager(graph, outs_g, step, ("q_a", "kv_a", "new residual"))


@pytest.mark.parametrize("dtype,tol", [(torch.bfloat16, 8e-2), (torch.float16, 1e-2)])
def test_input_norm_fold_model_logits(dtype, tol):
    """A small Kimi-shaped model (hidden 256, routing pinned) with the fold on vs SGLANG_EAGLE3_NO_FUSE=
    input_norm: prefill, decode and verify logits within rounding, and the fold ran in each layer of the
    decode and verify steps. The random model amplifies rounding: under the interpreter (hidden 64) bf16
    differs by 1-5e-2, float16 by <= 4e-3; a wiring slip such as a dropped residual moves them by ~0.6."""
    check_input_norm_fold_model("cuda", dtype, tol=tol, hidden=256, seed=3)


@pytest.mark.parametrize("T", [1, 2, 3, 4, 5, 6, 7, 8, 16])
def test_router_topk_fold_kimi(T):
    """The launcher's own config (split-K over K = 7168): weights and ids torch.equal to moe_topk on the
    launch's logits (and the reference's experts), logits and shared activation as without the tail,
    counters reset."""
    poison_allocator()
    check_router_topk_fold(T, EXPERTS, SHARED_INTER, HIDDEN, top_k=TOP_K, scale=ROUTED_SCALE, device="cuda",
                           seed=300 + T)


@pytest.mark.parametrize("config", [
    {"BLOCK_N": 32, "BLOCK_K": 256, "SPLIT": 1, "num_warps": 4, "num_stages": 2},  # one program streams all of K
    {"BLOCK_N": 32, "BLOCK_K": 128, "SPLIT": 7, "num_warps": 4, "num_stages": 3},
    {"BLOCK_N": 16, "BLOCK_K": 256, "SPLIT": 14, "num_warps": 4, "num_stages": 2},  # 24 router row blocks
])
@pytest.mark.parametrize("T", [1, 4, 8])
def test_router_topk_fold_configs(T, config):
    poison_allocator()
    check_router_topk_fold(T, EXPERTS, SHARED_INTER, HIDDEN, top_k=TOP_K, scale=ROUTED_SCALE, device="cuda",
                           config=config, seed=400 + T)


@pytest.mark.parametrize("T,norm,ties", [(1, False, False), (4, False, True), (16, False, False), (3, True, False)])
def test_router_topk_fold_grouped(T, norm, ties):
    """DeepSeek-V3's grouped routing (256 experts, 8 groups, the best 4 kept, top-8); ties across the groups;
    with the input-norm fold in the same launch."""
    poison_allocator()
    check_router_topk_fold(T, 256, SHARED_INTER, HIDDEN, top_k=8, n_group=8, topk_group=4, scale=2.5, norm=norm,
                           ties=ties, device="cuda", seed=500 + T)


@pytest.mark.parametrize("T", [1, 2, 4, 5, 8, 16])
def test_route_beside_shared_down_kimi(T):
    """The routing programs beside the shared expert's down projection [7168, 256] (the launcher's own
    config): the product torch.equal to the launch without them, weights and ids to moe_topk's on the same
    logits, at Kimi's routing (384 experts, top-8) and, at T=4, DeepSeek-V3's grouped one."""
    poison_allocator()
    check_route_beside_gemv(T, EXPERTS, HIDDEN, SHARED_INTER, top_k=TOP_K, scale=ROUTED_SCALE, device="cuda",
                            seed=600 + T)
    if T == 4:
        check_route_beside_gemv(T, 256, HIDDEN, SHARED_INTER, top_k=8, n_group=8, topk_group=4, scale=2.5,
                                ties=True, device="cuda", seed=650)


def test_route_beside_shared_down_graph_replay_equals_eager():
    """The shared down with the routing beside it captured in a CUDA graph: replays on new activations and
    logits equal eager calls, three times in a row."""
    from sglang_eagle3 import kernels

    T = 3
    g = torch.Generator(device="cuda").manual_seed(7)
    act = torch.randn(T, SHARED_INTER, device="cuda", generator=g).bfloat16()
    w = torch.randn(HIDDEN, SHARED_INTER, device="cuda", generator=g).bfloat16() / SHARED_INTER ** 0.5
    logits = torch.randn(T, EXPERTS, device="cuda", generator=g)
    bias = torch.rand(EXPERTS, device="cuda", generator=g) * 0.1
    route = kernels.Routing(bias, TOP_K, routed_scaling_factor=ROUTED_SCALE)

    def step():
        return kernels.gemv(act, w, route=route, route_logits=logits)

    graph, outs_g = _capture(step)
    for _ in range(3):
        act.copy_(torch.randn_like(act))
        logits.copy_(torch.randn_like(logits))
        bias.copy_(torch.rand_like(bias) * 0.1)
        _replay_equals_eager(graph, outs_g, step, ("shared", "weights", "ids"))


def _router_inputs(T: int, seed: int):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(T, HIDDEN, device="cuda", generator=g).bfloat16()
    w1, w2, w2_up = (torch.randn(n, HIDDEN, device="cuda", generator=g).bfloat16() / HIDDEN ** 0.5
                     for n in (EXPERTS, SHARED_INTER, SHARED_INTER))
    bias = torch.rand(EXPERTS, device="cuda", generator=g) * 0.1
    return x, w1, w2, w2_up, bias


def test_router_topk_fold_graph_replay_equals_eager():
    """The launch with its routing tail captured in a CUDA graph (both arrival counters reset in the launch):
    replays on new x and bias equal eager calls, and their routing equals moe_topk's on the replay's logits,
    three times in a row."""
    from sglang_eagle3 import kernels
    from sglang_eagle3.kernels.gemv import _COUNTERS

    T = 5
    x, w1, w2, w2_up, bias = _router_inputs(T, 6)
    route = kernels.Routing(bias, TOP_K, routed_scaling_factor=ROUTED_SCALE)

    def step():
        return kernels.gemv_pair(x, w1, w2, w2_up=w2_up, out1_dtype=torch.float32, route=route)

    graph, outs_g = _capture(step)
    for _ in range(3):
        x.copy_(torch.randn_like(x))
        bias.copy_(torch.rand_like(bias) * 0.1)
        _replay_equals_eager(graph, outs_g, step, ("logits", "shared act", "weights", "ids"))
        want_w, want_ids = kernels.moe_topk(outs_g[0], bias, top_k=TOP_K, n_group=1, topk_group=1,
                                            routed_scaling_factor=ROUTED_SCALE)
        assert torch.equal(outs_g[3], want_ids) and torch.equal(outs_g[2], want_w), "replay routing != moe_topk"
    left = {str(d): int(c.abs().sum()) for d, c in _COUNTERS.items()}
    assert not any(left.values()), f"counters not reset after replays: {left}"


# --- MLA's rotary beside W_UK (the rope_wuk fusion) ---------------------------------------------------------
HEADS, NOPE, KV_LORA, ROPE = 8, 128, 512, 64


@pytest.mark.parametrize("T", [1, 2, 4, 5, 8, 16])
def test_rope_beside_w_uk_kimi(T):
    """W_UK (q_nope [T, 8, 128] @ the N-contiguous [8, 512, 128] view, the launcher's own config) with the rotary
    programs beside it: q, the cache and the product torch.equal to the rotary launch then W_UK's (the
    launch compiled without fp fusion must not move W_UK's bits), and within rounding of the references."""
    poison_allocator()
    check_rope_beside_gemv(T, HEADS, NOPE, KV_LORA, ROPE, device="cuda", seed=700 + T)


def test_rope_beside_w_uk_graph_replay_equals_eager():
    """The fused launch captured in a CUDA graph: replays on new q, kv_a, positions and cache slots equal eager
    calls (q, the cache and the product), three times in a row."""
    from sglang_eagle3 import kernels

    T = 4
    q, kv_a, nw, pos, loc, cache, cos, sin, w_uk = rope_wuk_inputs(T, HEADS, NOPE, KV_LORA, ROPE, torch.bfloat16,
                                                                   "cuda", 11, slots=64)
    q0 = q.clone()
    w = w_uk.transpose(1, 2)
    rotary = _rope_wuk_rotary(q, kv_a, nw, pos, loc, cache, cos, sin, NOPE, KV_LORA)

    def step():
        q.copy_(q0)  # the rotary works in place: every call starts from the same q
        return kernels.gemv(q[..., :NOPE], w, rotary=rotary), q.clone(), cache.clone()

    graph, outs_g = _capture(step)
    for _ in range(3):
        q0.copy_(torch.randn_like(q0))
        kv_a.copy_(torch.randn_like(kv_a))
        pos.copy_(torch.randint(0, cos.shape[0], pos.shape, device="cuda"))
        loc.copy_(torch.randperm(cache.shape[0], device="cuda")[:T])
        _replay_equals_eager(graph, outs_g, step, ("W_UK product", "q", "cache"))


def test_rope_beside_w_uk_model_logits():
    """A small Kimi-shaped model (bf16, INT4 experts): decode and verify (T=4) logits and the KV caches with
    rope_wuk on equal those with it off (the other fusions as by default), eagerly and in replayed CUDA graphs."""
    from mla_rope_checks import model_step_logits

    from sglang_eagle3 import env

    seed = int(torch.randint(0, 1 << 30, (1,)))
    kw = dict(device="cuda", dtype=torch.bfloat16, seed=seed, hidden=256, layers=4, T=4, B=2, ctxs=(200, 1100),
              use_cuda_graph=True)
    on, cache_on, _ = model_step_logits(",".join(n for n in env.DEFAULT_NO_FUSE.split(",") if n != "rope_wuk"), **kw)
    off, cache_off, _ = model_step_logits(env.DEFAULT_NO_FUSE, **kw)
    for key, ref in off.items():
        assert torch.equal(on[key], ref), (seed, key, (on[key] - ref).abs().max().item())
    for a, b in zip(cache_on, cache_off, strict=True):
        assert torch.equal(a, b), (seed, "KV caches differ")


@pytest.mark.parametrize("T", [1, 4])
def test_kernels_per_moe_layer_rope_wuk(T, monkeypatch):
    """With rope_wuk on, one launch fewer a MoE layer than the default budget (test_kernels_gpu's 14): 13."""
    from kernel_checks import cuda_kernels_per_moe_layer

    from sglang_eagle3 import env

    monkeypatch.setenv(env.NO_FUSE.name, ",".join(n for n in env.DEFAULT_NO_FUSE.split(",") if n != "rope_wuk"))
    counts = cuda_kernels_per_moe_layer(T)
    print(f"T={T}: {counts}")
    assert counts["per_moe_layer"] <= 13, counts
