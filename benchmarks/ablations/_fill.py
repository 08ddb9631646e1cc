"""What a stand-in stores in place of the values it no longer computes (not an ablation itself: its name starts
with "_"). ``zeros`` is what the thirtieth session's stand-ins stored; ``noise`` a fixed pseudo-random pattern in
[-1, 1) that loads nothing either. They differ only in the data every later kernel then computes on: the
thirty-first session found an all-zero stream 3% faster for the same launches (BENCHMARKS.md), so a stand-in
priced with zeros prices the data too. ``with_fill(kernel, fill, module)`` is the same stand-in kernel storing
``fill``'s values: the one source, compiled against another ``fill``; ``with_helpers(module, overrides, ...)``
every kernel of a package module compiled against other helpers (moe_int4_gemv_*_cheap.py)."""

import types

import triton
import triton.language as tl
from triton.runtime.jit import KernelInterface


@triton.jit
def zeros(offs):
    """offs (any int tensor) -> float32 zeros of its shape."""
    return (offs * 0).to(tl.float32)


@triton.jit
def noise(offs):
    """offs -> float32 in [-1, 1) of its shape: a multiplicative hash of each offset (low bits dropped), so no
    two neighbours repeat and every bf16 mantissa bit toggles as with real activations."""
    h = (offs.to(tl.int64) * 2654435761 + 40503) & 0xFFFFFFFF
    return ((h >> 8) & 0xFFFF).to(tl.float32) * (1.0 / 32768.0) - 1.0


def _clone(kernel, scope: dict):
    """``kernel`` (a @triton.jit function) compiled again with ``scope`` as its globals."""
    fn = kernel.fn
    clone = types.FunctionType(fn.__code__, scope, fn.__name__, fn.__defaults__, fn.__closure__)
    clone.__kwdefaults__, clone.__annotations__ = fn.__kwdefaults__, fn.__annotations__  # constexprs: annotations
    return triton.jit(clone)


def with_fill(kernel, fill, module: str):
    """``kernel`` (a stand-in calling the global name ``fill``) recompiled with another fill, defined as if in
    ``module`` (kernels_from takes only what a file defines itself)."""
    return _clone(kernel, {**kernel.fn.__globals__, "fill": fill, "__name__": module})


def with_helpers(source, overrides: dict, module: str) -> dict:
    """Every @triton.jit function the module ``source`` defines, recompiled in one scope where ``overrides`` (name
    -> jit function) replace its helpers of those names, defined as if in ``module``: -> that scope. A kernel
    taken from it calls the overrides wherever the package's calls the originals, however deep (each helper
    resolves its globals in its own module, so replacing a name in the kernel's alone would not reach them)."""
    scope = {**vars(source), **overrides, "__name__": module}
    for name, obj in vars(source).items():
        # (KernelInterface: a JITFunction, or under the interpreter an InterpretedFunction; not a constexpr_function)
        if (isinstance(obj, KernelInterface) and name not in overrides and obj.fn.__module__ == source.__name__):
            scope[name] = _clone(obj, scope)
    return scope
