"""The leave-one-out kernels of benchmarks/ablations/ (timing only) must keep the signatures of the kernels they
stand in for: bench_kernels.kernels_from swaps one in by name where the launcher calls the real one with the
real one's arguments, so a parameter added to the real kernel and not to its stand-in breaks the swap (or,
worse, a constexpr default hides it). Checked by each parameter's name, constexpr-ness and default."""

from __future__ import annotations

import importlib
import inspect
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.bench_kernels import SWAPPABLE, _defines  # noqa: E402

ABLATIONS = sorted(p for folder in ("ablations", "variants") for p in (REPO / "benchmarks" / folder).glob("*.py")
                   if not p.name.startswith("_"))


def _signature(fn) -> list[tuple]:
    """A Triton kernel's parameters (name, constexpr-ness, default), or a Python function's (name, kind, default)."""
    if hasattr(fn, "params"):
        return [(p.name, p.is_constexpr, p.default) for p in fn.params]
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


def _real_kernel(name: str):
    """The package kernel a launcher in SWAPPABLE calls by ``name`` (the launcher module's global)."""
    for launcher, names in SWAPPABLE.items():
        if name in names:
            return getattr(importlib.import_module(launcher), name)
    raise AssertionError(f"{name} is not one of bench_kernels.SWAPPABLE's names: nothing would swap it in")


@pytest.mark.parametrize("path", ABLATIONS, ids=lambda p: p.stem)
def test_ablation_kernel_keeps_the_real_signature(path):
    spec = importlib.util.spec_from_file_location(f"ablation_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    swappable = {n for names in SWAPPABLE.values() for n in names}
    names = [n for n in vars(module) if n in swappable and _defines(module, n)]
    assert names, f"{path.name} defines none of bench_kernels.SWAPPABLE's names"
    for name in names:
        real = _real_kernel(name)
        assert _signature(getattr(module, name)) == _signature(real), (
            f"{path.name}: {name}'s parameters differ from {inspect.getmodule(getattr(real, 'fn', real)).__name__}"
            f".{name}'s")


def test_there_are_ablations():
    assert {p.stem for p in ABLATIONS} >= {"rotary_noop", "rms_norm_zero", "mla_merge_zero", "moe_topk_const",
                                           "rms_norm_skip", "rotary_skip", "moe_topk_skip"}


def test_kernels_from_refuses_two_files_replacing_one_name():
    """A '+' group whose files replace the same name would keep only the last file's (each wraps the package's
    own, not the other's): refused, naming it."""
    from benchmarks.bench_kernels import kernels_from

    V = REPO / "benchmarks" / "variants"
    kernels_from(f"{V / 'gemv_pair_l128.py'}+{V / 'gemv_fma_oproj.py'}")  # distinct names: fine
    with pytest.raises(SystemExit, match="fma_pair_config"):
        kernels_from(f"{V / 'gemv_pair_l128.py'}+{V / 'gemv_qkv_rows8.py'}")


CHEAP_DOTS = """
import sys
import torch
sys.path.insert(0, {repo!r})
sys.path.insert(0, {kernels!r})
from benchmarks.ablations import _moe_cheap_dots
from benchmarks.bench_kernels import kernels_from
from kernel_checks import make_moe_inputs
import importlib
launcher = importlib.import_module("sglang_eagle3.kernels.fused_moe")  # (the package's fused_moe is a function)
T, E, H, I, K = 3, 5, 64, 32, 4
args = make_moe_inputs(T, E, H, I, K, "cpu", True, torch.bfloat16, seed=71, skew=True)  # experts shared: ROWS pairs
NAMES = ("moe_int4_gemv_gate_up_kernel", "moe_int4_gemv_down_kernel")
same, cheap = _moe_cheap_dots.kernels("clone", cheap=False), _moe_cheap_dots.kernels("cheap")
A = {ablations!r}


def run(config, swap=None):
    saved = {{n: getattr(launcher, n) for n in NAMES}}
    for n in NAMES:
        setattr(launcher, n, swap[n] if swap else saved[n])
    try:
        return launcher.triton_fused_moe_int4(*args, 32, None, path="gemv", config=config)
    finally:
        for n in NAMES:
            setattr(launcher, n, saved[n])


for rows, preload in ((2, True), (1, False)):  # decode's form (ROWS, PRELOAD's tile) and the verify's slot loop
    config = {{"gate_up": {{"BLOCK_N": 16, "BLOCK_W": 4, "num_warps": 1, "F16": True, "ROWS": rows}},
              "down": {{"BLOCK_N": 16, "BLOCK_W": I // 8 if preload else 4, "num_warps": 1, "F16": True,
                        "PRELOAD": preload}}}}
    real = run(config)
    assert torch.equal(run(config, same), real), (rows, "the package's kernels compiled by with_helpers differ")
    both = run(config, cheap)
    assert torch.isfinite(both).all() and not torch.equal(both, real), (rows, both)
    with kernels_from(A["gate_up"] + "+" + A["down"])():
        assert torch.equal(run(config), both), (rows, "the two files together are not the cheap kernels")
    with kernels_from(A["down"])():
        down_only = run(config)
    assert not torch.equal(down_only, real) and not torch.equal(down_only, both), rows
print("ok")
"""


def test_cheap_dots_change_only_the_arithmetic():
    """benchmarks/ablations/_moe_cheap_dots.py under the interpreter (a subprocess): the INT4 GEMV MoE's kernels
    compiled by _fill.with_helpers with no override give the package's outputs bit for bit (so the cheap kernels
    keep everything but the helpers they replace), the cheap helpers reach both kernels at decode's form (gate_up's
    ROWS, down's PRELOAD tile) and at the slot loop, and the two ablation files swap in exactly those kernels."""
    import os
    import subprocess

    ablations = {k: str(REPO / "benchmarks" / "ablations" / f"moe_int4_gemv_{k}_cheap.py") for k in ("gate_up", "down")}
    code = CHEAP_DOTS.format(repo=str(REPO), kernels=str(REPO / "tests" / "kernels"), ablations=ablations)
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]
