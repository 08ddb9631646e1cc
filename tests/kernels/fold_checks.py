"""Checks of the launch folds into the skinny GEMM (input RMSNorm + residual into q_a/kv_a; MLA
merge into W_UV), under the interpreter (CASES, run by kernel_checks.py) and on the GPU."""

from __future__ import annotations

CASES: dict = {}
