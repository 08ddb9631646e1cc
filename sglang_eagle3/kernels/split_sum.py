"""SplitSum: a split-K GEMV's output left unreduced for its readers to add (kernels/gemv.py ``defer``).

The producer (triton/gemv.py with DEFER) skips its launch's tail; a reader kernel loads the value through
triton/sync.py load_split_sum, which adds the partials in split order and rounds as the tail would have. The
readers so far: the skinny GEMM (its x), the routing kernel (router logits) and the rotary launch (MLA's
latent and rope key).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, eq=False)
class SplitSum:
    """A split-K GEMV's output [T, n] left unreduced (``defer=True``): its kernels' readers add the partials
    themselves (triton/sync.py load_split_sum), which skips the launch's tail: the last split of each row
    block waiting on a counter, re-reading the partials and storing (1.5-1.7 us a launch on the H200,
    benchmarks/bench_chain.py ``single<i>/notail``). The numbers read are the ones the tail would have stored.

    ``part`` is the launch's fp32 scratch [split, 2, m_pad, width] (flat): output column c of row t, split s
    at ``((s * 2 + h) * m_pad + t) * width + col0 + c``, h = 0, or 1 for the up half of a ``gated`` output
    (then the value is SiLU(gate sum) * (up sum), rounded as the gated epilogue rounds). ``dtype``: what the
    tail would have stored (float32 router logits: no rounding)."""

    part: torch.Tensor
    split: int
    m_pad: int
    width: int
    col0: int
    T: int
    n: int
    dtype: torch.dtype
    gated: bool = False

    @property
    def shape(self) -> tuple[int, int]:
        return (self.T, self.n)

    @property
    def device(self) -> torch.device:
        return self.part.device

    @property
    def split_stride(self) -> int:
        return 2 * self.m_pad * self.width

    @property
    def up_stride(self) -> int:
        return self.m_pad * self.width

    def plane(self) -> torch.Tensor:
        """The partials as [split, 2, m_pad, n] (a view)."""
        planes = self.part[: self.split * 2 * self.m_pad * self.width].view(self.split, 2, self.m_pad, self.width)
        return planes[..., self.col0:self.col0 + self.n]

    def columns(self, start: int, n: int) -> SplitSum:
        """Columns [start, start + n) of this output (e.g. kv_a's latent and rope parts)."""
        assert 0 <= start and start + n <= self.n, f"columns [{start}, {start + n}) outside {self.n}"
        return SplitSum(self.part, self.split, self.m_pad, self.width, self.col0 + start, self.T, n, self.dtype,
                        self.gated)

    def rows(self) -> torch.Tensor:
        """[T, n] view of split 0's gate plane, rows ``width`` apart: the pointer and row stride a reader
        kernel takes (it adds the other planes itself)."""
        return self.part[self.col0:].as_strided((self.T, self.n), (self.width, 1))

    def materialize(self) -> torch.Tensor:
        """The [T, n] tensor the launch's tail would have stored (same order of sums, same roundings), for
        readers without a split-sum load (torch references, tests)."""
        planes = self.plane()[:, :, : self.T].float()
        acc = planes[0, 0].clone()
        for s in range(1, self.split):
            acc += planes[s, 0]
        y = acc.to(self.dtype)
        if self.gated:
            up = planes[0, 1].clone()
            for s in range(1, self.split):
                up += planes[s, 1]
            g = y.float()
            g = (g / (1.0 + torch.exp(-g))).to(self.dtype)  # the gated epilogue's formula
            y = (g.float() * up.to(self.dtype).float()).to(self.dtype)
        return y


def split_sum_args(x: SplitSum | None) -> dict:
    """A reader kernel's arguments for x (the constexprs of load_split_sum; X_SPLIT = 0 for a tensor)."""
    if x is None:
        return dict(X_SPLIT=0, x_split_stride=0, X_GATED=False, x_up_stride=0)
    return dict(X_SPLIT=x.split, x_split_stride=x.split_stride, X_GATED=x.gated, x_up_stride=x.up_stride)
