"""Every environment variable sglang_eagle3 reads, typed, in one place.

Read at call time (not import time), so a test or a launcher that sets one before calling in sees it.
Variables we only *report* (NCCL_*, CUDA_*: the worker environment) are in env_report.py, not here.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path


def _flag(name: str) -> bool:
    return os.environ.get(name, "0") == "1"


@dataclass(frozen=True)
class Knob:
    name: str
    help: str

    def raw(self) -> str | None:
        return os.environ.get(self.name)

    def flag(self) -> bool:
        return _flag(self.name)

    def switch(self, default: bool) -> bool:
        """A 0/1 knob: unset or empty gives ``default``; any value but 0 or 1 is an error naming it."""
        raw = self.raw()
        if raw not in (None, "", "0", "1"):
            raise ValueError(f"{self.name}={raw!r}: expected 0 (off) or 1 (on), or unset "
                             f"({'on' if default else 'off'})")
        return default if raw in (None, "") else raw == "1"

    def number(self, default: float) -> float:
        """A number >= 0 (``inf`` allowed): unset or empty gives ``default``; anything else is an error naming it."""
        raw = self.raw()
        if raw in (None, ""):
            return default
        try:
            value = float(raw)
        except ValueError:
            value = float("nan")
        if not value >= 0:
            raise ValueError(f"{self.name}={raw!r}: expected a number >= 0 (or inf), or unset ({default:g})")
        return value


TRITON_INTERPRET = Knob("TRITON_INTERPRET", "Triton's own: run kernels in its CPU interpreter (tests)")
DISABLE_MMA_V3 = Knob("DISABLE_MMA_V3", "Triton's own: 1 compiles Hopper's dots with mma.sync, not wgmma "
                       "(with EMULATE_GPU=sm_120: as that card compiles them)")
TRITON_ON_CPU = Knob("SGLANG_EAGLE3_TRITON_ON_CPU",
                     "with TRITON_INTERPRET=1, route the kernel entry points to Triton on CPU tensors (tests)")
CACHE_DIR = Knob("SGLANG_EAGLE3_CACHE_DIR", "autotuning cache (default ~/.cache/sglang_eagle3)")
CONFIG_TABLE = Knob("SGLANG_EAGLE3_CONFIG_TABLE",
                    "path of a kernel config table (kernels/configs/sm_*.json format, e.g. a --sweep's "
                    "sweep_table.json) used in place of the checked-in one for its GPU")
EMULATE_GPU = Knob("SGLANG_EAGLE3_EMULATE_GPU",
                   "sm_120: make every launch decision for the RTX PRO 6000 Blackwell on the GPU at hand (its config "
                   "table, 188 SMs for the grids, 99 KB of shared memory a block; kernels/tuning.py EMULATED_GPUS), to "
                   "run the derived table's configs on a Hopper GPU; with DISABLE_MMA_V3=1 Triton compiles the dots "
                   "with mma.sync as for sm_120. Correctness and relative cost only: not an sm_120 timing")
FAULT_INJECT = Knob("SGLANG_EAGLE3_FAULT_INJECT",
                    "test hook: 'rank=R,at=start' or 'rank=R,at=step:N' makes that TP worker fail (with ',hang=1': "
                    "stop answering there)")
OVERLAY_CONFIG = Knob("SGLANG_EAGLE3_OVERLAY", "set by apply(): the overlay config SGLang's workers re-apply")
OVERLAY_FORCE = Knob("SGLANG_EAGLE3_FORCE", "1: apply the overlay to an unsupported SGLang version")
STRICT_VERIFY = Knob("SGLANG_EAGLE3_STRICT_VERIFY", "1: launch_server --backend sglang fails instead of eager verify")
NO_MOE_ROUTING = Knob("SGLANG_EAGLE3_NO_MOE_ROUTING", "1: launch_server --backend sglang keeps SGLang's routing")
KEEP_GRAPH_BS = Knob("SGLANG_EAGLE3_KEEP_GRAPH_BS",
                     "1: launch_server --backend sglang does not add --cuda-graph-max-bs-decode")
GIT_COMMIT = Knob("GIT_COMMIT", "commit benchmarks record instead of HEAD (a copy elsewhere may carry stale git data)")
PDL = Knob("SGLANG_EAGLE3_PDL",
           "0: launch the Triton kernels without programmatic dependent launch (unset or 1: with it, on sm_90+)")
PDL_SKIP = Knob("SGLANG_EAGLE3_PDL_SKIP",
                "with PDL: comma list of kernel families launched without it (gemv, mla, moe, norm, rotary, topk)")
PDL_L2_PREFETCH = Knob("SGLANG_EAGLE3_PDL_L2_PREFETCH",
                       "1: with PDL a GEMV asks the L2 for its weight slab before it waits (off: slower on the H200)")
MOE_DOWN_PRELOAD = Knob("SGLANG_EAGLE3_MOE_DOWN_PRELOAD",
                        "0: the INT4 MoE down kernel always loads its weights after its PDL wait, slot by slot "
                        "(unset or 1: as the config table says; the H200's loads all k slots' weights before the "
                        "wait at T <= 4, while gate_up runs; kernels/fused_moe.py)")
GEMV_LEAN = Knob("SGLANG_EAGLE3_GEMV_LEAN",
                 "0: the skinny GEMM's pipelines as deep as shared memory allows (up to 4 stages of 256-wide K "
                 "tiles, the third session's heuristic); unset or 1: split-K launches at 3 stages, unsplit "
                 "short-K ones at 64-wide tiles 8 deep (kernels/gemv.py gemv_config)")
GEMV_FMA = Knob("SGLANG_EAGLE3_GEMV_FMA",
                "0: every skinny GEMM on the tensor-core kernel; 1: small K-contiguous projections without an "
                "epilogue (MLA's q_b, with its q_a norm, and W_UV per head), MLA's q_a + kv_a pair and a MoE "
                "layer's router + shared gate/up pair on the "
                "CUDA-core kernels wherever kernels/gemv.py fma_form / fma_pair_form take them; unset: as 1 for "
                "direct kernel calls, and in an engine only when its CUDA graphs serve "
                "one request a step (cuda_graph_max_bs 1: kernels/gemv.py fma_for_engine); read as layers are set up "
                "and graphs captured")
GEMV_FMA_CONFIG = Knob("SGLANG_EAGLE3_GEMV_FMA_CONFIG",
                       "the CUDA-core GEMV's launch config for every matrix it serves, e.g. "
                       "'BLOCK_N=8,LANES=32,num_warps=8,MAX_ROWS=8' (keys of kernels/gemv.py fma_config, "
                       "LANES_FIRST=0/1 optional; tuning another GPU, A/B runs; read as graphs are captured); unset: "
                       "fma_config's")
GEMV_LANES_FIRST = Knob("SGLANG_EAGLE3_GEMV_LANES_FIRST",
                        "unset or 1: the CUDA-core GEMV forms hold their weight tile lanes first (kernels/gemv.py "
                        "lanes_first; the default since the thirty-sixth session, paired on the H200); 0: weight "
                        "rows first (other bits, the same at every T); read as graphs are captured")
GEMV_GROUPS_INNER = Knob("SGLANG_EAGLE3_GEMV_GROUPS_INNER",
                         "which CUDA-core GEMV launches start a weight block's row-group programs side by side "
                         "past 4 rows of x (kernels/gemv.py row_groups_inner): pairs (unset: the default), all or "
                         "none (same bits; A/B runs); read as graphs are captured")
GEMV_FMA_PLAIN_PAIR = Knob("SGLANG_EAGLE3_GEMV_FMA_PLAIN_PAIR",
                           "0: a pair launch of two plain matrices (MLA's q_a + kv_a) stays on the tensor cores; "
                           "unset or 1: it takes the CUDA-core form where the engine allows that form (kernels/gemv.py "
                           "fma_pair_form; the default since the thirty-seventh session, paired on the H200); read "
                           "as graphs are captured")
MOE_DOT_MAX = Knob("SGLANG_EAGLE3_MOE_DOT_MAX",
                   "largest token count (from 2) whose INT4 MoE takes the dot path (gate_up as tensor-core dots "
                   "over each expert's pairs); 0: never (the GEMV path); unset: kernels/fused_moe.py DOT_MAX_TOKENS")
NO_FUSE = Knob("SGLANG_EAGLE3_NO_FUSE",
               "comma list of launch fusions to switch off, or 'all' (bisecting a numerical difference); unset: "
               "DEFAULT_NO_FUSE (input_norm,router_topk,q_rope_attn,route_shared_down,rope_wuk), '' turns every "
               "one on: "
               "qa_norm (q_a RMSNorm in q_b's GEMV), kv_norm (kv_a RMSNorm in the rotary launch), "
               "router_shared (router + shared expert gate/up in one GEMV), input_norm (a decoder layer's input "
               "RMSNorm and residual add in the q_a + kv_a GEMV), router_topk (the MoE routing in the tail of "
               "router_shared's GEMV; off with it), q_rope_attn (q's rope applied by the MLA kernel as it loads "
               "q, so the rotary launch does only k and the latent), route_shared_down (the MoE routing in "
               "programs beside the shared expert's down projection, one launch on the main stream; with "
               "router_shared, without router_topk), rope_wuk (MLA's rotary launch, q rope + kv_a norm + k rope "
               "into the cache, as programs of W_UK's GEMV launch; without q_rope_attn and the rope_side overlap)")
OVERLAP = Knob("SGLANG_EAGLE3_OVERLAP",
               "comma list of side-stream overlaps (layers/overlap.py), or 'none': shared_down (shared expert's "
               "down projection beside the routing), mla_k_path (MLA's kv_a norm + k rope into the cache beside "
               "q_b and W_UK, with the q_rope_attn fusion), rope_side (MLA's rotary launch beside W_UK), one of "
               "prefetch_attn / prefetch_late / prefetch_next / prefetch_mid / prefetch_mid_o (L2 prefetch of "
               "weights a layer reads later; the mid plans fork after the layer's q_a + kv_a launch), "
               "prefetch_next_moe (the next layer's q_a + kv_a, forked after the MoE router launch); unset: "
               "DEFAULT_OVERLAP")
SAMPLER_RADIX = Knob("SGLANG_EAGLE3_SAMPLER_RADIX",
                     "0: the sampler's top_k / top_p thresholds by sorting each row on CUDA too (the path before the "
                     "radix select, for A/B runs; read as graphs are captured: set it before the engine starts); "
                     "unset or 1: kernels.top_threshold (runtime/sampling.py filtered_scores)")
GRAMMAR_PREFILL_BELOW_US = Knob(
    "SGLANG_EAGLE3_GRAMMAR_PREFILL_BELOW_US",
    "microseconds: a request with a grammar has its mask row filled before each draft step where its recent rows "
    "took under this long, else its draft picks among the step's candidates and the rows fill while the verify runs "
    "(runtime/grammar.py; 0: candidates always, inf: rows ahead always; unset: grammar.PREFILL_BELOW_S)")
ADAPTIVE_CHANGE_NATS = Knob(
    "SGLANG_EAGLE3_ADAPTIVE_CHANGE_NATS",
    "the adaptive draft length's change test: nats of evidence at which position 1's recent checks replace the "
    "older ones (runtime/adaptive.py; inf: no test, the half-life alone; read when the engine starts; unset: "
    "AdaptiveConfig.change_nats)")
ADAPTIVE_STEP_UP = Knob(
    "SGLANG_EAGLE3_ADAPTIVE_STEP_UP",
    "0: the adaptive draft length may jump to any candidate (for A/B runs); unset or 1: no further than one candidate "
    "past the deepest draft position with evidence (runtime/adaptive.py AdaptiveConfig.step_up; read when the "
    "engine starts)")

ROUTING_TRACE = Knob(
    "SGLANG_EAGLE3_ROUTING_TRACE",
    "path: write every MoE layer's expert ids of each eager target forward there, one JSON line a forward "
    "(runtime/routing_trace.py; needs disable_cuda_graph=True), for benchmarks/routing.py's --routing trace:PATH")

MAX_THINK_TOKENS = Knob(
    "SGLANG_MAX_THINK_TOKENS",
    "SGLang's own (its name kept): the thinking budget of a request that names none, under strict thinking "
    "(EngineArgs.enable_strict_thinking, --enable-strict-thinking; runtime/reasoning.py): once the thinking holds "
    "this many tokens, its end marker is forced; negative or unset: no limit; read when the engine starts")

ALL = (TRITON_INTERPRET, DISABLE_MMA_V3, TRITON_ON_CPU, CACHE_DIR, CONFIG_TABLE, EMULATE_GPU, FAULT_INJECT,
       OVERLAY_CONFIG, OVERLAY_FORCE, STRICT_VERIFY, NO_MOE_ROUTING, KEEP_GRAPH_BS, GIT_COMMIT, PDL, PDL_SKIP,
       PDL_L2_PREFETCH, MOE_DOWN_PRELOAD, GEMV_LEAN, GEMV_FMA, GEMV_FMA_CONFIG, GEMV_LANES_FIRST, GEMV_GROUPS_INNER,
       GEMV_FMA_PLAIN_PAIR, MOE_DOT_MAX, NO_FUSE, OVERLAP, SAMPLER_RADIX, GRAMMAR_PREFILL_BELOW_US,
       ADAPTIVE_CHANGE_NATS, ADAPTIVE_STEP_UP, ROUTING_TRACE, MAX_THINK_TOKENS)


# What runs when SGLANG_EAGLE3_OVERLAP is unset (layers/overlap.py), chosen on the H200 (docs/BENCHMARKS.md,
# benchmarks/results/h200/overlap_step_*.json): the shared expert's down projection beside the routing saved
# ~0.1 ms a decode step; every L2 prefetch plan cost 0.1-0.5 ms there, so none is on (the RTX PRO 6000's
# 128 MB L2 may differ: measure with bench_verify_graph.py --overlap-variants); rope_side cost 1.6-3.2%.
DEFAULT_OVERLAP = "shared_down"


@contextlib.contextmanager
def overrides(values: dict[str, str | None]) -> Iterator[None]:
    """Sets (a None value: unsets) these variables for the block, then puts each back as it was (benchmarks
    timing one setting after another in one process; tests building models under a knob)."""
    old = {name: os.environ.get(name) for name in values}
    for name, value in values.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    try:
        yield
    finally:
        for name, value in old.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def max_think_tokens() -> int | None:
    """SGLANG_MAX_THINK_TOKENS as a budget: None where unset, empty or negative (SGLang's -1, no limit); anything but
    an integer is an error naming it."""
    raw = MAX_THINK_TOKENS.raw()
    if raw in (None, ""):
        return None
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{MAX_THINK_TOKENS.name}={raw!r}: expected an integer (negative: no limit), or "
                         "unset") from None
    return None if value < 0 else value


def cache_dir() -> Path:
    return Path(CACHE_DIR.raw() or Path.home() / ".cache" / "sglang_eagle3")


# Off unless SGLANG_EAGLE3_NO_FUSE is set without them, as measured on the H200 (docs/BENCHMARKS.md, fourth
# session): input_norm made the decode step slower (7.28 ms against 5.48, step_fold_*_f8980fd.json: its K tile
# had to shrink to 64 to compile without spills); router_topk gains nothing at decode and costs 9-23 us a layer
# at T = 4-8 (one program routes the rows one after another; step_*_a17a6fd.json); q_rope_attn's model-level
# GPU test fails on the H200 (mismatched logits, then an illegal memory access; tests/kernels/test_mla_rope_gpu.py).
# route_shared_down: one launch for the shared down and the routing is 1.2-1.5 us faster than the two in a row
# (bench_small_ops.py), but the step with the shared down on the side stream beside the routing (the
# shared_down overlap) was 0.04-0.1 ms faster than with it (step_new_ab1ca21.json, ninth session).
# Re-measured in the twenty-eighth session, against the twenty-seventh's kernels (step_fusions_82ef67a.json,
# the step alternating twice in one process): route_shared_down -1% at decode, +4% at verify T=4; input_norm
# +50-67%; q_rope_attn +2-4% (medians, decode and verify). All stay off.
# rope_wuk (twenty-ninth session): 0.7-1.05 us a layer faster alone (bench_small_ops.py), no faster in the step
# (4.36 / 4.39 ms at decode 1k, 5.81 / 5.80 at T=4, medians of six alternations, step_rope_wuk_x6_16aacf9.json):
# off, the same time with more code on the default path. Paired (thirtieth session, bench_verify_graph.py --paired,
# 95% intervals of +-0.1%): rope_wuk x1.004-1.009 and route_shared_down x1.005-1.051 of the defaults
# (paired_rope_wuk_59d360f.json, paired_knobs_9e110b6.json): slower, both.
# input_norm again (fifty-fourth session, H100, paired at 1k with uniform routing,
# benchmarks/results/h100/session54_e{1,2}_paired_fold_*.json, two machines): the fold now runs in the CUDA-core q_a +
# kv_a pair wherever that pair runs (kernels/triton/gemv.py gemv_fma_pair_kernel), x0.990-0.992 at decode but x1.07 /
# 1.15 / 1.14 at T = 2 / 4 / 8: each of the pair's 528 programs reads its rows of h and the residual twice (for the
# rstd, then for the products), and past one row the registers leave 3 blocks a SM for a grid that needs 4. Stays off.
DEFAULT_NO_FUSE = "input_norm,router_topk,q_rope_attn,route_shared_down,rope_wuk"
FUSIONS = ("qa_norm", "kv_norm", "router_shared", "input_norm", "router_topk", "q_rope_attn", "route_shared_down",
           "rope_wuk")


def fusion_on(name: str) -> bool:
    """Whether launch fusion ``name`` (one of FUSIONS) is on: all are, unless SGLANG_EAGLE3_NO_FUSE names it
    (unset: DEFAULT_NO_FUSE; set to "" every fusion is on). Layers read this once, when they are built."""
    assert name in FUSIONS, name
    raw = NO_FUSE.raw()
    raw = (DEFAULT_NO_FUSE if raw is None else raw).strip()
    off = {n.strip() for n in raw.split(",") if n.strip()}
    unknown = off - set(FUSIONS) - {"all"}
    if unknown:
        raise ValueError(f"{NO_FUSE.name}={raw!r}: unknown fusion(s) {sorted(unknown)}; known: "
                         f"{', '.join(FUSIONS)} or all")
    return "all" not in off and name not in off
