"""Paged KV memory: one page allocator shared by the target and draft pools (a request's page ids index
both), so a request's page list is its page table for either model."""

from __future__ import annotations

import torch

from sglang_eagle3.core import KVPool


class OutOfPagesError(RuntimeError):
    pass


class PageAllocator:
    """Free list of page ids 1..num_pages-1; page 0 is the scratch page for padded graph rows."""

    def __init__(self, num_pages: int):
        if num_pages < 2:
            raise ValueError(f"num_pages={num_pages} must be >= 2 (page 0 is reserved)")
        self.num_pages = num_pages
        self._free = list(range(num_pages - 1, 0, -1))

    @property
    def num_free(self) -> int:
        return len(self._free)

    def alloc(self, n: int) -> list[int]:
        if n > len(self._free):
            raise OutOfPagesError(f"KV cache exhausted: need {n} pages, {len(self._free)} free "
                                  f"of {self.num_pages - 1}")
        out = self._free[-n:] if n else []
        del self._free[len(self._free) - n:]
        return out[::-1]

    def free(self, pages: list[int]) -> None:
        self._free.extend(reversed(pages))


def make_pool(num_layers: int, num_pages: int, page_size: int, width: tuple[int, ...], dtype, device) -> KVPool:
    slots = num_pages * page_size
    return KVPool([torch.zeros(slots, *width, dtype=dtype, device=device) for _ in range(num_layers)], page_size)


def pages_for(tokens: int, page_size: int) -> int:
    return (tokens + page_size - 1) // page_size
