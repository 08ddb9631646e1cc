"""Kernel benchmark: MLA decode/verify attention, noaux_tc routing, fused MoE (bf16, INT4 W4A16: the GEMV
path for T <= GEMV_MAX_TOKENS and the tile path), RMSNorm and rotary embedding at the layer's shapes.

Writes ``<out>/kernels.json`` with the command, git commit, GPU, the copy bandwidth measured in the same run,
and per case the shape, microseconds per call, achieved GB/s over the bytes the op must move, and that as a
fraction of copy bandwidth. Timing: each case's calls are captured in one CUDA graph, cycling through several
input sets (different caches, different routed experts) so that the 60 MB L2 holds none of them between
uses; the graph is replayed with events around each replay and the median replay is divided by the calls.
``--sweep`` first times candidate configs per op, uses the winners, and writes them as a table
(``sweep_table.json``, the format of ``sglang_eagle3/kernels/configs/sm_90.json``); ``--sweep gemv`` only the
INT4 GEMV MoE (``--sweep-tokens``), over tiles that keep the table's arithmetic, each winner timed again against
the table's config; ``--moe-only`` then times just the INT4 GEMV MoE. Read-only rows ("read ceiling of ...") time a
kernel that only reads as many bytes as a case must: what any kernel of those bytes can reach in a graph on this GPU.

    python benchmarks/bench_kernels.py --out benchmarks/results/h200 [--sweep [gemv] [--sweep-tokens 1 2] [--moe-only]]
    SGLANG_EAGLE3_CONFIG_TABLE=OUT/sweep_table.json ...   # use a sweep's table without merging it
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import json
import math
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from sglang_eagle3.bench.harness import git_commit

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sglang_eagle3 import kernels  # noqa: E402
from sglang_eagle3.kernels import tuning  # noqa: E402
from sglang_eagle3.kernels.fused_moe import GEMV_MAX_TOKENS, triton_fused_moe, triton_fused_moe_int4  # noqa: E402
from sglang_eagle3.kernels.mla_attention import triton_mla_attention  # noqa: E402
from sglang_eagle3.kernels.rms_norm import triton_rms_norm  # noqa: E402
from sglang_eagle3.kernels.rotary import triton_apply_rotary  # noqa: E402

HEADS, KV_LORA, ROPE = 8, 512, 64  # Kimi-K2.5 TP=8 rank
EXPERTS, HIDDEN, INTER, TOP_K = 384, 7168, 256, 8
L2_BYTES = 60 << 20
SM_SCALE = 0.1352


def log(msg: str) -> None:
    print(msg, flush=True)


# What an A/B file may replace, launcher module -> names it calls through its globals: a kernels/triton/fused_moe.py
# of another commit gives the GEMV MoE kernels, a kernels/triton/mla_attention.py the MLA kernels, a
# kernels/mla_attention.py (the launcher itself) its launch plan, a kernels/triton/rotary.py, rms_norm.py or
# moe_topk.py the rotary, RMSNorm or routing kernel (each with the launcher's arguments of this checkout); a file
# defining the package's own rms_norm, apply_rotary or moe_topk replaces that dispatcher (benchmarks/ablations/
# *_skip.py: the launch itself left out); a kernels/triton/gemv.py the skinny GEMM's kernels, a gemv_config its
# launch configs (benchmarks/variants/).
SWAPPABLE = {"sglang_eagle3.kernels": ("rms_norm", "apply_rotary", "moe_topk"),
             "sglang_eagle3.kernels.gemv": ("gemv_kernel", "gemv_fma_kernel", "gemv_config", "fma_pair_form",
                                            "fma_pair_config", "fma_config", "fma_form"),
             "sglang_eagle3.kernels.fused_moe": ("moe_int4_gemv_gate_up_kernel", "moe_int4_gemv_down_kernel"),
             "sglang_eagle3.kernels.mla_attention": ("mla_split_kv_kernel", "mla_merge_splits_kernel", "launch_plan"),
             "sglang_eagle3.kernels.rotary": ("rotary_kernel",),
             "sglang_eagle3.kernels.rms_norm": ("rms_norm_kernel",),
             "sglang_eagle3.kernels.moe_topk": ("moe_topk_kernel",)}


def add_kernels_from_arg(ap, effect: str) -> None:
    """--kernels-from FILES ...: kernel files of other commits for kernels_from; ``effect`` says what the script
    does with each (e.g. "every variant is timed with each too")."""
    ap.add_argument("--kernels-from", nargs="+", default=[],
                    help=f"kernel files of other commits (bench_kernels.kernels_from: a.py or a.py+b.py): {effect} "
                         "(name suffix ' [a+b]')")


def ab_tag(paths: str) -> str:
    """" [a+b]" for kernels_from's "dir/a.py+dir/b.py": the suffix a benchmark gives that variant's name."""
    return " [" + "+".join(Path(p).stem for p in paths.split("+")) + "]"


def _defines(module, name: str) -> bool:
    """Whether ``module`` defines ``name`` itself (a function or a @triton.jit kernel), not by an import."""
    obj = getattr(module, name, None)
    return obj is not None and getattr(getattr(obj, "fn", obj), "__module__", None) == module.__name__


def kernels_from(paths: str):
    """A context manager factory: while it is entered the launchers call what the module files in ``paths``
    ("a.py" or "a.py+b.py") define (not import) of SWAPPABLE's names instead of their own (graphs captured inside
    keep it)."""
    swaps = []  # (launcher module, name, replacement)
    for path in paths.split("+"):
        spec = importlib.util.spec_from_file_location(f"ab_{Path(path).stem}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        found = [(importlib.import_module(launcher), name, getattr(module, name))
                 for launcher, names in SWAPPABLE.items() for name in names if _defines(module, name)]
        assert found, f"{path} defines none of {SWAPPABLE}"
        # Two files replacing one name would leave only the last one's (each wraps the package's own): refused.
        twice = sorted({name for _, name, _ in found} & {name for _, name, _ in swaps})
        if twice:
            raise SystemExit(f"--kernels-from {paths!r}: {path} replaces {', '.join(twice)}, as an earlier file of "
                             "the same '+' group does; only the last would take effect")
        swaps += found

    @contextlib.contextmanager
    def swapped():
        saved = [(launcher, name, getattr(launcher, name)) for launcher, name, _ in swaps]
        try:
            for launcher, name, replacement in swaps:
                setattr(launcher, name, replacement)
            yield
        finally:
            for launcher, name, original in saved:
                setattr(launcher, name, original)
    return swapped


def time_graph(calls: list, replays: int = 30) -> float:
    """Median microseconds per call of `calls` (thunks) captured back to back in one CUDA graph."""
    for c in calls:  # compile, and let any lazy state settle, outside capture
        c()
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for c in calls:
            c()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for c in calls:
            c()
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0)
    del graph
    return statistics.median(times) / len(calls)


@triton.jit
def stream_read_kernel(x_ptr, out_ptr, n, per_prog, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    """Reads x[pid * per_prog : (pid + 1) * per_prog] (bf16, 16-byte loads) and stores one fp32 sum: how fast a
    kernel in a graph can stream this many bytes at all (the ceiling a GEMV of the same bytes can reach). With
    PDL it first waits for the previous kernel and lets the next one start, as our kernels do (tuning.pdl)."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    pid = tl.program_id(0)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    lo = pid * per_prog
    for i in range(lo, lo + per_prog, BLOCK):
        offs = i + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + offs, mask=offs < n, other=0.0).to(tl.float32)
    tl.store(out_ptr + pid, tl.sum(acc, axis=0))


def read_ceiling_us(ws: list[torch.Tensor], sms: int) -> float:
    """Best graph-replay time of stream_read_kernel over ws (flattened), over a few grid shapes."""
    out = torch.empty(sms * 16, device="cuda", dtype=torch.float32)
    best = float("inf")
    for per_sm in (1, 2, 4, 8, 16):
        for block in (1024, 4096):
            progs = sms * per_sm
            def call(w, progs=progs, block=block):
                flat = torch.as_strided(w, (w.numel(),), (1,))  # a dense view in any order: the same bytes
                n = flat.numel()
                per = triton.cdiv(triton.cdiv(n, progs), block) * block
                stream_read_kernel[(triton.cdiv(n, per),)](flat, out, n, per, BLOCK=block,
                                                           num_warps=8 if block > 1024 else 4)
            best = min(best, time_graph([lambda w=w: call(w) for w in ws]))
    return best


def copy_bandwidth() -> dict[str, float]:
    """Device-to-device copy of 2 GiB, counting bytes read plus written, in GB/s (median of 20), three ways:
    eager cudaMemcpy (event-timed), that memcpy inside a graph (it may run on the copy engines), and an
    elementwise kernel in a graph. The best is the ceiling the fractions are taken against."""
    n = 1 << 30
    src = torch.randn(n // 2, device="cuda", dtype=torch.float32).view(torch.bfloat16)
    dst = torch.empty_like(src)
    nbytes = 2 * src.numel() * src.element_size()
    times = []
    for _ in range(23):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0)
    result = {"eager_memcpy": nbytes / statistics.median(times[3:]) / 1e3,
              "graph_memcpy": nbytes / time_graph([lambda: dst.copy_(src)], replays=20) / 1e3,
              "graph_kernel": nbytes / time_graph([lambda: torch.neg(src, out=dst)], replays=20) / 1e3}
    return {k: round(v, 1) for k, v in result.items()}


def sets_for(bytes_per_set: int, cap: int = 32) -> int:
    """Input sets to rotate so that the working set is at least 3x the L2."""
    return max(2, min(cap, math.ceil(3 * L2_BYTES / max(1, bytes_per_set))))


# ------------------------------------------------------------------------------------------------- cases
def mla_case(B: int, T: int, ctx: int, page_size: int = 64, capacity: int | None = None):
    """Thunk builder and bytes for MLA with B requests of `ctx` tokens each (T new), rotated over sets.
    ``capacity``: page table slots a request (default: ctx), as a graph captured for longer contexts has it."""
    kv_bytes = B * ctx * (KV_LORA + ROPE) * 2
    n_sets = sets_for(kv_bytes)
    P = math.ceil(max(ctx, capacity or 0) / page_size)
    pages = torch.randperm(n_sets * B * P, device="cuda").int().view(n_sets, B, P)
    kv = torch.randn(n_sets * B * P * page_size, KV_LORA + ROPE, device="cuda", dtype=torch.bfloat16)
    seq = torch.full((B,), ctx, dtype=torch.int32, device="cuda")
    qn = torch.randn(n_sets, B * T, HEADS, KV_LORA, device="cuda", dtype=torch.bfloat16) * 0.05
    qr = torch.randn(n_sets, B * T, HEADS, ROPE, device="cuda", dtype=torch.bfloat16) * 0.05
    kw = dict(tokens_per_req=T, page_size=page_size, kv_lora_rank=KV_LORA, sm_scale=SM_SCALE)
    q_bytes = B * T * HEADS * (2 * KV_LORA + ROPE) * 2  # q in, out back

    def calls(config=None, fn=triton_mla_attention):
        extra = {} if fn is not triton_mla_attention else {"config": config}
        return [lambda i=i: fn(qn[i], qr[i], kv, pages[i], seq, **kw, **extra) for i in range(n_sets)]

    return calls, kv_bytes + q_bytes


def moe_case(T: int, int4: bool, weights, path: str | None = None, pool: int = EXPERTS):
    """Fused MoE over the full 384-expert pool; bytes = distinct active experts' weights + x + out.
    path (INT4 only): "gemv", "tile", or None (the launcher's choice: gemv for T <= GEMV_MAX_TOKENS). pool: each token's
    experts are drawn from the first ``pool`` (fewer: tokens share experts, as a verify batch's draft tokens
    do: the Kimi slice's routing gave ~10 distinct experts a layer at T=4)."""
    n_sets = 16
    g = torch.Generator(device="cpu").manual_seed(T)
    ids = torch.stack([torch.stack([torch.randperm(pool, generator=g)[:TOP_K] for _ in range(T)])
                       for _ in range(n_sets)]).int().cuda()  # [sets, T, k]
    tw = torch.rand(n_sets, T, TOP_K, device="cuda")
    tw = tw / tw.sum(-1, keepdim=True)
    x = torch.randn(n_sets, T, HIDDEN, device="cuda", dtype=torch.bfloat16)
    if int4:
        expert_bytes = (2 * INTER * HIDDEN // 2 + 2 * INTER * HIDDEN // 32 * 2  # w13 nibbles + bf16 scales
                        + HIDDEN * INTER // 2 + HIDDEN * INTER // 32 * 2)
    else:
        expert_bytes = 3 * INTER * HIDDEN * 2
    distinct = statistics.mean(len(set(ids[s].flatten().tolist())) for s in range(n_sets))
    nbytes = int(distinct * expert_bytes) + 2 * T * HIDDEN * 2

    def calls(config=None, fn=None):
        if fn is None:
            fn = triton_fused_moe_int4 if int4 else triton_fused_moe
            extra = {"config": config, "path": path} if int4 else {"config": config}
        else:
            extra = {}
        return [lambda i=i: fn(x[i], *weights, tw[i], ids[i], **extra) for i in range(n_sets)]

    return calls, nbytes, distinct


def rms_norm_case(T: int, D: int, strided: bool = False, residual: bool = False):
    """RMSNorm of T rows of D (bf16). strided: rows are the first D columns of [T, D + 64] (MLA's latent c
    inside kv_a, normed in place). Bytes: x (and residual) read, out (and new residual) written, weight."""
    n_sets = 8
    width = D + 64 if strided else D
    base = torch.randn(n_sets, T, width, device="cuda", dtype=torch.bfloat16)
    x = base[..., :D]
    res = torch.randn(n_sets, T, D, device="cuda", dtype=torch.bfloat16) if residual else None
    w = torch.rand(D, device="cuda", dtype=torch.bfloat16) + 0.5
    nbytes = T * D * 2 * (4 if residual else 2) + D * 2

    def calls(fn=triton_rms_norm):
        if strided:
            return [lambda i=i: fn(x[i], w, 1e-6, out=x[i]) for i in range(n_sets)]
        return [lambda i=i: fn(x[i], w, 1e-6, None if res is None else res[i]) for i in range(n_sets)]

    return calls, nbytes


def rotary_case(T: int, heads: int = HEADS, rope: int = ROPE, nope: int = 128, interleaved: bool = True):
    """MLA's rope in place: q_rope [T, h, 64] inside q [T, h, 192] and k_rope [T, 64] inside kv_a [T, 576],
    positions scattered over a 32k float32 table. Bytes: q_rope and k_rope read and written, cos/sin rows."""
    n_sets = 8
    P = 32768
    q = torch.randn(n_sets, T, heads, nope + rope, device="cuda", dtype=torch.bfloat16)
    kv = torch.randn(n_sets, T, KV_LORA + rope, device="cuda", dtype=torch.bfloat16)
    pos = torch.randint(0, P, (n_sets, T), device="cuda")
    cos, sin = torch.rand(P, rope // 2, device="cuda"), torch.rand(P, rope // 2, device="cuda")
    nbytes = 2 * T * (heads + 1) * rope * 2 + 2 * T * rope // 2 * 4

    def calls(fn=triton_apply_rotary):
        return [lambda i=i: fn(q[i][..., nope:], kv[i][:, KV_LORA:], pos[i], cos, sin, interleaved=interleaved,
                               inplace=True) for i in range(n_sets)]

    return calls, nbytes


def topk_case(T: int):
    n_sets = 8
    logits = torch.randn(n_sets, T, EXPERTS, device="cuda")
    bias = torch.rand(EXPERTS, device="cuda") * 0.1
    kw = dict(top_k=TOP_K, n_group=1, topk_group=1, routed_scaling_factor=2.827)

    def calls(fn=kernels.moe_topk):
        return [lambda i=i: fn(logits[i], bias, **kw) for i in range(n_sets)]

    return calls, T * EXPERTS * 4 + EXPERTS * 4 + T * TOP_K * 8


def make_moe_weights(int4: bool):
    if int4:
        return (torch.randint(-2**31, 2**31 - 1, (EXPERTS, 2 * INTER, HIDDEN // 8), device="cuda", dtype=torch.int32),
                (torch.rand(EXPERTS, 2 * INTER, HIDDEN // 32, device="cuda") * 0.004).bfloat16(),
                torch.randint(-2**31, 2**31 - 1, (EXPERTS, HIDDEN, INTER // 8), device="cuda", dtype=torch.int32),
                (torch.rand(EXPERTS, HIDDEN, INTER // 32, device="cuda") * 0.01).bfloat16())
    return (torch.randn(EXPERTS, 2 * INTER, HIDDEN, device="cuda", dtype=torch.bfloat16) / math.sqrt(HIDDEN),
            torch.randn(EXPERTS, HIDDEN, INTER, device="cuda", dtype=torch.bfloat16) / math.sqrt(INTER))


# ------------------------------------------------------------------------------------------------- sweep
# (ctas_per_sm, min_keys_per_split): at B=1, 8k these give 256, 128, 64 and 32 splits (runtime, no recompile).
SPLIT_VARIANTS = ((4, 32), (1, 64), (1, 128), (1, 256))
MLA_SWEEP = [{"BLOCK_M": 16, "BLOCK_N": bn, "num_warps": w, "num_stages": s, "ctas_per_sm": c,
              "min_keys_per_split": mk}
             for bn in (32, 64) for w in (4, 8) for s in (2, 3) for c, mk in SPLIT_VARIANTS]
GATE_UP_SWEEP = tuning.CANDIDATES["fused_moe_int4_gate_up"]  # INT4 tile path (see bench_moe_tile.py)
DOWN_SWEEP = tuning.CANDIDATES["fused_moe_int4_down"]
GEMV_GATE_UP_SWEEP = tuning.CANDIDATES["fused_moe_int4_gemv_gate_up"]
GEMV_DOWN_SWEEP = tuning.CANDIDATES["fused_moe_int4_gemv_down"]


def sweep(rows: list, calls_fn, candidates: list, base: dict | None = None, key: str | None = None) -> dict:
    """Time each candidate (merged into base[key] when given); return the fastest."""
    best, best_us = None, math.inf
    for cand in candidates:
        cfg = {**base, key: cand} if key else cand
        try:
            us = time_graph(calls_fn(cfg), replays=10)
        except Exception as exc:
            rows.append({"config": cfg, "error": repr(exc)[:300]})
            continue
        rows.append({"config": cfg, "us": round(us, 3)})
        if us < best_us:
            best, best_us = cand, us
    if best is None:
        raise RuntimeError(f"every candidate failed: {rows[-1]}")
    return best


def sweep_moe(record: dict, op: str, T: int, path: str, gate_up_cands: list, down_cands: list) -> tuple:
    """Sweeps gate_up then down (with the winning gate_up) for one INT4 MoE path at T tokens; on failure keeps
    the defaults and logs why."""
    gate_up, down = tuning.DEFAULTS[f"{op}_gate_up"], tuning.DEFAULTS[f"{op}_down"]
    try:
        weights = make_moe_weights(True)
        calls, _, _ = moe_case(T, True, weights, path=path)
        base = {"gate_up": gate_up, "down": down}
        gate_up = sweep(record.setdefault(f"{op}_t{T}_gate_up", []), calls, gate_up_cands, base, "gate_up")
        down = sweep(record.setdefault(f"{op}_t{T}_down", []), calls, down_cands, {**base, "gate_up": gate_up},
                     "down")
        del weights, calls
        torch.cuda.empty_cache()
    except Exception:
        log(f"{op} sweep failed, keeping defaults:\n" + traceback.format_exc())
    return gate_up, down


def buckets_of(per_key: dict[int, dict], key_name: str) -> list[dict]:
    """Table buckets for configs given per key 1..n: each run of equal configs one bucket bounded by
    ``max_<key_name>`` (its last key), the last bucket unbounded."""
    keys = sorted(per_key)
    assert keys == list(range(1, len(keys) + 1)), f"need every key from 1, got {keys}"
    buckets: list[dict] = []
    for k in keys:
        if buckets and buckets[-1][1] == per_key[k]:
            buckets[-1][0] = k
        else:
            buckets.append([k, per_key[k]])
    return [{**({f"max_{key_name}": last} if i < len(buckets) - 1 else {}), **cfg}
            for i, (last, cfg) in enumerate(buckets)]


def gemv_form_candidates(form: dict[str, dict]) -> list[dict]:
    """Joint (gate_up, down) candidates for the INT4 GEMV path that keep the arithmetic of ``form`` (the table's
    configs at any T): each op's F16 and BLOCK_W stay the table's, since a table must not mix them across buckets
    (they fix how a token's sums are ordered and act rounded: decode and verify compute a token alike,
    test_tuning.py). Tiles vary: CANDIDATES' (BLOCK_N, warps) and BLOCK_N 32, ROWS 1 / 2 where gate_up is F16,
    PRELOAD on / off; gate_up's BLOCK_N a multiple of 8 under an F16 down (the launcher's rule for act's words).
    The sweep of the eighth session timed only the fp32 form, which the F16 table could not take."""
    keep = {op: {k: form[op][k] for k in ("F16", "BLOCK_W")} for op in ("gate_up", "down")}
    rows = (1, 2) if keep["gate_up"]["F16"] else (1,)
    tiles = [(c["BLOCK_N"], c["num_warps"]) for c in GEMV_GATE_UP_SWEEP] + [(32, 4), (32, 8)]
    gate_ups = [{"BLOCK_N": bn, "num_warps": w, **keep["gate_up"], "ROWS": r, "maxnreg": None}
                for bn, w in dict.fromkeys(tiles) for r in rows
                if not keep["down"]["F16"] or bn % 8 == 0]
    downs = [{"maxnreg": None, **{k: v for k, v in c.items() if k not in keep["down"]}, **keep["down"]}
             for c in GEMV_DOWN_SWEEP]
    return [{"gate_up": g, "down": d} for g in gate_ups for d in downs]


def confirm_pair(rows: list, calls, table_cfg: dict, best: dict, repeats: int = 3) -> dict:
    """The table's config against a sweep's winner, alternating ``repeats`` times at 30 replays each (the sweep
    timed 10): the winner is kept only where its median beats the table's by more than 1%, else the table's."""
    if best == table_cfg:
        return best
    times: dict[str, list[float]] = {"table": [], "sweep": []}
    for _ in range(repeats):
        for name, cfg in (("table", table_cfg), ("sweep", best)):
            times[name].append(time_graph(calls(cfg)))
    med = {k: statistics.median(v) for k, v in times.items()}
    keep = med["sweep"] < 0.99 * med["table"]
    rows.append({"confirm": {"table": table_cfg, "sweep": best}, "us": {k: [round(t, 3) for t in v]
                                                                         for k, v in times.items()},
                 "kept": "sweep" if keep else "table"})
    log(f"  confirm: table {med['table']:.2f} us, sweep {med['sweep']:.2f} us -> {'sweep' if keep else 'table'}")
    return best if keep else table_cfg


def run_gemv_sweep(out: Path, tokens: tuple[int, ...] = (1, 2)) -> dict:
    """``--sweep gemv``: the INT4 GEMV MoE path at each T of ``tokens`` (``--sweep-tokens``, default 1 and 2),
    gate_up and down swept jointly (with PRELOAD the down kernel overlaps gate_up, so the best pair need not
    pair the best of each) over tiles that keep the table's arithmetic (gemv_form_candidates), then the winner
    confirmed against the table's config (confirm_pair). Every T from 1 to GEMV_MAX_TOKENS keeps the config the
    table in use gives it unless swept; runs of equal configs become one bucket each. Written as
    ``sweep_table.json`` holding just those two ops (merge_sweep.py merges it; SGLANG_EAGLE3_CONFIG_TABLE reads
    it as is)."""
    log(f"== sweep (INT4 GEMV MoE path, T in {tokens}, gate_up x down)")
    dev = torch.device("cuda")
    record: dict[str, list] = {}
    stages = ("gate_up", "down")
    per_t = {T: {st: tuning.get_config(f"fused_moe_int4_gemv_{st}", dev, "tokens", T) for st in stages}
             for T in range(1, GEMV_MAX_TOKENS + 1)}
    weights = make_moe_weights(True)
    for T in tokens:
        calls, _, _ = moe_case(T, True, weights, path="gemv")
        pairs = gemv_form_candidates(per_t[T])
        if per_t[T] not in pairs:
            pairs.insert(0, dict(per_t[T]))
        rows = record.setdefault(f"fused_moe_int4_gemv_t{T}", [])
        best = sweep(rows, calls, pairs)
        per_t[T] = confirm_pair(rows, calls, per_t[T], best)
        log(f"gemv T={T} ({len(pairs)} pairs): {per_t[T]}")
    del weights
    torch.cuda.empty_cache()
    table_ops = {f"fused_moe_int4_gemv_{st}": buckets_of({T: c[st] for T, c in per_t.items()}, "tokens")
                 for st in stages}
    arch, sms, name = tuning.device_key(torch.cuda.current_device())
    table = {"arch": arch, "sm_counts": [sms], "measured": True,
             "source": f"benchmarks/bench_kernels.py --sweep gemv --sweep-tokens {' '.join(map(str, tokens))} on "
                       f"{name} (384 experts, gate_up x down jointly, the table's F16 and BLOCK_W; other T as the "
                       f"table in use had them)",
             "ops": table_ops}
    write_sweep_table(out, table, record)
    return table


def mla_verify_candidates(decode: dict) -> list[dict]:
    """run_sweep's candidates for MLA's verify bucket, from the decode bucket's winner: the row block and the depth
    vary, what fixes a token's sums (tuning.ONE_ARITHMETIC_KEYS: the key tile, the split size, the merge) stays the
    decode's, so that a verify computes each token as its decode does (before the forty-ninth session the split size
    varied too, and the table it wrote broke that; tuning.check_table refuses such a table now)."""
    return [{**decode, "BLOCK_M": bm, "num_stages": s} for bm in (16, 32) for s in (2, 3)]


def write_sweep_table(out: Path, table: dict, record: dict) -> None:
    """sweep.json (the timings) and sweep_table.json under ``out``; the table only once checked as
    SGLANG_EAGLE3_CONFIG_TABLE will check it (over the checked-in table for this GPU, where there is one), so that a
    sweep never leaves a table the engine then refuses (a ValueError says why; the timings are kept)."""
    (out / "sweep.json").write_text(json.dumps(record, indent=1))
    path = out / "sweep_table.json"
    tuning.over_checked_in(table, table["arch"], table["sm_counts"][0], f"the sweep's table for {path}")
    path.write_text(json.dumps(table, indent=1))


def run_sweep(out: Path) -> dict:
    """Winners per op on the decode shapes the targets name; written as a config table."""
    log("== sweep")
    record: dict[str, list] = {}
    t0 = time.time()
    mla_calls, _ = mla_case(1, 1, 8192)
    mla_decode = sweep(record.setdefault("mla_b1_t1_ctx8192", []), mla_calls, MLA_SWEEP)
    mla_calls, _ = mla_case(4, 4, 8192)
    mla_verify = sweep(record.setdefault("mla_b4_t4_ctx8192", []), mla_calls, mla_verify_candidates(mla_decode))
    log(f"mla sweep done in {time.time() - t0:.0f}s: decode {mla_decode} verify {mla_verify}")

    table_ops = {"moe_topk": [{"num_warps": 4}],
                 "mla_attention": [{"max_rows": 16, **mla_decode}, mla_verify],
                 "fused_moe_gate_up": [tuning.DEFAULTS["fused_moe_gate_up"]],
                 "fused_moe_down": [tuning.DEFAULTS["fused_moe_down"]]}
    # bf16 experts are no target: their table keeps the defaults. The tile path serves T > GEMV_MAX_TOKENS
    # (swept here at 256, one bucket; bench_moe_tile.py --sweep sweeps it per size class, 16..2048);
    # the GEMV path is swept at T=1 (decode) and its table bucket covers every T <= GEMV_MAX_TOKENS.
    for op, T, path, gate_up_cands, down_cands in (
            ("fused_moe_int4", 256, "tile", GATE_UP_SWEEP, DOWN_SWEEP),
            ("fused_moe_int4_gemv", 1, "gemv", GEMV_GATE_UP_SWEEP, GEMV_DOWN_SWEEP)):
        gate_up, down = sweep_moe(record, op, T, path, gate_up_cands, down_cands)
        table_ops[f"{op}_gate_up"] = [gate_up]
        table_ops[f"{op}_down"] = [down]
        log(f"{op} sweep done at {time.time() - t0:.0f}s: gate_up {gate_up} down {down}")
    arch, sms, name = tuning.device_key(torch.cuda.current_device())
    table = {"arch": arch, "sm_counts": [sms], "measured": True,
             "source": f"benchmarks/bench_kernels.py --sweep on {name}, decode shapes (MLA B=1 T=1 8k and "
                       "B=4 T=4 8k; MoE tile path T=256, GEMV path T=1, over 384 experts)", "ops": table_ops}
    write_sweep_table(out, table, record)
    return table


# ------------------------------------------------------------------------------------------------- main
def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--sweep", nargs="?", const="all", choices=["all", "gemv"], default=None,
                    help="sweep configs first (all ops, or only the INT4 GEMV MoE path) and use the winners")
    ap.add_argument("--sweep-tokens", type=int, nargs="+", default=[1, 2],
                    help=f"with --sweep gemv: the T (1..{GEMV_MAX_TOKENS}) to sweep")
    ap.add_argument("--moe-only", action="store_true",
                    help="time only the INT4 GEMV MoE at T = 1, 2, 4, 8 and its read ceilings (after a --sweep gemv)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    arch, sms, name = tuning.device_key(torch.cuda.current_device())

    copy_ways = copy_bandwidth()
    copy_gbps = max(copy_ways.values())
    log(f"copy bandwidth {copy_gbps:.0f} GB/s ({copy_ways}) on {name} ({arch}, {sms} SMs)")
    table = None
    if args.sweep:
        try:
            table = (run_sweep(args.out) if args.sweep == "all"
                     else run_gemv_sweep(args.out, tuple(sorted(set(args.sweep_tokens)))))
        except Exception:
            log("sweep failed:\n" + traceback.format_exc())

    def cfg(op: str, key_name: str, key: int):
        if table is None or op not in table["ops"]:  # not swept in this run: the checked-in table
            return None
        return tuning.table_config(table, op, key_name, key)

    cases = []
    launch_counts: dict[str, dict] = {}
    commit = git_commit()

    def write() -> None:
        result = {
            "command": "python " + " ".join(sys.argv),
            "git_commit": commit,
            "gpu": name, "arch": arch, "sm_count": sms,
            "torch": torch.__version__, "triton": __import__("triton").__version__,
            "copy_gbps": round(copy_gbps, 1), "copy_gbps_by_method": copy_ways,
            "method": "CUDA graph of one call per rotated input set (working set >= 3x L2), median of replays "
                      "/ calls; bytes = fewest bytes the op must move (KV read once; distinct active experts "
                      "read once; inputs and outputs)",
            "configs": table["ops"] if table else "checked-in table (sglang_eagle3/kernels/configs)",
            "kernel_report": kernels.kernel_report(),  # PDL, fusions, overlaps as this run had them
            "cases": cases,
            "kernels_per_moe_layer": launch_counts,
        }
        (args.out / "kernels.json").write_text(json.dumps(result, indent=1))

    def record(name_: str, shape: dict, us: float, nbytes: int, **extra) -> None:
        gbps = nbytes / us / 1e3
        cases.append({"name": name_, "shape": shape, "us": round(us, 3), "bytes": nbytes,
                      "gbps": round(gbps, 1), "frac_of_copy_bw": round(gbps / copy_gbps, 3), **extra})
        log(f"{name_:<44} {us:9.2f} us {gbps:8.0f} GB/s {gbps / copy_gbps:6.1%}  {extra or ''}")
        write()

    def guarded(fn, label):
        try:
            fn()
        except Exception:
            log(f"{label} failed:\n" + traceback.format_exc())

    def moe(int4: bool, T: int, weights, path: str | None = None) -> None:
        op = "fused_moe_int4" if int4 else "fused_moe"
        if int4 and path is None:
            path = "gemv" if T <= GEMV_MAX_TOKENS else "tile"
        table_op = f"{op}_gemv" if path == "gemv" else op
        calls, nbytes, distinct = moe_case(T, int4, weights, path=path)
        c = None if table is None or f"{table_op}_gate_up" not in table["ops"] else {
            "gate_up": cfg(f"{table_op}_gate_up", "tokens", T), "down": cfg(f"{table_op}_down", "tokens", T)}
        shape = {"T": T, "E": EXPERTS, "H": HIDDEN, "I": INTER, "top_k": TOP_K, "int4": int4}
        label = f"{op} T={T}" if not int4 else f"{op} ({path}) T={T}"
        record(label, {**shape, "path": path} if int4 else shape, time_graph(calls(c)), nbytes,
               distinct_experts=distinct)
        if T <= 4 and path != "tile":
            ref = kernels.ref_fused_moe_int4 if int4 else kernels.ref_fused_moe
            record(f"{op}_ref T={T}", shape, time_graph(calls(fn=ref)[:4]), nbytes, distinct_experts=distinct,
                   peer="torch reference")

    def read_ceiling(of: str) -> None:
        """How fast any kernel in a graph can stream the bytes of case `of` (stream_read_kernel, best grid,
        contiguous): the ceiling for a kernel that reads those bytes once, against the copy bandwidth."""
        nbytes = next(c["bytes"] for c in cases if c["name"] == of)
        ws = [torch.empty(nbytes // 2, device="cuda", dtype=torch.bfloat16).normal_()
              for _ in range(sets_for(nbytes))]
        record(f"read ceiling of {of}", {"of": of}, read_ceiling_us(ws, tuning.sm_count(ws[0].device)), nbytes,
               peer="read-only kernel")

    if args.moe_only:
        weights = make_moe_weights(True)
        for T in (1, 2, 4, 8):
            guarded(lambda T=T, weights=weights: moe(True, T, weights), f"moe int4 T={T}")
        del weights
        torch.cuda.empty_cache()
        for T in (1, 2, 4, 8):
            guarded(lambda T=T: read_ceiling(f"fused_moe_int4 (gemv) T={T}"), f"read ceiling T={T}")
        log(f"wrote {args.out / 'kernels.json'}")
        return

    for T in (1, 8, 64):
        def topk(T=T):
            calls, nbytes = topk_case(T)
            record(f"moe_topk T={T}", {"T": T, "E": EXPERTS, "top_k": TOP_K}, time_graph(calls()), nbytes)
            record(f"moe_topk_ref T={T}", {"T": T, "E": EXPERTS, "top_k": TOP_K},
                   time_graph(calls(kernels.ref_moe_topk)), nbytes, peer="torch reference")
        guarded(topk, f"moe_topk T={T}")

    for B, T, ctx in ((1, 1, 1024), (1, 1, 8192), (1, 1, 32768), (8, 1, 8192), (1, 4, 8192), (4, 4, 8192),
                      (32, 4, 2048)):
        def mla(B=B, T=T, ctx=ctx):
            calls, nbytes = mla_case(B, T, ctx)
            shape = {"B": B, "T": T, "ctx": ctx, "H": HEADS, "kv_lora": KV_LORA, "rope": ROPE, "page": 64}
            record(f"mla B={B} T={T} ctx={ctx}", shape, time_graph(calls(cfg("mla_attention", "rows", T * HEADS))),
                   nbytes)
            if B * ctx <= 8192:
                record(f"mla_ref B={B} T={T} ctx={ctx}", shape,
                       time_graph(calls(fn=kernels.ref_mla_attention)[:4]), nbytes, peer="torch reference")
        guarded(mla, f"mla B={B} T={T} ctx={ctx}")

    def moe_per_pair(T: int, weights, pool: int) -> None:
        """The INT4 GEMV gate_up with one program per pair against the expert's first pair doing all its
        pairs, at the table's config, uniform routing or tokens sharing a pool of experts."""
        calls, nbytes, distinct = moe_case(T, True, weights, path="gemv", pool=pool)
        dev = torch.device("cuda")
        gate_up = tuning.get_config("fused_moe_int4_gemv_gate_up", dev, "tokens", T)
        down = tuning.get_config("fused_moe_int4_gemv_down", dev, "tokens", T)
        for per_pair in (False, True):
            c = {"gate_up": {**gate_up, "PER_PAIR": per_pair}, "down": down}
            label = f"fused_moe_int4 (gemv, {'per pair' if per_pair else 'first pair works'}, pool {pool}) T={T}"
            record(label, {"T": T, "E": EXPERTS, "pool": pool, "per_pair": per_pair}, time_graph(calls(c)),
                   nbytes, distinct_experts=distinct)

    def moe_down_preload(T: int, weights) -> None:
        """The INT4 GEMV MoE (gate_up + down; calls back to back like every case here) with the down kernel's weights
        loaded slot by slot after its PDL wait, or all before it (PRELOAD), at the table's down config and at
        8 warps."""
        calls, nbytes, distinct = moe_case(T, True, weights, path="gemv")
        dev = torch.device("cuda")
        gate_up = tuning.get_config("fused_moe_int4_gemv_gate_up", dev, "tokens", T)
        down = tuning.get_config("fused_moe_int4_gemv_down", dev, "tokens", T)
        for preload, warps in ((False, down["num_warps"]), (True, down["num_warps"]), (True, 8), (False, 8)):
            c = {"gate_up": gate_up, "down": {**down, "PRELOAD": preload, "num_warps": warps}}
            record(f"fused_moe_int4 (gemv, down {'preload' if preload else 'slot loop'}, {warps} warps) T={T}",
                   {"T": T, "E": EXPERTS, "preload": preload, "down_warps": warps}, time_graph(calls(c)), nbytes,
                   distinct_experts=distinct)

    int4_weights = make_moe_weights(True)
    for T in (1, 2, 4, 8):
        guarded(lambda T=T, w=int4_weights: moe_down_preload(T, w), f"moe down preload T={T}")
    for T in (2, 4, 8):
        for pool in (EXPERTS, 12):
            guarded(lambda T=T, pool=pool, w=int4_weights: moe_per_pair(T, w, pool), f"moe per pair T={T} pool={pool}")
    del int4_weights
    torch.cuda.empty_cache()

    for int4, batch_sizes in ((True, (1, 2, 4, 8, 16, 64)), (False, (1, 4, 8))):
        weights = make_moe_weights(int4)
        for T in batch_sizes:
            guarded(lambda T=T, int4=int4, weights=weights: moe(int4, T, weights), f"moe int4={int4} T={T}")
            if int4 and T in (1, 8):  # the tile path at decode sizes, for comparison with the GEMV path
                guarded(lambda T=T, weights=weights: moe(True, T, weights, path="tile"), f"moe tile T={T}")
        del weights
        torch.cuda.empty_cache()

    for of in ("mla B=1 T=1 ctx=8192", "mla B=1 T=4 ctx=8192", *(f"fused_moe_int4 (gemv) T={T}" for T in (1, 2, 4, 8))):
        guarded(lambda of=of: read_ceiling(of), f"read ceiling of {of}")

    # Per-layer small ops (latency-bound: the bytes are a few KB; what counts is one launch instead of ~7-12).
    for T, D, strided, residual, what in ((1, HIDDEN, False, False, "input/post-attention norm"),
                                          (8, HIDDEN, False, True, "norm fused with the residual add"),
                                          (1, 1536, False, False, "q_a_layernorm"),
                                          (1, KV_LORA, True, False, "kv_a_layernorm in place in kv_a"),
                                          (64, HIDDEN, False, False, "verify/prefill rows")):
        def norm(T=T, D=D, strided=strided, residual=residual, what=what):
            calls, nbytes = rms_norm_case(T, D, strided, residual)
            shape = {"T": T, "D": D, "strided": strided, "residual": residual, "what": what}
            record(f"rms_norm T={T} D={D}{' +res' if residual else ''}", shape, time_graph(calls()), nbytes)
            if not strided:
                record(f"rms_norm_ref T={T} D={D}{' +res' if residual else ''}", shape,
                       time_graph(calls(kernels.ref_rms_norm)), nbytes, peer="torch reference")
        guarded(norm, f"rms_norm T={T} D={D}")

    for T in (1, 8, 64):
        def rope(T=T):
            calls, nbytes = rotary_case(T)
            shape = {"T": T, "heads": HEADS, "rope": ROPE, "interleaved": True, "inplace": True}
            record(f"rotary q+k T={T}", shape, time_graph(calls()), nbytes)
            record(f"rotary_ref q+k T={T}", shape, time_graph(calls(kernels.ref_apply_rotary)), nbytes,
                   peer="torch reference")
        guarded(rope, f"rotary T={T}")

    # Launches per MoE decoder layer of an eager step (profiler count; tests/kernels/kernel_checks.py).
    def launches(T: int) -> None:
        from tests.kernels.kernel_checks import cuda_kernels_per_moe_layer

        counts = cuda_kernels_per_moe_layer(T)
        launch_counts[f"T={T}"] = counts
        log(f"kernels per MoE layer at T={T}: {counts['per_moe_layer']} "
            f"({', '.join(sorted(set(counts['kernels_of_two_moe_layers'])))[:600]})")
        write()

    for T in (1, 4):
        guarded(lambda T=T: launches(T), f"kernels per layer T={T}")

    write()
    log(f"wrote {args.out / 'kernels.json'}")


if __name__ == "__main__":
    main()
