"""Triton kernels vs their torch references on CPU, under the Triton interpreter.

The interpreter must be switched on before triton is imported, and other tests in this pytest process import
triton without it, so the cases run in fresh subprocesses (kernel_checks.py, one a core: case_runner.py) and are
reported one by one.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
from case_runner import run_cases, selected_cases  # noqa: E402
from kernel_checks import CASES  # noqa: E402


@pytest.fixture(scope="module")
def interpreter_results(request) -> dict[str, dict]:
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    # ~7 minutes on one core of a 2-core CI-like machine (2026-11-30), about half that on both
    return run_cases(HERE / "kernel_checks.py", selected_cases(request, CASES), env, timeout=720)


@pytest.mark.parametrize("case", sorted(CASES))
def test_kernel_matches_reference_under_interpreter(interpreter_results, case):
    row = interpreter_results.get(case)
    assert row is not None, f"case {case} did not report (subprocess crashed?)"
    assert row["ok"], row["detail"]


def test_cpu_defaults_to_reference():
    """Without use_triton, CPU tensors take the torch reference (no interpreter needed)."""
    import torch

    from sglang_eagle3 import kernels

    logits = torch.randn(3, 16)
    w, ids = kernels.moe_topk(logits, None, top_k=2, n_group=1, topk_group=1)
    rw, rids = kernels.ref_moe_topk(logits, None, top_k=2, n_group=1, topk_group=1)
    assert torch.equal(ids, rids) and torch.equal(w, rw)


@pytest.mark.parametrize("kw,needle", [
    (dict(top_k=9, n_group=4, topk_group=2), "exceeds the 8 experts"),
    (dict(top_k=2, n_group=4, topk_group=0), "topk_group"),
    (dict(top_k=2, n_group=0, topk_group=1), "n_group"),
    (dict(top_k=0, n_group=1, topk_group=1), "top_k"),
    (dict(top_k=2, n_group=16, topk_group=2), ">= 2 experts a group"),
    (dict(top_k=2, n_group=3, topk_group=1), "divisible"),
])
def test_cpu_routing_is_checked_as_the_kernel(kw, needle):
    """The reference path (CPU's default) routed impossible configurations silently (ids from dropped groups)."""
    import torch

    from sglang_eagle3 import kernels

    with pytest.raises(AssertionError, match=needle):
        kernels.moe_topk(torch.randn(3, 16), None, **kw)


def test_reference_routing_breaks_ties_as_the_kernel():
    """Lowest id first among equal scores (the kernel's documented order): torch.topk's tie order is unspecified."""
    import torch

    from sglang_eagle3 import kernels

    T, E, k = 40, 48, 8
    logits = torch.randint(0, 3, (T, E)).float() * 0.5  # many exact ties
    _, ids = kernels.ref_moe_topk(logits, None, top_k=k, n_group=1, topk_group=1)
    s = logits.sigmoid()
    for t in range(T):
        assert ids[t].tolist() == sorted(range(E), key=lambda i, t=t: (-s[t, i].item(), i))[:k]


def test_references_take_an_empty_batch():
    import torch

    from sglang_eagle3.kernels import ref

    E, I, H, k = 4, 8, 16, 2
    w13, w2 = torch.randn(E, 2 * I, H), torch.randn(E, H, I)
    ids, w = torch.zeros(0, k, dtype=torch.int32), torch.zeros(0, k)
    assert ref.ref_fused_moe(torch.zeros(0, H), w13, w2, w, ids).shape == (0, H)


def test_mla_widths_the_kernel_cannot_take_go_to_the_reference(monkeypatch):
    from sglang_eagle3 import kernels

    monkeypatch.setattr(kernels, "_kernel_ok", lambda *a, **k: True)  # as on a GPU
    assert kernels.mla_uses_kernel(64, 512)
    assert not kernels.mla_uses_kernel(24, 512)  # a rope width tl.dot cannot take (it raised inside the launcher)
    assert not kernels.mla_uses_kernel(64, 96)
    with pytest.raises(AssertionError, match="nothing to rotate"):
        kernels.apply_rotary(None, None, None, None, None, interleaved=True)
