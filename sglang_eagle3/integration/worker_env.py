"""Worker environment: what every SGLang worker really runs with, and where SGLang changed the user's values.

Patched symbols (0.5.23):
- ``sglang.srt.entrypoints.engine._set_envs_and_config``: diff ``os.environ`` around it and warn for every
  user-set variable it overwrote (it always writes CUDA_DEVICE_MAX_CONNECTIONS=8; NCCL_CUMEM_ENABLE /
  NCCL_NVLS_ENABLE when unset or when symmetric memory / NVLS is enabled). It runs in the launching process
  right before the workers are spawned, so it also diffs the environment ``apply()`` saw against the one at
  that call: that catches what SGLang's argument resolution wrote earlier (``server_args.resolve_once``, e.g.
  ``--enable-deterministic-inference`` with TP > 1 sets NCCL_ALGO / NCCL_MIN_NCHANNELS / NCCL_MAX_NCHANNELS).
- ``Scheduler.get_init_info``: each scheduler worker adds ``"sglang_eagle3": {"worker_env": ..., "overlay":
  ...}`` to its handshake dict; worker 0's dict is merged into ``Engine.get_server_info()`` and the HTTP
  ``/server_info`` (``/get_server_info``).
- ``DataParallelController.get_init_info``: with ``--dp-size`` > 1 SGLang's engine and HTTP launcher receive the DP
  controller's handshake dict instead of the schedulers' (it keeps theirs in ``_scheduler_init_infos``); it gets
  the first scheduler's ``"sglang_eagle3"`` entry plus ``"workers"``, every scheduler's, so the server info has
  the same shape and every worker's report with and without DP.
- ``Scheduler.get_internal_state``: adds live overlay state (verify-path counters) to the internal state.
- ``Engine.get_server_info``: adds every worker's report and ``compare_reports`` disagreements.
- ``Engine.run_scheduler_process_func``: scheduler processes are *spawned*, so a patch made in the parent
  does not exist in them; this bootstrap re-applies the overlay in the child (config passed through the
  ``SGLANG_EAGLE3_OVERLAY`` environment variable, which spawn inherits) before the entry point that was
  installed there (SGLang's ``run_scheduler_process`` or a fork's). Only ``sglang.Engine`` uses it; SGLang's
  HTTP launcher passes ``run_scheduler_process`` itself, and there the plugin (plugin.py) does the same job.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping

from sglang_eagle3.env_report import collect_env_report, compare_reports, overridden_user_values

logger = logging.getLogger(__name__)

INFO_KEY = "sglang_eagle3"
WORKERS_KEY = "workers"  # in a DP controller's INFO_KEY entry: every scheduler's entry


def wrap_set_envs_and_config(original: Callable, overrides: list[str],
                             env_at_apply: dict[str, str] | None = None) -> Callable:
    """Warn (and append to ``overrides``) for each user-set variable SGLang changed before spawning workers:
    in ``_set_envs_and_config`` itself, and (``env_at_apply``: ``os.environ`` when ``apply()`` ran) between
    ``apply()`` and this call, where SGLang's argument resolution writes some (NOTE: so does any code of
    the caller's that changes os.environ in between; the message says both)."""

    def _set_envs_and_config(server_args):
        before = dict(os.environ)
        msgs = changed_since_apply(env_at_apply or {}, before)
        result = original(server_args)
        msgs += overridden_user_values(before, os.environ)
        for msg in msgs:
            logger.warning("%s", msg)
            overrides.append(msg)
        return result

    return _set_envs_and_config


def changed_since_apply(env_at_apply: Mapping[str, str], now: Mapping[str, str]) -> list[str]:
    """Messages for reported variables (NCCL_*, CUDA_*, ...; secrets never) set when ``apply()`` ran whose
    value is different, or gone, in ``now``."""
    reported = collect_env_report(env_at_apply, include_device=False)["env"]
    return [f"{name}: user set {value!r} (when the overlay was applied), changed to {now.get(name, '<unset>')!r} "
            "before SGLang's engine start (by SGLang's argument resolution, e.g. --enable-deterministic-inference "
            "with TP > 1, or by the caller's own code)"
            for name, value in reported.items() if now.get(name) != value]


def wrap_get_init_info(original: Callable, overlay_status: Callable[[], dict]) -> Callable:
    def get_init_info(self):
        info = original(self)
        report = collect_env_report()
        logger.info("SGLang worker environment (pid %s, device %s): NCCL %s, %d NCCL/CUDA/TORCH variables set",
                    report["pid"], report["device"], report["nccl"], len(report["env"]))
        info[INFO_KEY] = {"worker_env": report, "overlay": overlay_status()}
        return info

    return get_init_info


def wrap_dp_controller_get_init_info(original: Callable) -> Callable:
    def get_init_info(self):
        info = original(self)
        infos = list(getattr(self, "_scheduler_init_infos", None) or [])
        workers = [i[INFO_KEY] for i in infos if isinstance(i, dict) and isinstance(i.get(INFO_KEY), dict)]
        if workers:
            info[INFO_KEY] = {**workers[0], WORKERS_KEY: workers}
        return info

    return get_init_info


def wrap_get_internal_state(original: Callable, live_state: Callable[[], dict]) -> Callable:
    def get_internal_state(self, recv_req):
        out = original(self, recv_req)
        state = getattr(out, "internal_state", None)
        if isinstance(state, dict):
            state[INFO_KEY] = live_state()
        return out

    return get_internal_state


def wrap_engine_get_server_info(original: Callable, overrides: list[str]) -> Callable:
    def get_server_info(self):
        info = original(self)
        infos = getattr(getattr(self, "_scheduler_init_result", None), "scheduler_infos", None) or []
        workers = []
        for i in infos:
            entry = i.get(INFO_KEY) if isinstance(i, dict) else None
            if isinstance(entry, dict):  # a DP controller's entry carries its schedulers' under WORKERS_KEY
                workers.extend(entry[WORKERS_KEY] if WORKERS_KEY in entry else [entry])
        envs = [w["worker_env"] for w in workers if "worker_env" in w]
        info[INFO_KEY + "_workers"] = workers
        info[INFO_KEY + "_env_disagreements"] = compare_reports(envs)
        info[INFO_KEY + "_env_overridden_by_sglang"] = list(overrides)
        return info

    return get_server_info


def run_scheduler_process_with_overlay(entry: Callable, *args, **kwargs):
    """Spawn target for SGLang's scheduler workers: apply the overlay here, then run ``entry`` (the
    ``Engine.run_scheduler_process_func`` found at apply time, normally SGLang's ``run_scheduler_process``).

    Installed as ``functools.partial(run_scheduler_process_with_overlay, entry)``: top-level, so spawn pickles
    it by qualified name (``entry`` must be picklable too, as SGLang already needs it to be).
    """
    from sglang_eagle3.integration import sglang_overlay

    sglang_overlay.apply_from_env()
    return entry(*args, **kwargs)
