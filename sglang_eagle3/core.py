"""Shared types at the bottom of the import graph: the per-step batch metadata that layers read and the
runtime fills. Layers never import the runtime; the runtime never reaches into layers' internals.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch


class ForwardMode(enum.Enum):
    EXTEND = "extend"  # prefill of a batch: ragged new tokens per request (never graphed)
    DECODE = "decode"  # one new token per request
    TARGET_VERIFY = "target_verify"  # k+1 new tokens per request, causal among themselves
    DRAFT_EXTEND = "draft_extend"  # draft over accepted tokens, padded to k+1 per request
    PREFILL = "prefill"  # prompts padded to a graph's token bucket (as many tokens each), causal (graphed)

    @property
    def is_uniform(self) -> bool:
        """Same number of new tokens for every request: the shapes CUDA graphs are captured for."""
        return self is not ForwardMode.EXTEND


@dataclass
class KVPool:
    """One model's paged KV cache: per layer a [num_pages * page_size, width...] tensor.

    Page 0 is never handed to requests: padded batch rows in CUDA graphs point at it, so their writes
    land somewhere harmless.

    mha_scratch: an MLA target's [num_slots, heads x (nope + rope + v)] buffer for prefill in the non-absorbed
    form (layers/mla.py), shared by the layers one after another: each overwrites the slots of its batch's keys.
    None: prefill stays absorbed.
    """

    layers: list[torch.Tensor]
    page_size: int
    mha_scratch: torch.Tensor | None = None

    @property
    def num_slots(self) -> int:
        return self.layers[0].shape[0]


@dataclass
class ForwardBatch:
    """What one forward of one model needs besides token ids and positions.

    page_table:    [B, P] int32 page ids of each request (row b covers positions 0 .. P*page_size-1)
    seq_lens:      [B] int32 tokens in the cache after this forward (prefix + new)
    out_cache_loc: [N] int64 cache slot written by each new token (N = total new tokens)
    tokens_per_req: T for uniform modes; extend_lens (host ints) for EXTEND
    """

    mode: ForwardMode
    kv: KVPool
    page_table: torch.Tensor
    seq_lens: torch.Tensor
    out_cache_loc: torch.Tensor
    tokens_per_req: int = 1
    extend_lens: list[int] | None = None

    @property
    def batch_size(self) -> int:
        return self.page_table.shape[0]

    def __post_init__(self):
        if self.mode is ForwardMode.EXTEND:
            assert self.extend_lens is not None and len(self.extend_lens) == self.batch_size, (
                f"EXTEND needs extend_lens for each of {self.batch_size} requests, got {self.extend_lens}")
