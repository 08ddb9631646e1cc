"""Spawn targets for the overlay tests: a child that runs SGLang's real scheduler entry point and reports the
overlay state it ended up with. Importable by name (multiprocessing's spawn pickles targets by reference)."""

from __future__ import annotations

import sys


def overlay_state() -> dict:
    from sglang.srt.model_executor.model_runner import ModelRunner

    overlay = sys.modules.get("sglang_eagle3.integration.sglang_overlay")
    status = overlay.status() if overlay is not None else None
    return {"forward_raw_patched": hasattr(ModelRunner.__dict__["_forward_raw"], "__wrapped__"),
            "config": status["config"] if status else None}


def run_scheduler_entry(entry, queue) -> None:
    """Call ``entry`` as SGLang's launcher calls a scheduler worker's target, with arguments that make it stop
    right after its start-up (SGLang's run_scheduler_process: load_plugins(), then the rank placement, which
    fails on ``server_args=None``); report the overlay state left behind."""
    try:
        entry(None, None, 0, 0, 0, None, None)
        error = None
    except Exception as e:  # expected: the placement reads server_args
        error = f"{type(e).__name__}: {e}"
    queue.put({**overlay_state(), "error": error})


def spawned_report(entry) -> tuple[int | None, dict]:
    """(exit code, report) of a spawned child running ``entry`` through run_scheduler_entry."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=run_scheduler_entry, args=(entry, queue))
    proc.start()
    child = queue.get(timeout=300)
    proc.join(timeout=60)
    return proc.exitcode, child
