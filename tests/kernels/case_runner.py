"""Runs a checks script's cases (kernel_checks.py, compile_checks.py: one JSON line per case) in fresh
subprocesses, sharded over the machine's cores: the interpreter and Triton's ptxas are single-threaded, and these
two runs are most of the CPU suite's time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

MAX_SHARDS = 8  # each shard imports torch and triton (~0.4 GB): bounded on a many-core machine


def run_cases(script: Path, cases: list[str], env: dict[str, str], timeout: float) -> dict[str, dict]:
    """{case: {"case", "ok", "detail"}} for ``cases`` (in order), run by ``script`` in up to one subprocess a core
    this process may use, MAX_SHARDS at most (cases dealt round-robin, so the slow ones of an area spread out).
    A shard that crashes or is still running ``timeout`` seconds after the start reports the cases it printed; the
    others are missing and their tests say so."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    shards = max(1, min(len(cases), cores, MAX_SHARDS))
    procs = [subprocess.Popen([sys.executable, str(script), *cases[i::shards]], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for i in range(shards)]
    deadline = time.monotonic() + timeout  # one limit for the shards together: they run side by side
    results, errors = {}, []
    for proc in procs:
        try:
            out, err = proc.communicate(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            err += f"\n(killed after {timeout} s)"
        for line in out.splitlines():
            if line.startswith("{"):
                row = json.loads(line)
                results[row["case"]] = row
        if proc.returncode:
            errors.append(f"rc={proc.returncode}: {err[-2000:]}")
    assert results, f"{script.name} produced no results:\n" + "\n".join(errors)
    return results


def selected_cases(request, all_cases) -> list[str]:
    """The cases of this test module that the session selected (e.g. -k moe), else all of them."""
    chosen = sorted({item.callspec.params["case"] for item in request.session.items
                     if item.module is request.module and hasattr(item, "callspec")})
    return chosen or sorted(all_cases)
