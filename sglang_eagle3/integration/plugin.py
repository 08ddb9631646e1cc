"""SGLang plugin: the overlay in every SGLang process whose parent applied it.

SGLang 0.5.23 calls ``sglang.srt.plugins.load_plugins()`` at the start of every process it owns: the scheduler
workers (first line of ``run_scheduler_process``), the detokenizer, the DP controller and the engine itself. It
runs each entry point of the group ``sglang.srt.plugins`` (setup.py registers ``load`` below under the name
``sglang_eagle3``); ``SGLANG_PLUGINS``, when set, is a comma list of the plugin names allowed to run.

This is what brings the overlay into the workers that SGLang's HTTP launcher spawns (``sglang serve``,
``python -m sglang.launch_server``, ``launch_server --backend sglang``): ``http_server.launch_server`` binds
``run_scheduler_process`` as a default argument at import time, so the ``Engine.run_scheduler_process_func``
bootstrap is never used there. ``load`` does nothing unless ``SGLANG_EAGLE3_OVERLAY`` is set, i.e. unless
an ancestor process called ``apply()``; then it applies that same configuration (a no-op where it is already
applied, as in the process that called ``apply()``).

Kept free of SGLang and torch imports: the entry point is loaded in every SGLang process of anyone who has
this package installed, overlay or not.
"""

from __future__ import annotations

import logging
import os

from sglang_eagle3 import env

logger = logging.getLogger(__name__)

GROUP = "sglang.srt.plugins"  # sglang.srt.plugins.GENERAL_PLUGINS_GROUP in 0.5.23
NAME = "sglang_eagle3"
TARGET = "sglang_eagle3.integration.plugin:load"


def load() -> None:
    """Entry point SGLang runs in each of its processes: apply the inherited overlay configuration, if any.

    A failure raises ``SystemExit`` on purpose: ``load_plugins`` logs and swallows ``Exception`` from a plugin,
    which would leave a worker running without the overlay its parent reported as applied (strict mode
    included). ``SystemExit`` passes through, so the worker dies and SGLang's start-up reports it.
    """
    if not env.OVERLAY_CONFIG.raw():
        return
    from sglang_eagle3.integration import sglang_overlay

    try:
        sglang_overlay.apply_from_env()
    except Exception as e:
        logger.exception("sglang_eagle3: could not apply the overlay in SGLang process %d", os.getpid())
        raise SystemExit(f"sglang_eagle3: the overlay its parent applied could not be applied in SGLang "
                         f"process {os.getpid()}: {e}") from e


def reachability_problem() -> str | None:
    """Why SGLang's ``load_plugins`` would not run ``load`` in its processes, or None when it will.

    Reads the installed package metadata (no SGLang import): the entry point must be registered, with this
    target, and ``SGLANG_PLUGINS`` (when set) must name it.
    """
    from importlib.metadata import distributions, entry_points

    found = [ep for ep in entry_points(group=GROUP) if ep.name == NAME]
    if not found:
        missing = f"the SGLang plugin entry point {NAME!r} (group {GROUP!r}) is not registered"
        # entry_points() reads only the first metadata directory of a distribution on sys.path: a stale
        # sglang_eagle3.egg-info in the working directory (a build artifact) hides the installed one.
        first = next((d for d in distributions() if (d.metadata["Name"] or "").replace("-", "_") == NAME), None)
        if first is None:
            return f"{missing}: sglang_eagle3 is not installed in this environment (pip install -e <checkout>)"
        where = os.path.abspath(str(getattr(first, "_path", "?")))
        return (f"{missing}: the first sglang_eagle3 metadata on sys.path, {where}, has no entry point (a stale "
                "build artifact, or an install older than the entry point); reinstall (pip install -e <checkout>) "
                "and regenerate or delete that directory")
    if found[0].value != TARGET:
        return f"the SGLang plugin entry point {NAME!r} points at {found[0].value!r}, not {TARGET!r}; reinstall"
    allowed = os.environ.get("SGLANG_PLUGINS", "")
    if allowed and NAME not in {x.strip() for x in allowed.split(",")}:
        return f"SGLANG_PLUGINS={allowed!r} does not name {NAME!r}, so SGLang skips the plugin"
    return None
