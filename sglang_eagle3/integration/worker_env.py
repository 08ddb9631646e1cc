"""Worker environment: what every SGLang worker really runs with, and where SGLang changed the user's values.

Patched symbols (0.5.23):
- ``sglang.srt.entrypoints.engine._set_envs_and_config``: diff ``os.environ`` around it and warn for every
  user-set variable it overwrote (it always writes CUDA_DEVICE_MAX_CONNECTIONS=8; NCCL_CUMEM_ENABLE /
  NCCL_NVLS_ENABLE when unset or when symmetric memory / NVLS is enabled).
- ``Scheduler.get_init_info``: each scheduler worker adds ``"sglang_eagle3": {"worker_env": ..., "overlay":
  ...}`` to its handshake dict; worker 0's dict is what ``/get_server_info`` shows.
- ``Scheduler.get_internal_state``: adds live overlay state (verify-path counters) to the internal state.
- ``Engine.get_server_info``: adds every worker's report and ``compare_reports`` disagreements.
- ``Engine.run_scheduler_process_func``: scheduler processes are *spawned*, so a patch made in the parent
  does not exist in them; this bootstrap re-applies the overlay in the child (config passed through the
  ``SGLANG_EAGLE3_OVERLAY`` environment variable, which spawn inherits) before SGLang's own entry point.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

from sglang_eagle3.env_report import collect_env_report, compare_reports, overridden_user_values

logger = logging.getLogger(__name__)

INFO_KEY = "sglang_eagle3"


def wrap_set_envs_and_config(original: Callable, overrides: list[str]) -> Callable:
    """Warn (and append to ``overrides``) for each user-set variable SGLang's engine start changed."""

    def _set_envs_and_config(server_args):
        before = dict(os.environ)
        result = original(server_args)
        for msg in overridden_user_values(before, os.environ):
            logger.warning("%s", msg)
            overrides.append(msg)
        return result

    return _set_envs_and_config


def wrap_get_init_info(original: Callable, overlay_status: Callable[[], dict]) -> Callable:
    def get_init_info(self):
        info = original(self)
        report = collect_env_report()
        logger.info("SGLang worker environment (pid %s, device %s): NCCL %s, %d NCCL/CUDA/TORCH variables set",
                    report["pid"], report["device"], report["nccl"], len(report["env"]))
        info[INFO_KEY] = {"worker_env": report, "overlay": overlay_status()}
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
        workers = [i.get(INFO_KEY) for i in infos if isinstance(i, dict) and i.get(INFO_KEY)]
        envs = [w["worker_env"] for w in workers if "worker_env" in w]
        info[INFO_KEY + "_workers"] = workers
        info[INFO_KEY + "_env_disagreements"] = compare_reports(envs)
        info[INFO_KEY + "_env_overridden_by_sglang"] = list(overrides)
        return info

    return get_server_info


def run_scheduler_process_with_overlay(*args, **kwargs):
    """Spawn target for SGLang's scheduler workers: apply the overlay here, then run SGLang's entry point.

    Top-level (picklable by reference) on purpose: multiprocessing's spawn sends only its qualified name.
    """
    from sglang_eagle3.integration import sglang_overlay

    sglang_overlay.apply_from_env()
    from sglang.srt.managers.scheduler import run_scheduler_process

    return run_scheduler_process(*args, **kwargs)
