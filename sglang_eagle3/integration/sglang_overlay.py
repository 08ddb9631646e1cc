"""The SGLang overlay: ``apply(...)`` patches SGLang 0.5.23 in this process, ``remove()`` restores it exactly.

Every patched symbol is listed once, in ``PATCHES`` below, with the parameters its SGLang definition must
have and the code path around it (names its code must use, SGLang functions that must call it); apply resolves
each, compares ``inspect.signature`` and the code objects with those pins, installs the wrapper and keeps the raw
original (``owner.__dict__[attr]``) so that ``remove()`` puts back the very same object.

Features (each switchable in ``apply``):
  verify_guard   count target-verify forwards by path (graph / prefill_graph / eager) with reasons;
                 ``strict_verify=True`` raises instead of falling back            (verify_guard.py)
  moe_routing    biased grouped top-k -> our ``moe_topk`` on CUDA                 (moe_routing.py)
  draft_wiring   check draft/target compatibility when aux capture is configured (draft_wiring.py)
  worker_env     worker environment reports + override warnings                  (worker_env.py)

How workers get it: ``apply`` writes its config to ``SGLANG_EAGLE3_OVERLAY``, which spawned processes inherit.
SGLang runs our plugin (``plugin.py``, entry point group ``sglang.srt.plugins``) first thing in each of its
processes, and it re-applies that config; this is the only route on the HTTP launcher's path. The
``Engine.run_scheduler_process_func`` bootstrap (always installed) does the same for ``sglang.Engine`` even
where the package is not installed (no entry point); in a worker the second of the two is a no-op.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import json
import logging
import multiprocessing
import os
import threading
import types
from dataclasses import asdict, dataclass, field
from typing import Any

from sglang_eagle3 import env
from sglang_eagle3.integration import draft_wiring, moe_routing, plugin, worker_env
from sglang_eagle3.integration import verify_guard as verify_guard_mod

logger = logging.getLogger(__name__)

SUPPORTED_SGLANG_VERSIONS: tuple[str, ...] = ("0.5.23",)
ENV_CONFIG = env.OVERLAY_CONFIG.name  # JSON OverlayConfig; set by apply(), read by spawned workers
ENV_FORCE = env.OVERLAY_FORCE.name  # "1": same as apply(force=True)


class UnsupportedSGLangVersion(RuntimeError):
    """The installed SGLang is not one the overlay was written against."""


class PatchTargetError(RuntimeError):
    """A patch target is missing or its signature differs from the pinned one."""


@dataclass(frozen=True)
class OverlayConfig:
    """What the overlay does. Serialised into ``SGLANG_EAGLE3_OVERLAY`` for spawned workers."""

    verify_guard: bool = True
    strict_verify: bool = False  # raise VerifyFallbackError instead of a verify fallback
    moe_routing: bool = True
    draft_wiring: bool = True
    worker_env: bool = True
    force: bool = False  # patch an unsupported SGLang version anyway (mismatched targets are skipped)
    verify_summary_every: int = 1000  # log the verify counters every N verify forwards (0 = never)

    def __post_init__(self):
        # Checked by type, not truthiness: strict_verify="no" (or "false" from a hand-written
        # SGLANG_EAGLE3_OVERLAY) would otherwise turn strict mode *on*.
        for name in ("verify_guard", "strict_verify", "moe_routing", "draft_wiring", "worker_env", "force"):
            value = getattr(self, name)
            if not isinstance(value, bool):
                raise TypeError(f"{name}={value!r}: expected True or False")
        every = self.verify_summary_every
        if isinstance(every, bool) or not isinstance(every, int):
            raise TypeError(f"verify_summary_every={every!r}: expected an integer >= 0 (0 = never)")
        if self.strict_verify and not self.verify_guard:
            raise ValueError("strict_verify=True needs verify_guard=True")
        if every < 0:
            raise ValueError(f"verify_summary_every={every} must be >= 0")

    @classmethod
    def from_json(cls, raw: str) -> OverlayConfig:
        """The config in ``SGLANG_EAGLE3_OVERLAY`` (a JSON object of ``apply()``'s keyword options; ``{}``: the
        defaults); raises ``ValueError`` naming the variable and its value when it is anything else."""
        fields = ", ".join(f.name for f in dataclasses.fields(cls))
        where = f"{ENV_CONFIG}={raw!r}"
        try:
            options = json.loads(raw)
        except ValueError as e:
            raise ValueError(f"{where} is not valid JSON ({e}); it holds apply()'s options as a JSON object, "
                             "e.g. '{}' (the defaults) or '{\"strict_verify\": true}'") from None
        if not isinstance(options, dict):
            raise ValueError(f"{where}: expected a JSON object of apply()'s options ({fields}), e.g. '{{}}' for "
                             "the defaults; it is not an on/off switch (unset it to leave SGLang alone)")
        unknown = sorted(set(options) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise ValueError(f"{where}: unknown option(s) {', '.join(unknown)} (known: {fields})")
        try:
            return cls(**options)
        except (TypeError, ValueError) as e:
            raise ValueError(f"{where}: {e}") from None


@dataclass(frozen=True)
class PatchSpec:
    """One patched SGLang symbol: ``module:qualname`` owner + attribute, pinned parameter names."""

    key: str
    feature: str  # OverlayConfig flag that enables it ("always" = installed whenever the overlay is)
    module: str
    owner: str | None  # class name inside module, None for a module-level function
    attr: str
    params: tuple[str, ...]
    code_path: str  # what SGLang does there, for the log and the docs
    # The code path itself, pinned by name (a signature can stay while the code around it moves): ``uses``, names
    # SGLang's original must still reference (attributes the wrapper or the verify diagnosis read, calls it makes);
    # ``called_by``, "module:qualname" of the SGLang functions that must still reference ``attr`` for the patch to be
    # reached at all (a caller that moved on, or bound the original at import, would leave the patch unused).
    uses: tuple[str, ...] = ()
    called_by: tuple[str, ...] = ()

    @property
    def symbol(self) -> str:
        return f"{self.module}.{self.owner + '.' if self.owner else ''}{self.attr}"


_MR = "sglang.srt.model_executor.model_runner"
_ENGINE = "sglang.srt.entrypoints.engine"
_SCHED = "sglang.srt.managers.scheduler"
PATCHES: tuple[PatchSpec, ...] = (
    PatchSpec("verify.forward_raw", "verify_guard", _MR, "ModelRunner", "_forward_raw",
              ("self", "forward_batch", "pp_proxy_tensors", "reinit_attn_backend", "split_forward_count"),
              "dispatch of every forward: decode graph -> prefill graph -> eager runner",
              uses=("decode_cuda_graph_runner", "can_run_graph", "prefill_cuda_graph_runner", "eager_runner",
                    "execute", "ModelRunnerOutput"),
              called_by=(f"{_MR}:ModelRunner.forward",)),
    PatchSpec("verify.decode_can_run_graph", "verify_guard",
              "sglang.srt.model_executor.runner.decode_cuda_graph_runner", "DecodeCudaGraphRunner",
              "can_run_graph", ("self", "forward_batch"),
              "TARGET_VERIFY graph eligibility (eagle_prepare_for_verify and _forward_raw call it)",
              # every condition verify_guard.diagnose_decode_fallback names, in SGLang's terms
              uses=("replace_embeds", "ragged_verify_mode", "num_tokens_per_req", "captured_req_width",
                    "require_mlp_tp_gather", "_max_dp_batch_size", "disable_padding", "max_bs", "require_mlp_sync",
                    "can_run_decode_cuda_graph", "is_encoder_decoder", "enable_two_batch_overlap", "can_run_tbo"),
              called_by=("sglang.srt.speculative.eagle_utils:eagle_prepare_for_verify",
                         f"{_MR}:ModelRunner._forward_raw")),
    PatchSpec("verify.prefill_can_run_graph", "verify_guard",
              "sglang.srt.model_executor.runner.prefill_cuda_graph_runner", "PrefillCudaGraphRunner",
              "can_run_graph", ("self", "forward_batch"), "piecewise prefill graph eligibility",
              called_by=(f"{_MR}:ModelRunner._forward_raw",)),
    PatchSpec("moe.biased_grouped_topk", "moe_routing", "sglang.srt.layers.moe.topk", None, "biased_grouped_topk",
              ("hidden_states", "gating_output", "correction_bias", "topk", "renormalize", "num_expert_group",
               "topk_group", "num_fused_shared_experts", "routed_scaling_factor",
               "apply_routed_scaling_factor_on_output"),
              "select_experts' noaux_tc branch (use_grouped_topk with a correction bias)",
              called_by=("sglang.srt.layers.moe.topk:select_experts",)),
    PatchSpec("wiring.init_attention_backends", "draft_wiring", _MR, "ModelRunner", "init_attention_backends",
              ("self",), "configure_aux_hidden_state_capture -> set_eagle3_layers_to_capture",
              uses=("configure_aux_hidden_state_capture", "spec_aux_config", "eagle_use_aux_hidden_state",
                    "eagle_aux_hidden_state_layer_ids"),
              called_by=("sglang.srt.managers.tp_worker:TpModelWorker.init_attention_backends",)),
    PatchSpec("env.set_envs_and_config", "worker_env", _ENGINE, None,
              "_set_envs_and_config", ("server_args",), "engine start writes NCCL_*/CUDA_* before spawning",
              called_by=(f"{_ENGINE}:Engine._launch_subprocesses",)),
    PatchSpec("env.scheduler_get_init_info", "worker_env", _SCHED, "Scheduler",
              "get_init_info", ("self",), "scheduler handshake dict (server info)",
              called_by=(f"{_SCHED}:run_scheduler_process",)),
    PatchSpec("env.dp_controller_get_init_info", "worker_env", "sglang.srt.managers.data_parallel_controller",
              "DataParallelController", "get_init_info", ("self",),
              "DP controller handshake dict (with --dp-size > 1 it replaces the schedulers' in server info)",
              uses=("_scheduler_init_infos",),
              called_by=("sglang.srt.managers.data_parallel_controller:run_data_parallel_controller_process",)),
    PatchSpec("env.scheduler_get_internal_state", "worker_env", _SCHED, "Scheduler",
              "get_internal_state", ("self", "recv_req"), "scheduler internal state (server info)",
              called_by=(f"{_SCHED}:Scheduler.init_request_dispatcher",)),
    PatchSpec("env.engine_get_server_info", "worker_env", _ENGINE, "Engine",
              "get_server_info", ("self",), "Engine.get_server_info",
              uses=("_scheduler_init_result", "scheduler_infos")),
    PatchSpec("workers.run_scheduler_process_func", "always", _ENGINE, "Engine",
              "run_scheduler_process_func",
              ("server_args", "port_args", "gpu_id", "tp_rank", "pp_rank", "dp_rank", "pipe_writer",
               "display_tp_rank", "display_dp_rank", "display_moe_ep_rank"),
              "spawn target of every scheduler worker process",
              called_by=(f"{_ENGINE}:Engine.__init__",)),
)
# The plugin route (plugin.py): SGLang's scheduler entry point must still run load_plugins() in each worker it
# starts, or the workers of its HTTP launcher never get the overlay. Checked with the patches.
PLUGIN_ROUTE = (f"{_SCHED}:run_scheduler_process", "load_plugins")


@dataclass
class _Applied:
    spec: PatchSpec
    owner: Any
    original: Any  # raw object from owner.__dict__ (a staticmethod stays a staticmethod)
    replacement: Any  # what apply() set there: remove() restores only a symbol that still holds it


@dataclass
class _State:
    config: OverlayConfig | None = None
    applied: list[_Applied] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    sglang_version: str | None = None
    guard: verify_guard_mod.VerifyGuard | None = None
    moe_counters: dict = field(default_factory=dict)
    wiring: dict = field(default_factory=dict)
    env_overrides: list[str] = field(default_factory=list)
    env_at_apply: dict[str, str] = field(default_factory=dict)  # os.environ when apply() ran
    plugin_problem: str | None = None  # why SGLang's load_plugins would not run our plugin (None: it will)


_STATE = _State()
_LOCK = threading.RLock()


def installed_sglang_version() -> str:
    """Version of the installed sglang distribution, without importing it (importing takes ~10 s)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("sglang")
    except PackageNotFoundError as e:
        raise ImportError("the SGLang overlay needs SGLang; install it with pip install 'sglang==0.5.23' "
                          "(or bash .ci/install_sglang.sh for a separate test environment)") from e


def check_version(version: str, *, force: bool) -> None:
    if version in SUPPORTED_SGLANG_VERSIONS:
        return
    msg = (f"sglang_eagle3's overlay supports SGLang {', '.join(SUPPORTED_SGLANG_VERSIONS)}; found sglang {version}. "
           f"Install a supported version (pip install 'sglang=={SUPPORTED_SGLANG_VERSIONS[-1]}'), or pass "
           f"apply(force=True) / set {ENV_FORCE}=1 to patch anyway (targets whose signature changed are skipped)")
    if not force:
        raise UnsupportedSGLangVersion(msg)
    logger.warning("%s; continuing because force is set", msg)


def resolve_target(spec: PatchSpec) -> tuple[Any, Any]:
    """(owner object, raw original) for a spec; raises PatchTargetError naming the symbol."""
    try:
        module = importlib.import_module(spec.module)
    except ImportError as e:
        raise PatchTargetError(f"{spec.symbol}: cannot import {spec.module}: {e}") from e
    owner = module if spec.owner is None else getattr(module, spec.owner, None)
    if owner is None:
        raise PatchTargetError(f"{spec.symbol}: {spec.module} has no {spec.owner}")
    raw = owner.__dict__.get(spec.attr) if spec.owner else getattr(module, spec.attr, None)
    if raw is None:
        raise PatchTargetError(f"{spec.symbol}: not defined on {owner.__name__} itself")
    return owner, raw


def target_params(raw: Any) -> tuple[str, ...]:
    fn = raw.__func__ if isinstance(raw, (staticmethod, classmethod)) else raw
    return tuple(inspect.signature(fn).parameters)


def code_names(fn: Any) -> frozenset[str] | None:
    """Every global and attribute name ``fn``'s code refers to, nested functions and comprehensions included;
    None when ``fn`` has no Python code (a builtin, a C extension)."""
    fn = inspect.unwrap(getattr(fn, "__func__", fn))
    code = getattr(fn, "__code__", None)
    if code is None:
        return None
    names, stack = set(), [code]
    while stack:
        c = stack.pop()
        names.update(c.co_names)
        stack.extend(k for k in c.co_consts if isinstance(k, types.CodeType))
    return frozenset(names)


def _resolve_function(where: str) -> Any:
    """``"module:Qual.name"`` -> the function (raises PatchTargetError naming what is missing)."""
    module_name, _, qualname = where.partition(":")
    try:
        obj = importlib.import_module(module_name)
    except ImportError as e:
        raise PatchTargetError(f"cannot import {module_name}: {e}") from e
    for part in qualname.split("."):
        inner = obj.__dict__.get(part) if isinstance(obj, type) else getattr(obj, part, None)
        if inner is None:
            raise PatchTargetError(f"{module_name}.{qualname}: {getattr(obj, '__name__', obj)} has no {part}")
        obj = inner
    return obj


def code_path_problems(spec: PatchSpec, raw: Any) -> list[str]:
    """Where SGLang's code around ``spec`` is not what the overlay was written against: names of ``spec.uses`` the
    original no longer refers to, ``spec.called_by`` functions that no longer call it (empty: as pinned)."""
    problems = []
    if spec.uses:
        names = code_names(raw)
        missing = [] if names is None else [n for n in spec.uses if n not in names]
        if names is None:
            problems.append("has no Python code to check")
        elif missing:
            problems.append(f"no longer refers to {', '.join(missing)}")
    for where in spec.called_by:
        try:
            names = code_names(_resolve_function(where))
        except PatchTargetError as e:
            problems.append(f"its caller is gone ({e})")
            continue
        if names is not None and spec.attr not in names:
            problems.append(f"{where.replace(':', '.')} no longer calls {spec.attr}")
    return problems


def worker_plugin_problem() -> str | None:
    """Why SGLang's processes would not run our plugin (plugin.py): not registered, left out by SGLANG_PLUGINS, or
    SGLang's scheduler entry point no longer calling ``load_plugins``; None when they will."""
    return plugin.reachability_problem() or _plugin_route_problem()


def _plugin_route_problem() -> str | None:
    """Why SGLang's scheduler entry point would not run our plugin in its workers, from its code; None: it does."""
    where, call = PLUGIN_ROUTE
    try:
        names = code_names(_resolve_function(where))
    except PatchTargetError as e:
        return f"the worker entry point the plugin relies on is gone ({e})"
    if names is not None and call not in names:
        return f"{where.replace(':', '.')} no longer calls {call}(), so SGLang's workers would not run the plugin"
    return None


def _make_replacement(spec: PatchSpec, raw: Any, state: _State) -> Any:
    guard = state.guard
    if spec.key == "verify.forward_raw":
        return verify_guard_mod.wrap_forward_raw(raw, guard)
    if spec.key == "verify.decode_can_run_graph":
        return verify_guard_mod.wrap_decode_can_run_graph(raw, guard)
    if spec.key == "verify.prefill_can_run_graph":
        return verify_guard_mod.wrap_prefill_can_run_graph(raw, guard)
    if spec.key == "moe.biased_grouped_topk":
        return moe_routing.wrap_biased_grouped_topk(raw, moe_routing.resolve_moe_topk(), state.moe_counters)
    if spec.key == "wiring.init_attention_backends":
        return draft_wiring.wrap_init_attention_backends(raw, state.wiring)
    if spec.key == "env.set_envs_and_config":
        return worker_env.wrap_set_envs_and_config(raw, state.env_overrides, state.env_at_apply)
    if spec.key == "env.scheduler_get_init_info":
        return worker_env.wrap_get_init_info(raw, status)
    if spec.key == "env.dp_controller_get_init_info":
        return worker_env.wrap_dp_controller_get_init_info(raw)
    if spec.key == "env.scheduler_get_internal_state":
        return worker_env.wrap_get_internal_state(raw, status)
    if spec.key == "env.engine_get_server_info":
        return worker_env.wrap_engine_get_server_info(raw, state.env_overrides)
    if spec.key == "workers.run_scheduler_process_func":
        # Wrap whatever is installed (a fork may have put its own function there: SGLang's documented hook);
        # a partial of a module-level function stays picklable for multiprocessing's spawn.
        inner = raw.__func__ if isinstance(raw, staticmethod) else raw
        return staticmethod(functools.partial(worker_env.run_scheduler_process_with_overlay, inner))
    raise AssertionError(f"no replacement for {spec.key}")


def _is_custom_scheduler_entry(spec: PatchSpec, raw: Any) -> bool:
    """``Engine.run_scheduler_process_func`` set to a function other than SGLang's ``run_scheduler_process``
    (a fork's override): wrapped whatever its parameters, since the bootstrap passes every argument through."""
    if spec.key != "workers.run_scheduler_process_func":
        return False
    try:
        from sglang.srt.managers.scheduler import run_scheduler_process
    except ImportError:  # another SGLang layout (force=True): the pinned signature decides
        return False
    return (raw.__func__ if isinstance(raw, staticmethod) else raw) is not run_scheduler_process


def _is_multiprocessing_child() -> bool:
    """A process started by multiprocessing (spawn, forkserver or fork), including while it re-imports the
    parent's main module. NOTE: ``parent_process()`` is set only when the child's target starts; during the
    re-import multiprocessing marks the process with ``_inheriting`` (its own check against starting
    processes from an importing main module reads the same attribute)."""
    return (multiprocessing.parent_process() is not None
            or bool(getattr(multiprocessing.current_process(), "_inheriting", False)))


def _inherited_config() -> OverlayConfig | None:
    """The config a parent wrote to ``SGLANG_EAGLE3_OVERLAY``, when this is a multiprocessing child of it."""
    raw = os.environ.get(ENV_CONFIG)
    if not raw or not _is_multiprocessing_child():
        return None
    return OverlayConfig.from_json(raw)


def _enabled(spec: PatchSpec, config: OverlayConfig) -> bool:
    return spec.feature == "always" or bool(getattr(config, spec.feature))


def apply(*, verify_guard: bool = True, strict_verify: bool = False, moe_routing: bool = True,
          draft_wiring: bool = True, worker_env: bool = True, force: bool = False,
          verify_summary_every: int = 1000) -> dict:
    """Patch SGLang in this process (and, through the spawn bootstrap, in its workers); returns ``status()``.

    Idempotent: the same config again is a no-op; a different one removes the overlay and applies anew.
    Raises ``UnsupportedSGLangVersion`` for a version outside ``SUPPORTED_SGLANG_VERSIONS`` unless ``force``
    (or ``SGLANG_EAGLE3_FORCE=1``), and ``PatchTargetError`` if a target is missing or its signature
    changed (with ``force`` such targets are skipped and listed in ``status()["skipped"]``).

    In a multiprocessing child of a process that applied the overlay (``SGLANG_EAGLE3_OVERLAY`` inherited),
    the parent's config wins over the arguments: a spawned child re-imports the parent's main module, so a
    module-level ``import sglang_eagle3.patch`` (or ``apply()``) runs again there and must not replace the
    options the parent chose under ``if __name__ == "__main__"`` before SGLang's worker reads them.
    """
    config = OverlayConfig(verify_guard=verify_guard, strict_verify=strict_verify, moe_routing=moe_routing,
                           draft_wiring=draft_wiring, worker_env=worker_env,
                           force=force or env.OVERLAY_FORCE.switch(False),
                           verify_summary_every=verify_summary_every)
    inherited = _inherited_config()
    if inherited is not None and inherited != config:
        logger.info("sglang_eagle3: this process (pid %d) is a child of one that applied the overlay; using the "
                    "parent's config %s, not %s", os.getpid(), asdict(inherited), asdict(config))
        config = inherited
    return apply_config(config)


def apply_config(config: OverlayConfig) -> dict:
    """``apply`` taking an ``OverlayConfig``."""
    with _LOCK:
        if _STATE.config == config:
            return status()
        if _STATE.config is not None:
            remove()
        version = installed_sglang_version()
        check_version(version, force=config.force)
        resolved = []
        for spec in PATCHES:
            if not _enabled(spec, config):
                continue
            try:
                owner, raw = resolve_target(spec)
                got = target_params(raw)
                if got != spec.params and not _is_custom_scheduler_entry(spec, raw):
                    raise PatchTargetError(f"{spec.symbol}: signature {got} != pinned {spec.params} "
                                           f"(sglang {version})")
                moved = code_path_problems(spec, raw)
                if moved:
                    raise PatchTargetError(f"{spec.symbol}: the code path the overlay patches there ({spec.code_path}) "
                                           f"is not SGLang {SUPPORTED_SGLANG_VERSIONS[-1]}'s in the installed sglang "
                                           f"{version}: {'; '.join(moved)}")
            except PatchTargetError as e:
                if not config.force:
                    raise
                logger.warning("skipping %s: %s", spec.key, e)
                _STATE.skipped[spec.key] = str(e)
                continue
            resolved.append((spec, owner, raw))
        _STATE.guard = verify_guard_mod.VerifyGuard(strict=config.strict_verify,
                                                    summary_every=config.verify_summary_every)
        replacements = [(spec, owner, raw, _make_replacement(spec, raw, _STATE)) for spec, owner, raw in resolved]
        for spec, owner, raw, new in replacements:
            if not isinstance(new, staticmethod):
                new.__wrapped__ = raw.__func__ if isinstance(raw, staticmethod) else raw
                new.__qualname__ = getattr(raw, "__qualname__", new.__qualname__)
                new.__name__ = getattr(raw, "__name__", new.__name__)
                new.__doc__ = getattr(raw, "__doc__", None)
            setattr(owner, spec.attr, new)
            _STATE.applied.append(_Applied(spec, owner, raw, new))
        _STATE.config = config
        _STATE.sglang_version = version
        os.environ[ENV_CONFIG] = json.dumps(asdict(config))
        _STATE.env_at_apply.update(os.environ)
        _STATE.plugin_problem = worker_plugin_problem()
        logger.info("sglang_eagle3 overlay applied to sglang %s (%s); patched: %s", version, asdict(config),
                    ", ".join(a.spec.symbol for a in _STATE.applied))
        if _STATE.plugin_problem is not None and not _is_multiprocessing_child():  # once, in the launching process
            logger.warning("sglang_eagle3: %s. Workers of sglang.Engine still get the overlay (spawn bootstrap); "
                           "workers started by SGLang's HTTP launcher (sglang serve, python -m "
                           "sglang.launch_server) will NOT", _STATE.plugin_problem)
        if config.verify_guard and not config.worker_env and not _is_multiprocessing_child():
            # NOTE: the counters live in the workers; the internal-state patch that carries them out belongs to the
            # worker_env feature. Said here because nothing else would: the "sglang_eagle3" entry is simply absent.
            logger.warning("sglang_eagle3: worker_env=False leaves Scheduler.get_internal_state unpatched, so the "
                           "verify counters of SGLang's workers will not be in get_server_info()['internal_states'] "
                           "(the workers still log the first fallback of each reason, and the counters every "
                           "verify_summary_every verifies)")
        return status()


def remove() -> None:
    """Restore every patched symbol to the exact original object; a no-op when nothing is applied.

    A symbol that something else replaced after ``apply()`` (a user's or another library's patch, which may
    call ours) is left as it is, with a warning naming it: restoring the original would silently drop that
    patch. The verify counters go with the overlay (``verify_stats()`` before ``remove()`` keeps them)."""
    with _LOCK:
        kept = []
        for a in reversed(_STATE.applied):
            now = a.owner.__dict__.get(a.spec.attr) if a.spec.owner else getattr(a.owner, a.spec.attr, None)
            if now is a.replacement:
                setattr(a.owner, a.spec.attr, a.original)
            else:
                kept.append(a.spec.symbol)
                logger.warning("sglang_eagle3: %s was replaced after the overlay patched it (now %r); left as it "
                               "is, since restoring SGLang's original would drop that patch (which may still call "
                               "the overlay's)", a.spec.symbol, now)
        if _STATE.applied:
            logger.info("sglang_eagle3 overlay removed (%d symbols restored%s)", len(_STATE.applied) - len(kept),
                        f", {len(kept)} left patched by others: {', '.join(kept)}" if kept else "")
        _STATE.applied.clear()
        _STATE.skipped.clear()
        _STATE.config = None
        _STATE.sglang_version = None
        _STATE.guard = None
        _STATE.moe_counters.clear()
        _STATE.wiring.clear()
        _STATE.env_overrides.clear()
        _STATE.env_at_apply.clear()
        _STATE.plugin_problem = None
        os.environ.pop(ENV_CONFIG, None)


def apply_from_env() -> dict | None:
    """Apply the config a parent put in ``SGLANG_EAGLE3_OVERLAY`` (no-op when unset); used by workers (the
    SGLang plugin and the spawn bootstrap)."""
    raw = os.environ.get(ENV_CONFIG)
    if not raw:
        return None
    config = OverlayConfig.from_json(raw)
    if not config.force and env.OVERLAY_FORCE.switch(False):  # as apply() reads it
        config = dataclasses.replace(config, force=True)
    return apply_config(config)


def is_applied() -> bool:
    return _STATE.config is not None


def verify_stats() -> dict:
    """Target-verify path counters of *this* process (workers: see ``Engine.get_server_info()``)."""
    return _STATE.guard.snapshot() if _STATE.guard is not None else verify_guard_mod.VerifyStats().as_dict()


def guard() -> verify_guard_mod.VerifyGuard | None:
    return _STATE.guard


def status() -> dict:
    """JSON-serialisable state of the overlay in this process."""
    cfg = _STATE.config
    return {
        "applied": cfg is not None,
        "sglang_version": _STATE.sglang_version,
        "config": asdict(cfg) if cfg is not None else None,
        "patched": [{"key": a.spec.key, "symbol": a.spec.symbol, "code_path": a.spec.code_path}
                    for a in _STATE.applied],
        "skipped": dict(_STATE.skipped),
        "verify": verify_stats(),
        "moe_routing_calls": dict(_STATE.moe_counters),
        "draft_wiring": dict(_STATE.wiring),
        "env_overridden_by_sglang": list(_STATE.env_overrides),
        "worker_plugin_problem": _STATE.plugin_problem,
        "pid": os.getpid(),
    }

