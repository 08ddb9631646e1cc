"""The Triton kernels compile for sm_90 and sm_120 on this (CPU) machine, with the properties their design
relies on (see compile_checks.py). Runs in a fresh subprocess without TRITON_INTERPRET (under the
interpreter, triton.jit builds interpreted functions that cannot be compiled)."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
from case_runner import CaseRun, selected_cases  # noqa: E402
from compile_checks import CASES  # noqa: E402


def _ptxas() -> bool:
    import triton

    return bool(shutil.which(os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")))


def start_cases(items) -> CaseRun | None:
    """The compile checks' run of the session's selected cases (every case compiles several kernels for two GPUs;
    tests/conftest.py starts it at collection); None without ptxas (the fixture skips)."""
    cases = selected_cases(items, __file__, CASES)
    if not cases or not _ptxas():
        return None
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    return CaseRun(HERE / "compile_checks.py", cases, env)


@pytest.fixture(scope="module")
def compile_results(request, started_case_run) -> dict[str, dict]:
    if not _ptxas():
        pytest.skip("this Triton wheel ships no ptxas")
    return (started_case_run or start_cases(request.session.items)).results(timeout=540)


@pytest.mark.parametrize("case", sorted(CASES))
def test_kernel_compiles_for_gpu(compile_results, case):
    row = compile_results.get(case)
    assert row is not None, f"case {case} did not report (subprocess crashed?)"
    assert row["ok"], row["detail"]
