"""Linear layers that own their tensor-parallel sharding.

Each parameter carries a ``weight_loader(param, loaded)`` that copies this rank's slice out of the full
checkpoint tensor. ``loaded`` may be a torch tensor or any object with ``.shape`` and
``.narrow(dim, start, length) -> Tensor`` (the loader passes lazy safetensors slices, so each rank reads
only its bytes).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from sglang_eagle3 import kernels
from sglang_eagle3.distributed.parallel_state import get_tp, tp_all_reduce


def load_slice(loaded, dim: int | None, shard: int, num_shards: int) -> torch.Tensor:
    """This shard of ``loaded`` along ``dim`` (whole tensor when dim is None)."""
    if dim is None or num_shards == 1:
        return loaded.narrow(0, 0, loaded.shape[0]) if not isinstance(loaded, torch.Tensor) else loaded
    size = loaded.shape[dim]
    if size % num_shards:
        raise ValueError(f"dimension {dim} of size {size} is not divisible by tp_size={num_shards}")
    part = size // num_shards
    return loaded.narrow(dim, shard * part, part)


def copy_checked(param: torch.Tensor, value: torch.Tensor, name: str = "") -> None:
    if tuple(param.shape) != tuple(value.shape):
        raise ValueError(f"shape mismatch for {name or 'parameter'}: checkpoint slice {tuple(value.shape)} "
                         f"vs model {tuple(param.shape)}")
    with torch.no_grad():
        param.copy_(value.to(param.dtype))


def sharded_loader(dim: int | None):
    """weight_loader that takes this rank's slice along ``dim`` (None: replicated)."""

    def loader(param, loaded, name: str = ""):
        tp = get_tp()
        copy_checked(param, load_slice(loaded, dim, tp.rank, tp.size), name)

    return loader


def matmul_wt(x: torch.Tensor, weight: torch.Tensor, use_triton: bool | None = None, fma: bool | None = None,
              **epilogue) -> torch.Tensor:
    """x [..., in] W^T -> [..., out]: the skinny-GEMM kernel for decode/verify row counts on CUDA (one launch
    with its split-K reduction, and ``epilogue`` = w_up / add / out_dtype fused, see kernels.gemv; ``fma``
    False keeps it off the CUDA-core form), torch's GEMM otherwise."""
    x2 = x.reshape(-1, x.shape[-1])
    y = kernels.gemv(x2, weight, use_triton=use_triton, fma=fma, **epilogue)
    return y.view(*x.shape[:-1], y.shape[-1])


class LinearBase(nn.Module):
    """y = x W^T; W is [out, in] as in checkpoints. ``shard_dim`` is which dim of W is split over TP."""

    shard_dim: int | None = None

    def __init__(self, in_features: int, out_features: int, bias: bool = False, dtype=None):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features, dtype=dtype), requires_grad=False)
        self.weight.weight_loader = sharded_loader(self.shard_dim)
        if bias:
            self.bias = nn.Parameter(torch.empty(out_features, dtype=dtype), requires_grad=False)
            self.bias.weight_loader = sharded_loader(0 if self.shard_dim == 0 else None)
        else:
            self.register_parameter("bias", None)
        self.use_triton: bool | None = None  # None: the GEMV kernel on CUDA, torch elsewhere (set by the runner)
        # Whether the GEMV may take its CUDA-core form where kernels/gemv.py fma_form takes this matrix (set by the
        # runner for the whole engine, kernels/gemv.py fma_for_engine: one form for every row count).
        self.gemv_fma = True

    @property
    def fma(self) -> bool | None:
        """kernels.gemv's ``fma`` argument for this layer's products."""
        return None if self.gemv_fma else False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.bias is not None:
            return F.linear(x, self.weight, self.bias)
        return matmul_wt(x, self.weight, self.use_triton, self.fma)


class ReplicatedLinear(LinearBase):
    shard_dim = None


class ColumnParallelLinear(LinearBase):
    """Output features split over TP; no communication."""

    shard_dim = 0

    def __init__(self, in_features: int, out_features: int, bias: bool = False, dtype=None):
        tp = get_tp().size
        if out_features % tp:
            raise ValueError(f"{out_features=} must be divisible by {tp=}")
        super().__init__(in_features, out_features // tp, bias, dtype)


class RowParallelLinear(LinearBase):
    """Input features split over TP; partial sums are all-reduced (bias added once, after)."""

    shard_dim = 1

    def __init__(self, in_features: int, out_features: int, bias: bool = False, dtype=None,
                 reduce: bool = True):
        tp = get_tp().size
        if in_features % tp:
            raise ValueError(f"{in_features=} must be divisible by {tp=}")
        super().__init__(in_features // tp, out_features, bias, dtype)
        self.reduce = reduce

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = matmul_wt(x, self.weight, self.use_triton, self.fma)
        if self.reduce:
            y = tp_all_reduce(y)
        return y if self.bias is None else y + self.bias
