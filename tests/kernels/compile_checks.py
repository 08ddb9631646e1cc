"""Compile the Triton kernels for real GPUs without one: Triton's own ptxas (shipped in its wheel) turns them
into sm_90 (H200) and sm_120 (RTX PRO 6000 Blackwell) cubins on a CPU machine. The interpreter runs kernels
as NumPy, so it never sees what only the GPU compiler rejects (non-constexpr globals, reassigned constexprs)
nor what it generates; this catches both: every kernel must compile without spilling to local memory, the
rotary kernel must contain no FFMA (its bit-exactness against torch relies on it), the INT4 GEMV inner
loop must stay near 4 SASS instructions per weight (one LOP3 + FADD + FFMA per weight is the design) with no
layout conversion of weight-sized tiles (they would show up as shared-memory barriers), and the GEMV carries
its in-launch split handshake exactly when it splits.

Run as ``python compile_checks.py [NAME ...]``: one JSON line per check (as kernel_checks.py does).
"""

from __future__ import annotations

import collections
import inspect
import json
import os
import re
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from sglang_eagle3.kernels import tuning
from sglang_eagle3.kernels.gemv import NORM_POST_LIMITS, gemv_config
from sglang_eagle3.kernels.mla_attention import launch_plan, merge_tile, split_pass_smem, split_pass_stages
from sglang_eagle3.kernels.triton import fused_moe as fm
from sglang_eagle3.kernels.triton import gemv as gv
from sglang_eagle3.kernels.triton import mla_attention as ma
from sglang_eagle3.kernels.triton import prefetch as pf
from sglang_eagle3.kernels.triton import rms_norm as rn
from sglang_eagle3.kernels.triton import rotary as ro

BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
MAX_GEMV_INSTR_PER_WEIGHT = 5.0
MAX_GEMV_F16_INSTR_PER_WEIGHT = 3.3
MAX_DOWN_F16_INSTR_PER_WEIGHT = 4.0  # the whole (straight-line) down kernel; ~4.3 (slot loop) / 5.1 (PRELOAD) in fp32


def compile_kernel(fn, sig: dict, consts: dict, aligned: list[str], arch: int, num_warps: int = 4,
                   num_stages: int = 1, **options):
    """`fn` compiled for sm_<arch> (Triton's CompiledKernel: .asm holds every stage's IR, .metadata.shared the
    shared memory a block takes). `aligned` args get the 16-byte divisibility the JIT infers for aligned tensors
    and strides."""
    # A constexpr parameter the caller leaves out takes its default, as a launch that omits it does.
    consts = {**{p.name: p.default for p in fn.params
                 if p.is_constexpr and p.name not in consts and p.default is not inspect.Parameter.empty}, **consts}
    sig = {**sig, **{k: "constexpr" for k in consts if k not in sig}}
    signature = {k: ("constexpr" if k in consts else v) for k, v in sig.items()}
    attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in aligned}
    return triton.compile(ASTSource(fn, signature, constexprs=consts, attrs=attrs),
                          target=GPUTarget("cuda", arch, 32),
                          options=dict(num_warps=num_warps, num_stages=num_stages, **options))


def compile_sass(fn, sig: dict, consts: dict, aligned: list[str], arch: int, num_warps: int = 4,
                 num_stages: int = 1, **options) -> tuple[str, str]:
    """(SASS text, resource usage line) of `fn` compiled for sm_<arch> (compile_kernel's arguments)."""
    return sass_of(compile_kernel(fn, sig, consts, aligned, arch, num_warps, num_stages, **options))


def sass_of(kernel) -> tuple[str, str]:
    """(SASS text, resource usage line) of a compiled kernel."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        sass = subprocess.run([os.path.join(BIN, "cuobjdump"), "-sass", f.name], capture_output=True, text=True,
                              check=True).stdout
        res = subprocess.run([os.path.join(BIN, "cuobjdump"), "-res-usage", f.name], capture_output=True, text=True,
                             check=True).stdout
    return sass, " ".join(re.findall(r"(?:REG|STACK|SHARED|LOCAL):\d+", res))


def _no_spills(res: str, what: str) -> None:
    local = int(re.search(r"LOCAL:(\d+)", res).group(1))
    stack = int(re.search(r"STACK:(\d+)", res).group(1))
    assert local == 0 and stack == 0, f"{what} spills to local memory: {res}"


def _no_local(res: str, what: str) -> None:
    """No spills to local memory (a stack frame of a few bytes without local traffic is allowed)."""
    assert int(re.search(r"LOCAL:(\d+)", res).group(1)) == 0, f"{what} spills to local memory: {res}"


def _instructions(sass: str) -> list[str]:
    """The SASS text's instructions, one a line, without their addresses and encodings."""
    return re.findall(r"/\*[0-9a-f]{4,}\*/\s+(.*?);", sass)


def _opcodes(lines: list[str]) -> collections.Counter:
    return collections.Counter(re.sub(r"^@!?U?P\w+\s+", "", x).split()[0].split(".")[0] for x in lines)


def _innermost_loop(sass: str) -> list[str]:
    """Instructions of the shortest backward-branch span (the innermost loop)."""
    ins = [(int(m.group(1), 16), m.group(2)) for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+(.*?);", sass)]
    loops = []
    for addr, txt in ins:
        target = re.search(r"BRA(?:\.\w+)* .*?0x([0-9a-f]+)", txt)  # BRA, BRA.U, BRA.DIV ...
        if target and int(target.group(1), 16) < addr:
            start = int(target.group(1), 16)
            loops.append([x for a, x in ins if start <= a <= addr])
    assert loops, "no loop found"
    return min(loops, key=len)


# Shared memory a block may opt into: sm_90 (H100/H200) 227 KB, sm_120 (RTX PRO 6000 Blackwell) 99 KB.
SMEM_PER_BLOCK = {90: 227 << 10, 120: 99 << 10}


GATE_UP_SIG = dict(x_ptr="*bf16", w13_ptr="*i32", s13_ptr="*bf16", ids_ptr="*i32", act_ptr="*fp32",
                   stride_xt="i32", stride_we="i32", stride_wn="i32", stride_se="i32", stride_sn="i32",
                   stride_at="i32", TK="i32", I="i32", H_WORDS="i32", magic="i32", TOP_K="i32", TK_PAD="i32",
                   GROUP_WORDS="i32", BLOCK_N="i32", BLOCK_W="i32", EVEN="i32", PER_PAIR="i32", SHIFT16="i32",
                   F16="i32")
GATE_UP_ALIGNED = ["x_ptr", "w13_ptr", "s13_ptr", "ids_ptr", "act_ptr", "stride_xt", "stride_we", "stride_wn",
                   "stride_se", "stride_sn", "stride_at", "I", "H_WORDS"]
DOWN_SIG = dict(act_ptr="*fp32", w2_ptr="*i32", s2_ptr="*bf16", ids_ptr="*i32", topk_w_ptr="*fp32",
                add_ptr="*bf16", out_ptr="*bf16", stride_at="i32", stride_we="i32", stride_wn="i32",
                stride_se="i32", stride_sn="i32", stride_addt="i32", stride_ot="i32", H="i32", magic="i32",
                I_WORDS="i32", TOP_K="i32", GROUP_WORDS="i32", HAS_ADD="i32", BLOCK_N="i32", BLOCK_W="i32",
                EVEN="i32", PDL="i32", PRELOAD="i32", SHIFT16="i32", F16="i32")
DOWN_ALIGNED = ["act_ptr", "w2_ptr", "s2_ptr", "ids_ptr", "topk_w_ptr", "add_ptr", "out_ptr", "stride_at",
                "stride_we", "stride_wn", "stride_se", "stride_sn", "stride_addt", "stride_ot", "H"]


def check_gemv(arch: int) -> dict:
    """INT4 GEMV kernels at Kimi TP=8 shapes (the sm_90 defaults and a sweep candidate), both mask modes."""
    out = {}
    # gate_up with one program per pair (the default) at the table's configs (T=1, then T >= 2, with SHIFT16 as the
    # launcher gives it) in both mask modes, and with the expert's first pair working for all (PER_PAIR=False).
    # The packed fp16 form (F16) at the same tiles: the dots as HFMA2 (two weights an op), ~2.1 instructions a
    # weight, plus the per-chunk work on x (rounding, packing, the move to the weights' layout) that a thread's
    # 8-16 words share: ~3.0 at the T=1 and T >= 2 configs, against the fp32 form's ~4.2.
    # ACT_F16: act stored for down's packed fp16 form (a scale per word of 8: outside the loop).
    for bn, bw, warps, per_pair, shift16, f16, act_f16 in ((16, 128, 8, True, False, False, False),
                                                           (8, 128, 4, True, True, False, False),
                                                           (4, 128, 2, False, True, False, False),
                                                           (16, 128, 8, True, False, True, True),
                                                           (8, 128, 4, True, True, True, False),
                                                           (32, 128, 4, True, True, True, True)):
        for even in (True, False):
            sass, res = compile_sass(fm.moe_int4_gemv_gate_up_kernel,
                                     {**GATE_UP_SIG, "act_ptr": "*i32" if act_f16 else "*fp32", "ACT_F16": "i32"},
                                     dict(TOP_K=8, TK_PAD=8, GROUP_WORDS=4, BLOCK_N=bn, BLOCK_W=bw, EVEN=even,
                                          PER_PAIR=per_pair, SHIFT16=shift16, F16=f16, ACT_F16=act_f16),
                                     GATE_UP_ALIGNED, arch, warps)
            _no_spills(res, f"gate_up {bn=} {bw=} {even=} {per_pair=} {f16=}")
            loop = _innermost_loop(sass)
            per_weight = len(loop) / (2 * bn * bw * 8 / (32 * warps))  # gate + up rows, 8 weights a word
            ops = _opcodes(loop)
            out[f"gate_up_bn{bn}_bw{bw}_even{int(even)}_pp{int(per_pair)}_s16{int(shift16)}_f16{int(f16)}"
                f"_act{int(act_f16)}"] = round(per_weight, 2)
            if f16:
                assert per_weight <= MAX_GEMV_F16_INSTR_PER_WEIGHT and ops["HFMA2"] > 0, (
                    f"F16 gate_up inner loop {per_weight:.2f} SASS instructions a weight: {dict(ops.most_common(10))}")
            elif even:
                assert per_weight <= MAX_GEMV_INSTR_PER_WEIGHT, (
                    f"gate_up inner loop {per_weight:.2f} SASS instructions per weight (> "
                    f"{MAX_GEMV_INSTR_PER_WEIGHT}): {dict(ops.most_common(10))}")
                # Only small tiles change layout through shared memory (a store, a barrier, a load, a barrier
                # each): the two scale tiles ([BLOCK_N, BLOCK_W/4] bf16) and the 8 columns of the x chunk
                # ([BLOCK_W] fp32 each, see _x_columns); a conversion of a weight-sized tile would add more
                # (the first version of this kernel had 26).
                assert ops["BAR"] <= 20, f"barriers in the gate_up inner loop (layout conversions): {dict(ops)}"
    # gate_up's ROWS form (a word decoded once for up to ROWS pairs of an expert) at the sm_90 table's buckets that
    # take it, both mask modes, with and without SHIFT16: no local memory (a few bytes of stack at 255 registers
    # are allowed), and the weights decoded once: one decode's 4 LOP3 a word in the program, not one per row.
    sm90 = json.loads((Path(tuning.__file__).parent / "configs" / "sm_90.json").read_text())
    for cfg in (b for b in sm90["ops"]["fused_moe_int4_gemv_gate_up"] if b.get("ROWS", 1) > 1):
        for even, shift16 in ((True, False), (True, True), (False, True)):
            bn, warps, rows = cfg["BLOCK_N"], cfg["num_warps"], cfg["ROWS"]
            sass, res = compile_sass(fm.moe_int4_gemv_gate_up_kernel,
                                     {**GATE_UP_SIG, "act_ptr": "*i32", "ACT_F16": "i32", "ROWS": "i32"},
                                     dict(TOP_K=8, TK_PAD=64, GROUP_WORDS=4, BLOCK_N=bn, BLOCK_W=cfg["BLOCK_W"],
                                          EVEN=even, PER_PAIR=True, SHIFT16=shift16, F16=True, ACT_F16=True,
                                          ROWS=rows), GATE_UP_ALIGNED, arch, warps)
            _no_local(res, f"gate_up ROWS={rows} {bn=} {warps=} {even=} {shift16=}")
            words = 2 * bn * cfg["BLOCK_W"] // (32 * warps)  # gate + up words a thread decodes per chunk
            lop3 = _opcodes(_instructions(sass))["LOP3"]
            assert words * 4 <= lop3 < words * 4 * rows, f"ROWS={rows}: {lop3} LOP3 for {words} words a chunk"
            out[f"gate_up_rows{rows}_bn{bn}_w{warps}_even{int(even)}_s16{int(shift16)}"] = res
    # down: the slot loop (PRELOAD off, the table's T > 2 config first) and every slot's weights before the PDL
    # wait (PRELOAD: the table's T <= 4 config first).
    # F16: act in the packed fp16 form (int32) and the dots as HFMA2, each word's sum times its factor: ~3.3 / 3.7
    # SASS instructions a weight over the whole kernel (slot loop / PRELOAD) against ~4.3 / 5.1.
    for bn, warps, preload, even, f16 in ((32, 4, False, True, False), (16, 2, False, True, False),
                                          (8, 2, True, True, False), (32, 8, True, True, False),
                                          (16, 2, True, False, False), (32, 4, False, True, True),
                                          (8, 2, True, True, True), (16, 2, True, False, True)):
        sass, res = compile_sass(fm.moe_int4_gemv_down_kernel, {**DOWN_SIG, "act_ptr": "*i32" if f16 else "*fp32"},
                                 dict(I_WORDS=32, TOP_K=8, GROUP_WORDS=4, HAS_ADD=True, BLOCK_N=bn, BLOCK_W=32,
                                      EVEN=even, PDL=preload, PRELOAD=preload, SHIFT16=bn != 8, F16=f16),
                                 DOWN_ALIGNED, arch, warps, enable_fp_fusion=False)  # as the launcher compiles it
        _no_spills(res, f"down {bn=} {warps=} {preload=} {even=} {f16=}")
        if f16 and even:
            ins = _instructions(sass)
            per_weight = len(ins) / (8 * bn * 32 * 8 / (32 * warps))  # 8 slots x BLOCK_N rows x 32 words x 8
            ops = _opcodes(ins)
            assert per_weight <= MAX_DOWN_F16_INSTR_PER_WEIGHT and ops["HFMA2"] > 0, (
                f"F16 down {bn=} {preload=}: {per_weight:.2f} SASS instructions a weight: {dict(ops.most_common(10))}")
            res += f" per_weight:{per_weight:.2f}"
        if preload:  # every weight load (.cg: LDG.*.STRONG.GPU) is issued before the wait (griddepcontrol.wait
            # is ACQBULK in SASS); after it only act's loads (L1-cached) and add's
            lines = sass.splitlines()
            wait = next(i for i, line in enumerate(lines) if "ACQBULK" in line)
            assert any(re.search(r"LDG\.E\.128\.STRONG\.GPU", line) for line in lines[:wait]), "no weight loads?"
            late = [line for line in lines[wait:] if re.search(r"LDG\.E\.\w+\.STRONG\.GPU", line)]
            assert not late, f"down {bn=} PRELOAD: wide weight loads after the wait: {late[:3]}"
        out[f"down_bn{bn}_w{warps}_preload{int(preload)}_even{int(even)}_f16{int(f16)}"] = res
    return out


def check_dot_gate_up(arch: int) -> dict:
    """The INT4 dot path's gate_up (tl.dot over an expert's pairs) at the tuning candidates (the table's first),
    split and not, both mask modes: no spills to local memory."""
    sig = {k: v for k, v in GATE_UP_SIG.items() if k not in ("PER_PAIR", "SHIFT16", "F16")}
    sig.update(part_ptr="*fp32", count_ptr="*i32", SPLIT_WORDS="i32", BLOCK_M="i32", SPLIT="i32", EXACT="i32",
               INTERPRET="i32", PDL="i32")
    out = {}
    cands = [tuning.DEFAULTS["fused_moe_int4_dot_gate_up"]] + tuning.CANDIDATES["fused_moe_int4_dot_gate_up"]
    for cfg in cands + [{**cands[0], "EXACT": True}, {**cands[0], "SPLIT": 1}]:
        for even in (True, False):
            consts = dict(TOP_K=8, TK_PAD=32, GROUP_WORDS=4, BLOCK_M=16, BLOCK_N=cfg["BLOCK_N"],
                          BLOCK_W=cfg["BLOCK_W"], SPLIT=cfg["SPLIT"], EVEN=even, EXACT=cfg["EXACT"],
                          INTERPRET=False, PDL=True)
            _, res = compile_sass(fm.moe_int4_dot_gate_up_kernel, sig, consts,
                                  GATE_UP_ALIGNED + ["part_ptr", "count_ptr"], arch, cfg["num_warps"])
            _no_local(res, f"dot gate_up {cfg} {even=}")
            out[f"{cfg['BLOCK_N']}x{cfg['BLOCK_W']}_w{cfg['num_warps']}_s{cfg['SPLIT']}_exact{int(cfg['EXACT'])}"
                f"_even{int(even)}"] = res
    return out


MAX_TILE_INSTR_PER_WEIGHT = 12.0  # INT4 tile gate_up inner loop, SASS per weight and thread (7.6-9.5 as built)


# The swap gate_up's loop, SASS per weight and thread: 4.3-4.5 at sm_90 as built (HGMMA; 5.2-6.0 with float32
# decode arithmetic instead of the bf16x2 PTX), 6.0-10.2 at sm_120 (HMMA, mma.sync's fragments).
MAX_SWAP_INSTR_PER_WEIGHT = {90: 6.0, 120: 12.0}


def _swap_gate_up(arch: int, cfg: dict, sig_of) -> dict:
    """The swap gate_up at a table config: no spills, HGMMA/HMMA with the decoded weights from registers (no
    shared-memory trip for them: the loop's STS are the activations'), and its loop near its design (a shift, a
    LOP3 and two bf16x2 FMAs for two weights)."""
    sig, aligned = sig_of(fm.moe_int4_swap_gate_up_kernel, {"x_ptr": "*bf16", "s13_ptr": "*bf16", "act_ptr": "*bf16"})
    consts = dict(TOP_K=8, GROUP_WORDS=4, BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], BLOCK_W=cfg["BLOCK_W"],
                  EVEN=True, INTERPRET=False)
    sass, res = compile_sass(fm.moe_int4_swap_gate_up_kernel, sig, consts, aligned, arch, num_warps=cfg["num_warps"])
    _no_local(res, f"swap gate_up {cfg}")
    assert ("HGMMA" if arch == 90 else "HMMA") in sass, f"swap gate_up {cfg}: no tensor-core MMA at sm_{arch}"
    per_weight = len(_innermost_loop(sass)) * cfg["num_warps"] * 32 / (2 * cfg["BLOCK_N"] * 8 * cfg["BLOCK_W"])
    assert per_weight <= MAX_SWAP_INSTR_PER_WEIGHT[arch], f"swap gate_up {cfg}: {per_weight:.1f} SASS a weight"
    return {"res": res, "instr_per_weight": round(per_weight, 2)}


def _swap_down(arch: int, cfg: dict, block_m: int, sig_of) -> str:
    sig, aligned = sig_of(fm.moe_int4_swap_down_kernel, {"act_ptr": "*bf16", "s2_ptr": "*bf16", "topk_w_ptr": "*fp32",
                                                          "out_ptr": "*fp32"})
    consts = dict(GROUP_WORDS=4, BLOCK_M=block_m, BLOCK_N=cfg["BLOCK_N"], BLOCK_W=cfg["BLOCK_W"], EVEN=True,
                  INTERPRET=False)
    _, res = compile_sass(fm.moe_int4_swap_down_kernel, sig, consts, aligned, arch, num_warps=cfg["num_warps"])
    _no_local(res, f"swap down {cfg} BLOCK_M={block_m}")
    return res


def check_tile_path(arch: int) -> dict:
    """The tile (tl.dot) kernels of fused_moe at the sm_90 table's INT4 configs and the bf16 defaults, the
    routing plan's one-program kernel and the slot sum with the shared-expert add: none spills to local memory
    (a few bytes of stack frame are reported, not failed), and the INT4 gate_up's loop over scale groups stays
    near its design (exact nibble decode, one dot per group, the scale on the result)."""
    table = json.load(open(os.path.join(os.path.dirname(tuning.__file__), "configs", "sm_90.json")))["ops"]
    out = {}
    common = dict(GROUP=32, BLOCK_K=32, INTERPRET=False, DOT_PRECISION="tf32")

    def sig_of(fn, floats):
        sig = {n: ("*i32" if n.endswith("_ptr") else "i32") for n in fn.arg_names}
        sig.update(floats)
        return sig, [n for n in fn.arg_names if n.endswith("_ptr") or n.startswith("stride") or n in ("H", "I")]

    for int4 in (True, False):
        wt = {} if int4 else {"w13_ptr": "*bf16", "w2_ptr": "*bf16"}
        gu_cfgs = table["fused_moe_int4_gate_up"] if int4 else [tuning.DEFAULTS["fused_moe_gate_up"]]
        dn_cfgs = table["fused_moe_int4_down"] if int4 else [tuning.DEFAULTS["fused_moe_down"]]
        for i, cfg in enumerate(gu_cfgs):
            if cfg.get("SWAP"):
                out[f"gate_up_int4{int(int4)}_{i}"] = _swap_gate_up(arch, cfg, sig_of)
                continue
            sig, aligned = sig_of(fm.moe_gate_up_kernel, {"x_ptr": "*bf16", "s13_ptr": "*bf16", "act_ptr": "*bf16",
                                                          **{k: v for k, v in wt.items() if k == "w13_ptr"}})
            consts = dict(common, TOP_K=8, INT4=int4, BLOCK_M=cfg.get("BLOCK_M", 16), BLOCK_N=cfg["BLOCK_N"])
            if not int4:
                consts["BLOCK_K"] = cfg["BLOCK_K"]
            sass, res = compile_sass(fm.moe_gate_up_kernel, sig, consts, aligned, arch, num_warps=cfg["num_warps"],
                                     num_stages=cfg["num_stages"])
            _no_local(res, f"gate_up int4={int4} {cfg}")
            row = {"res": res}
            if int4:
                per_weight = len(_innermost_loop(sass)) * cfg["num_warps"] * 32 / (2 * cfg["BLOCK_N"] * 32)
                assert per_weight <= MAX_TILE_INSTR_PER_WEIGHT, f"gate_up {cfg}: {per_weight:.1f} SASS a weight"
                row["instr_per_weight"] = round(per_weight, 2)
            out[f"gate_up_int4{int(int4)}_{i}"] = row
        for i, cfg in enumerate(dn_cfgs):
            if int4 and any(c.get("SWAP") for c in gu_cfgs):  # the plan's BLOCK_M: every gate_up bucket's
                for bm in sorted({c["BLOCK_M"] for c in gu_cfgs}):
                    out[f"down_int4_swap_{i}_m{bm}"] = _swap_down(arch, cfg, bm, sig_of)
                continue
            sig, aligned = sig_of(fm.moe_down_kernel, {"act_ptr": "*bf16", "s2_ptr": "*bf16", "topk_w_ptr": "*fp32",
                                                       "out_ptr": "*fp32",
                                                       **{k: v for k, v in wt.items() if k == "w2_ptr"}})
            consts = dict(common, INT4=int4, BLOCK_M=16, BLOCK_N=cfg["BLOCK_N"])
            if not int4:
                consts["BLOCK_K"] = cfg["BLOCK_K"]
            _, res = compile_sass(fm.moe_down_kernel, sig, consts, aligned, arch, num_warps=cfg["num_warps"],
                                  num_stages=cfg["num_stages"])
            _no_local(res, f"down int4={int4} {cfg}")
            out[f"down_int4{int(int4)}_{i}"] = res
    sig, aligned = sig_of(fm.moe_align_kernel, {})
    _, res = compile_sass(fm.moe_align_kernel, sig, dict(E_PAD=512, BLOCK_M=16, CHUNK=1024), aligned, arch)
    _no_local(res, "align")
    out["align"] = res
    _, res = compile_sass(fm.moe_sum_slots_kernel,
                          dict(per_pair_ptr="*fp32", add_ptr="*bf16", out_ptr="*bf16", stride_pt="i32",
                               stride_at="i32", stride_ot="i32", H="i32", TOP_K="i32", HAS_ADD="i32", BLOCK="i32"),
                          dict(TOP_K=8, HAS_ADD=True, BLOCK=1024), ["per_pair_ptr", "add_ptr", "out_ptr"], arch)
    _no_spills(res, "sum_slots")
    return out


def _memory_order(sass: str) -> dict:
    """Where the global loads fall against the PDL wait (ACQBULK) and the first global store: a load the compiler
    keeps below a store is one more memory round trip after the wait (kernels/triton/rotary.py's module doc)."""
    ops = [m.group(1) for m in re.finditer(r"\b(LDG|STG|ACQBULK)\b", sass)]
    wait = ops.index("ACQBULK") if "ACQBULK" in ops else 0
    first_store = ops.index("STG") if "STG" in ops else len(ops)
    return {"loads_before_wait": ops[:wait].count("LDG"), "loads_after_first_store": ops[first_store:].count("LDG")}


def check_rms_norm(arch: int) -> dict:
    sig = dict(x_ptr="*bf16", res_ptr="*bf16", w_ptr="*bf16", out_ptr="*bf16", res_out_ptr="*bf16",
               out_rows_ptr="*i64", stride_x="i32", stride_r="i32", stride_o="i32", stride_ro="i32", D="i32",
               eps="fp32", HAS_RESIDUAL="i32", HAS_OUT_ROWS="i32", BLOCK_D="i32", PDL="i32")
    out = {}
    for D, warps, residual, rows in ((7168, 16, False, False), (7168, 16, True, False), (512, 4, False, True),
                                     (512, 4, True, True)):
        sass, res = compile_sass(rn.rms_norm_kernel, sig,
                                 dict(HAS_RESIDUAL=residual, HAS_OUT_ROWS=rows, BLOCK_D=triton.next_power_of_2(D),
                                      PDL=True), ["x_ptr", "w_ptr", "out_ptr"], arch, warps)
        _no_spills(res, f"rms_norm {D=}")
        order = _memory_order(sass)
        # The weight before the wait; nothing loaded after the residual's store (the output row index before it).
        assert order["loads_before_wait"] > 0 and order["loads_after_first_store"] == 0, f"rms_norm {D=}: {order}"
        out[f"D{D}_res{int(residual)}_rows{int(rows)}"] = {"res": res, **order}
    return out


ROTARY_SIG = dict(pos_ptr="*i64", cos_ptr="*fp32", sin_ptr="*fp32", q_ptr="*bf16", q_out_ptr="*bf16", k_ptr="*bf16",
           k_out_ptr="*bf16", k_out_rows_ptr="*i64", stride_qt="i32", stride_qh="i32", stride_qot="i32",
           stride_qoh="i32", stride_kt="i32", stride_kh="i32", stride_kot="i32", stride_koh="i32",
           stride_table="i32", HQ="i32", HK="i32", HAS_K="i32", K_OUT_ROWS="i32", INTERLEAVED="i32",
           HALF="i32", HALF_PAD="i32", BLOCK_H="i32", PDL="i32", NORM_C="i32", c_ptr="*bf16", nw_ptr="*bf16",
           c_out_ptr="*bf16", stride_ct="i32", stride_cot="i32", C="i32", eps="fp32", BLOCK_C="i32",
           HAS_Q="i32", ONE_BLOCK="i32")
# MLA's rotary launch (8 q heads, one k head: one head block; the kv_a norm of c [512] into the cache rows).
MLA_ROTARY_CONSTS = dict(HAS_K=True, K_OUT_ROWS=True, INTERLEAVED=True, HALF=32, HALF_PAD=32, BLOCK_H=8, PDL=True,
                         NORM_C=True, BLOCK_C=512, HAS_Q=True, ONE_BLOCK=True)


def check_rotary(arch: int) -> dict:
    sig = ROTARY_SIG
    out = {}
    for interleaved, half, block_h, rows in ((True, 32, 8, True), (False, 64, 32, False), (True, 32, 8, "norm"),
                                             (True, 32, 8, "k_only")):
        # "norm": MLA's kv_a RMSNorm of c [512] into the cache rows in the same launch; "k_only": that without q
        sass, res = compile_sass(ro.rotary_kernel, sig,
                                 dict(HAS_K=True, K_OUT_ROWS=bool(rows), INTERLEAVED=interleaved, HALF=half,
                                      HALF_PAD=half, BLOCK_H=block_h, PDL=False, NORM_C=rows in ("norm", "k_only"),
                                      BLOCK_C=512, HAS_Q=rows != "k_only"), ["q_ptr", "k_ptr"], arch,
                                 enable_fp_fusion=False)
        _no_spills(res, "rotary")
        fma = sum(1 for line in sass.splitlines() if re.search(r"\bFFMA\b", line))
        assert fma == 0, f"rotary kernel has {fma} FFMA: its results would differ from torch's (mul, mul, sub)"
        out[f"interleaved{int(interleaved)}_rows{rows}"] = res
    # MLA's launch (8 q heads, one k head: one head block), with PDL: every load before the first store, the norm
    # weight before the wait (seven round trips in a row after the wait before the twenty-seventh session).
    sass, res = compile_sass(ro.rotary_kernel, sig, MLA_ROTARY_CONSTS, ["q_ptr", "k_ptr"], arch, enable_fp_fusion=False)
    order = _memory_order(sass)
    assert order["loads_before_wait"] > 0 and order["loads_after_first_store"] == 0, f"rotary (MLA): {order}"
    out["mla_pdl"] = {"res": res, **order}
    return out


DENSE_GEMV_SIG = dict(x_ptr="*bf16", w_ptr="*bf16", w_up_ptr="*bf16", add_ptr="*bf16", out_ptr="*bf16",
           part_ptr="*fp32", count_ptr="*i32", w2_ptr="*bf16", out2_ptr="*bf16", T="i32", N="i32", K="i32",
           k_per_split="i32", N2="i32", NB1="i32", s_xt="i32", s_xb="i32", s_wb="i32", s_wn="i32", s_wk="i32",
           s_at="i32", s_ab="i32", s_ot="i32", s_ob="i32", s_w2n="i32", s_o2t="i32",
           W_KMAJOR="i32", EPI="i32", SPLIT="i32", M_PAD="i32", BLOCK_N="i32", BLOCK_K="i32", INTERPRET="i32",
           PDL="i32", PAIR="i32", NORM="i32", nw_ptr="*bf16", eps="fp32", EPI2="i32", w2_up_ptr="*bf16",
           HAS_RES="i32", res_ptr="*bf16", res_out_ptr="*bf16", s_rt="i32", s_rot="i32",
           ROUTE="i32", bias_ptr="*fp32", topk_w_ptr="*fp32", topk_id_ptr="*i32", s_twt="i32", s_tit="i32",
           routed_scaling_factor="fp32", PER_GROUP="i32", N_GROUP="i32", TOPK_GROUP="i32", TOP_K="i32",
           G_PAD="i32", PG_PAD="i32", K_PAD="i32", HAS_BIAS="i32", RENORMALIZE="i32", PREFETCH_L2="i32",
           ROUTE_SIDE="i32", logits_ptr="*fp32", s_lt="i32")
DENSE_GEMV_ALIGNED = ["x_ptr", "w_ptr", "w_up_ptr", "add_ptr", "out_ptr", "part_ptr", "N", "K", "k_per_split", "s_xt",
           "s_xb", "s_wb", "s_wn", "s_at", "s_ot", "res_ptr", "res_out_ptr", "s_rt", "s_rot", "bias_ptr",
           "topk_w_ptr", "topk_id_ptr"]


def check_dense_gemv(arch: int) -> dict:
    """The skinny GEMM at Kimi TP=8 decode shapes: no spills, 16-byte weight loads along K, and the split-K
    handshake (fences + one atomic per program) present exactly when SPLIT > 1 (one more with the routing
    tail); every epilogue, both RMSNorm folds (the q_a norm read first, the input norm + residual scaled in
    the epilogue), and the router + shared expert launch with the MoE routing in its tail (Kimi's: 384
    experts, top-8, one group), split as its launcher splits it and unsplit."""
    sig, aligned = DENSE_GEMV_SIG, DENSE_GEMV_ALIGNED
    no_route = dict(ROUTE=False, PER_GROUP=1, N_GROUP=1, TOPK_GROUP=1, TOP_K=1, G_PAD=1, PG_PAD=1, K_PAD=1,
                    HAS_BIAS=False, RENORMALIZE=False)
    kimi_route = dict(ROUTE=True, PER_GROUP=384, N_GROUP=1, TOPK_GROUP=1, TOP_K=8, G_PAD=1, PG_PAD=512, K_PAD=8,
                      HAS_BIAS=True, RENORMALIZE=True)
    # "route": the router [384] + shared expert gate/up [2 x 256] launch with the routing tail, as its launcher
    # plans it on this arch (K = 7168: 10 splits on the H200; with and without PDL), and unsplit. NOTE: this
    # gated pair sits at 225-255 registers with or without the tail (which needs ~50 of its own, after the main
    # loop); unsplit with PDL it spills 8 bytes on sm_120, tail or not (no launcher plan for Kimi gives that).
    route = gemv_config(384 + 2 * 256, 7168, 1, True, 132, 2, SMEM_PER_BLOCK[arch])
    # "fold": q_a + kv_a with the layer's input norm and residual add (NORM_POST), split as at T <= 16 on the
    # H200 (N = 1536 + 576, K = 7168: 4 splits), with the tile and stages its launcher picks on this arch.
    fold = gemv_config(2112, 7168, 1, True, 132, 1, SMEM_PER_BLOCK[arch], acts=2,
                       **NORM_POST_LIMITS)
    # "lean": o_proj as gemv_config plans it now (64-wide K tiles, 8 stages: unsplit, K <= 2048)
    lean = gemv_config(7168, 1024, 1, True, 132, 1, SMEM_PER_BLOCK[arch], lean=True)
    # "side": the shared expert's down projection [7168, 256] with Kimi's routing programs beside it
    side = gemv_config(7168, 256, 1, True, 132, 1, SMEM_PER_BLOCK[arch])
    out = {}
    for i, (kmajor, epi, split, bn, bk, pdl, pair) in enumerate(((True, gv.EPI_NONE, 1, 32, 256, True, False),
                                                  (True, gv.EPI_ADD, 4, 16, 256, False, False),
                                                  (True, gv.EPI_GATED, 7, 32, 256, True, False),
                                                  (False, gv.EPI_NONE, 2, 64, 64, True, False),
                                                  (True, gv.EPI_NONE, 6, 32, 256, False, True),
                                                  (True, gv.EPI_NONE, 11, 32, 256, False, "router"),
                                                  (True, gv.EPI_NONE, fold["SPLIT"], 32, fold["BLOCK_K"], False,
                                                   "fold"),
                                                  (True, gv.EPI_NONE, 1, 32, fold["BLOCK_K"], True, "fold"),
                                                  (True, gv.EPI_NONE, route["SPLIT"], route["BLOCK_N"],
                                                   route["BLOCK_K"], False, "route"),
                                                  (True, gv.EPI_NONE, route["SPLIT"], route["BLOCK_N"],
                                                   route["BLOCK_K"], True, "route"),
                                                  (True, gv.EPI_NONE, 1, route["BLOCK_N"], route["BLOCK_K"], False,
                                                   "route"),
                                                  (True, gv.EPI_NONE, 1, lean["BLOCK_N"], lean["BLOCK_K"], True,
                                                   "lean"),
                                                  (True, gv.EPI_NONE, side["SPLIT"], side["BLOCK_N"], side["BLOCK_K"],
                                                   True, "side"))):
        prefetch = i == 0  # the first (a PDL case) with the L2 prefetch before its wait; the others as shipped
        # "router": the first matrix's output is float32, the second is gated (router + shared expert)
        router = pair in ("router", "route")
        sig_ = dict(sig, out_ptr="*fp32", add_ptr="*fp32") if router else sig
        norm = gv.NORM_POST if pair == "fold" else (gv.NORM_PRE if pair is False and split == 4 else gv.NORM_NONE)
        stages = fold["num_stages"] if pair == "fold" else route["num_stages"] if pair == "route" else (
            lean["num_stages"] if pair == "lean" else side["num_stages"] if pair == "side" else
            2 if epi == gv.EPI_GATED or pair == "router" else 4)
        routing = kimi_route if pair == "route" else (dict(kimi_route, ROUTE=False, ROUTE_SIDE=True)
                                                      if pair == "side" else no_route)
        sass, res = compile_sass(gv.gemv_kernel, sig_,
                                 dict(W_KMAJOR=kmajor, EPI=epi, SPLIT=split, M_PAD=16, BLOCK_N=bn, BLOCK_K=bk,
                                      INTERPRET=False, PDL=pdl, PAIR=pair not in (False, "lean", "side"),
                                      NORM=norm, EPI2=gv.EPI_GATED if router else gv.EPI_NONE,
                                      HAS_RES=pair == "fold", PREFETCH_L2=prefetch, **routing),
                                 aligned, arch, num_stages=stages)
        what = (f"gemv kmajor={kmajor} epi={epi} split={split} BLOCK_N={bn} BLOCK_K={bk} pair={pair} {stages=} {pdl=}"
                f" {prefetch=}")
        _no_spills(res, what)
        lines = [ln.split("*/", 1)[1].strip() for ln in sass.splitlines() if re.search(r"/\*[0-9a-f]{4,}\*/", ln)]
        ops = _opcodes(lines)
        atoms = ops["ATOM"] + ops["ATOMG"] + ops["RED"]
        fences = ops["MEMBAR"] + ops["FENCE"]
        handshakes = (split > 1) + (pair == "route")  # split-K's, the routing tail's
        if handshakes:
            assert atoms >= handshakes and fences >= 2 * handshakes, (
                f"{what}: {handshakes} arrival handshake(s) missing ({atoms=} {fences=})")
        else:
            assert atoms == 0, f"{what}: atomics without split-K or routing"
        if kmajor:
            assert re.search(r"(LDG|LDGSTS)\.E\S*\.128", sass), f"{what}: weight loads are not 16 bytes wide"
        # PDL: the grid-dependency wait (ACQBULK) is there, only with PDL; the weight slab is prefetched into L2
        # (CCTL.E.PF2) only where asked for (SGLANG_EAGLE3_PDL_L2_PREFETCH=1, off by default).
        assert ("CCTL.E.PF2" in sass) == prefetch and (ops["ACQBULK"] > 0) == pdl, f"{what} {pdl=}: {dict(ops)}"
        out[what] = res
    return out


def check_rope_wuk(arch: int) -> dict:
    """W_UK's launch (Kimi TP=8: q_nope [T, 8, 128] @ an N-contiguous [8, 512, 128] view, unsplit, as
    gemv_config plans it) with MLA's rotary programs beside it (ROPE_SIDE; the rope_wuk fusion), compiled as
    its launcher compiles it (no fp fusion) with PDL: no spills, no FFMA (the rotation rounds as the reference
    and the rotary launch do; W_UK's products are tensor-core dots), the norm weight loaded before a wait."""
    rot_sig = {f"rp_{k}": v for k, v in ROTARY_SIG.items() if k != "PDL"}
    cfg = gemv_config(512, 128, 8, False, 132, 1, SMEM_PER_BLOCK[arch])
    assert cfg["SPLIT"] == 1, cfg
    consts = dict(W_KMAJOR=False, EPI=gv.EPI_NONE, SPLIT=1, M_PAD=16, BLOCK_N=cfg["BLOCK_N"],
                  BLOCK_K=cfg["BLOCK_K"], INTERPRET=False, PDL=True, PAIR=False, NORM=gv.NORM_NONE, ROPE_SIDE=True,
                  **{f"rp_{k}": v for k, v in MLA_ROTARY_CONSTS.items() if k != "PDL"})
    sass, res = compile_sass(gv.gemv_kernel, {**DENSE_GEMV_SIG, "ROPE_SIDE": "i32", **rot_sig}, consts,
                             DENSE_GEMV_ALIGNED + ["rp_q_ptr", "rp_k_ptr"], arch, num_stages=cfg["num_stages"],
                             enable_fp_fusion=False)
    _no_spills(res, "W_UK + rotary")
    ops = _sass_ops(sass)
    assert ops["FFMA"] == 0, f"W_UK + rotary has {ops['FFMA']} FFMA: the rotation would not round as torch's"
    assert ops["HMMA"] > 0, f"W_UK's dots are not on the tensor cores: {dict(ops.most_common(12))}"
    order = _memory_order(sass)
    assert order["loads_before_wait"] > 0, f"W_UK + rotary: the norm weight is loaded after the wait ({order})"
    return {"res": res, "config": cfg, **order}


MLA_SIG = dict(qn_ptr="*bf16", qr_ptr="*bf16", kv_ptr="*bf16", page_table_ptr="*i32", seq_lens_ptr="*i32",
               out_ptr="*bf16", mid_o_ptr="*fp32", mid_lse_ptr="*fp32", stride_qn_tok="i32", stride_qn_head="i32",
               stride_qr_tok="i32", stride_qr_head="i32", stride_kv_slot="i32", stride_pt_req="i32",
               stride_o_tok="i32", stride_o_head="i32", sm_scale_log2="fp32", NUM_SPLITS="i32", T="i32", H="i32",
               DC="i32", DR="i32", PAGE_SIZE="i32", BLOCK_M="i32", BLOCK_N="i32", SPLIT_KV="i32",
               DOT_PRECISION="constexpr", INTERPRET="i32", PDL="i32")
MLA_ALIGNED = ["qn_ptr", "qr_ptr", "kv_ptr", "out_ptr", "mid_o_ptr", "mid_lse_ptr", "stride_qn_tok",
               "stride_qr_tok", "stride_kv_slot", "stride_o_tok"]
# The rope variant (launch fusion q_rope_attn): q's rope rotated as it loads.
MLA_ROPE_SIG = dict(MLA_SIG, ROPE="i32", pos_ptr="*i64", cos_ptr="*fp32", sin_ptr="*fp32", stride_table="i32")
MLA_MERGE_SIG = dict(mid_o_ptr="*fp32", mid_lse_ptr="*fp32", out_ptr="*bf16", seq_lens_ptr="*i32",
                     stride_o_tok="i32", stride_o_head="i32", NUM_SPLITS="i32", T="i32", H="i32", DC="i32",
                     BLOCK_M="i32", BLOCK_N="i32", SPLITS_PAD="i32", BLOCK_D="i32", PDL="i32")


# The split kernel's grouped-query arguments too (kv-head groups, value rows of their own).
GQA_SIG = dict(MLA_SIG, GROUPS="i32", stride_kv_group="i32", SEPARATE_V="i32", v_ptr="*bf16", stride_v_slot="i32",
               stride_v_group="i32")
GQA_ALIGNED = MLA_ALIGNED + ["v_ptr", "stride_v_slot", "stride_kv_group", "stride_v_group"]


def _sass_ops(sass: str) -> collections.Counter:
    return _opcodes([ln.split("*/", 1)[1].strip() for ln in sass.splitlines() if re.search(r"/\*[0-9a-f]{4,}\*/", ln)])


def check_mla(arch: int) -> dict:
    """MLA decode (T=1) and verify (T=4) at Kimi TP=8 shapes (8 heads, latent 512, rope 64, page 64) with this
    arch's table config and the defaults, unsplit (writes the output) and split (writes fp32 partials): no
    spills, no atomics, and the grid-dependency wait there exactly when compiled with PDL (here: when split).
    The rope variant (table config) likewise, and with as many FFMA as without the rope: the rotation's products
    are not contracted (a contracted one adds FFMA), so it rounds as the rotary kernel does.
    The merge kernel at 2..256 splits, at the table's and the defaults' merge tile and warps and a few more: no
    spills, PDL wait."""
    table = json.loads((tuning.CONFIG_DIR / f"sm_{arch}.json").read_text())["ops"]["mla_attention"]
    out = {}
    for T in (1, 4):
        for name, bucket in (("table", tuning._pick_bucket(table, "rows", T * 8)), ("defaults", {})):
            cfg = {**tuning.DEFAULTS["mla_attention"], **bucket}
            plan = launch_plan(1, T, 8, 8192, 132, cfg)  # (sm_90 at T=4: its short_split, 16 rows at 2 stages)
            block_m = plan["BLOCK_M"]
            for split_kv in (False, True):
                ffma = {}
                for rope in (False, True) if name == "table" else (False,):
                    what = f"mla {name} T={T} {split_kv=}" + (" rope" if rope else "")
                    sass, res = compile_sass(ma.mla_split_kv_kernel, MLA_ROPE_SIG,
                                             dict(T=T, H=8, DC=512, DR=64, PAGE_SIZE=64, BLOCK_M=block_m,
                                                  BLOCK_N=cfg["BLOCK_N"], SPLIT_KV=split_kv, DOT_PRECISION="tf32",
                                                  INTERPRET=False, PDL=split_kv, ROPE=rope),
                                             MLA_ALIGNED, arch, cfg["num_warps"], plan["num_stages"])
                    _no_spills(res, what)
                    ops = _sass_ops(sass)
                    atoms = ops["ATOM"] + ops["ATOMG"] + ops["RED"]
                    assert atoms == 0, f"{what}: {atoms=}"
                    assert (ops["ACQBULK"] > 0) == split_kv, f"{what}: grid-dependency wait only with PDL {dict(ops)}"
                    ffma[rope] = ops["FFMA"]
                    out[what] = res
                assert len(set(ffma.values())) == 1, f"mla {name} T={T} {split_kv=}: FFMA {ffma} (False: no rope)"
    merge_cfgs = {(c.get("merge_tile", 4096), c.get("merge_warps", 4))
                  for c in [tuning.DEFAULTS["mla_attention"]] + table}
    for values, warps in sorted(merge_cfgs | {(1024, 1), (2048, 2), (8192, 8)}):
        for splits in (2, 19, 128, 256):
            tile = merge_tile(splits, 512, values)
            what = f"mla merge kernel {splits=} {tile} {warps=}"
            sass, res = compile_sass(ma.mla_merge_splits_kernel, MLA_MERGE_SIG,
                                     dict(T=4, H=8, DC=512, BLOCK_M=16, BLOCK_N=64, PDL=True, **tile),
                                     ["mid_o_ptr", "mid_lse_ptr", "out_ptr", "stride_o_tok"], arch, warps)
            _no_spills(res, what)
            assert _sass_ops(sass)["ACQBULK"] > 0, f"{what}: no grid-dependency wait with PDL"
            out[what] = res
    return out


def check_gqa(arch: int) -> dict:
    """The split kernel as the EAGLE-3 draft's grouped-query attention (Kimi-shaped draft at TP=8: 8 query heads on
    one kv head, head_dim 128, page 64; and two kv heads a rank) at the defaults and the table's config: value
    rows of their own, one score dot, decode and verify, unsplit and split: no spills, no atomics, the PDL wait
    when compiled with it, the merge kernel with kv-head groups likewise."""
    ops_table = json.loads((tuning.CONFIG_DIR / f"sm_{arch}.json").read_text())["ops"]
    buckets = ops_table.get("gqa_attention", [{}])
    sig, aligned = GQA_SIG, GQA_ALIGNED
    out = {}
    for T in (1, 4):
        table_cfg = {**tuning.DEFAULTS["gqa_attention"], **tuning._pick_bucket(buckets, "rows", T * 8)}
        configs = {"table": table_cfg}
        if table_cfg != tuning.DEFAULTS["gqa_attention"]:
            configs["defaults"] = tuning.DEFAULTS["gqa_attention"]
        for name, cfg in configs.items():
            block_m = launch_plan(1, T, 8, 8192, 132, cfg)["BLOCK_M"]
            for groups in (1, 2):
                for split_kv in (False, True):
                    what = f"gqa {name} T={T} {groups=} {split_kv=}"
                    sass, res = compile_sass(ma.mla_split_kv_kernel, sig,
                                             dict(T=T, H=8, DC=128, DR=0, PAGE_SIZE=64, BLOCK_M=block_m,
                                                  BLOCK_N=cfg["BLOCK_N"], SPLIT_KV=split_kv, DOT_PRECISION="tf32",
                                                  INTERPRET=False, PDL=split_kv, GROUPS=groups, SEPARATE_V=True),
                                             aligned, arch, cfg["num_warps"], cfg["num_stages"])
                    _no_spills(res, what)
                    ops = _sass_ops(sass)
                    assert ops["ATOM"] + ops["ATOMG"] + ops["RED"] == 0, f"{what}: atomics {dict(ops)}"
                    assert (ops["ACQBULK"] > 0) == split_kv, f"{what}: grid-dependency wait only with PDL {dict(ops)}"
                    out[what] = res
    for groups in (1, 2):
        tile = merge_tile(64, 128, tuning.DEFAULTS["gqa_attention"]["merge_tile"])
        what = f"gqa merge kernel {groups=} {tile}"
        sass, res = compile_sass(ma.mla_merge_splits_kernel, dict(MLA_MERGE_SIG, GROUPS="i32"),
                                 dict(T=4, H=8, DC=128, BLOCK_M=16, BLOCK_N=64, PDL=True, GROUPS=groups, **tile),
                                 ["mid_o_ptr", "mid_lse_ptr", "out_ptr", "stride_o_tok"], arch, 4)
        _no_spills(res, what)
        assert _sass_ops(sass)["ACQBULK"] > 0, f"{what}: no grid-dependency wait with PDL"
        out[what] = res
    return out




def check_mla_pipeline(arch: int) -> dict:
    """The split pass's key tiles are really pipelined: compiled at this arch's table config (decode and verify
    rows, bf16 and float32 caches, MLA and the draft's grouped-query form), the loop's TTGIR keeps num_stages - 1
    buffers of key tiles (until the page table entries were loaded a tile ahead, Triton kept ONE at num_stages
    2-4: each tile waited for its own load), and the block's shared memory is within split_pass_smem's figure
    (and 256 bytes of it) and, for bf16, within the arch's limit at the depth split_pass_stages fits (float32,
    twice the bytes, only where one buffer fits at all: Kimi-sized float32 verify on sm_120 does not)."""
    ops_table = json.loads((tuning.CONFIG_DIR / f"sm_{arch}.json").read_text())["ops"]
    out = {}
    for op, Dc, Dr, separate_v in (("mla_attention", 512, 64, False), ("gqa_attention", 128, 0, True)):
        for T, cap in ((1, 8192), (4, 8192), (4, 131072)):  # at T=4 a short table may take short_split's plan
            cfg = {**tuning.DEFAULTS[op], **tuning._pick_bucket(ops_table.get(op, [{}]), "rows", T * 8)}
            plan = launch_plan(1, T, 8, cap, 132, cfg)
            block_m, block_n = plan["BLOCK_M"], cfg["BLOCK_N"]
            for dtype, elem in (("bf16", 2), ("fp32", 4)):
                stages = split_pass_stages(plan["num_stages"], block_m, block_n, Dc, Dr, elem, SMEM_PER_BLOCK[arch],
                                           separate_v)
                sig = GQA_SIG  # the split kernel's full signature (kv-head groups, value rows of their own)
                if dtype == "fp32":
                    sig = {k: ("*fp32" if v == "*bf16" else v) for k, v in sig.items()}
                kernel = compile_kernel(ma.mla_split_kv_kernel, sig,
                                        dict(T=T, H=8, DC=Dc, DR=Dr, PAGE_SIZE=64, BLOCK_M=block_m, BLOCK_N=block_n,
                                             SPLIT_KV=True, DOT_PRECISION="ieee" if dtype == "fp32" else "tf32",
                                             INTERPRET=False, PDL=True,
                                             GROUPS=1, SEPARATE_V=separate_v),
                                        GQA_ALIGNED, arch, cfg["num_warps"], stages)
                what = f"{op} T={T} {cap} slots {dtype} BLOCK_M={block_m} BLOCK_N={block_n} num_stages={stages}"
                want = split_pass_smem(stages, block_m, block_n, Dc, Dr, elem, separate_v)
                shared = kernel.metadata.shared
                fits = split_pass_smem(2, block_m, block_n, Dc, Dr, elem, separate_v) <= SMEM_PER_BLOCK[arch]
                assert want - 256 <= shared <= want and (shared <= SMEM_PER_BLOCK[arch] or not fits), (
                    f"{what}: {shared} bytes of shared memory, split_pass_smem says {want}, limit "
                    f"{SMEM_PER_BLOCK[arch]}")
                assert fits or dtype == "fp32", f"{what}: the table's bf16 config does not fit one key-tile buffer"
                tile = f"memdesc<{max(1, stages - 1)}x{block_n}x{Dc}x{dtype.replace('fp', 'f')}"
                assert tile in kernel.asm["ttgir"], f"{what}: no {tile} key-tile buffers in the TTGIR"
                out[what] = f"{shared} bytes, {max(1, stages - 1)} key-tile buffer(s)"
    return out


def check_mla_dot_precision(arch: int) -> dict:
    """float32 MLA (the float32 engine's tiny shapes: latent 32, rope 16) with DOT_PRECISION="ieee", as
    tuning.dot_precision gives it, multiplies on the FMA units: no tensor-core (TF32) instruction; "tf32" and
    bf16 use tensor cores (so the check can tell). HMMA is mma.sync, HGMMA is sm_90's wgmma."""
    sig = {k: ("*fp32" if v == "*bf16" else v) for k, v in MLA_SIG.items()}
    out = {}
    for dtype, precision in (("fp32", "ieee"), ("fp32", "tf32"), ("bf16", "tf32")):
        cfg = tuning.DEFAULTS["mla_attention"]
        sass, res = compile_sass(ma.mla_split_kv_kernel, sig if dtype == "fp32" else MLA_SIG,
                                 dict(T=4, H=2, DC=32, DR=16, PAGE_SIZE=16, BLOCK_M=16, BLOCK_N=cfg["BLOCK_N"],
                                      SPLIT_KV=True, DOT_PRECISION=precision, INTERPRET=False, PDL=False),
                                 MLA_ALIGNED, arch, cfg["num_warps"], cfg["num_stages"])
        what = f"mla {dtype} DOT_PRECISION={precision}"
        _no_spills(res, what)
        ops = _sass_ops(sass)
        tensor_core = ops["HMMA"] + ops["HGMMA"]
        assert (tensor_core == 0) == (precision == "ieee"), f"{what}: {tensor_core} tensor-core instructions"
        out[what] = f"{tensor_core} HMMA/HGMMA, {ops['FFMA']} FFMA; {res}"
    return out



def check_prefetch(arch: int) -> dict:
    """The bulk L2 prefetch compiles to UBLKPF (cp.async.bulk.prefetch on the uniform datapath: the warp issues
    its lanes' pieces one after another) and nothing spills."""
    from sglang_eagle3.kernels import prefetch as launcher

    sass, res = compile_sass(pf.l2_prefetch_kernel, dict(table_ptr="*i64", RANGES="i32", BULK="i32", LANES="i32",
                                                         PROGRAMS_PER_RANGE="i32"),
                             dict(RANGES=6, BULK=launcher.BULK, LANES=launcher.LANES,
                                  PROGRAMS_PER_RANGE=launcher.PROGRAMS_PER_RANGE), ["table_ptr"], arch, 1)
    _no_spills(res, "l2_prefetch")
    ops = _sass_ops(sass)
    assert ops["UBLKPF"] >= 1, f"no bulk prefetch instruction in the SASS: {sorted(ops)}"
    return {"UBLKPF": ops["UBLKPF"], "res": res}


def check_mha_prefill(arch: int) -> dict:
    """MLA prefill in the non-absorbed form at Kimi TP=8 shapes (8 heads, latent 512, rope 64, nope / v 128, page
    64), the op's config on this arch for chunks of 64, 128, 256 and 1024 tokens (every bucket of the sm_90 table): the
    decompression kernel and the split
    kernel with one kv head a query head (values of their own, rope in the score), unsplit and split: no spills,
    shared memory within a block's, the PDL wait when compiled with it."""
    from sglang_eagle3.kernels.triton import mla_prefill as mp

    smem = SMEM_PER_BLOCK[arch]
    out = {}
    dsig = dict(kv_ptr="*bf16", page_table_ptr="*i32", seq_lens_ptr="*i32", w_ptr="*bf16", out_ptr="*bf16",
                stride_kv_slot="i32", stride_pt_req="i32", stride_w_row="i32", stride_out_slot="i32",
                stride_out_head="i32", DC="i32", DR="i32", D="i32", PAGE_SIZE="i32", BLOCK_N="i32", BLOCK_K="i32",
                DOT_PRECISION="constexpr", INTERPRET="i32", PDL="i32")
    for T in (64, 128, 256, 1024):
        dev_cfg = _table_or_default(arch, "mla_mha_prefill", "tokens", T)
        what = f"decompress T={T}"
        kernel = compile_kernel(mp.mla_decompress_kernel, dsig,
                                dict(DC=512, DR=64, D=128, PAGE_SIZE=64, BLOCK_N=dev_cfg["decompress_block_n"],
                                     BLOCK_K=dev_cfg["decompress_block_k"], DOT_PRECISION="tf32", INTERPRET=False,
                                     PDL=True),
                                ["kv_ptr", "w_ptr", "out_ptr", "stride_kv_slot", "stride_w_row", "stride_out_slot",
                                 "stride_out_head"], arch, dev_cfg["decompress_warps"], dev_cfg["decompress_stages"])
        assert kernel.metadata.shared <= smem, f"{what}: {kernel.metadata.shared} B of shared memory > {smem}"
        sass, res = sass_of(kernel)
        _no_spills(res, what)
        assert _sass_ops(sass)["ACQBULK"] > 0, f"{what}: no grid-dependency wait with PDL"
        out[what] = {"shared": kernel.metadata.shared, "res": res}
        plan = launch_plan(1, T, 1, 131072, 132, dev_cfg, 8)
        stages = split_pass_stages(dev_cfg["num_stages"], plan["BLOCK_M"], dev_cfg["BLOCK_N"], 128, 64, 2, smem, True)
        for split_kv in (False, True):
            what = f"attention T={T} {split_kv=}"
            kernel = compile_kernel(ma.mla_split_kv_kernel, GQA_SIG,
                                    dict(T=T, H=1, DC=128, DR=64, PAGE_SIZE=64, BLOCK_M=plan["BLOCK_M"],
                                         BLOCK_N=dev_cfg["BLOCK_N"], SPLIT_KV=split_kv, DOT_PRECISION="tf32",
                                         INTERPRET=False, PDL=True, GROUPS=8, SEPARATE_V=True),
                                    GQA_ALIGNED, arch, dev_cfg["num_warps"], stages)
            assert kernel.metadata.shared <= smem, f"{what}: {kernel.metadata.shared} B of shared memory > {smem}"
            sass, res = sass_of(kernel)
            _no_spills(res, what)
            assert _sass_ops(sass)["ACQBULK"] > 0, f"{what}: no grid-dependency wait with PDL"
            out[what] = {"shared": kernel.metadata.shared, "res": res, "stages": stages}
    return out


def _table_or_default(arch: int, op: str, key_name: str, key: int) -> dict:
    """``op``'s config for sm_<arch> at ``key_name`` = key: its table bucket over the defaults, or the defaults."""
    buckets = json.loads((tuning.CONFIG_DIR / f"sm_{arch}.json").read_text())["ops"].get(op)
    return {**tuning.DEFAULTS[op], **(tuning._pick_bucket(buckets, key_name, key) if buckets else {})}


def check_moe_topk(arch: int) -> dict:
    """The routing kernel at Kimi's shape (384 experts, top-8, one group) and DeepSeek-V3's (256 in 8 groups,
    4 kept), at sm_120's 4 warps and sm_90's 1: no spills, one cross-warp reduction round a pick (the packed
    choice-and-slot key: at most 4 barriers a pick, where max + argmin + a masked sum took ~9), and the bias loaded
    before the PDL wait (route_bias)."""
    from sglang_eagle3.kernels.triton import moe_topk as mt

    sig = dict(logits_ptr="*fp32", bias_ptr="*fp32", weights_ptr="*fp32", ids_ptr="*i32", stride_lt="i32",
               stride_wt="i32", stride_it="i32", routed_scaling_factor="fp32", E="i32", PER_GROUP="i32",
               N_GROUP="i32", TOPK_GROUP="i32", TOP_K="i32", G_PAD="i32", PG_PAD="i32", K_PAD="i32",
               HAS_BIAS="i32", RENORMALIZE="i32", PDL="i32")
    out = {}
    for E, groups, kept in ((384, 1, 1), (256, 8, 4)):
        consts = dict(E=E, PER_GROUP=E // groups, N_GROUP=groups, TOPK_GROUP=kept, TOP_K=8,
                      G_PAD=triton.next_power_of_2(groups), PG_PAD=triton.next_power_of_2(E // groups), K_PAD=8,
                      HAS_BIAS=True, RENORMALIZE=True, PDL=True)
        for warps in (1, 4):
            sass, res = compile_sass(mt.moe_topk_kernel, sig, consts, ["logits_ptr"], arch, warps)
            _no_spills(res, f"moe_topk E={E}")
            bars = _sass_ops(sass)["BAR"]
            group_step = 3 * (kept + 2) if groups > 1 else 0  # the group scores' own reductions
            assert bars <= 4 * 8 + group_step, f"moe_topk E={E}: {bars} barriers (a second reduction per pick?)"
            order = _memory_order(sass)
            assert order["loads_before_wait"] > 0, f"moe_topk E={E}: the bias is loaded after the wait ({order})"
            out[f"E{E}_groups{groups}_warps{warps}"] = {"res": res, "BAR": bars, **order}
    return out


def _reduce_layouts(kernel) -> list[str]:
    """The operand types (shape and layout, spelled out) of every tt.reduce in a compiled kernel's TTGIR."""
    ir = kernel.asm["ttgir"]
    defs = dict(re.findall(r"^(#\w+) = (#ttg\.\w+<.*?>)\s*$", ir, re.M))
    types = set(re.findall(r"\}\) : \((tensor<.*?>)\) -> tensor", ir))
    return sorted(re.sub(r"#(?:blocked|linear)\d*\b", lambda m: defs[m.group(0)], t) for t in types)


def fma_gemv_cases(kernels=gv) -> list[tuple]:
    """The CUDA-core forms as a Kimi TP=8 rank launches them: (name, kernel, signature, config, K, constexprs, args
    the JIT specializes as 16-divisible) for q_b with its q_a norm (fma_config), MLA's W_UV per head (8 heads of 128 x
    512, fma_config), the router + shared gate/up pair (fma_pair_config: 384 router rows, 256 gated, K = 7168) and
    MLA's q_a + kv_a as a plain pair (1536 + 576 rows, K = 7168; SGLANG_EAGLE3_GEMV_FMA_PLAIN_PAIR), also with the
    decoder layer's input norm and residual add folded in (NORM_PRE with HAS_RES, the input_norm fusion).
    ``kernels``: the module holding gemv_fma_kernel and gemv_fma_pair_kernel (another commit's, to compare)."""
    from sglang_eagle3.kernels.gemv import fma_config, fma_pair_config

    single = dict(x_ptr="*bf16", w_ptr="*bf16", out_ptr="*bf16", nw_ptr="*bf16", T="i32", N="i32", K="i32",
                  s_xt="i32", s_wn="i32", s_ot="i32", s_xb="i32", s_wb="i32", s_ob="i32", eps="fp32")
    two = dict(x_ptr="*bf16", w1_ptr="*bf16", w2_ptr="*bf16", w2_up_ptr="*bf16", out_ptr="*fp32", out2_ptr="*bf16",
               T="i32", N="i32", N2="i32", NB1="i32", K="i32", s_xt="i32", s_w1n="i32", s_w2n="i32", s_ot="i32",
               s_o2t="i32")
    return [("q_b_norm", kernels.gemv_fma_kernel, single, fma_config(1536, 1536), 1536, {"NORM": 1},
             ["x_ptr", "w_ptr", "out_ptr", "nw_ptr", "N", "K", "s_xt", "s_wn", "s_ot"]),
            ("w_uv_heads", kernels.gemv_fma_kernel, single, fma_config(128, 512), 512, {"NORM": 0, "HEADS": True},
             ["x_ptr", "w_ptr", "out_ptr", "N", "K", "s_xt", "s_wn", "s_ot", "s_xb", "s_wb", "s_ob"]),
            ("router_shared", kernels.gemv_fma_pair_kernel, two, fma_pair_config(384, 256, 7168), 7168, {},
             ["x_ptr", "w1_ptr", "w2_ptr", "w2_up_ptr", "out_ptr", "out2_ptr", "N", "N2", "NB1", "K", "s_xt",
              "s_w1n", "s_w2n", "s_ot", "s_o2t"]),
            ("qkv_a_plain", kernels.gemv_fma_pair_kernel, dict(two, out_ptr="*bf16"),
             fma_pair_config(1536, 576, 7168, gated=False), 7168, {"GATED": False},
             ["x_ptr", "w1_ptr", "w2_ptr", "w2_up_ptr", "out_ptr", "out2_ptr", "N", "N2", "NB1", "K", "s_xt",
              "s_w1n", "s_w2n", "s_ot", "s_o2t"]),
            ("qkv_a_plain_norm", kernels.gemv_fma_pair_kernel,
             dict(two, out_ptr="*bf16", nw_ptr="*bf16", res_ptr="*bf16", res_out_ptr="*bf16", s_rt="i32",
                  s_rot="i32", eps="fp32"),
             fma_pair_config(1536, 576, 7168, gated=False), 7168, {"GATED": False, "NORM": 1, "HAS_RES": True},
             ["x_ptr", "w1_ptr", "w2_ptr", "w2_up_ptr", "out_ptr", "out2_ptr", "N", "N2", "NB1", "K", "s_xt",
              "s_w1n", "s_w2n", "s_ot", "s_o2t", "nw_ptr", "res_ptr", "res_out_ptr", "s_rt", "s_rot"])]


def compile_fma_case(case: tuple, rows: int, arch: int, **constexprs):
    """One of fma_gemv_cases compiled at ``rows`` rows of x a program (plus ``constexprs``, e.g. LF)."""
    _, fn, sig, cfg, K, extra, aligned = case
    consts = dict(ROWS=rows, BLOCK_N=cfg["BLOCK_N"], LANES=cfg["LANES"], VEC=8, NSTEPS=-(-K // (cfg["LANES"] * 8)),
                  PDL=True, **extra, **constexprs)
    return compile_kernel(fn, sig, consts, aligned, arch, cfg["num_warps"])


def check_fma_gemv(arch: int) -> dict:
    """The skinny GEMM's CUDA-core forms (fma_gemv_cases) at 1, 2 and 4 rows of x a program, with the weight tile
    either way round (LANES_FIRST): no spills, the weights' loads 16 bytes wide (K divisible by 16, as the JIT
    specializes it at these shapes: without that the masked loads go 2 bytes at a time), and every reduction's
    operand in the same layout at 1, 2 and 4 rows (the order of a token's sums must not follow T: decode ==
    verify). The row groups' order as the launchers take it (row_groups_inner)."""
    from sglang_eagle3.kernels.gemv import row_groups_inner

    out = {}
    for case in fma_gemv_cases():
        name = case[0]
        for lanes_first in (False, True):
            layouts = {}
            for rows in (1, 2, 4):
                what = f"{name} rows={rows} lanes_first={lanes_first}"
                inner = row_groups_inner("pair" if case[1] is gv.gemv_fma_pair_kernel else "single")
                kernel = compile_fma_case(case, rows, arch, LF=lanes_first, GROUPS_INNER=inner)
                sass, res = sass_of(kernel)
                if name == "qkv_a_plain_norm" and not lanes_first:
                    # the input-norm fold rows first: x's prologue and the stream's loads beside rows first's
                    # shared-memory x tiles spill at 4 rows (255 registers); the fold is measured lanes first only
                    out[f"{name}_rows{rows}"] = {"res": res}
                    continue
                _no_spills(res, what)
                wide = sum(1 for line in sass.splitlines() if re.search(r"\bLDG\.E\.128\b", line))
                assert wide > 0, f"{what}: no 16-byte weight loads"
                layouts[rows] = _reduce_layouts(kernel)
                assert layouts[rows], f"{what}: no reduction found in the TTGIR"
                regs = int(re.search(r"REG:(\d+)", res).group(1))
                # the pair's 224 programs of 8 warps take one wave of 132 SMs only at two blocks a SM (q_a + kv_a's
                # 528 take four blocks a SM, at most 64 registers, for one wave: not asserted, printed)
                assert name != "router_shared" or regs <= 128, f"{what}: {regs} registers, one block a SM"
                out[f"{name}_rows{rows}{'_lf' if lanes_first else ''}"] = {
                    "res": res, "LDG.128": wide, "instructions": len(_instructions(sass))}
            assert not layouts or layouts[1] == layouts[2] == layouts[4], (
                f"{name} lanes_first={lanes_first}: a reduction's layout follows ROWS, so a token's sums would "
                f"follow T: {layouts}")
    return out


CASES = {f"{name}_sm{arch}": (lambda fn=fn, arch=arch: fn(arch))
         for arch in (90, 120)
         for name, fn in (("gemv", check_gemv), ("dot_gate_up", check_dot_gate_up), ("dense_gemv", check_dense_gemv),
                          ("tile_path", check_tile_path),
                          ("rms_norm", check_rms_norm), ("rotary", check_rotary), ("rope_wuk", check_rope_wuk),
                          ("mla", check_mla),
                          ("gqa", check_gqa), ("mla_pipeline", check_mla_pipeline),
                          ("mla_dot_precision", check_mla_dot_precision),
                          ("prefetch", check_prefetch), ("moe_topk", check_moe_topk),
                          ("mha_prefill", check_mha_prefill), ("fma_gemv", check_fma_gemv))}

if __name__ == "__main__":
    for name in sys.argv[1:] or list(CASES):
        try:
            print(json.dumps({"case": name, "ok": True, "detail": CASES[name]()}), flush=True)
        except Exception:
            print(json.dumps({"case": name, "ok": False, "detail": traceback.format_exc()}), flush=True)
