"""Launcher for the one-launch RMSNorm (optionally fused with the residual add); semantics in ref_rms_norm.

One program per row, the whole row in registers (D <= 32768), grid fixed by shapes (graph-safe). Rows may be
strided (the MLA latent ``c`` is a view into kv_a's rows), ``out`` may be a strided view too (the norm can
write in place), or rows of another tensor picked by ``out_rows`` (MLA writes c straight into its cache slots).
"""

from __future__ import annotations

import torch
import triton

from sglang_eagle3.kernels import tuning
from sglang_eagle3.kernels.triton.rms_norm import rms_norm_kernel

MAX_D = 32768  # one row per program in registers: 32 fp32 values a thread at 32 warps


def _rows(t: torch.Tensor, D: int) -> torch.Tensor:
    """t [..., D] as a [M, D] view (no copy); asserts that one exists."""
    assert t.stride(-1) == 1, f"rows must have unit inner stride, got strides {t.stride()}"
    try:
        return t.view(-1, D)
    except RuntimeError as exc:
        raise AssertionError(f"tensor of shape {tuple(t.shape)} and strides {t.stride()} is not a view of "
                             f"[rows, {D}]") from exc


def num_warps_for(D: int) -> int:
    """~8 elements a thread, 4..16 warps."""
    return max(4, min(16, triton.next_power_of_2(D) // 256))


def triton_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None, *,
                    out: torch.Tensor | None = None,
                    out_rows: torch.Tensor | None = None) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """x [..., D] (bf16/fp16/fp32), weight [D] -> out [..., D] in x.dtype; with residual [..., D] also returns
    the new residual x + residual (x.dtype): (out, new_residual). With out_rows [M] (int, M = rows of x),
    row i goes to out[out_rows[i]] of a 2-D ``out`` [S, D] of any float dtype (a scatter into cache slots)."""
    D = x.shape[-1]
    assert x.dtype in (torch.bfloat16, torch.float16, torch.float32), f"unsupported {x.dtype=}"
    assert weight.shape == (D,) and weight.is_contiguous(), f"weight must be contiguous [{D}], got {weight.shape}"
    assert weight.dtype.is_floating_point and weight.device == x.device, f"{weight.dtype=} {weight.device=}"
    assert 0 < D <= MAX_D, f"{D=} must lie in (0, {MAX_D}]"
    if x.stride(-1) != 1:
        x = x.contiguous()
    x2 = x.reshape(-1, D)  # a view whenever the rows allow one, else one copy
    M = x2.shape[0]
    if out_rows is not None:
        assert out is not None and out.dim() == 2 and out.shape[1] == D and out.stride(1) == 1, (
            f"out_rows needs a 2-D out [S, {D}] with unit inner stride, got "
            f"{None if out is None else (tuple(out.shape), out.stride())}")
        assert out.dtype in (torch.bfloat16, torch.float16, torch.float32), f"unsupported {out.dtype=}"
        assert out_rows.shape == (M,) and out_rows.is_contiguous() and not out_rows.dtype.is_floating_point, (
            f"out_rows must be contiguous int [{M}], got {out_rows.dtype} {tuple(out_rows.shape)}")
        assert residual is None, "out_rows with a residual is not supported"
        o2 = out
    else:
        if out is None:
            out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        assert out.shape == x.shape and out.dtype == x.dtype, (
            f"out {tuple(out.shape)} {out.dtype} must match x {tuple(x.shape)} {x.dtype}")
        o2 = _rows(out, D)
    r2 = ro2 = x2  # never read unless HAS_RESIDUAL
    new_residual = None
    if residual is not None:
        assert residual.shape == x.shape and residual.dtype == x.dtype, (
            f"residual {tuple(residual.shape)} {residual.dtype} must match x {tuple(x.shape)} {x.dtype}")
        r2 = residual.reshape(-1, D) if residual.stride(-1) == 1 else residual.contiguous().view(-1, D)
        new_residual = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        ro2 = new_residual.view(-1, D)
    if M:
        pdl = tuning.pdl(x.device, "norm")
        rms_norm_kernel[(M,)](
            x2, r2, weight, o2, ro2, out_rows if out_rows is not None else x2,
            x2.stride(0), r2.stride(0), o2.stride(0), ro2.stride(0),
            D, float(eps),
            HAS_RESIDUAL=residual is not None, HAS_OUT_ROWS=out_rows is not None,
            BLOCK_D=triton.next_power_of_2(D),
            num_warps=1 if tuning.interpreting() else num_warps_for(D),
            PDL=pdl, **tuning.pdl_launch(pdl),
        )
    return out if residual is None else (out, new_residual)
