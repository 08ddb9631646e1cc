"""``launch_server --backend sglang``: apply the overlay, then hand every remaining flag to SGLang's own
launcher (``python -m sglang.launch_server``), in this process. SGLang's HTTP launcher spawns its scheduler
workers with its stock ``run_scheduler_process``; they get the overlay from our SGLang plugin (plugin.py),
which re-applies the config ``apply`` left in SGLANG_EAGLE3_OVERLAY. Start-up is refused when SGLang would
not run that plugin (package not installed with its entry point, or SGLANG_PLUGINS leaving it out).

Overlay switches come from the environment so they never collide with SGLang's flags:
SGLANG_EAGLE3_STRICT_VERIFY=1 (fail instead of falling back to eager verify), SGLANG_EAGLE3_NO_MOE_ROUTING=1,
SGLANG_EAGLE3_FORCE=1 (other SGLang versions, at your own risk), SGLANG_EAGLE3_KEEP_GRAPH_BS=1 (do not add
--cuda-graph-max-bs-decode, see close_common_fallbacks).
"""

from __future__ import annotations

import logging
import runpy
import sys

from sglang_eagle3 import env

logger = logging.getLogger(__name__)

# SGLang 0.5.23 flags that already fix the decode runner's batch sizes (the runner that replays verify graphs).
DECODE_GRAPH_BS_FLAGS = ("--cuda-graph-max-bs-decode", "--cuda-graph-bs-decode")


def _flag_value(argv: list[str], flag: str) -> str | None:
    for i, a in enumerate(argv):
        if a == flag and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


def _has_flag(argv: list[str], flag: str) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in argv)


def _with_config_file(argv: list[str]) -> list[str]:
    """``argv`` with the values of a ``--config`` YAML merged in as SGLang merges them (its own
    ConfigArgumentMerger), for reading only; unchanged when there is no --config or it cannot be read
    (SGLang's launcher then reports the problem itself)."""
    if "--config" not in argv:
        return argv
    import argparse

    from sglang.srt.server_args import ServerArgs
    from sglang.srt.utils.server_args_config_parser import ConfigArgumentMerger

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    try:
        return ConfigArgumentMerger(parser).merge_config_with_args(list(argv))
    except Exception as e:  # a missing or malformed file: SGLang's launcher says so when it parses argv
        logger.debug("could not read --config for close_common_fallbacks: %s", e)
        return argv


def close_common_fallbacks(argv: list[str]) -> list[str]:
    """The commonest eager verify fallback is a running batch above the largest captured decode graph (verify
    replays graphs of SGLang's decode runner): SGLang 0.5.23 picks that size from the GPU's memory and only ever
    lowers it to --max-running-requests, never raises it. When the user set --max-running-requests and no
    decode graph batch size (--cuda-graph-max-bs-decode, --cuda-graph-bs-decode; on the command line or in a
    --config file), capture up to it: adds ``--cuda-graph-max-bs-decode N`` (logged; SGLANG_EAGLE3_KEEP_GRAPH_BS=1
    keeps SGLang's choice). A --cuda-graph-config JSON still wins over the added flag, as SGLang ranks them."""
    seen = _with_config_file(argv)
    running = _flag_value(seen, "--max-running-requests")
    if running is None or any(_has_flag(seen, f) for f in DECODE_GRAPH_BS_FLAGS) or env.KEEP_GRAPH_BS.flag():
        return argv
    logger.info("capturing decode/verify CUDA graphs up to --max-running-requests=%s (added "
                "--cuda-graph-max-bs-decode %s) so verify never falls back to eager for batch size", running, running)
    return [*argv, "--cuda-graph-max-bs-decode", running]


def launch_sglang(argv: list[str]) -> int:
    from sglang_eagle3.integration import plugin, sglang_overlay

    problem = plugin.reachability_problem()
    if problem is not None:
        logger.error("sglang_eagle3 overlay: %s. SGLang's launcher spawns its workers with its stock entry point, "
                     "so without the plugin they would run without the overlay; not starting", problem)
        return 2
    status = sglang_overlay.apply(strict_verify=env.STRICT_VERIFY.flag(), moe_routing=not env.NO_MOE_ROUTING.flag())
    logger.info("sglang_eagle3 overlay applied here (%d patches); SGLang's workers apply it through the plugin; "
                "starting SGLang's launcher", len(status.get("patched", [])))
    saved = sys.argv
    sys.argv = ["sglang.launch_server", *close_common_fallbacks(argv)]
    try:
        runpy.run_module("sglang.launch_server", run_name="__main__", alter_sys=True)
    except SystemExit as e:
        return int(e.code or 0) if not isinstance(e.code, str) else 1
    finally:
        sys.argv = saved
    return 0
