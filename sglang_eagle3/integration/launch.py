"""``launch_server --backend sglang``: apply the overlay, then hand every remaining flag to SGLang's own
launcher (``python -m sglang.launch_server``), in this process so the overlay is in place before SGLang
spawns its workers (which re-apply it from SGLANG_EAGLE3_OVERLAY).

Overlay switches come from the environment so they never collide with SGLang's flags:
SGLANG_EAGLE3_STRICT_VERIFY=1 (fail instead of falling back to eager verify), SGLANG_EAGLE3_NO_MOE_ROUTING=1,
SGLANG_EAGLE3_FORCE=1 (other SGLang versions, at your own risk).
"""

from __future__ import annotations

import logging
import os
import runpy
import sys

logger = logging.getLogger(__name__)


def launch_sglang(argv: list[str]) -> int:
    from sglang_eagle3.integration import sglang_overlay

    status = sglang_overlay.apply(strict_verify=os.environ.get("SGLANG_EAGLE3_STRICT_VERIFY") == "1",
                                  moe_routing=os.environ.get("SGLANG_EAGLE3_NO_MOE_ROUTING") != "1")
    logger.info("sglang_eagle3 overlay applied (%d patches); starting SGLang's launcher",
                len(status.get("patched", [])))
    saved = sys.argv
    sys.argv = ["sglang.launch_server", *argv]
    try:
        runpy.run_module("sglang.launch_server", run_name="__main__", alter_sys=True)
    except SystemExit as e:
        return int(e.code or 0) if not isinstance(e.code, str) else 1
    finally:
        sys.argv = saved
    return 0
