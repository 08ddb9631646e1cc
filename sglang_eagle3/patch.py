"""``import sglang_eagle3.patch`` applies the SGLang overlay with its defaults.

Equivalent to ``sglang_eagle3.apply()``; for options (strict verify, features off) call ``apply(...)``
yourself instead. Import it before creating ``sglang.Engine``: SGLang's scheduler workers are spawned
and get the overlay through the ``SGLANG_EAGLE3_OVERLAY`` variable that ``apply`` sets.
"""

from __future__ import annotations

from sglang_eagle3.integration.sglang_overlay import apply

status = apply()
