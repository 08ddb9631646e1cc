"""The checked-in config tables: well formed, every op covered, sm_120 within its shared-memory limit."""

from __future__ import annotations

import json
import random
import re

import pytest

from sglang_eagle3.kernels import tuning

TABLES = sorted(tuning.CONFIG_DIR.glob("sm_*.json"))


@pytest.mark.parametrize("path", TABLES, ids=lambda p: p.stem)
def test_table_well_formed(path):
    """Each checked-in table passes the check a table given by SGLANG_EAGLE3_CONFIG_TABLE must pass (known ops and
    keys, an unbounded last bucket, one arithmetic at every T: tuning.check_table)."""
    table = json.loads(path.read_text())
    assert table["arch"] == path.stem and table["sm_counts"], path
    tuning.check_table(table, path.name)


def _table_with(op: str, buckets: list[dict]) -> dict:
    base = json.loads((tuning.CONFIG_DIR / "sm_90.json").read_text())
    return {**base, "ops": {**base["ops"], op: buckets}}


@pytest.mark.parametrize("op,buckets,match", [
    # the packed fp16 gate_up at T=1, the fp32 one above: a verify rounds a token apart from its decode
    ("fused_moe_int4_gemv_gate_up", [{"max_tokens": 1, "BLOCK_N": 16, "F16": True}, {"BLOCK_N": 16, "F16": False}],
     r"fused_moe_int4_gemv_gate_up's buckets differ in \('F16', 'BLOCK_W'\)"),
    ("fused_moe_int4_gemv_down", [{"max_tokens": 4, "BLOCK_W": 32, "F16": True}, {"BLOCK_W": 16, "F16": True}],
     r"fused_moe_int4_gemv_down's buckets differ"),
    ("mla_attention", [{"max_rows": 16, "merge_tile": 8192}, {"merge_tile": 4096}], r"mla_attention's buckets differ"),
    # down's packed fp16 form (the sm_90 table's) beside a gate_up bucket of 4 rows: act not stored by whole words
    ("fused_moe_int4_gemv_gate_up", [{"max_tokens": 2, "BLOCK_N": 4, "F16": True}, {"BLOCK_N": 16, "F16": True}],
     r"needs gate_up BLOCK_N a multiple of 8 in every bucket, got \[4, 16\]"),
    ("mla_attention", [{"max_rows": 16}, {"max_rows": 64}], r"last bucket is bounded \(\['max_rows'\]\)"),
    ("mla_attention", [{"BLOCK_M": 16, "stages": 2}], r"has keys no mla_attention config has: \['stages'\]"),
    ("mla_atention", [{"BLOCK_M": 16}], r"unknown op 'mla_atention'"),
    ("mla_attention", [], r"non-empty list of buckets"),
])
def test_check_table_refuses(op, buckets, match):
    """A table that the launchers would misread, or that would compute a token differently in decode and verify, is
    refused with the op and the values named (the sm_90 table with one op replaced)."""
    with pytest.raises(ValueError, match=match):
        tuning.check_table(_table_with(op, buckets), "t.json")


@pytest.mark.parametrize("arch,smem", [("sm_90", 227 << 10), ("sm_120", 99 << 10)])
def test_mla_tables_fit_shared_memory(arch, smem):
    """Each MLA bucket's depth, as the table gives it, fits a block at Kimi's bf16 shapes (the launcher would
    lower a depth that does not: split_pass_stages), by split_pass_smem, whose figure compile_checks.py checks
    against Triton's own allocation (mla_pipeline_sm90 / _sm120)."""
    from sglang_eagle3.kernels.mla_attention import split_pass_smem, split_pass_stages

    table = json.loads((tuning.CONFIG_DIR / f"{arch}.json").read_text())
    for bucket in table["ops"]["mla_attention"]:
        cfg = {**tuning.DEFAULTS["mla_attention"], **bucket}
        need = split_pass_smem(cfg["num_stages"], cfg["BLOCK_M"], cfg["BLOCK_N"], 512, 64, 2)
        assert need <= smem, f"{arch} {cfg}: {need} bytes of shared memory, {smem} a block"
        assert split_pass_stages(cfg["num_stages"], cfg["BLOCK_M"], cfg["BLOCK_N"], 512, 64, 2, smem) == \
            cfg["num_stages"], cfg


def test_mla_stages_lowered_to_fit():
    """float32 at the sm_90 table's depth needs two buffers of 147 KB: lowered to one (2 stages) to fit 227 KB;
    a depth that fits is left alone."""
    from sglang_eagle3.kernels.mla_attention import split_pass_smem, split_pass_stages

    assert split_pass_smem(3, 16, 64, 512, 64, 4) > 227 << 10
    assert split_pass_stages(3, 16, 64, 512, 64, 4, 227 << 10) == 2
    assert split_pass_stages(3, 16, 64, 512, 64, 2, 227 << 10) == 3
    assert split_pass_stages(5, 16, 16, 512, 64, 2, 99 << 10) == 5


@pytest.mark.parametrize("path", TABLES, ids=lambda p: p.stem)
def test_mla_one_merge_and_split_size_at_every_T(path):
    """MLA's buckets give decode and verify rows one merge tile (its tl.sum order follows the tile), one
    min_keys_per_split and ctas_per_sm (the split count and so the key partition; tuning.check_table, run on every
    table in test_table_well_formed): with the launch plan's split count independent of T up to
    SPLITS_BY_REQUEST_MAX_TOKENS (checked here at Kimi TP=8's 8 heads), a token's attention is the same bits in both
    (docs/KERNELS.md, "Decode and verify compute a token alike")."""
    from sglang_eagle3.kernels.mla_attention import SPLITS_BY_REQUEST_MAX_TOKENS, launch_plan

    table = json.loads(path.read_text())
    default = tuning.DEFAULTS["mla_attention"]
    sms = table["sm_counts"][0]
    for ctx in (1024, 8192, 131072):
        plans = {T: launch_plan(1, T, 8, ctx, sms, {**default, **tuning._pick_bucket(table["ops"]["mla_attention"],
                                                                                      "rows", 8 * T)})
                 for T in range(1, SPLITS_BY_REQUEST_MAX_TOKENS + 1)}
        assert len({p["splits"] for p in plans.values()}) == 1, f"{path.name} {ctx=}: {plans}"


def test_sm120_unmeasured():
    table = json.loads((tuning.CONFIG_DIR / "sm_120.json").read_text())
    assert table["measured"] is False and "unmeasured" in table["source"]
    assert table["sm_counts"] == [188]


def test_pick_bucket_first_covering():
    buckets = [{"max_rows": 16, "BLOCK_M": 16}, {"BLOCK_M": 32}]
    assert tuning._pick_bucket(buckets, "rows", 8) == {"BLOCK_M": 16}
    assert tuning._pick_bucket(buckets, "rows", 17) == {"BLOCK_M": 32}


# Every dense projection of one Kimi-K2.5 TP=8 rank layer as the GEMV sees it: (N, K, heads, K-contiguous,
# matrices per program), plus the dense layer's MLP and an irregular shape.
GEMV_SHAPES = [(1536, 7168, 1, True, 1), (576, 7168, 1, True, 1), (2112, 7168, 1, True, 1),
               (1536, 1536, 1, True, 1), (512, 128, 8, False, 1), (128, 512, 8, True, 1),
               (7168, 1024, 1, True, 1), (384, 7168, 1, True, 1), (256, 7168, 1, True, 2),
               (7168, 256, 1, True, 1), (2304, 7168, 1, True, 2), (7168, 2304, 1, True, 1), (1000, 333, 1, True, 1)]


@pytest.mark.parametrize("lean", [True, False], ids=["lean", "full"])
@pytest.mark.parametrize("sms,smem", [(132, 227 << 10), (188, 99 << 10), (84, 99 << 10)],
                         ids=["sm90_h200", "sm120_rtx_pro_6000", "small_gpu"])
@pytest.mark.parametrize("N,K,B,k_major,mats", GEMV_SHAPES)
def test_gemv_config_fits(N, K, B, k_major, mats, sms, smem, lean):
    """The GEMV's shape heuristic on any GPU: tiles the dot accepts, a split count no larger than the K
    tiles, and pipeline stages that fit the block's shared memory (the sm_120 table is derived from this,
    never measured: it must at least launch). ``lean``: split launches of wide K tiles at most 3 stages deep,
    unsplit K-contiguous ones with K <= 2048 in 64-wide tiles up to 8 deep; the full pipelines at most 4."""
    from sglang_eagle3.kernels.gemv import gemv_config

    cfg = gemv_config(N, K, B, k_major, sms, mats, smem, lean=lean)
    assert cfg["BLOCK_N"] >= 16 and cfg["BLOCK_K"] >= 16, cfg
    assert 1 <= cfg["SPLIT"] <= -(-K // cfg["BLOCK_K"]), cfg
    stage_bytes = (cfg["BLOCK_N"] * cfg["BLOCK_K"] * mats + 16 * cfg["BLOCK_K"]) * 2
    assert 1 <= cfg["num_stages"] <= (8 if lean else 4) and cfg["num_stages"] * stage_bytes <= smem, (
        cfg, stage_bytes, smem)
    if lean and cfg["SPLIT"] > 1 and cfg["BLOCK_K"] >= 128:
        assert cfg["num_stages"] <= 3, cfg
    if lean and k_major and K <= 2048 and cfg["SPLIT"] == 1:
        assert cfg["BLOCK_K"] == min(64, max(16, 1 << (K - 1).bit_length())), cfg
    if not lean:
        assert cfg["BLOCK_K"] == (min(256, max(16, 1 << (K - 1).bit_length())) if k_major else
                                  max(16, min(64, 1 << (K - 1).bit_length()))), cfg
    # ~1 program per SM at least whenever the slab is split (else the split would be pointless)
    blocks = -(-N // cfg["BLOCK_N"]) * B
    if cfg["SPLIT"] > 1:
        assert blocks * cfg["SPLIT"] >= min(sms, blocks * -(-K // cfg["BLOCK_K"])), cfg


def test_gemv_lean_knob(monkeypatch):
    """SGLANG_EAGLE3_GEMV_LEAN: unset or 1 the lean configs, 0 the full pipelines (o_proj's shape differs)."""
    from sglang_eagle3.kernels.gemv import gemv_config

    shape = (7168, 1024, 1, True, 132, 1, 227 << 10)  # o_proj of a Kimi TP=8 rank on the H200
    monkeypatch.delenv("SGLANG_EAGLE3_GEMV_LEAN", raising=False)
    assert gemv_config(*shape) == gemv_config(*shape, lean=True) != gemv_config(*shape, lean=False)
    monkeypatch.setenv("SGLANG_EAGLE3_GEMV_LEAN", "0")
    assert gemv_config(*shape) == gemv_config(*shape, lean=False)
    monkeypatch.setenv("SGLANG_EAGLE3_GEMV_LEAN", "1")
    assert gemv_config(*shape) == gemv_config(*shape, lean=True)


def test_gemv_fma_form_and_knob(monkeypatch):
    """Which matrices the skinny GEMM runs on the CUDA cores: a Kimi TP=8 rank's q_b (and DeepSeek-V3's), not the
    wide projections, short K, 3-D (per-head) weights, N-contiguous views or epilogues; SGLANG_EAGLE3_GEMV_FMA=0
    turns it off, a bad value is named."""
    import torch

    from sglang_eagle3.kernels.gemv import fma_config, fma_form, fma_pair_config

    def takes(N, K, epilogue=False, heads=0, n_major=False):
        shape = (heads, N, K) if heads else (N, K)
        w = torch.empty(shape[::-1] if n_major else shape, dtype=torch.bfloat16)
        w = w.permute(*range(w.dim() - 1, -1, -1)) if n_major else w
        x = torch.empty((1, heads, K) if heads else (1, K), dtype=torch.bfloat16)
        return fma_form(N, K, x, w, epilogue)

    monkeypatch.delenv("SGLANG_EAGLE3_GEMV_FMA", raising=False)
    assert takes(1536, 1536) and takes(3072, 1536)  # q_b: Kimi, DeepSeek-V3 (TP=8)
    assert not takes(7168, 1024) and not takes(2112, 7168) and not takes(7168, 256)  # o_proj, q_a + kv_a, down
    assert not takes(64, 65536)  # few rows of a very long K (its steps are unrolled)
    assert not takes(1536, 1536, epilogue=True) and not takes(512, 1536, heads=8)
    assert not takes(1536, 1536, n_major=True)
    monkeypatch.delenv("SGLANG_EAGLE3_GEMV_LANES_FIRST", raising=False)
    assert fma_config(1536, 1536) == {"BLOCK_N": 4, "LANES": 128, "num_warps": 4, "MAX_ROWS": 4,
                                      "LANES_FIRST": True}  # lanes first is the default (thirty-sixth session)
    assert fma_config(1100, 512)["num_warps"] == 2
    monkeypatch.setenv("SGLANG_EAGLE3_GEMV_FMA_CONFIG", "BLOCK_N=8, LANES=32,num_warps=8,MAX_ROWS=8")
    assert fma_config(1536, 1536) == {"BLOCK_N": 8, "LANES": 32, "num_warps": 8, "MAX_ROWS": 8,
                                      "LANES_FIRST": True}
    monkeypatch.setenv("SGLANG_EAGLE3_GEMV_LANES_FIRST", "0")
    assert fma_config(1536, 1536)["LANES_FIRST"] is False
    monkeypatch.setenv("SGLANG_EAGLE3_GEMV_FMA_CONFIG", "BLOCK_N=8,LANES=32,num_warps=8,MAX_ROWS=8,LANES_FIRST=1")
    assert fma_config(1536, 1536)["LANES_FIRST"] is True
    # SGLANG_EAGLE3_GEMV_LANES_FIRST: both forms' default tile order (an explicit LANES_FIRST=0 still wins)
    monkeypatch.setenv("SGLANG_EAGLE3_GEMV_LANES_FIRST", "1")
    assert fma_pair_config(384, 256, 7168)["LANES_FIRST"] is True
    monkeypatch.setenv("SGLANG_EAGLE3_GEMV_FMA_CONFIG", "BLOCK_N=8,LANES=32,num_warps=8,MAX_ROWS=8,LANES_FIRST=0")
    assert fma_config(1536, 1536)["LANES_FIRST"] is False
    monkeypatch.delenv("SGLANG_EAGLE3_GEMV_FMA_CONFIG")
    assert fma_config(1536, 1536)["LANES_FIRST"] is True
    monkeypatch.setenv("SGLANG_EAGLE3_GEMV_LANES_FIRST", "on")
    with pytest.raises(ValueError, match="SGLANG_EAGLE3_GEMV_LANES_FIRST='on'"):
        fma_pair_config(384, 256, 7168)
    monkeypatch.delenv("SGLANG_EAGLE3_GEMV_LANES_FIRST")
    monkeypatch.setenv("SGLANG_EAGLE3_GEMV_FMA_CONFIG", "BLOCK_N=8,LANES=32,num_warps=8,MAX_ROWS=8")
    for bad in ("BLOCK_N=8", "BLOCK_N=8,LANES=32,num_warps=8,MAX_ROWS=16", "BLOCK_N=6,LANES=32,num_warps=8,MAX_ROWS=8",
                "BLOCK_N:8", "ROWS=8,LANES=32,num_warps=8,MAX_ROWS=8",
                "BLOCK_N=8,LANES=32,num_warps=8,MAX_ROWS=8,LANES_FIRST=2"):
        monkeypatch.setenv("SGLANG_EAGLE3_GEMV_FMA_CONFIG", bad)
        with pytest.raises(ValueError, match="SGLANG_EAGLE3_GEMV_FMA_CONFIG="):
            fma_config(1536, 1536)
    monkeypatch.delenv("SGLANG_EAGLE3_GEMV_FMA_CONFIG")
    monkeypatch.setenv("SGLANG_EAGLE3_GEMV_FMA", "0")
    assert not takes(1536, 1536)
    monkeypatch.setenv("SGLANG_EAGLE3_GEMV_FMA", "yes")
    with pytest.raises(ValueError, match="SGLANG_EAGLE3_GEMV_FMA='yes'"):
        takes(1536, 1536)


def test_gemv_fma_for_engine(monkeypatch):
    """An engine allows the CUDA-core form when its graphs serve one request a step, or when the knob forces it."""
    from sglang_eagle3.kernels.gemv import fma_for_engine

    monkeypatch.delenv("SGLANG_EAGLE3_GEMV_FMA", raising=False)
    assert fma_for_engine(1) and not fma_for_engine(2) and not fma_for_engine(16)
    monkeypatch.setenv("SGLANG_EAGLE3_GEMV_FMA", "1")
    assert fma_for_engine(16)
    monkeypatch.setenv("SGLANG_EAGLE3_GEMV_FMA", "0")
    assert not fma_for_engine(1)
    monkeypatch.setenv("SGLANG_EAGLE3_GEMV_FMA", "on")
    with pytest.raises(ValueError, match="SGLANG_EAGLE3_GEMV_FMA='on'"):
        fma_for_engine(1)


def test_pdl_knobs(monkeypatch):
    """PDL never off CUDA; the skip list and the L2 prefetch flag; every bad value named in its error."""
    import torch

    from sglang_eagle3.kernels import tuning

    for name in ("SGLANG_EAGLE3_PDL", "SGLANG_EAGLE3_PDL_SKIP", "SGLANG_EAGLE3_PDL_L2_PREFETCH"):
        monkeypatch.delenv(name, raising=False)
    cpu = torch.device("cpu")
    assert not any(tuning.pdl(cpu, k) for k in tuning.PDL_KERNELS)
    assert not tuning.pdl_l2_prefetch()
    monkeypatch.setenv("SGLANG_EAGLE3_PDL_L2_PREFETCH", "1")
    assert tuning.pdl_l2_prefetch()
    monkeypatch.setenv("SGLANG_EAGLE3_PDL_SKIP", "moe, gemv")
    assert not tuning.pdl(cpu, "moe")
    with pytest.raises(AssertionError, match="'attention'"):
        tuning.pdl(cpu, "attention")
    monkeypatch.setenv("SGLANG_EAGLE3_PDL_SKIP", "moe,mlp")
    with pytest.raises(ValueError, match=r"SGLANG_EAGLE3_PDL_SKIP='moe,mlp': unknown \['mlp'\]"):
        tuning.pdl(cpu, "moe")
    monkeypatch.delenv("SGLANG_EAGLE3_PDL_SKIP")
    monkeypatch.setenv("SGLANG_EAGLE3_PDL", "yes")
    with pytest.raises(ValueError, match="SGLANG_EAGLE3_PDL='yes'"):
        tuning.pdl(cpu, "gemv")
    monkeypatch.delenv("SGLANG_EAGLE3_MOE_DOWN_PRELOAD", raising=False)
    assert tuning.moe_down_preload()
    monkeypatch.setenv("SGLANG_EAGLE3_MOE_DOWN_PRELOAD", "0")
    assert not tuning.moe_down_preload()
    monkeypatch.setenv("SGLANG_EAGLE3_MOE_DOWN_PRELOAD", "off")
    with pytest.raises(ValueError, match="SGLANG_EAGLE3_MOE_DOWN_PRELOAD='off'"):
        tuning.moe_down_preload()


def test_kernel_report(monkeypatch):
    """The provenance the server and benchmarks record: what the knobs resolve to, a bad one reported."""
    import torch

    from sglang_eagle3 import env, kernels

    monkeypatch.setenv("SGLANG_EAGLE3_NO_FUSE", "qa_norm")
    monkeypatch.setenv("SGLANG_EAGLE3_OVERLAP", "none")
    report = kernels.kernel_report(torch.device("cpu"))
    assert report["device"] == "cpu" and report["pdl"] == []  # never off CUDA
    assert report["fusions"] == sorted(f for f in env.FUSIONS if f != "qa_norm")
    assert report["overlaps"] == {"shared_down": False, "prefetch": None, "mla_k_path": False, "rope_side": False,
                                  "prefetch_next_moe": False}
    monkeypatch.setenv("SGLANG_EAGLE3_OVERLAP", "shared_down,prefetch_atn")
    report = kernels.kernel_report("cpu")
    assert report["overlaps"].startswith("error:") and "prefetch_atn" in report["overlaps"]


def test_config_table_override(tmp_path, monkeypatch):
    """SGLANG_EAGLE3_CONFIG_TABLE: its ops replace the checked-in table's, the rest stay; a file for another GPU,
    an unreadable one, or one without ops is refused with the path in the message."""
    from sglang_eagle3.kernels import tuning

    base = json.loads((tuning.CONFIG_DIR / "sm_90.json").read_text())
    sms = base["sm_counts"][0]
    bucket = {"BLOCK_N": 32, "BLOCK_W": 128, "num_warps": 8, "F16": True}
    override = tmp_path / "sweep_table.json"
    override.write_text(json.dumps({"arch": "sm_90", "sm_counts": [sms], "ops": {
        "fused_moe_int4_gemv_gate_up": [{"max_tokens": 3, **bucket},
                                        {"BLOCK_N": 8, "BLOCK_W": 128, "num_warps": 4, "F16": True}]}}))
    monkeypatch.delenv("SGLANG_EAGLE3_CONFIG_TABLE", raising=False)
    assert tuning._table("sm_90", sms)["ops"] == base["ops"]
    monkeypatch.setenv("SGLANG_EAGLE3_CONFIG_TABLE", str(override))
    merged = tuning._table("sm_90", sms)
    assert tuning._pick_bucket(merged["ops"]["fused_moe_int4_gemv_gate_up"], "tokens", 2) == bucket
    assert merged["ops"]["mla_attention"] == base["ops"]["mla_attention"]
    assert str(override) in merged["source"]
    with pytest.raises(ValueError, match=re.escape(f"is for sm_90 with SM counts {base['sm_counts']}, this GPU is "
                                                   "sm_120 with 188 SMs")):
        tuning._table("sm_120", 188)
    for name, text in (("broken.json", "{"), ("no_ops.json", json.dumps({"arch": "sm_90", "sm_counts": [sms]}))):
        bad = tmp_path / name
        bad.write_text(text)
        monkeypatch.setenv("SGLANG_EAGLE3_CONFIG_TABLE", str(bad))
        with pytest.raises(ValueError, match=name):
            tuning._table("sm_90", sms)
    monkeypatch.setenv("SGLANG_EAGLE3_CONFIG_TABLE", str(tmp_path / "missing.json"))
    with pytest.raises(ValueError, match="missing.json.*cannot be read"):
        tuning._table("sm_90", sms)
    # gate_up in the fp32 form at every T beside the checked-in table's packed fp16 down is one arithmetic (act is
    # stored in down's form whatever gate_up's dots are); an fp32 bucket under packed fp16 ones is not, and the
    # message names the file and the checked-in table under it
    fp32 = tmp_path / "fp32.json"
    fp32.write_text(json.dumps({"arch": "sm_90", "sm_counts": [sms], "ops": {
        "fused_moe_int4_gemv_gate_up": [{"BLOCK_N": 16, "F16": False}]}}))
    monkeypatch.setenv("SGLANG_EAGLE3_CONFIG_TABLE", str(fp32))
    assert tuning._table("sm_90", sms)["ops"]["fused_moe_int4_gemv_gate_up"] == [{"BLOCK_N": 16, "F16": False}]
    mixed = tmp_path / "mixed.json"
    mixed.write_text(json.dumps({"arch": "sm_90", "sm_counts": [sms], "ops": {
        "fused_moe_int4_gemv_gate_up": [{"max_tokens": 1, **bucket}, {"BLOCK_N": 16, "F16": False}]}}))
    monkeypatch.setenv("SGLANG_EAGLE3_CONFIG_TABLE", str(mixed))
    with pytest.raises(ValueError, match=r"SGLANG_EAGLE3_CONFIG_TABLE='.*mixed.json' over sm_90.json: "
                                         r"fused_moe_int4_gemv_gate_up's buckets differ in \('F16', 'BLOCK_W'\)"):
        tuning._table("sm_90", sms)


def test_moe_dot_knob_and_path_choice(monkeypatch):
    """SGLANG_EAGLE3_MOE_DOT_MAX: unset keeps DOT_MAX_TOKENS (the dot path off), N sends 2..N tokens to the dot
    path (never one token), a bad value is named in its error; the launcher's path follows it."""
    import importlib

    import torch

    from sglang_eagle3.kernels import quant

    fused_moe = importlib.import_module("sglang_eagle3.kernels.fused_moe")  # (kernels.fused_moe is a function)
    monkeypatch.delenv("SGLANG_EAGLE3_MOE_DOT_MAX", raising=False)
    assert tuning.moe_dot_max(fused_moe.DOT_MAX_TOKENS) == fused_moe.DOT_MAX_TOKENS == 0
    for bad in ("on", "-1", "4.0"):
        monkeypatch.setenv("SGLANG_EAGLE3_MOE_DOT_MAX", bad)
        with pytest.raises(ValueError, match=f"SGLANG_EAGLE3_MOE_DOT_MAX='{re.escape(bad)}'"):
            tuning.moe_dot_max(0)

    taken = []
    for name in ("_launch_int4_gemv", "_launch_int4_dot", "_launch"):
        monkeypatch.setattr(fused_moe, name, lambda *a, name=name, **k: taken.append(name))
    E, H, I, k = 4, 64, 32, 2
    p13, s13 = quant.quantize_int4(torch.randn(E, 2 * I, H))
    p2, s2 = quant.quantize_int4(torch.randn(E, H, I))

    def path_at(T: int) -> str:
        ids = torch.randint(0, E, (T, k), dtype=torch.int32)
        fused_moe.triton_fused_moe_int4(torch.randn(T, H), p13, s13, p2, s2, torch.rand(T, k), ids)
        return taken.pop()

    monkeypatch.setenv("SGLANG_EAGLE3_MOE_DOT_MAX", "8")
    assert [path_at(T) for T in (1, 2, 8, 9, 129)] == [
        "_launch_int4_gemv", "_launch_int4_dot", "_launch_int4_dot", "_launch_int4_gemv", "_launch"]
    monkeypatch.setenv("SGLANG_EAGLE3_MOE_DOT_MAX", "0")
    assert path_at(4) == "_launch_int4_gemv"


def test_gemv_fma_plain_pair_knob(monkeypatch):
    """A pair of plain matrices (MLA's q_a + kv_a) takes the CUDA cores (the default since the thirty-seventh
    session, at 128 lanes; the gated pair at 256) unless SGLANG_EAGLE3_GEMV_FMA_PLAIN_PAIR=0, which leaves the gated
    router + shared pair there; K's range, epilogues and SGLANG_EAGLE3_GEMV_FMA=0 still rule both; a bad value is
    named."""
    from sglang_eagle3.kernels.gemv import fma_pair_config, fma_pair_form

    monkeypatch.delenv("SGLANG_EAGLE3_GEMV_FMA", raising=False)
    monkeypatch.delenv("SGLANG_EAGLE3_GEMV_FMA_PLAIN_PAIR", raising=False)
    assert fma_pair_form(7168, gated=True, epilogue=False) and fma_pair_form(7168, gated=False, epilogue=False)
    assert fma_pair_config(1536, 576, 7168, gated=False)["LANES"] == 128
    assert fma_pair_config(384, 256, 7168)["LANES"] == 256
    monkeypatch.setenv("SGLANG_EAGLE3_GEMV_FMA_PLAIN_PAIR", "0")
    assert not fma_pair_form(7168, gated=False, epilogue=False) and fma_pair_form(7168, gated=True, epilogue=False)
    monkeypatch.setenv("SGLANG_EAGLE3_GEMV_FMA_PLAIN_PAIR", "1")
    assert not fma_pair_form(7168, gated=False, epilogue=True) and not fma_pair_form(512, gated=False, epilogue=False)
    monkeypatch.setenv("SGLANG_EAGLE3_GEMV_FMA", "0")
    assert not fma_pair_form(7168, gated=False, epilogue=False)
    monkeypatch.delenv("SGLANG_EAGLE3_GEMV_FMA")
    monkeypatch.setenv("SGLANG_EAGLE3_GEMV_FMA_PLAIN_PAIR", "yes")
    with pytest.raises(ValueError, match="SGLANG_EAGLE3_GEMV_FMA_PLAIN_PAIR='yes'"):
        fma_pair_form(7168, gated=False, epilogue=False)


def test_mla_short_split_only_where_no_split_holds_more_tiles():
    """The sm_90 table's short_split (16-row blocks at one key-tile buffer for verify rows) applies where a request's
    splits hold at most max_tiles key tiles whatever the context, from shapes alone: batch 1 in an 8448-slot table,
    not in a long-context server's table, not for 4 requests (fewer splits a request, more tiles each), not for a
    prefill chunk (its splits follow the row blocks), never for decode rows (16 already); and it never changes the
    split count, which a token's bits follow."""
    from sglang_eagle3.kernels.mla_attention import launch_plan

    table = json.loads((tuning.CONFIG_DIR / "sm_90.json").read_text())
    sms = table["sm_counts"][0]

    def plan(B, T, cap):
        return launch_plan(B, T, 8, cap, sms, tuning.table_config(table, "mla_attention", "rows", 8 * T))

    short = tuning.table_config(table, "mla_attention", "rows", 32)["short_split"]
    per_split = 64 * short["max_tiles"]
    for T in (3, 4, 8, 16):
        got = plan(1, T, 8448)
        assert (got["BLOCK_M"], got["num_stages"], got["row_blocks"]) == (16, 2, -(-T * 8 // 16)), (T, got)
        assert got["splits"] == plan(1, 1, 8448)["splits"] == 132, (T, got)
        for B, cap in ((1, 132 * per_split + 64), (1, 131072), (4, 8448)):
            long = plan(B, T, cap)
            assert (long["BLOCK_M"], long["num_stages"]) == (32, 3), (T, B, cap, long)
            assert long["splits"] == plan(B, 1, cap)["splits"], (T, B, cap, long)
    assert plan(1, 17, 8448)["BLOCK_M"] == 32  # a prefill chunk's rows: the table's blocks
    assert (plan(1, 1, 8448)["BLOCK_M"], plan(1, 1, 8448)["num_stages"]) == (16, 3)


def test_gemv_fma_row_groups_grid(monkeypatch):
    """The CUDA-core forms' grid: row groups on axis 0 for the pair launches by default (a weight block's programs
    adjacent), for both forms with SGLANG_EAGLE3_GEMV_GROUPS_INNER=all, for neither with none; the blocks there at
    one row group (the grid as before) and where they would not fit grid axis 1; a bad value is named."""
    from sglang_eagle3.kernels.gemv import _fma_grid, row_groups_inner

    monkeypatch.delenv("SGLANG_EAGLE3_GEMV_GROUPS_INNER", raising=False)
    assert row_groups_inner("pair") and not row_groups_inner("single")
    blocks, rows = 528, 4  # q_a + kv_a at Kimi's TP=8 rank (1536 + 576 rows, 4 a program)
    assert _fma_grid(blocks, 7, rows, 1, True) == ((2, blocks, 1), True)  # a verify of 7: two row groups
    assert _fma_grid(blocks, 7, rows, 1, False) == ((blocks, 2, 1), False)
    assert _fma_grid(blocks, 4, rows, 1, True) == ((blocks, 1, 1), False)  # one row group
    assert _fma_grid(70_000, 7, rows, 8, True) == ((70_000, 2, 8), False)  # past axis 1's 65535
    for value, pair, single in (("all", True, True), ("NONE", False, False), ("pairs", True, False)):
        monkeypatch.setenv("SGLANG_EAGLE3_GEMV_GROUPS_INNER", value)
        assert (row_groups_inner("pair"), row_groups_inner("single")) == (pair, single), value
    monkeypatch.setenv("SGLANG_EAGLE3_GEMV_GROUPS_INNER", "1")
    with pytest.raises(ValueError, match="SGLANG_EAGLE3_GEMV_GROUPS_INNER='1'"):
        row_groups_inner("pair")


@pytest.fixture
def fake_gpu(monkeypatch):
    """torch.cuda.get_device_properties answering for an H100 (no CUDA here); the cached lookups cleared after."""
    import types

    import torch

    props = types.SimpleNamespace(major=9, minor=0, multi_processor_count=132, name="NVIDIA H100 80GB HBM3",
                                  shared_memory_per_block_optin=227 << 10)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: props)
    monkeypatch.delenv("SGLANG_EAGLE3_CONFIG_TABLE", raising=False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    tuning._device.cache_clear()
    yield props
    tuning._device.cache_clear()


def test_emulated_gpu(fake_gpu, monkeypatch):
    """SGLANG_EAGLE3_EMULATE_GPU=sm_120 on a Hopper GPU: the launch decisions follow the derived sm_120 table, its
    188 SMs and its 99 KB a block (the configs, grids and MLA depth an RTX PRO 6000 gets), and the device name says
    which card emulates it; an unknown name, or a GPU that cannot hold the profile's blocks, is refused by value."""
    import torch

    from sglang_eagle3 import kernels
    from sglang_eagle3.kernels.mla_attention import launch_plan

    cuda = torch.device("cuda", 0)
    monkeypatch.delenv("SGLANG_EAGLE3_EMULATE_GPU", raising=False)
    assert tuning.device_key(0) == ("sm_90", 132, "NVIDIA H100 80GB HBM3")
    assert tuning.smem_per_block(cuda) == 227 << 10
    sm90 = tuning.get_config("mla_attention", cuda, "rows", 8)
    monkeypatch.setenv("SGLANG_EAGLE3_EMULATE_GPU", "sm_120")
    arch, sms, name = tuning.device_key(0)
    assert (arch, sms) == ("sm_120", 188) and name.startswith("NVIDIA H100 80GB HBM3 emulating sm_120"), name
    assert tuning.sm_count(cuda) == 188 and tuning.smem_per_block(cuda) == 99 << 10
    report = kernels.kernel_report(cuda)  # the provenance benchmarks and the server record: it names the emulation
    assert (report["gpu"], report["arch"], report["sm_count"]) == (name, "sm_120", 188)
    assert report["config_table"] == {"arch": "sm_120", "measured": False, "override": None}
    table = json.loads((tuning.CONFIG_DIR / "sm_120.json").read_text())
    for rows in (8, 32):
        got = tuning.get_config("mla_attention", cuda, "rows", rows)
        assert got == tuning.table_config(table, "mla_attention", "rows", rows)
    assert got != sm90
    # the split count follows the emulated SM count
    plan = launch_plan(1, 1, 8, 131072, tuning.sm_count(cuda), tuning.get_config("mla_attention", cuda, "rows", 8))
    assert plan["splits"] == got["ctas_per_sm"] * 188, plan
    monkeypatch.setenv("SGLANG_EAGLE3_EMULATE_GPU", "sm_121")
    with pytest.raises(ValueError, match=r"SGLANG_EAGLE3_EMULATE_GPU='sm_121': unknown GPU, expected one of "
                                         r"\['sm_120'\]"):
        tuning.device_key(0)
    report = kernels.kernel_report(cuda)  # reported, not raised (the launches raise it)
    assert report["gpu"].startswith("error: SGLANG_EAGLE3_EMULATE_GPU='sm_121'") and report["arch"] is None, report
    fake_gpu.shared_memory_per_block_optin = 48 << 10
    tuning._device.cache_clear()
    monkeypatch.setenv("SGLANG_EAGLE3_EMULATE_GPU", "sm_120")
    with pytest.raises(ValueError, match="needs an sm_90 or newer GPU with at least 99 KB .* this one is sm_90 "
                                         "with 48 KB"):
        tuning.smem_per_block(cuda)
    with pytest.raises(ValueError, match="this one is sm_80 with 163 KB"):
        tuning.emulated_gpu("sm_120", "sm_80", 163 << 10)


def test_derived_table_said_once(caplog, monkeypatch, tmp_path):
    """A process on a GPU whose checked-in table was never measured (sm_120's) is told so once, with the command that
    measures one; a measured table, or a table given by SGLANG_EAGLE3_CONFIG_TABLE, says nothing."""
    monkeypatch.delenv("SGLANG_EAGLE3_CONFIG_TABLE", raising=False)
    tuning._merged_table.cache_clear()
    try:
        with caplog.at_level("WARNING", logger="sglang_eagle3.kernels.tuning"):
            for _ in range(2):
                tuning._table("sm_120", 188)
                tuning._table("sm_90", 132)
        said = [r.getMessage() for r in caplog.records]
        assert len(said) == 1 and "configs/sm_120.json (188 SMs) is derived" in said[0], said
        assert "bench_kernels.py --out DIR --sweep`" in said[0], said
        assert "SGLANG_EAGLE3_CONFIG_TABLE=DIR/sweep_table.json" in said[0], said
        swept = tmp_path / "sweep_table.json"  # a table measured on that GPU, over the derived one
        swept.write_text(json.dumps({"arch": "sm_120", "sm_counts": [188], "measured": True,
                                     "ops": {"moe_topk": [{"num_warps": 1}]}}))
        monkeypatch.setenv("SGLANG_EAGLE3_CONFIG_TABLE", str(swept))
        caplog.clear()
        with caplog.at_level("WARNING", logger="sglang_eagle3.kernels.tuning"):
            assert tuning._table("sm_120", 188)["ops"]["moe_topk"] == [{"num_warps": 1}]
        assert not caplog.records, [r.getMessage() for r in caplog.records]
    finally:
        tuning._merged_table.cache_clear()


def test_autotune_cache_per_gpu_kind_and_dir_read_at_call(tmp_path, monkeypatch, caplog):
    """_autotune (no GPU needed: the timings come from `bench`): the winner is the fastest candidate, cached on
    disk under SGLANG_EAGLE3_CACHE_DIR as it is at the call (set here after the import), reused without timing
    again; two GPU kinds keep their own files; an unreadable cache file is tuned afresh with a warning."""
    monkeypatch.setattr(tuning, "_tuned", {})
    op = "fused_moe_int4_gemv_down"
    cands = tuning.CANDIDATES[op]
    costs = {json.dumps(c, sort_keys=True): random.uniform(1, 100) for c in cands}
    want = min(cands, key=lambda c: costs[json.dumps(c, sort_keys=True)])

    def bench(cfg):
        return costs[json.dumps({k: cfg[k] for k in cands[0]}, sort_keys=True)]

    def no_bench(cfg):
        raise AssertionError("timed again where the cache holds the op")

    dir_a = tmp_path / "a"
    monkeypatch.setenv("SGLANG_EAGLE3_CACHE_DIR", str(dir_a))
    got = tuning._autotune(op, "sm_89", 128, "GPU X", "T=1", bench)
    assert {k: got[k] for k in want} == want
    (file_a,) = dir_a.glob("tuning-sm_89-128sm-*.json")
    assert json.loads(file_a.read_text()) == {f"{op}/T=1": want}
    assert tuning._autotune(op, "sm_89", 128, "GPU X", "T=1", no_bench) == got

    # another kind of GPU in the same process: its own file, holding only its own entry
    got_b = tuning._autotune(op, "sm_86", 84, "GPU Y", "T=2", bench)
    (file_b,) = dir_a.glob("tuning-sm_86-84sm-*.json")
    assert json.loads(file_b.read_text()) == {f"{op}/T=2": {k: got_b[k] for k in want}}
    assert json.loads(file_a.read_text()) == {f"{op}/T=1": want}

    # a fresh process (the in-memory entries gone) reads the file instead of timing
    monkeypatch.setattr(tuning, "_tuned", {})
    assert tuning._autotune(op, "sm_89", 128, "GPU X", "T=1", no_bench) == got

    # a corrupt file: tuned afresh, named in a warning, rewritten whole
    dir_c = tmp_path / "c"
    monkeypatch.setenv("SGLANG_EAGLE3_CACHE_DIR", str(dir_c))
    corrupt = tuning._cache_file("sm_89", 128, "GPU X")
    assert corrupt.parent == dir_c
    dir_c.mkdir()
    corrupt.write_text('{"half a file')
    with caplog.at_level("WARNING", logger=tuning.__name__):
        assert tuning._autotune(op, "sm_89", 128, "GPU X", "T=1", bench) == got
    assert str(corrupt) in caplog.text
    assert json.loads(corrupt.read_text()) == {f"{op}/T=1": want}
