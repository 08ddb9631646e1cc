"""Tensor-parallel process group and the two collectives the layers need.

One group per process, set once by the worker at start-up (``init_tp``). With tp_size == 1 every
collective is the identity, so single-process code never touches torch.distributed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class TPInfo:
    rank: int = 0
    size: int = 1
    # Benchmarks of ONE rank's slice on one GPU: shapes as for `size` ranks, collectives skipped ...
    simulated: bool = False
    # ... except all-reduces when this is set: they then run over the initialised process group (of fewer
    # GPUs than `size`), so a benchmark times the step with real all-reduce traffic of the right sizes. The
    # lm_head's all-gather stays skipped (its shape needs all `size` ranks; once a step, small).
    simulated_all_reduce: bool = False


_TP = TPInfo()


def init_tp(rank: int, size: int, simulated: bool = False, simulated_all_reduce: bool = False) -> None:
    """Records this process's TP coordinates. torch.distributed must already be initialised if size > 1,
    unless ``simulated`` (a single process standing in for one rank: shapes sharded, no communication)
    without ``simulated_all_reduce`` (all-reduces over the real group, see TPInfo)."""
    global _TP
    if simulated_all_reduce and not simulated:
        raise ValueError("simulated_all_reduce applies to simulated rank slices only")
    if (size > 1 and not simulated or simulated_all_reduce) and not dist.is_initialized():
        raise RuntimeError(f"tp_size={size} needs torch.distributed initialised before init_tp")
    if not 0 <= rank < size:
        raise ValueError(f"tp rank {rank} outside [0, {size})")
    _TP = TPInfo(rank, size, simulated, simulated_all_reduce)


def get_tp() -> TPInfo:
    return _TP


def tp_all_reduce(x: torch.Tensor) -> torch.Tensor:
    if _TP.size == 1 or (_TP.simulated and not _TP.simulated_all_reduce):
        return x
    dist.all_reduce(x)
    return x


def tp_all_gather_last_dim(x: torch.Tensor) -> torch.Tensor:
    """[..., D] on each rank -> [..., D * tp] in rank order."""
    if _TP.size == 1 or _TP.simulated:
        return x  # simulated: this rank's slice only
    x = x.contiguous()
    if x.is_cuda:  # one flat NCCL call (capturable in CUDA graphs), then ranks' slices side by side
        flat = torch.empty((_TP.size, *x.shape), dtype=x.dtype, device=x.device)
        dist.all_gather_into_tensor(flat, x)
        return flat.movedim(0, -2).reshape(*x.shape[:-1], _TP.size * x.shape[-1])
    parts = [torch.empty_like(x) for _ in range(_TP.size)]
    dist.all_gather(parts, x)
    return torch.cat(parts, dim=-1)


def tp_min_int(value: int, device: torch.device) -> int:
    """The smallest of every rank's ``value`` (start-up agreements, e.g. the KV pool's size: ranks allocate pages
    in lockstep, so they must hold the same number)."""
    if _TP.size == 1 or _TP.simulated:
        return value
    t = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return int(t.item())


def tp_max_floats(values: list[float], device: torch.device) -> list[float]:
    """Each entry's largest value over the ranks (start-up agreements on measured times, e.g. the adaptive draft
    length's round costs: every rank must hold the same table to choose the same k from the same accept counts)."""
    if _TP.size == 1 or _TP.simulated or not values:
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()
