"""sglang_eagle3: EAGLE-3 speculative decoding for DeepSeek-V3-family MoE models.

Public API (imported lazily so that ``import sglang_eagle3.kernels`` stays light):
  Engine            offline engine shaped like SGLang's ``sglang.Engine``
  apply / remove    the SGLang overlay (see sglang_eagle3.integration)
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["Engine", "apply", "remove", "__version__"]


def __getattr__(name):
    if name == "Engine":
        from sglang_eagle3.engine import Engine

        return Engine
    if name in ("apply", "remove"):
        from sglang_eagle3.integration import sglang_overlay

        return getattr(sglang_overlay, name)
    raise AttributeError(f"module 'sglang_eagle3' has no attribute {name!r}")
