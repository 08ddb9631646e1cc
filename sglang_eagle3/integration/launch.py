"""``launch_server --backend sglang``: apply the overlay, then hand every remaining flag to SGLang's own
launcher (``python -m sglang.launch_server``), in this process so the overlay is in place before SGLang
spawns its workers (which re-apply it from SGLANG_EAGLE3_OVERLAY).

Overlay switches come from the environment so they never collide with SGLang's flags:
SGLANG_EAGLE3_STRICT_VERIFY=1 (fail instead of falling back to eager verify), SGLANG_EAGLE3_NO_MOE_ROUTING=1,
SGLANG_EAGLE3_FORCE=1 (other SGLang versions, at your own risk), SGLANG_EAGLE3_KEEP_GRAPH_BS=1 (do not raise
--cuda-graph-max-bs, see close_common_fallbacks).
"""

from __future__ import annotations

import logging
import runpy
import sys

from sglang_eagle3 import env

logger = logging.getLogger(__name__)


def _flag_value(argv: list[str], flag: str) -> str | None:
    for i, a in enumerate(argv):
        if a == flag and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


def close_common_fallbacks(argv: list[str]) -> list[str]:
    """The commonest eager verify fallback is a running batch above the largest captured graph: SGLang picks
    --cuda-graph-max-bs from the GPU's memory, independently of --max-running-requests. When the user set the
    latter and not the former, capture up to it (logged; SGLANG_EAGLE3_KEEP_GRAPH_BS=1 keeps SGLang's choice)."""
    running = _flag_value(argv, "--max-running-requests")
    if running is None or _flag_value(argv, "--cuda-graph-max-bs") is not None \
            or env.KEEP_GRAPH_BS.flag():
        return argv
    logger.info("capturing CUDA graphs up to --max-running-requests=%s (added --cuda-graph-max-bs %s) so verify "
                "never falls back to eager for batch size", running, running)
    return [*argv, "--cuda-graph-max-bs", running]


def launch_sglang(argv: list[str]) -> int:
    from sglang_eagle3.integration import sglang_overlay

    status = sglang_overlay.apply(strict_verify=env.STRICT_VERIFY.flag(), moe_routing=not env.NO_MOE_ROUTING.flag())
    logger.info("sglang_eagle3 overlay applied (%d patches); starting SGLang's launcher",
                len(status.get("patched", [])))
    saved = sys.argv
    sys.argv = ["sglang.launch_server", *close_common_fallbacks(argv)]
    try:
        runpy.run_module("sglang.launch_server", run_name="__main__", alter_sys=True)
    except SystemExit as e:
        return int(e.code or 0) if not isinstance(e.code, str) else 1
    finally:
        sys.argv = saved
    return 0
