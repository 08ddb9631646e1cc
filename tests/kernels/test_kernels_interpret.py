"""Triton kernels vs their torch references on CPU, under the Triton interpreter.

The interpreter must be switched on before triton is imported, and other tests in this pytest process import
triton without it, so the cases run in fresh subprocesses (kernel_checks.py, one a core: case_runner.py), started
when the session's tests are collected (tests/conftest.py), and are reported one by one.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
from case_runner import CaseRun, selected_cases  # noqa: E402
from kernel_checks import CASES  # noqa: E402


def start_cases(items) -> CaseRun | None:
    """The interpreter's run of the session's selected cases (tests/conftest.py starts it at collection)."""
    cases = selected_cases(items, __file__, CASES)
    if not cases:
        return None
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return CaseRun(HERE / "kernel_checks.py", cases, env)


@pytest.fixture(scope="module")
def interpreter_results(request, started_case_run) -> dict[str, dict]:
    # ~6.5 CPU-minutes of cases (2026-12-08, in one process on a 2-core machine: 376 s, 569 before kernel_checks'
    # patch_language_once_a_launch), most of them run by the time it is asked
    return (started_case_run or start_cases(request.session.items)).results(timeout=720)


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
