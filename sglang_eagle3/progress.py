"""Progress of long work: the formatting shared by its lines (checkpoint loads, draft training), and the
start-up heartbeat.

The heartbeat: long start-up work (a checkpoint's tensors, each CUDA graph captured, the adaptive draft length's
timing) calls ``beat("what it is doing now")`` as it goes. Outside a TP worker's start nothing listens and a beat
costs a context-variable lookup; inside one (distributed/workers.py) the worker forwards the latest beat to the
engine, whose start-up bound (``worker_start_timeout``) is then a bound on time without progress, not on the whole
start: a healthy load of a 1T-parameter checkpoint from slow storage may take an hour, a hang is named in minutes
with the last thing each rank reported. A context variable rather than a callback threaded through the loader, the
model runner and every graph runner: the code that beats should not know who listens, as model code does not know
it is captured."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator

_LISTENER: contextvars.ContextVar[Callable[..., None] | None] = contextvars.ContextVar(
    "sglang_eagle3_progress_listener", default=None)


def duration(seconds: float) -> str:
    """``1h02m``, ``3m05s`` or ``42s``: how long a piece of work took or has left, to the second."""
    s = int(round(seconds))
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


def beat(doing: str, *args) -> None:
    """Reports progress of start-up work: ``doing % args`` is what runs now (formatted only by a listener, which
    may drop beats closer together than it forwards: call it as often as a unit of work completes)."""
    listener = _LISTENER.get()
    if listener is not None:
        listener(doing, *args)


@contextlib.contextmanager
def listening(listener: Callable[..., None]) -> Iterator[None]:
    """``listener(doing, *args)`` hears every beat of this context (this thread) while the block runs."""
    token = _LISTENER.set(listener)
    try:
        yield
    finally:
        _LISTENER.reset(token)
