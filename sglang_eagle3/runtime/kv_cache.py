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

    def reclaim(self, held: set[int]) -> list[int]:
        """Makes the free list every page outside ``held`` (and the scratch page 0), each once; returns the pages it
        brought back. For after an interrupt: a page moves between the free list and a request's page list in two
        operations, and a KeyboardInterrupt between them leaves it in neither (or, freed twice, in the list twice).
        O(num_pages), so run only then."""
        seen: set[int] = set()
        free = []
        for p in self._free:  # the current order kept: the next allocations are the ones they would have been
            if p not in held and p not in seen:
                seen.add(p)
                free.append(p)
        lost = [p for p in range(self.num_pages - 1, 0, -1) if p not in held and p not in seen]
        self._free = lost + free
        return lost


def make_pool(num_layers: int, num_pages: int, page_size: int, width: tuple[int, ...], dtype, device,
              mha_scratch_width: int = 0) -> KVPool:
    """The layers' cache tensors (zeros), and with ``mha_scratch_width`` the MLA prefill scratch (KVPool)."""
    slots = num_pages * page_size
    scratch = torch.empty(slots, mha_scratch_width, dtype=dtype, device=device) if mha_scratch_width else None
    return KVPool([torch.zeros(slots, *width, dtype=dtype, device=device) for _ in range(num_layers)], page_size,
                  scratch)


def pages_for(tokens: int, page_size: int) -> int:
    return (tokens + page_size - 1) // page_size


def kv_bytes_per_token(target_config, draft, dtype: torch.dtype, mha_scratch_width: int = 0) -> int:
    """KV cache bytes one token takes on this rank: the target's latent row in every layer (MLA's cache is not
    split across TP ranks), the MLA prefill scratch's row (``mha_scratch_width`` elements; KVPool) and the draft's
    key and value rows for its kv heads on this rank."""
    elems = target_config.num_hidden_layers * target_config.kv_cache_dim + mha_scratch_width
    if draft is not None:
        elems += 2 * draft.midlayer.self_attn.num_kv_heads * draft.config.head_dim
    return elems * torch.empty((), dtype=dtype).element_size()


def pages_that_fit(free_bytes: int, total_bytes: int, mem_fraction_static: float, bytes_per_page: int) -> int:
    """Pages the KV pools may take once the weights are loaded: the free memory beyond a reserve of
    (1 - mem_fraction_static) of the device for activations and CUDA graphs (SGLang's rule: weights and KV
    cache together stay within that fraction)."""
    budget = free_bytes - (1.0 - mem_fraction_static) * total_bytes
    return max(0, int(budget // bytes_per_page))
