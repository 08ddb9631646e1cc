"""Vocab-parallel embedding and LM head: each TP rank holds vocab/tp rows."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from sglang_eagle3.distributed.parallel_state import get_tp, tp_all_gather_last_dim, tp_all_reduce
from sglang_eagle3.layers.linear import sharded_loader


class _VocabSharded(nn.Module):
    """A [vocab/tp, dim] weight holding this rank's contiguous block of vocabulary rows."""

    def __init__(self, vocab_size: int, dim: int, dtype=None):
        super().__init__()
        tp = get_tp()
        if vocab_size % tp.size:
            raise ValueError(f"{vocab_size=} must be divisible by tp_size={tp.size}")
        self.vocab_size = vocab_size
        self.part = vocab_size // tp.size
        self.start = tp.rank * self.part
        self.weight = nn.Parameter(torch.empty(self.part, dim, dtype=dtype), requires_grad=False)
        self.weight.weight_loader = sharded_loader(0)


class VocabParallelEmbedding(_VocabSharded):

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.part == self.vocab_size:
            return F.embedding(ids, self.weight)
        if get_tp().simulated:
            # One process standing in for one rank: the all-reduce that would bring rows held by other ranks
            # is skipped, so read a stand-in row here instead of zeros (keeps activations and routing real).
            return F.embedding(ids % self.part, self.weight)
        local = ids - self.start
        inside = (local >= 0) & (local < self.part)
        out = F.embedding(local.clamp(0, self.part - 1), self.weight) * inside.unsqueeze(-1).to(self.weight.dtype)
        return tp_all_reduce(out)


class ParallelLMHead(_VocabSharded):
    """logits = h W^T over the full vocab (gathered from the ranks' slices), in float32."""

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return tp_all_gather_last_dim(F.linear(h, self.weight).float())
