"""A random walk through a grammar's masks: what the grammar lets a model write, drawn at random (the forced tool-call
tests, tests/server/test_tools_markup.py and tests/integration/test_tools_markup_sglang.py; no hypothesis here: the
SGLang virtualenv runs the latter)."""

from __future__ import annotations

import random

import torch

from sglang_eagle3.runtime.grammar import GrammarSpec, allowed_tokens, bitmask_words


def random_walk(backend, spec: GrammarSpec, stop: int, rng: random.Random, limit: int,
                prefer: int | None = None, p_prefer: float = 0.25) -> list | None:
    """Tokens drawn at random among those the grammar allows until it allows the stop token (taken then with
    probability 1/2, at once past half of ``limit``; before that ``prefer``, where allowed, with probability
    ``p_prefer``); None where ``limit`` runs out first, or where the bytes are not UTF-8 (xgrammar lets a few such
    sequences through, such as a 0xF7 lead byte: no model's text)."""
    vocab = backend.vocab_size
    m = backend.matcher(spec)
    mask = torch.zeros(1, bitmask_words(vocab), dtype=torch.int32)
    out: list[int] = []
    for step in range(limit):
        m.fill(mask, 0)
        allowed = allowed_tokens(mask, vocab)[0].nonzero().flatten().tolist()
        assert allowed, out
        if prefer in allowed and rng.random() < p_prefer:
            t = prefer
        elif stop in allowed and (len(allowed) == 1 or step > limit // 2 or rng.random() < 0.5):
            try:
                b"".join(backend.tokenizer.token_bytes(t) for t in out).decode()
            except UnicodeDecodeError:
                return None
            return out
        else:
            t = rng.choice([t for t in allowed if t != stop])
        assert m.accept(t)
        out.append(t)
    return None
