"""SGLang integration: the overlay that patches SGLang 0.5.23 in place (see sglang_overlay.py and
docs/SGLANG_OVERLAY.md). Importing this package does not import SGLang; ``apply()`` does.
"""

from __future__ import annotations

__all__ = ["apply", "remove", "status"]


def __getattr__(name):
    if name in __all__:
        from sglang_eagle3.integration import sglang_overlay

        return getattr(sglang_overlay, name)
    raise AttributeError(f"module 'sglang_eagle3.integration' has no attribute {name!r}")
