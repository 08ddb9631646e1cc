"""Launcher of the persistent GEMV chain (triton/chain.py): several dependent decode GEMVs in one launch.

An experiment kernel, not wired into the model: benchmarks/bench_chain.py times it against the same GEMVs as
separate launches under PDL, to learn whether overlapping the stages of a layer inside one launch pays on a
given GPU before a per-layer persistent kernel is built (docs/KERNELS.md, "Persistent chain").
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

from sglang_eagle3.kernels import tuning
from sglang_eagle3.kernels.gemv import GEMV_MAX_ROWS, _counters, gemv_config
from sglang_eagle3.kernels.triton.chain import gemv_chain_kernel

PRE_MODES = {"none": 0, "l2": 1, "regs": 2}


@dataclass(frozen=True)
class ChainStage:
    """y = x w^T for w [N, K] (K-contiguous). x is a tensor [T, K], or ``src`` = j < this stage's index: stage
    j's output, columns [col0, col0 + K). ``wait``: the stage waits for the previous one to be complete (set it
    when it reads an earlier stage's output; a stage that reads only tensors may skip it). ``split``: K ranges
    (None: gemv_config's choice); a split stage leaves fp32 partials that its readers reduce."""
    w: torch.Tensor
    x: torch.Tensor | None = None
    src: int | None = None
    col0: int = 0
    wait: bool = True
    split: int | None = None
    block_n: int = 32
    block_k: int = 256


def _check(stages: list[ChainStage], T: int) -> None:
    assert stages, "a chain needs at least one stage"
    assert 1 <= T <= GEMV_MAX_ROWS, f"{T=}: the chain serves 1..{GEMV_MAX_ROWS} rows"
    for i, st in enumerate(stages):
        N, K = st.w.shape
        assert st.w.dim() == 2 and st.w.stride(1) == 1 and st.w.dtype in (torch.bfloat16, torch.float16), (
            f"stage {i}: w must be a K-contiguous bf16/fp16 [N, K], got {tuple(st.w.shape)} {st.w.dtype}")
        assert (st.x is None) != (st.src is None), f"stage {i}: exactly one of x and src"
        if st.x is not None:
            assert st.x.shape == (T, K) and st.x.stride(1) == 1 and st.x.dtype == st.w.dtype, (
                f"stage {i}: x must be [{T}, {K}] {st.w.dtype} with unit inner stride, got {tuple(st.x.shape)}")
        else:
            assert 0 <= st.src < i, f"stage {i}: src={st.src} must be an earlier stage"
            src_n = stages[st.src].w.shape[0]
            assert 0 <= st.col0 and st.col0 + K <= src_n, (
                f"stage {i}: columns [{st.col0}, {st.col0 + K}) outside stage {st.src}'s {src_n} outputs")
            # Stage j waits for j - 1 only: stage src is complete when every stage after it up to i waited.
            assert all(stages[j].wait for j in range(st.src + 1, i + 1)), (
                f"stage {i} reads stage {st.src}: it and every stage between must wait")


def balanced_split(blocks: int, K: int, block_k: int, programs: int, max_split: int = 16) -> int:
    """The K split that spreads blocks x split items most evenly over the programs (a stage lasts as long as
    its busiest program, and every program waits for it): the fewest splits within 5% of the best balance."""
    best = []
    for split in range(1, min(max_split, triton.cdiv(K, block_k)) + 1):
        kps = triton.cdiv(triton.cdiv(K, split), block_k) * block_k
        real = triton.cdiv(K, kps)
        items = blocks * real
        waves = triton.cdiv(items, programs)
        # time ~ the busiest program's tiles: waves x tiles an item
        best.append((waves * kps, real))
    lo = min(t for t, _ in best)
    return min(sp for t, sp in best if t <= 1.05 * lo)


def triton_gemv_chain(stages: list[ChainStage], T: int, *, pre: str = "none", programs_per_sm: int = 1,
                      num_stages: int = 3, num_warps: int = 4, reduce: str = "consumer",
                      balance: bool = False) -> list[torch.Tensor]:
    """Runs the chain in one launch; returns each stage's output: [T, N] in w's dtype (split 1, or with
    ``reduce="producer"``: a split stage reduces its own partials) or fp32 partials [split, m_pad, N] (rows >= T
    unwritten; ``reduce="consumer"``: the stages that read them add them), which ``chain_output`` reduces.
    ``balance``: each stage's split from balanced_split (else gemv_config's, the separate launch's)."""
    _check(stages, T)
    assert pre in PRE_MODES, f"pre={pre!r}: one of {sorted(PRE_MODES)}"
    assert reduce in ("consumer", "producer"), f"reduce={reduce!r}: 'consumer' or 'producer'"
    dev = stages[0].w.device
    interpret = tuning.interpreting()
    sms = tuning.sm_count(dev)
    G = 1 if interpret else programs_per_sm * sms
    producer = reduce == "producer"
    m_pad = max(16, triton.next_power_of_2(T))
    outs, parts, plans, rb_offs = [], [], [], []
    n_counters = len(stages) + 1
    for st in stages:
        N, K = st.w.shape
        blocks = triton.cdiv(N, st.block_n)
        if st.split:
            split = st.split
        elif balance:
            split = balanced_split(blocks, K, st.block_k, programs_per_sm * sms)
        else:
            split = gemv_config(N, K, 1, True, sms)["SPLIT"]
        kps = triton.cdiv(triton.cdiv(K, split), st.block_k) * st.block_k
        split = triton.cdiv(K, kps)
        plans.append((split, kps))
        partials = torch.empty(split, m_pad, N, dtype=torch.float32, device=dev) if split > 1 else None
        if split == 1 or producer:
            outs.append(torch.empty(T, N, dtype=st.w.dtype, device=dev))
        else:
            outs.append(partials)
        parts.append(partials if partials is not None and producer else outs[-1])
        rb_offs.append(n_counters)
        n_counters += blocks if split > 1 and producer else 0
    xs, s_xts, planes, x_parts = [], [], [], []
    for st in stages:
        if st.x is not None:
            xs.append(st.x)
            s_xts.append(st.x.stride(0))
            planes.append(0)
            x_parts.append(0)
        else:
            src_out, src_n = outs[st.src], stages[st.src].w.shape[0]
            split = plans[st.src][0] if src_out.dim() == 3 else 1
            xs.append(src_out[..., st.col0:])
            s_xts.append(src_n)
            planes.append(m_pad * src_n if split > 1 else 0)
            x_parts.append(split if split > 1 else 0)
    count = _counters(dev, n_counters)  # zero between calls: the kernel resets what it used (no memset)
    pdl = tuning.pdl(dev, "gemv")
    args = (tuple(xs), tuple(st.w for st in stages), tuple(outs), tuple(parts), tuple(s_xts), tuple(planes),
            tuple(st.w.stride(0) for st in stages), tuple(st.w.shape[0] for st in stages),
            tuple(st.w.shape[1] for st in stages), tuple(p[1] for p in plans), tuple(rb_offs), count, T)
    kw = dict(S=len(stages), X_PARTS=tuple(x_parts), SPLIT=tuple(p[0] for p in plans),
              BLOCK_N=tuple(st.block_n for st in stages), BLOCK_K=tuple(st.block_k for st in stages),
              WAIT=tuple(st.wait for st in stages), M_PAD=m_pad, PRE=PRE_MODES[pre], INTERPRET=interpret, PDL=pdl,
              REDUCE=producer, num_warps=1 if interpret else num_warps, num_stages=num_stages,
              **tuning.pdl_launch(pdl))
    if not interpret:
        _assert_resident(args, kw, G, dev)
    gemv_chain_kernel[(G,)](*args, **kw)
    return outs


_RESIDENT: dict = {}


def _assert_resident(args: tuple, kw: dict, G: int, dev: torch.device) -> None:
    """Every program waits for others: a grid that cannot be resident at once would hang. Compiles first
    (warmup, no launch) and checks registers, shared memory and threads against the SMs'."""
    dtypes = tuple(t.dtype for group in args[:4] for t in group)  # xs, ws, outs, parts
    key = (dtypes, G, tuple(sorted((name, str(v)) for name, v in kw.items())))
    if key in _RESIDENT:
        return
    k = gemv_chain_kernel.warmup(*args, grid=(G,), **kw)
    k._init_handles()
    props = torch.cuda.get_device_properties(dev)
    threads = 32 * kw["num_warps"]
    regs = max(k.n_regs, 1) * threads
    smem = getattr(props, "shared_memory_per_multiprocessor", 228 << 10)
    per_sm = min(getattr(props, "regs_per_multiprocessor", 65536) // regs,
                 getattr(props, "max_threads_per_multi_processor", 2048) // threads,
                 smem // max(k.metadata.shared + 1024, 1))
    if G > per_sm * props.multi_processor_count:
        raise ValueError(f"gemv_chain: {G} programs cannot all be resident ({per_sm} a SM: {k.n_regs} registers x "
                         f"{threads} threads, {k.metadata.shared} B shared memory) and would wait for each other")
    _RESIDENT[key] = per_sm


def chain_output(out: torch.Tensor, T: int, dtype: torch.dtype) -> torch.Tensor:
    """A stage's result [T, N] from what triton_gemv_chain returned for it (partials added in split order)."""
    if out.dim() == 2:
        return out
    acc = out[0, :T].clone()
    for p in range(1, out.shape[0]):
        acc += out[p, :T]
    return acc.to(dtype)


def ref_gemv_chain(stages: list[ChainStage], T: int) -> list[torch.Tensor]:
    """Each stage's [T, N] in w's dtype: fp32 products of the previous stages' rounded outputs."""
    ys = []
    for st in stages:
        x = st.x if st.x is not None else ys[st.src][:, st.col0:st.col0 + st.w.shape[1]]
        ys.append((x.float() @ st.w.float().t()).to(st.w.dtype))
    return ys
