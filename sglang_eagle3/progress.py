"""Formatting shared by the progress lines of long work (checkpoint loads, draft training)."""

from __future__ import annotations


def duration(seconds: float) -> str:
    """``1h02m``, ``3m05s`` or ``42s``: how long a piece of work took or has left, to the second."""
    s = int(round(seconds))
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"
