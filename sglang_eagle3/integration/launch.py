"""``launch_server --backend sglang``: apply the overlay, then hand every remaining flag to SGLang's own
launcher (``python -m sglang.launch_server``), in this process. SGLang's HTTP launcher spawns its scheduler
workers with its stock ``run_scheduler_process``; they get the overlay from our SGLang plugin (plugin.py),
which re-applies the config ``apply`` left in SGLANG_EAGLE3_OVERLAY. Start-up is refused when SGLang would
not run that plugin (package not installed with its entry point, SGLANG_PLUGINS leaving it out, a
run_scheduler_process that no longer calls load_plugins), with --use-ray (SGLang's Ray actors never run plugins),
and when ``apply`` refuses the installed SGLang (its version, a moved code path).

Overlay switches come from the environment so they never collide with SGLang's flags:
SGLANG_EAGLE3_STRICT_VERIFY=1 (fail instead of falling back to eager verify), SGLANG_EAGLE3_NO_MOE_ROUTING=1,
SGLANG_EAGLE3_FORCE=1 (other SGLang versions, at your own risk), SGLANG_EAGLE3_KEEP_GRAPH_BS=1 (do not add
--cuda-graph-max-bs-decode, see close_common_fallbacks).
"""

from __future__ import annotations

import argparse
import logging
import runpy
import sys

from sglang_eagle3 import env

logger = logging.getLogger(__name__)

# SGLang 0.5.23 flags that already fix the decode runner's batch sizes (the runner that replays verify graphs).
DECODE_GRAPH_BS_FLAGS = ("--cuda-graph-max-bs-decode", "--cuda-graph-bs-decode")


def _flag_value(argv: list[str], flag: str) -> str | None:
    """The value of the last ``flag`` in ``argv`` (argparse keeps the last one)."""
    value = None
    for i, a in enumerate(argv):
        if a == flag and i + 1 < len(argv):
            value = argv[i + 1]
        elif a.startswith(flag + "="):
            value = a.split("=", 1)[1]
    return value


def _has_flag(argv: list[str], flag: str) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in argv)


class _ArgvUnreadable(Exception):
    pass


def _sglang_reading(argv: list[str]) -> argparse.Namespace | None:
    """``argv`` as SGLang's own parser reads it: a ``--config`` YAML merged under the command line by its
    ConfigArgumentMerger, the last occurrence of a flag winning, abbreviations expanded. None when ``argv`` does not
    parse (SGLang's launcher then reports it). Without SGLang (tests), a plain reading of the flags used here."""
    try:
        from sglang.srt.server_args import ServerArgs
        from sglang.srt.utils.server_args_config_parser import ConfigArgumentMerger
    except ImportError:
        running = _flag_value(argv, "--max-running-requests")
        if running is not None and not running.isdigit():
            return None
        return argparse.Namespace(max_running_requests=None if running is None else int(running),
                                  cuda_graph_max_bs_decode=_flag_value(argv, "--cuda-graph-max-bs-decode"),
                                  cuda_graph_bs_decode=_flag_value(argv, "--cuda-graph-bs-decode"),
                                  use_ray=_has_flag(argv, "--use-ray"))

    class Parser(argparse.ArgumentParser):
        def error(self, message):  # argparse would print SGLang's usage and exit here
            raise _ArgvUnreadable(message)

    parser = Parser(add_help=False)
    ServerArgs.add_cli_args(parser)
    for action in parser._actions:  # a missing --model-path is for SGLang's launcher to report, not a reason to skip
        action.required = False
    try:
        merged = ConfigArgumentMerger(parser).merge_config_with_args(list(argv)) if "--config" in argv else argv
        ns, _ = parser.parse_known_args(merged)  # flags a plugin adds later are not known yet: left aside
    except Exception as e:  # a bad value, a missing or malformed --config file
        logger.debug("could not read the SGLang arguments: %s", e)
        return None
    return ns


def close_common_fallbacks(argv: list[str]) -> list[str]:
    """The commonest eager verify fallback is a running batch above the largest captured decode graph (verify
    replays graphs of SGLang's decode runner): SGLang 0.5.23 picks that size from the GPU's memory and only ever
    lowers it to --max-running-requests, never raises it. When the user set --max-running-requests and no
    decode graph batch size (--cuda-graph-max-bs-decode, --cuda-graph-bs-decode; on the command line or in a
    --config file, read with SGLang's own parser), capture up to it: adds ``--cuda-graph-max-bs-decode N``
    (logged; SGLANG_EAGLE3_KEEP_GRAPH_BS=1 keeps SGLang's choice). A --cuda-graph-config JSON still wins over the
    added flag, as SGLang ranks them."""
    reading = _sglang_reading(argv)
    if reading is None or env.KEEP_GRAPH_BS.switch(False):
        return argv
    running = reading.max_running_requests
    if running is None or reading.cuda_graph_max_bs_decode is not None or reading.cuda_graph_bs_decode is not None:
        return argv
    logger.info("capturing decode/verify CUDA graphs up to --max-running-requests=%d (added "
                "--cuda-graph-max-bs-decode %d) so verify never falls back to eager for batch size", running, running)
    return [*argv, "--cuda-graph-max-bs-decode", str(running)]


def launch_sglang(argv: list[str]) -> int:
    from sglang_eagle3.integration import sglang_overlay

    try:  # 0/1 only: SGLANG_EAGLE3_STRICT_VERIFY=true must not start a server that is silently not strict
        strict, no_moe = env.STRICT_VERIFY.switch(False), env.NO_MOE_ROUTING.switch(False)
        env.KEEP_GRAPH_BS.switch(False)
        env.OVERLAY_FORCE.switch(False)
    except ValueError as e:
        logger.error("sglang_eagle3 overlay: %s; not starting", e)
        return 2
    problem = sglang_overlay.worker_plugin_problem()
    if problem is not None:
        logger.error("sglang_eagle3 overlay: %s. SGLang's launcher spawns its workers with its stock entry point, "
                     "so without the plugin they would run without the overlay; not starting", problem)
        return 2
    reading = _sglang_reading(argv)
    if reading is not None and reading.use_ray:
        # NOTE: SGLang 0.5.23's SchedulerActor builds its Scheduler without load_plugins(), and an actor on a Ray
        # cluster gets the cluster's environment, not this process's.
        logger.error("sglang_eagle3 overlay: --use-ray (as SGLang reads the arguments): SGLang's Ray mode runs its "
                     "schedulers as Ray actors, which never run SGLang's plugins, so its workers would serve without "
                     "the overlay (and, on a Ray cluster, without this process's environment: --worker-env); not "
                     "starting (drop --use-ray, or run SGLang's own launcher without the overlay)")
        return 2
    try:
        status = sglang_overlay.apply(strict_verify=strict, moe_routing=not no_moe)
    except (sglang_overlay.UnsupportedSGLangVersion, sglang_overlay.PatchTargetError) as e:
        logger.error("sglang_eagle3 overlay: %s; not starting", e)
        return 2
    logger.info("sglang_eagle3 overlay applied here (%d patches); SGLang's workers apply it through the plugin; "
                "starting SGLang's launcher", len(status.get("patched", [])))
    saved = sys.argv
    sys.argv = ["sglang.launch_server", *close_common_fallbacks(argv)]
    try:
        runpy.run_module("sglang.launch_server", run_name="__main__", alter_sys=True)
    except SystemExit as e:
        if isinstance(e.code, str):  # sys.exit("message"): Python would print it; caught here, it must be said
            logger.error("%s", e.code)
            return 1
        return int(e.code or 0)
    finally:
        sys.argv = saved
    return 0
