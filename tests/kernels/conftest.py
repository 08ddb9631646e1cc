"""Starts the kernel checks' subprocess runs (the interpreter's and the compile checks', case_runner.py) as soon as
the session's tests are collected: they are most of the CPU suite's time, single-threaded a shard, and run beside
the tests before them instead of after them (the suite took ~20 minutes on a 2-core machine with them run in turn).
A test module with ``start_cases(items)`` takes part; its fixture waits for the run (case_runner.take_run)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from case_runner import RUNS  # noqa: E402


def pytest_collection_finish(session):
    if session.config.option.collectonly:
        return
    runs = session.config.stash.setdefault(RUNS, {})
    for module in {item.module for item in session.items if hasattr(getattr(item, "module", None), "start_cases")}:
        run = module.start_cases(session.items)
        if run is not None:
            runs[module.__file__] = run


def pytest_sessionfinish(session):
    for run in session.config.stash.get(RUNS, {}).values():
        run.kill()
