"""What the current process actually runs with: NCCL/CUDA/torch environment, versions and device.

Dependency-free at import time (torch is imported lazily and is optional), so that TP workers, the SGLang
overlay and the benchmark harness can all call it in whatever process they need the truth from. Collect a
report in every worker, send the dicts to one place, and ``compare_reports`` says where they disagree: the
usual cause of "rank 3 is slow" is a variable that one launcher set and another did not.

SGLang's engine start (``sglang.srt.entrypoints.engine._set_envs_and_config``, 0.5.23) writes a few
variables before it spawns its workers; ``sglang_forced_env`` predicts what it will write and
``warn_sglang_overrides`` warns where that replaces a value the user set.
"""

from __future__ import annotations

import logging
import os
import platform
import re
import subprocess
import sys
from collections.abc import Mapping

from sglang_eagle3 import env

logger = logging.getLogger(__name__)

# Variables whose name starts with one of these are reported.
ENV_PREFIXES: tuple[str, ...] = (
    "NCCL_", "CUDA_", "TORCH_", "PYTORCH_", "NVSHMEM_", "UCX_", "GLOO_", "TRITON_", "SGLANG_", "OMP_",
    "MASTER_", "CUBLAS_", "CUDNN_", "NVIDIA_", "TORCHINDUCTOR_",
)
# Single variables outside those prefixes that change distributed/accelerator behaviour.
ENV_NAMES: tuple[str, ...] = ("LOCAL_RANK", "RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "LD_LIBRARY_PATH",
                              "HIP_VISIBLE_DEVICES", "CUBLAS_WORKSPACE_CONFIG",
                              "DISABLE_MMA_V3")  # Triton's, unprefixed: Hopper's dots compiled without wgmma
# Values that legitimately differ between ranks: never reported as disagreements.
PER_RANK_KEYS: frozenset[str] = frozenset({
    "env.LOCAL_RANK", "env.RANK", "env.CUDA_VISIBLE_DEVICES", "env.HIP_VISIBLE_DEVICES", "pid",
    "device.index", "env.TORCHELASTIC_RUN_ID", "hostname",
})
# Secrets never leave the process (tokens for hubs or clouds that happen to share a prefix).
_SECRET_MARKERS = ("TOKEN", "SECRET", "PASSWORD", "KEY")

# The variables SGLang 0.5.23's engine writes before spawning workers.
SGLANG_FORCED_VARS: tuple[str, ...] = ("NCCL_CUMEM_ENABLE", "NCCL_NVLS_ENABLE", "CUDA_DEVICE_MAX_CONNECTIONS")


def is_secret(name: str) -> bool:
    """A variable whose value never goes into a report, a warning or a log (tokens, keys, passwords), in any case
    (hf_token as HF_TOKEN)."""
    upper = name.upper()
    return any(m in upper for m in _SECRET_MARKERS)


# What a program reads as a variable name: letters, digits and '_', not starting with a digit.
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def env_pair_problems(pairs) -> list[str]:
    """Why each (name, value) pair for the workers' environment (worker_env, --worker-env) cannot reach them as meant,
    naming the pair (a secret's value hidden): a name no program reads by that spelling ('NCCL_ALGO =Ring' set
    "NCCL_ALGO ", and NCCL ran with its default; an empty name or one with '=' the OS refuses), or a NUL byte in the
    value (the OS refuses it). Empty: every pair is fine."""
    bad = []
    for name, value in pairs:
        pair = f"{name}=<hidden>" if is_secret(name) else f"{name}={value}"
        if not _ENV_NAME.fullmatch(name):
            bad.append(f"{pair!r}: {name!r} is not an environment variable name (letters, digits and '_', not "
                       "starting with a digit)")
        elif "\0" in value:
            bad.append(f"{pair!r}: a NUL byte in the value")
    return bad


def is_reported(name: str) -> bool:
    """A variable the reports carry: the NCCL / CUDA / torch / ... families (ENV_PREFIXES, ENV_NAMES), no secret."""
    return not is_secret(name) and (name in ENV_NAMES or name.startswith(ENV_PREFIXES))


def collect_env_report(environ: Mapping[str, str] | None = None, *, include_device: bool = True) -> dict:
    """Report of this process as a flat, JSON-serialisable dict.

    Keys: ``env`` (name -> value for every NCCL_*/CUDA_*/TORCH_*/... variable that is set, secrets left
    out), ``pid``, ``hostname``, ``python``, ``torch`` (version or None), ``cuda`` (torch's CUDA build or
    None), ``nccl`` (``"major.minor.patch"`` as torch's NCCL binding reports it, or None), ``device``
    (``{"type", "index", "name", "capability"}``; type "cpu" without a GPU). ``include_device=False``
    skips touching CUDA at all (safe before a fork, and in processes that must not create a context).
    """
    env = os.environ if environ is None else environ
    report: dict = {
        "env": {k: env[k] for k in sorted(env) if is_reported(k)},
        "pid": os.getpid(),
        "hostname": platform.node(),
        "python": sys.version.split()[0],
        "torch": None,
        "cuda": None,
        "nccl": None,
        "device": {"type": "cpu", "index": None, "name": None, "capability": None},
    }
    try:
        import torch
    except ImportError:
        return report
    report["torch"] = torch.__version__
    report["cuda"] = torch.version.cuda
    try:
        nccl = torch.cuda.nccl.version() if torch.version.cuda else None
        if isinstance(nccl, tuple):
            nccl = ".".join(str(p) for p in nccl)
        report["nccl"] = str(nccl) if nccl is not None else None
    except (RuntimeError, AttributeError) as e:
        logger.debug("NCCL version unavailable: %s", e)
    if include_device and torch.cuda.is_available():
        index = torch.cuda.current_device()
        report["device"] = {
            "type": "cuda",
            "index": index,
            "name": torch.cuda.get_device_name(index),
            "capability": ".".join(str(c) for c in torch.cuda.get_device_capability(index)),
        }
    return report


def _flatten(report: Mapping, prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for k, v in report.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def compare_reports(reports: list[dict], *, ignore: frozenset[str] = PER_RANK_KEYS) -> list[str]:
    """Human-readable disagreements between reports (one per differing key), empty if they agree.

    A variable set in one report and unset in another is a disagreement (shown as ``<unset>``). Keys in
    ``ignore`` (dotted: ``env.RANK``, ``device.index``, ``pid``) differ by design between ranks.
    Example line: ``env.NCCL_PROTO differs: Simple in [0, 2], <unset> in [1]``.
    """
    flat = [_flatten(r) for r in reports]
    keys = sorted(set().union(*flat)) if flat else []
    problems: list[str] = []
    for key in keys:
        if key in ignore:
            continue
        by_value: dict[str, list[int]] = {}
        for i, f in enumerate(flat):
            by_value.setdefault(repr(f[key]) if key in f else "<unset>", []).append(i)
        if len(by_value) > 1:
            parts = ", ".join(f"{v} in {idx}" for v, idx in by_value.items())
            problems.append(f"{key} differs: {parts}")
    return problems


def sglang_forced_env(environ: Mapping[str, str] | None = None, *, enable_symm_mem: bool = False,
                      enable_nccl_nvls: bool = False) -> dict[str, str]:
    """The values SGLang 0.5.23's engine start writes for ``SGLANG_FORCED_VARS``, given the environment.

    Read from ``_set_envs_and_config`` (sglang/srt/entrypoints/engine.py): NCCL_CUMEM_ENABLE is written when
    unset or when --enable-symm-mem is on; NCCL_NVLS_ENABLE when unset or when --enable-nccl-nvls /
    --enable-symm-mem is on; CUDA_DEVICE_MAX_CONNECTIONS=8 ALWAYS, whatever the user set (the REFERENCE
    note "unless already set" is wrong for this one). Multi-node MNNVL and KV-shard cases that also write
    NCCL_CUMEM_ENABLE=1 are not modelled here; the overlay's runtime check sees them.
    """
    env = os.environ if environ is None else environ
    forced: dict[str, str] = {}
    if "NCCL_CUMEM_ENABLE" not in env or enable_symm_mem:
        forced["NCCL_CUMEM_ENABLE"] = str(int(enable_symm_mem))
    if "NCCL_NVLS_ENABLE" not in env or enable_nccl_nvls or enable_symm_mem:
        forced["NCCL_NVLS_ENABLE"] = str(int(enable_nccl_nvls or enable_symm_mem))
    forced["CUDA_DEVICE_MAX_CONNECTIONS"] = "8"
    return forced


def overridden_user_values(before: Mapping[str, str], after: Mapping[str, str],
                           names: tuple[str, ...] | None = None) -> list[str]:
    """Messages for variables set in ``before`` whose value differs (or vanished) in ``after``.

    ``names=None`` compares every reported variable (see ``ENV_PREFIXES``); pass a tuple to restrict.
    """
    candidates = names if names is not None else tuple(k for k in before if is_reported(k))
    out = []
    for name in candidates:
        if name in before and after.get(name) != before[name]:
            new = after.get(name, "<unset>")
            out.append(f"{name}: user set {before[name]!r}, SGLang's engine start changed it to {new!r}")
    return out


def warn_sglang_overrides(environ: Mapping[str, str] | None = None, *, enable_symm_mem: bool = False,
                          enable_nccl_nvls: bool = False) -> list[str]:
    """Log a warning for each user-set variable SGLang's engine start would override; return the messages.

    Call it before launching SGLang (``environ`` defaults to ``os.environ``). A variable the user did not
    set is not warned about: SGLang's default is then the only value there is.
    """
    env = os.environ if environ is None else environ
    forced = sglang_forced_env(env, enable_symm_mem=enable_symm_mem, enable_nccl_nvls=enable_nccl_nvls)
    msgs = overridden_user_values(env, {**env, **forced}, SGLANG_FORCED_VARS)
    for m in msgs:
        logger.warning("%s", m)
    return msgs


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the checkout holding this package


def git_commit(repo: str = REPO) -> str:
    """GIT_COMMIT when set (a run on another machine names the commit it was sent from: the copy there may
    carry stale git metadata, as the GPU machines' copies did, recording the session's first commit + "-dirty"
    for every run), else HEAD of the checkout (+ "-dirty" with uncommitted changes to tracked files), else
    "unknown"."""
    if env.GIT_COMMIT.raw():
        return env.GIT_COMMIT.raw()
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo,
                               capture_output=True, text=True).stdout.strip()
    except OSError:
        commit, dirty = "", ""
    if len(commit) != 40:
        return "unknown"
    return commit + ("-dirty" if dirty else "")
