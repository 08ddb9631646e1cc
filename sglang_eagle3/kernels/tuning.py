"""Launch configs per GPU: a checked-in table keyed by compute capability and SM count, else autotune once.

Tables live in ``configs/sm_<major><minor>.json`` (SGLANG_EAGLE3_CONFIG_TABLE names another file, e.g. one a
``bench_kernels.py --sweep`` wrote on your GPU); each file lists the SM counts it was made for, whether it
was measured, and per op a list of buckets ``{"max_<key>": n, ...config}`` (first bucket whose bound covers
the key wins; the last bucket has no bound). A GPU with no matching table gets each op tuned on first use
(eagerly, outside graph capture) over that op's candidates, the winner cached on disk under
``~/.cache/sglang_eagle3``. Under capture, under the Triton interpreter, or on CPU the op's default is used.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from sglang_eagle3 import env

logger = logging.getLogger(__name__)

CONFIG_DIR = Path(__file__).parent / "configs"
# Kernel families whose launches take the PDL attribute (SGLANG_EAGLE3_PDL_SKIP removes some), per launcher.
PDL_KERNELS = ("gemv", "mla", "moe", "norm", "rotary", "topk")

# Defaults: safe on any CUDA GPU with >= 99 KB shared memory per block, and the only configs the
# interpreter sees (it cannot autotune).
DEFAULTS: dict[str, dict] = {
    "moe_topk": {"num_warps": 4},
    # MLA: the split launch's tiles and split heuristic; merge_tile fp32 partials (splits x columns) a merge
    # program at merge_warps warps (4096 at 4: 32 registers a thread).
    # short_split (None, or {"max_tiles", "BLOCK_M", "num_stages"}): the split pass's rows and depth where no split
    # can hold more than max_tiles key tiles (kernels/mla_attention.py launch_plan).
    "mla_attention": {"BLOCK_M": 16, "BLOCK_N": 32, "num_warps": 4, "num_stages": 2, "ctas_per_sm": 2,
                      "min_keys_per_split": 64, "merge_tile": 4096, "merge_warps": 4, "short_split": None},
    # The draft's grouped-query attention on the same split kernel (head_dim 128 a row instead of MLA's 576:
    # wider key tiles fit). Not yet measured on any GPU: the defaults, or autotuned where no table has it.
    "gqa_attention": {"BLOCK_M": 16, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2, "ctas_per_sm": 2,
                      "min_keys_per_split": 128, "merge_tile": 4096, "merge_warps": 4},
    # MLA prefill in the non-absorbed form (mla_attention.triton_mla_mha_prefill): the split kernel's keys as for
    # mla_attention (BLOCK_M query tokens of one head a program), then the decompression GEMM's key tile, K step,
    # warps, stages and programs a SM. 8 warps for both: at 4 the sm_120 builds (mma.sync, operands in registers)
    # spill; 74 / 49 KB of shared memory there, 106 / 74 KB on sm_90 (tests/kernels/compile_checks.py, mha_prefill).
    "mla_mha_prefill": {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 8, "num_stages": 2, "ctas_per_sm": 1,
                        "min_keys_per_split": 256, "merge_tile": 4096, "merge_warps": 4, "decompress_block_n": 64,
                        "decompress_block_k": 64, "decompress_warps": 8, "decompress_stages": 3,
                        "decompress_ctas_per_sm": 4},
    # MoE tile path: BLOCK_M pairs of one expert a block (the routing plan both kernels share, so gate_up's
    # config carries it), BLOCK_N output rows, BLOCK_K the bf16 path's K step (INT4 steps one scale group).
    "fused_moe_gate_up": {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 128, "num_warps": 4, "num_stages": 3},
    "fused_moe_down": {"BLOCK_N": 64, "BLOCK_K": 128, "num_warps": 4, "num_stages": 3},
    # SWAP (INT4, bf16 activations): the swap kernels (weights as the dot's M, BLOCK_W words of K a step, scaled
    # weights rounded to bf16; the tables turn them on) instead of the group path (exact weights, one scale
    # group a step); BLOCK_N is then gate_up's gate rows (with as many up rows) or down's rows.
    "fused_moe_int4_gate_up": {"BLOCK_M": 16, "BLOCK_N": 64, "num_warps": 4, "num_stages": 4, "SWAP": False,
                               "BLOCK_W": 16},
    "fused_moe_int4_down": {"BLOCK_N": 64, "num_warps": 4, "num_stages": 4, "BLOCK_W": 16},
    # INT4 GEMV path (T <= GEMV_MAX_TOKENS). BLOCK_N weight rows per program (gate_up: BLOCK_N gate + BLOCK_N up rows),
    # BLOCK_W int32 words (8 weights each, a multiple of the 4 words of a scale group) per row per step. At
    # Kimi TP=8 shapes (I=256, H=7168) and T=1 the defaults give 8 experts x 32 = 256 gate_up programs
    # streaming 64 KB each (two 8 KB chunks in flight, 128 registers a thread at sm_90), and 224 down programs
    # of 8 slots x 4 KB, unrolled. No num_stages: the kernels prefetch/unroll themselves (Triton does not
    # pipeline loads that feed no tl.dot). PRELOAD: down loads every slot's weights before its PDL wait (one
    # [8 x BLOCK_N, 32-word] tile; the sm_90 table has it up to T = 6, in one warp at T = 2..6: configs/sm_90.json).
    # F16: gate_up's dots in packed fp16 (16-bit activations only; a table keeps it, and BLOCK_W, the same in every
    # bucket); in down's config, act stored in packed fp16 and down's dots so too (the same rules, and gate_up
    # BLOCK_N % 8 == 0). ROWS (2 or 4, with F16): a gate_up program decodes each weight word once for up to ROWS pairs
    # of its expert (the sm_90 table: at T=1 and above 16 tokens; triton/fused_moe.py _gate_up_rows).
    # maxnreg: a cap on the registers a thread (None: the compiler's choice; fused_moe._register_cap)
    "fused_moe_int4_gemv_gate_up": {"BLOCK_N": 8, "BLOCK_W": 128, "num_warps": 4, "F16": False, "ROWS": 1,
                                    "maxnreg": None},
    "fused_moe_int4_gemv_down": {"BLOCK_N": 32, "BLOCK_W": 32, "num_warps": 4, "PRELOAD": False, "F16": False,
                                 "maxnreg": None},
    # INT4 dot path (verify batches, off unless SGLANG_EAGLE3_MOE_DOT_MAX): gate_up as tl.dot over an expert's
    # pairs, BLOCK_N gate + BLOCK_N up rows a program, BLOCK_W words a row a step, H split over SPLIT programs;
    # EXACT: fp32 weights and TF32 dots (exact products; 1.5-1.8x slower on the H200), else bf16 weights.
    "fused_moe_int4_dot_gate_up": {"BLOCK_N": 32, "BLOCK_W": 16, "num_warps": 4, "EXACT": False, "SPLIT": 4},
}

# Autotune search spaces for GPUs without a table (kept small: each candidate compiles). The autotuner picks per
# key bucket, so a decode and a verify may get different candidates: those of an op that serves both vary only what
# leaves a token's numbers alone (warps, stages, MLA's BLOCK_M and the INT4 down kernel's PRELOAD), never what orders
# its sums (MLA's key tile and split size, the INT4 GEMV's BLOCK_W): docs/KERNELS.md, "Decode and verify compute a
# token alike".
CANDIDATES: dict[str, list[dict]] = {
    "mla_attention": [
        {**DEFAULTS["mla_attention"], "BLOCK_N": 32, "num_warps": w, "num_stages": s}
        for w in (4, 8) for s in (1, 2, 3)
    ],
    "gqa_attention": [
        {**DEFAULTS["gqa_attention"], "BLOCK_N": bn, "num_warps": w, "num_stages": s, "ctas_per_sm": c}
        for bn in (32, 64, 128) for w in (4, 8) for s in (2, 3) for c in (1, 2, 4)
    ],
    "fused_moe_gate_up": [
        {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "num_warps": w, "num_stages": 3}
        for bm in (16, 64) for bn in (32, 64) for bk in (64, 128) for w in (4, 8)
    ],
    "fused_moe_int4_gate_up": [
        {"BLOCK_M": bm, "BLOCK_N": bn, "num_warps": w, "num_stages": s}
        for bm, bn, w, s in ((16, 32, 4, 4), (16, 64, 4, 4), (16, 64, 4, 6), (16, 128, 8, 4), (32, 64, 4, 4),
                             (32, 128, 8, 4), (64, 64, 4, 4), (64, 128, 8, 3))
    ],
}
CANDIDATES["fused_moe_int4_gemv_gate_up"] = [  # (BLOCK_N, num_warps) at 128-word chunks: ~4-16 words a thread
    {"BLOCK_N": bn, "BLOCK_W": 128, "num_warps": w}
    for bn, w in ((4, 2), (4, 4), (8, 4), (8, 8), (16, 4), (16, 8))
]
CANDIDATES["fused_moe_int4_gemv_down"] = [
    {"BLOCK_N": bn, "BLOCK_W": 32, "num_warps": w, "PRELOAD": pre}
    for bn, w in ((8, 2), (16, 4), (32, 4), (32, 8), (64, 4), (64, 8)) for pre in (False, True)
    if not pre or bn // w <= 8  # PRELOAD holds 8 slots x BLOCK_N rows x 32 words: <= 64 words a thread
]
CANDIDATES["fused_moe_int4_dot_gate_up"] = [
    {"BLOCK_N": bn, "BLOCK_W": bw, "num_warps": w, "EXACT": False, "SPLIT": split}
    for bn, bw, w, split in ((32, 16, 4, 2), (32, 16, 4, 4), (32, 16, 4, 8), (16, 32, 4, 4), (32, 32, 8, 4))
]
CANDIDATES["fused_moe_down"] = [{k: v for k, v in c.items() if k != "BLOCK_M"} for c in CANDIDATES["fused_moe_gate_up"]
                                 if c["BLOCK_M"] == 16]
CANDIDATES["fused_moe_int4_down"] = [{"BLOCK_N": bn, "num_warps": w, "num_stages": s}
                                     for bn, w, s in ((32, 4, 4), (64, 4, 4), (64, 4, 6), (128, 4, 4), (128, 8, 4),
                                                      (256, 8, 3))]


def interpreting() -> bool:
    """True under the Triton interpreter; then also makes sure its loop bounds work (see below)."""
    if not env.TRITON_INTERPRET.flag():
        return False
    _patch_interpreter_index()
    return True


@functools.cache
def _patch_interpreter_index() -> None:
    """NOTE: Triton 3.6's interpreter keeps scalars as 1-element arrays and turns a loop bound into an int
    with ``int(array)``, which NumPy >= 2.4 refuses for 1-d arrays; kernels whose loop bounds are loaded
    from memory (seq_lens, expert counts) then fail on CPU only. Convert through ``.item()`` instead."""
    from triton.runtime import interpreter

    original = interpreter._patch_lang_tensor

    def patched(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    interpreter._patch_lang_tensor = patched


@dataclass(frozen=True)
class EmulatedGpu:
    """A GPU whose launch decisions SGLANG_EAGLE3_EMULATE_GPU makes on another: the config table (``arch``), the
    SM count the grids follow and the shared memory a block may use (MLA's key-tile depth follows it)."""
    arch: str
    sms: int
    smem_per_block: int
    name: str


# Our users' GPU, whose table (configs/sm_120.json) is derived, never measured: no sm_120 card is lent. Emulated on a
# Hopper GPU, every config, grid and shared-memory budget of that table runs for real (the GPU tests, the
# decode/verify invariance probe); the compiler still targets the card at hand (DISABLE_MMA_V3=1 keeps it to
# mma.sync, as sm_120 has no wgmma), so its timings say what the configs cost relative to each other, not sm_120's.
EMULATED_GPUS = {"sm_120": EmulatedGpu("sm_120", 188, 99 << 10, "RTX PRO 6000 Blackwell")}


def emulated_gpu(value: str, real_arch: str, real_smem: int) -> EmulatedGpu:
    """The EMULATED_GPUS profile SGLANG_EAGLE3_EMULATE_GPU=``value`` names, checked against the GPU at hand: it
    must be sm_90 or newer (the emulated card launches with PDL) and give a block at least the profile's shared
    memory (the profile's configs are sized for it). A ValueError naming the value otherwise."""
    gpu = EMULATED_GPUS.get(value)
    if gpu is None:
        raise ValueError(f"{env.EMULATE_GPU.name}={value!r}: unknown GPU, expected one of {sorted(EMULATED_GPUS)}")
    major = int(real_arch.removeprefix("sm_")[:-1] or 0)
    if major < 9 or real_smem < gpu.smem_per_block:
        raise ValueError(f"{env.EMULATE_GPU.name}={value!r} needs an sm_90 or newer GPU with at least "
                         f"{gpu.smem_per_block >> 10} KB of shared memory a block; this one is {real_arch} with "
                         f"{real_smem >> 10} KB")
    return gpu


def device_key(device_index: int) -> tuple[str, int, str]:
    """(``sm_90``-style arch, SM count, device name) of a CUDA device, or of the GPU SGLANG_EAGLE3_EMULATE_GPU
    names (the name then says which card emulates it)."""
    return _device(device_index, env.EMULATE_GPU.raw() or None)[:3]


@functools.cache
def _device(device_index: int, emulate: str | None) -> tuple[str, int, str, int]:
    """device_key's three and the shared memory a block may use (opt-in maximum), of the device or its emulation."""
    props = torch.cuda.get_device_properties(device_index)
    arch, sms, name = f"sm_{props.major}{props.minor}", props.multi_processor_count, props.name
    smem = int(getattr(props, "shared_memory_per_block_optin", 0) or 96 << 10)
    if emulate is None:
        return arch, sms, name, smem
    gpu = emulated_gpu(emulate, arch, smem)
    if not env.DISABLE_MMA_V3.flag():
        logger.warning("%s=%s on %s without %s=1: Triton may compile dots for %s's wgmma, which %s lacks",
                       env.EMULATE_GPU.name, emulate, name, env.DISABLE_MMA_V3.name, arch, gpu.arch)
    return (gpu.arch, gpu.sms, f"{name} emulating {gpu.arch} ({gpu.name}: {gpu.sms} SMs, "
            f"{gpu.smem_per_block >> 10} KB a block)", gpu.smem_per_block)


def dot_precision(dtype: torch.dtype) -> str:
    """tl.dot's input_precision for operands of ``dtype``: float32 products are IEEE float32 unless torch
    itself allows TF32 for float32 matmuls (``torch.backends.cuda.matmul.allow_tf32``, off by default), so a
    float32 engine computes what the float32 torch references do. TF32 keeps ~10 mantissa bits: graph and
    eager runs that split the same sum differently (MLA's split count follows the padded batch) then differ
    by ~1e-4, enough to flip an MoE routing choice. Half-precision operands ignore it."""
    if dtype == torch.float32 and not torch.backends.cuda.matmul.allow_tf32:
        return "ieee"
    return "tf32"


def pdl(device: torch.device, kernel: str) -> bool:
    """Whether ``kernel`` (a family of PDL_KERNELS) launches on ``device`` with programmatic dependent launch
    (PDL): on sm_90 and newer unless SGLANG_EAGLE3_PDL=0 or SGLANG_EAGLE3_PDL_SKIP names the family, never
    under the interpreter.

    A PDL kernel may start while the kernel before it in the stream is still running: it waits
    (``gdc_wait``) before touching anything the previous kernel writes or reads, and lets its own successor
    start right after that wait (``gdc_launch_dependents``). So when a kernel starts, the kernel two before it
    in the stream has finished. Before its wait a kernel may only touch memory no kernel of the step writes,
    or that the kernel two before it wrote: the GEMV's optional L2 prefetch of its weights
    (SGLANG_EAGLE3_PDL_L2_PREFETCH=1), the INT4 MoE down kernel's routing and weights (PRELOAD), the MLA
    merge's seq_lens (a graph input).

    On by default, measured on the H200 (benchmarks/bench_pdl.py; benchmarks/results/h200/*_aae7240*,
    *_3fa1d10*): inside a CUDA graph a PDL kernel starts while its predecessor runs and leaves its wait
    ~0.45 us after the predecessor's end, against ~0.85 us from end to start without PDL; the 61-layer Kimi
    rank step went from 5.45-5.47 to 5.03 ms (decode, 1k) and from 7.13-7.18 to 6.82 ms (verify T=4). An
    earlier measurement found no gain (0.829 vs 0.810 ms on 6 layers) because the GEMV then prefetched its
    whole weight slab into L2 before its wait, which alone cost the step ~0.7 ms (5.76 ms with it). Loading
    the first weight tiles into registers before the wait instead, or the MLA split's first key tile, changed
    nothing measurable (5.03-5.06 ms either way): built and measured in 3fa1d10, removed since."""
    on = env.PDL.switch(default=True)
    assert kernel in PDL_KERNELS, f"unknown PDL kernel family {kernel!r} (one of {PDL_KERNELS})"
    skip = {k.strip() for k in (env.PDL_SKIP.raw() or "").split(",") if k.strip()}
    unknown = skip - set(PDL_KERNELS)
    if unknown:
        raise ValueError(f"{env.PDL_SKIP.name}={env.PDL_SKIP.raw()!r}: unknown {sorted(unknown)}, "
                         f"expected a comma list of {', '.join(PDL_KERNELS)}")
    if device.type != "cuda" or not on or kernel in skip or interpreting():
        return False
    return _capability(device.index if device.index is not None else torch.cuda.current_device()) >= 9


def pdl_l2_prefetch() -> bool:
    """Whether a PDL GEMV asks the L2 for its weight slab before its wait (SGLANG_EAGLE3_PDL_L2_PREFETCH=1;
    off: 0.7 ms slower a step on the H200, see pdl)."""
    return env.PDL_L2_PREFETCH.flag()


def moe_down_preload() -> bool:
    """Whether the INT4 GEMV MoE's down kernel may load all its weights before its PDL wait where its config
    asks for it (PRELOAD, see triton/fused_moe.py); SGLANG_EAGLE3_MOE_DOWN_PRELOAD=0 turns it off everywhere."""
    return env.MOE_DOWN_PRELOAD.switch(default=True)


def moe_dot_max(default: int) -> int:
    """Largest T whose INT4 MoE takes the dot path (from T=2): SGLANG_EAGLE3_MOE_DOT_MAX, else ``default``."""
    raw = env.MOE_DOT_MAX.raw()
    if raw in (None, ""):
        return default
    if not raw.isdigit():
        raise ValueError(f"{env.MOE_DOT_MAX.name}={raw!r}: expected a token count (0: off)")
    return int(raw)


def pdl_launch(enabled: bool) -> dict:
    """Launch options for a kernel whose PDL constexpr is ``enabled`` (none under the interpreter)."""
    return {"launch_pdl": True} if enabled else {}


@functools.cache
def _capability(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).major


def smem_per_block(device: torch.device) -> int:
    """Shared memory one block may use (opt-in maximum): 227 KB on sm_90, 99 KB on sm_120 (emulated too)."""
    if device.type != "cuda":
        return 96 << 10
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _device(index, env.EMULATE_GPU.raw() or None)[3]


def sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 132  # the interpreter: any plausible number; grids stay small on tiny test shapes
    return device_key(device.index if device.index is not None else torch.cuda.current_device())[1]


def _table(arch: str, sms: int) -> dict | None:
    """The config table for this GPU: the checked-in configs/<arch>.json if it lists this SM count, with the
    ops of SGLANG_EAGLE3_CONFIG_TABLE's file (if set) in place of its own; None: autotune."""
    return _merged_table(arch, sms, env.CONFIG_TABLE.raw() or None)


@functools.cache
def _merged_table(arch: str, sms: int, override: str | None) -> dict | None:
    if override is None:
        table = _checked_in(arch, sms)
        if table is not None and table.get("measured") is False:  # once a process (cached): the RTX PRO 6000's
            logger.warning("kernel configs: configs/%s.json (%d SMs) is derived from the GPU's limits, never measured "
                           "on one; `python benchmarks/bench_kernels.py --out DIR --sweep` measures a table on "
                           "this GPU and %s=DIR/sweep_table.json runs it", arch, sms, env.CONFIG_TABLE.name)
        return table
    table = _load_table(override)
    if table.get("arch") != arch or sms not in table.get("sm_counts", []):  # say so, rather than tune blind
        raise ValueError(f"{env.CONFIG_TABLE.name}={override!r} is for {table.get('arch')} with SM counts "
                         f"{table.get('sm_counts')}, this GPU is {arch} with {sms} SMs")
    return over_checked_in(table, arch, sms, f"{env.CONFIG_TABLE.name}={override!r}")


def _checked_in(arch: str, sms: int) -> dict | None:
    """configs/<arch>.json where it lists ``sms``, else None."""
    path = CONFIG_DIR / f"{arch}.json"
    base = _load_table(str(path)) if path.exists() else None
    return base if base is not None and sms in base["sm_counts"] else None


def over_checked_in(table: dict, arch: str, sms: int, name: str) -> dict:
    """``table``'s ops in place of the checked-in table's for this GPU (where there is one), the rest kept, as the
    launchers will read it; refused (check_table, a ValueError naming ``name``) where they would misread it or
    compute a token apart in decode and verify. How SGLANG_EAGLE3_CONFIG_TABLE's file is read, and how a sweep
    checks the table it writes (benchmarks/bench_kernels.py)."""
    base = _checked_in(arch, sms)
    merged = table if base is None else {
        **base, "source": f"{base.get('source')}; ops {sorted(table['ops'])} from {name}",
        "ops": {**base["ops"], **table["ops"]}}
    check_table(merged, name if base is None else f"{name} over {arch}.json")
    return merged


# Config keys every bucket of an op must agree on, because they fix the order or the rounding of a token's sums
# (docs/KERNELS.md, "Decode and verify compute a token alike"): a decode (T=1) and a verify (T=k+1) fall in different
# buckets, and lossless greedy speculation needs each token computed alike in both.
ONE_ARITHMETIC_KEYS = {
    "fused_moe_int4_gemv_gate_up": ("F16", "BLOCK_W"),  # the packed fp16 dots or the fp32 ones; the fp32 sums' order
    "fused_moe_int4_gemv_down": ("F16", "BLOCK_W"),  # (F16 there also fixes how act is rounded)
    "mla_attention": ("merge_tile", "merge_warps", "min_keys_per_split", "ctas_per_sm", "BLOCK_N"),  # the split
    # count, the key tiles and the merge's tl.sum order
}


def check_table(table: dict, where: str) -> None:
    """Refuse a config table (a ValueError naming ``where``, the op and the values) that the launchers would
    misread or that would let a decode and a verify compute one token differently: an op that is not a kernel's, a
    bucket key no config has, a last bucket with a bound (a key past it would have no config), buckets of one op
    that differ in a ONE_ARITHMETIC_KEYS key, or the INT4 GEMV down kernel's packed fp16 form beside a gate_up
    bucket whose BLOCK_N is not whole 8-row words (that bucket's T would quietly run the fp32 form)."""
    for op, buckets in table["ops"].items():
        if op not in DEFAULTS:
            raise ValueError(f"{where}: unknown op {op!r} (ops: {', '.join(sorted(DEFAULTS))})")
        if not isinstance(buckets, list) or not buckets or not all(isinstance(b, dict) for b in buckets):
            raise ValueError(f"{where}: {op} must be a non-empty list of buckets (objects), got {buckets!r}")
        for bucket in buckets:
            unknown = sorted(k for k in bucket if not k.startswith("max_") and k not in DEFAULTS[op])
            if unknown:
                raise ValueError(f"{where}: {op} bucket {bucket} has keys no {op} config has: {unknown}")
        bounded = [k for k in buckets[-1] if k.startswith("max_")]
        if bounded:
            raise ValueError(f"{where}: {op}'s last bucket is bounded ({bounded}): keys past it would have no config")
        shared = ONE_ARITHMETIC_KEYS.get(op, ())
        forms = sorted({tuple(b.get(k, DEFAULTS[op].get(k)) for k in shared) for b in buckets}, key=str)
        if len(forms) > 1:
            raise ValueError(f"{where}: {op}'s buckets differ in {shared}: {forms}; decode and verify would compute "
                             f"a token apart (speculation no longer lossless): keep them the same in every bucket")
    down = table["ops"].get("fused_moe_int4_gemv_down", [DEFAULTS["fused_moe_int4_gemv_down"]])
    if down[0].get("F16", DEFAULTS["fused_moe_int4_gemv_down"]["F16"]):
        gate_up = table["ops"].get("fused_moe_int4_gemv_gate_up", [DEFAULTS["fused_moe_int4_gemv_gate_up"]])
        rows = [b.get("BLOCK_N", DEFAULTS["fused_moe_int4_gemv_gate_up"]["BLOCK_N"]) for b in gate_up]
        if any(bn % 8 for bn in rows):
            raise ValueError(f"{where}: the INT4 GEMV down kernel's packed fp16 form (F16) needs gate_up BLOCK_N a "
                             f"multiple of 8 in every bucket, got {rows}")


@functools.cache
def _load_table(path: str) -> dict:
    try:
        table = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"kernel config table {path!r} cannot be read: {e}") from e
    if not isinstance(table, dict) or not isinstance(table.get("ops"), dict):
        raise ValueError(f"kernel config table {path!r} has no 'ops' mapping (see kernels/configs/sm_90.json)")
    return table


def _pick_bucket(buckets: list[dict], key_name: str, key: int) -> dict:
    for bucket in buckets:
        bound = bucket.get(f"max_{key_name}")
        if bound is None or key <= bound:
            return {k: v for k, v in bucket.items() if not k.startswith("max_")}
    raise ValueError(f"no bucket covers {key_name}={key} (last bucket must be unbounded)")


# The autotuned configs of this process, per cache file (a GPU kind's, under the cache dir as it is at the call): a
# process with two kinds of GPU, or a cache dir changed between calls, keeps each file's entries to itself.
_tuned: dict[Path, dict[str, dict]] = {}


def _cache_file(arch: str, sms: int, name: str) -> Path:
    safe = "".join(ch if ch.isalnum() else "_" for ch in name)
    return env.cache_dir() / f"tuning-{arch}-{sms}sm-{safe}.json"  # (read at each call, as env.py's knobs are)


def table_config(table: dict, op: str, key_name: str, key: int) -> dict:
    """`op`'s config at `key_name=key` in a config table (its bucket over the defaults), as get_config reads it."""
    return {**DEFAULTS[op], **_pick_bucket(table["ops"][op], key_name, key)}


def get_config(op: str, device: torch.device, key_name: str, key: int,
               bench: Callable[[dict], float] | None = None) -> dict:
    """Config for `op` at `key_name=key` on `device`.

    bench(config) -> microseconds, used only on a GPU with no table and not under graph capture.
    """
    if device.type != "cuda" or interpreting():
        return dict(DEFAULTS[op])
    arch, sms, name = device_key(device.index if device.index is not None else torch.cuda.current_device())
    table = _table(arch, sms)
    if table is not None and op in table["ops"]:
        return table_config(table, op, key_name, key)
    if bench is None or op not in CANDIDATES or torch.cuda.is_current_stream_capturing():
        return dict(DEFAULTS[op])
    return _autotune(op, arch, sms, name, f"{key_name}={_bucket_of(key)}", bench)


def bench_us(fn: Callable[[], object]) -> float:
    """Median microseconds of fn over event-timed repeats (for autotuning, not for reported numbers)."""
    import triton.testing

    return 1000.0 * triton.testing.do_bench(fn, warmup=5, rep=20, return_mode="median")


def _bucket_of(key: int) -> int:
    """Power-of-two bucket so that autotuning runs once per size class, not per exact shape."""
    return 1 << max(0, (key - 1).bit_length())


def _read_cache(path: Path) -> dict[str, dict]:
    """An autotuning cache file's entries; one that cannot be read as them is tuned afresh (and rewritten) with a
    warning that names it, rather than failing the forward that asked."""
    if not path.exists():
        return {}
    try:
        entries = json.loads(path.read_text())
        if isinstance(entries, dict) and all(isinstance(v, dict) for v in entries.values()):
            return entries
        problem = "not a JSON object of configs"
    except (OSError, ValueError) as exc:
        problem = str(exc)
    logger.warning("autotuning cache %s unreadable (%s): tuning again, it will be rewritten", path, problem)
    return {}


def _autotune(op: str, arch: str, sms: int, name: str, key: str, bench: Callable[[dict], float]) -> dict:
    cache_key = f"{op}/{key}"
    path = _cache_file(arch, sms, name)
    if path not in _tuned:
        _tuned[path] = _read_cache(path)
    tuned = _tuned[path]
    if cache_key in tuned:
        return {**DEFAULTS[op], **tuned[cache_key]}
    timings = []
    for cand in CANDIDATES[op]:
        try:
            timings.append((bench({**DEFAULTS[op], **cand}), cand))
        except Exception as exc:  # a candidate that does not compile or fit on this GPU is skipped
            logger.debug("candidate %s for %s failed: %s", cand, cache_key, exc)
    if not timings:
        return dict(DEFAULTS[op])
    best_us, best = min(timings, key=lambda tc: tc[0])
    logger.info("autotuned %s on %s (%s, %d SMs): %s in %.1f us", cache_key, name, arch, sms, best, best_us)
    tuned[cache_key] = best
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(tuned, indent=1, sort_keys=True))
    return {**DEFAULTS[op], **best}
