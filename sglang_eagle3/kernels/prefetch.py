"""Launcher for the bulk L2 prefetch (kernels/triton/prefetch.py); its reference is doing nothing.

A prefetch only asks the L2 to hold bytes that a later kernel reads; it changes no value anywhere, so the
"reference" of this op is a no-op and the tests check that results are unchanged with it on, that it runs
eagerly and inside CUDA graphs, and that it compiles for sm_90 and sm_120.
"""

from __future__ import annotations

import torch

from sglang_eagle3.kernels.triton.prefetch import l2_prefetch_kernel

BULK = 16 << 10  # bytes per prefetch instruction
LANES = 32  # instructions per program per iteration: one warp, one per thread
PROGRAMS_PER_RANGE = 4
ALIGN = 16  # cp.async.bulk: 16-byte aligned address and size


def prefetch_table(tensors: list[torch.Tensor]) -> torch.Tensor:
    """int64 [n, 2] (address, bytes) of each tensor's storage span, on their device, for l2_prefetch. Each
    tensor must be contiguous (its bytes are one range); the range is widened to 16-byte boundaries (a few
    neighbouring bytes prefetched too)."""
    assert tensors, "nothing to prefetch"
    device = tensors[0].device
    rows = []
    for t in tensors:
        assert t.device == device, f"all tensors on one device: {t.device} vs {device}"
        assert t.is_contiguous(), f"prefetch ranges must be contiguous tensors, got strides {t.stride()}"
        start = t.data_ptr() // ALIGN * ALIGN
        end = -(-(t.data_ptr() + t.numel() * t.element_size()) // ALIGN) * ALIGN
        rows.append((start, end - start))
    return torch.tensor(rows, dtype=torch.int64, device=device)


def l2_prefetch(table: torch.Tensor) -> None:
    """Prefetches every (address, bytes) range of ``table`` (from prefetch_table) into L2; returns at once on
    anything but a CUDA device of compute capability >= 9 (where there is no bulk prefetch: a no-op)."""
    assert table.dtype == torch.int64 and table.dim() == 2 and table.shape[1] == 2 and table.is_contiguous(), (
        f"table must be contiguous int64 [n, 2], got {table.dtype} {tuple(table.shape)}")
    if not table.is_cuda or torch.cuda.get_device_capability(table.device)[0] < 9 or table.shape[0] == 0:
        return
    l2_prefetch_kernel[(table.shape[0], PROGRAMS_PER_RANGE)](
        table, RANGES=table.shape[0], BULK=BULK, LANES=LANES, PROGRAMS_PER_RANGE=PROGRAMS_PER_RANGE,
        num_warps=1)


__all__ = ["prefetch_table", "l2_prefetch"]
