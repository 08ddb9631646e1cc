"""``import sglang_eagle3.patch`` applies the SGLang overlay with its defaults.

Equivalent to ``sglang_eagle3.apply()``; for options (strict verify, features off) call ``apply(...)``
yourself instead. Import it before creating ``sglang.Engine``: SGLang's scheduler workers are spawned
and get the overlay through the ``SGLANG_EAGLE3_OVERLAY`` variable that ``apply`` sets (read there by our
SGLang plugin, or by the ``sglang.Engine`` spawn bootstrap). In a multiprocessing child of a process that
applied the overlay, this import takes the parent's configuration (a spawned child re-imports the parent's
main module, so this line runs there again; it must not reset options the parent chose).
"""

from __future__ import annotations

from sglang_eagle3.integration.sglang_overlay import apply

status = apply()
