"""Checks of the INT4 MoE tensor-core verify path, under the interpreter (CASES, run by
kernel_checks.py) and on the GPU."""

from __future__ import annotations

CASES: dict = {}
