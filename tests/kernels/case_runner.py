"""Runs a checks script's cases (kernel_checks.py, compile_checks.py: one JSON line per case) in fresh
subprocesses, sharded over the machine's cores: the interpreter and Triton's ptxas are single-threaded, and these
two runs are most of the CPU suite's time. tests/conftest.py starts them as soon as the session's tests are
collected, so that they run beside the rest of the suite (which keeps one core busy) instead of after it; each
module's fixture then waits for its run's results."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

MAX_SHARDS = 8  # each shard imports torch and triton (~0.4 GB): bounded on a many-core machine


class CaseRun:
    """``cases`` of ``script`` running in up to one subprocess a core this process may use, MAX_SHARDS at most
    (cases dealt round-robin, so the slow ones of an area spread out); started here, waited for by results()."""

    def __init__(self, script: Path, cases: list[str], env: dict[str, str]):
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        shards = max(1, min(len(cases), cores, MAX_SHARDS))
        self.script = script
        # At a lower priority: beside the suite's other tests, whose multi-process tests (TP over gloo, servers)
        # slowed 2-3x when these shared the cores with them at the same priority, they take the cores left idle.
        self.procs = [subprocess.Popen([sys.executable, str(script), *cases[i::shards]], env=env,
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                       preexec_fn=_lower_priority if hasattr(os, "nice") else None)
                      for i in range(shards)]

    def results(self, timeout: float) -> dict[str, dict]:
        """{case: {"case", "ok", "detail", "seconds"}}. A shard that crashes or is still running ``timeout`` seconds
        after this call reports the cases it printed; the others are missing and their tests say so. (From this
        call, not from the start: a run started beside other tests shares the cores with them until then.)"""
        deadline = time.monotonic() + timeout  # one limit for the shards together: they run side by side
        results, errors = {}, []
        for proc in self.procs:
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
        assert results, f"{self.script.name} produced no results:\n" + "\n".join(errors)
        return results

    def kill(self) -> None:
        """Stops shards still running (the session ended before their tests: -x, Ctrl-C, deselected)."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()


def _lower_priority() -> None:
    os.nice(15)


def selected_cases(items, module_file: str, all_cases) -> list[str]:
    """The cases of the test module in ``module_file`` among the session's ``items`` (e.g. -k moe), in
    ``all_cases``' sorted order; none selected: []."""
    name = Path(module_file).name
    return sorted({item.callspec.params["case"] for item in items
                   if Path(str(item.fspath)).name == name and hasattr(item, "callspec")} & set(all_cases))
