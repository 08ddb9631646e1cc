"""The leave-one-out kernels of benchmarks/ablations/ (timing only) must keep the signatures of the kernels they
stand in for: bench_kernels.kernels_from swaps one in by name where the launcher calls the real one with the
real one's arguments, so a parameter added to the real kernel and not to its stand-in breaks the swap (or,
worse, a constexpr default hides it). Checked by each parameter's name, constexpr-ness and default."""

from __future__ import annotations

import importlib
import inspect
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.bench_kernels import SWAPPABLE, _defines  # noqa: E402

ABLATIONS = sorted(p for folder in ("ablations", "variants") for p in (REPO / "benchmarks" / folder).glob("*.py")
                   if not p.name.startswith("_"))


def _signature(fn) -> list[tuple]:
    """A Triton kernel's parameters (name, constexpr-ness, default), or a Python function's (name, kind, default)."""
    if hasattr(fn, "params"):
        return [(p.name, p.is_constexpr, p.default) for p in fn.params]
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


def _real_kernel(name: str):
    """The package kernel a launcher in SWAPPABLE calls by ``name`` (the launcher module's global)."""
    for launcher, names in SWAPPABLE.items():
        if name in names:
            return getattr(importlib.import_module(launcher), name)
    raise AssertionError(f"{name} is not one of bench_kernels.SWAPPABLE's names: nothing would swap it in")


@pytest.mark.parametrize("path", ABLATIONS, ids=lambda p: p.stem)
def test_ablation_kernel_keeps_the_real_signature(path):
    spec = importlib.util.spec_from_file_location(f"ablation_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    swappable = {n for names in SWAPPABLE.values() for n in names}
    names = [n for n in vars(module) if n in swappable and _defines(module, n)]
    assert names, f"{path.name} defines none of bench_kernels.SWAPPABLE's names"
    for name in names:
        real = _real_kernel(name)
        assert _signature(getattr(module, name)) == _signature(real), (
            f"{path.name}: {name}'s parameters differ from {inspect.getmodule(getattr(real, 'fn', real)).__name__}"
            f".{name}'s")


def test_there_are_ablations():
    assert {p.stem for p in ABLATIONS} >= {"rotary_noop", "rms_norm_zero", "mla_merge_zero", "moe_topk_const",
                                           "rms_norm_skip", "rotary_skip", "moe_topk_skip"}


def test_kernels_from_refuses_two_files_replacing_one_name():
    """A '+' group whose files replace the same name would keep only the last file's (each wraps the package's
    own, not the other's): refused, naming it."""
    from benchmarks.bench_kernels import kernels_from

    V = REPO / "benchmarks" / "variants"
    kernels_from(f"{V / 'gemv_pair_l128.py'}+{V / 'gemv_fma_oproj.py'}")  # distinct names: fine
    with pytest.raises(SystemExit, match="fma_pair_config"):
        kernels_from(f"{V / 'gemv_pair_l128.py'}+{V / 'gemv_qkv_rows8.py'}")
