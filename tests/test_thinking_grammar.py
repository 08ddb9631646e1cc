"""Structured output for reasoning models (runtime/reasoning.py ThinkingMatcher, EngineArgs.reasoning_parser): the
grammar constrains the answer after the thinking, not the thinking.

Checked against: a reference written here from the rules (a token walk's allowed set at each position: every token
inside the thinking, a fresh matcher fed the answer's tokens after it, and at the output's start the grammar's
tokens plus the start marker), with rejected tokens and rollbacks drawn at random. End to end (a tokenizer whose
markers are tokens): tests/server/test_reasoning.py.
"""

from __future__ import annotations

import os
import random

import pytest
import torch

from sglang_eagle3.config import ConfigError
from sglang_eagle3.engine import EMBEDDED_DIR, EngineArgs
from sglang_eagle3.runtime.grammar import GrammarBackend, GrammarSpec, bitmask_words
from sglang_eagle3.runtime.reasoning import ThinkingMatcher
from sglang_eagle3.tokenizer import load_tokenizer

pytest.importorskip("xgrammar")
TARGET = os.path.join(EMBEDDED_DIR, "target")
pytestmark = pytest.mark.skipif(not os.path.exists(os.path.join(TARGET, "config.json")),
                                reason="embedded weights not present")
THINK, END = "<think>", "</think>"


def _allowed(fill, vocab: int) -> set[int]:
    mask = torch.zeros(1, bitmask_words(vocab), dtype=torch.int32)
    fill(mask, 0)
    bits = ((mask[0].unsqueeze(-1) >> torch.arange(32, dtype=torch.int32)) & 1).view(-1)[:vocab]
    return set(torch.nonzero(bits).view(-1).tolist())


def _reference(backend, spec, tokens: list[int], start: int, end: int, forced: bool, vocab: int) -> set[int]:
    """The tokens allowed after ``tokens`` by the rules."""
    state, answer = ("thinking" if forced else "open"), []
    for t in tokens:
        if state == "thinking":
            state = "answer" if t == end else "thinking"
        elif state == "open" and t == start:
            state = "thinking"
        else:
            state = "answer"
            answer.append(t)
    if state == "thinking":
        return set(range(vocab))
    fresh = backend.matcher(spec) if backend.reasoning is None else backend.matcher(spec).inner
    for t in answer:
        assert fresh.accept(t)
    allowed = _allowed(fresh.fill, vocab)
    return allowed | {start} if state == "open" else allowed


@pytest.mark.parametrize("forced", [False, True])
def test_matcher_against_the_rules(forced):
    tok = load_tokenizer(TARGET)
    vocab = tok.vocab_size
    plain = GrammarBackend(tok, vocab, [tok.eos_token_id])
    backend = GrammarBackend(tok, vocab, [tok.eos_token_id])
    spec = GrammarSpec("regex", r"(yes|no|maybe), [a-z]+( [a-z]+){0,4}\.")
    backend.compile(spec)
    # Two ids the grammar never allows stand in for the markers (the embedded tokenizer has none).
    start, end = vocab - 3, vocab - 2
    rng = random.Random(int(forced))
    for _ in range(12):
        m = ThinkingMatcher(plain.matcher(spec), start, end, thinking=forced)
        walk: list[int] = []
        for _ in range(rng.randint(3, 25)):
            want = _reference(plain, spec, walk, start, end, forced, vocab)
            assert _allowed(m.fill, vocab) == want, walk
            if rng.random() < 0.15 and walk:  # roll back a few and compare again
                n = rng.randint(1, min(4, len(walk)))
                m.rollback(n)
                del walk[-n:]
                continue
            if m.terminated:
                break
            refused = sorted(set(range(vocab)) - want)
            if refused and rng.random() < 0.15:
                t = rng.choice(refused)
                assert not m.accept(t)  # (nothing changes)
                continue
            pick = [end] if m.state == "thinking" and rng.random() < 0.3 else sorted(want)
            if m.state == "open" and rng.random() < 0.4:
                pick = [start]
            t = rng.choice(pick)
            assert m.accept(t), (walk, t)
            walk.append(t)


def test_backend_wraps_where_the_markers_are_tokens(caplog):
    tok = load_tokenizer(TARGET)
    args = EngineArgs(model_path=TARGET, device="cpu", reasoning_parser="kimi_k2")
    backend = GrammarBackend.for_engine(args, tok, tok.vocab_size, [tok.eos_token_id])
    spec = GrammarSpec("regex", "yes|no")
    with caplog.at_level("WARNING"):
        m = backend.matcher(spec)
    # The embedded tokenizer spells </think> in several tokens: no wrap, and a warning naming the marker.
    assert not isinstance(m, ThinkingMatcher) and "</think>" in caplog.text
    with pytest.raises(ConfigError, match="kimi_k2"):
        EngineArgs(model_path=TARGET, device="cpu", reasoning_parser="r2d2")


@pytest.mark.parametrize("forced", [False, True])
def test_verify_rows_filled_together_are_the_rows_one_by_one(forced, monkeypatch):
    """GrammarBatch.host_masks over ThinkingMatchers whose rows are dear (filled together on the RowFiller's threads
    from forks of their grammars, the start marker's bit set after where the row sits at the output's start, rows
    inside the thinking left all allowed) == the same rows filled one by one (ThinkingMatcher.fill, checked against
    the rules above), for random outputs and drafts across the markers."""
    from sglang_eagle3.runtime.grammar import GrammarBatch, RowFiller

    tok = load_tokenizer(TARGET)
    vocab = tok.vocab_size
    backend = GrammarBackend(tok, vocab, [tok.eos_token_id], fill_threads=2)
    spec = GrammarSpec("regex", r"(yes|no|maybe), [a-z]+( [a-z]+){0,4}\.")
    start, end = vocab - 3, vocab - 2
    answer = tok.encode("yes, abc de fg.")
    pool = answer + [start, end, start, end] + [tok.eos_token_id, 7, 300]
    rng = random.Random(3 + int(forced))
    together = []
    fill = RowFiller.fill
    monkeypatch.setattr(RowFiller, "fill", lambda self, forks, bitmask, rows: (together.append(len(forks)),
                                                                             fill(self, forks, bitmask, rows)))
    for _ in range(6):
        T, outs = rng.randint(2, 6), []
        for _ in range(8):
            out = rng.choice([[], [start], [start, 11], [start, 11, end], [end], answer[:2], [start, end] + answer[:1]])
            outs.append(out)
        # Random drafts, or the answer's tokens (rows past the output's start inside the grammar).
        drafts = [[0] + ([rng.choice(pool) for _ in range(T - 1)] if rng.random() < 0.5 else
                         (answer * 2)[:T - 1]) for _ in outs]
        rows = {}
        for dear in (False, True):
            matchers = []
            for out in outs:
                m = ThinkingMatcher(backend.matcher(spec), start, end, thinking=forced)
                for t in out:
                    if not m.accept(t):
                        break
                m.inner.fill_seconds = 1.0 if dear else 0.0
                matchers.append(m)
            rows[dear] = GrammarBatch(matchers, vocab, lambda t: t).host_masks(drafts, T)
        assert torch.equal(rows[True], rows[False])
    assert together and all(n > 1 for n in together), together


def test_a_prompt_that_opens_the_thinking_starts_the_output_inside_it():
    """Kimi-K2.5's chat template ends its generation prompt with <think> (unless thinking is false), so the model
    writes thoughts</think>answer: its matcher must start inside the thinking, or the grammar holds the very first
    token (JSON at once, no thinking). A prompt ending otherwise starts at the output's start, as before; a forced
    format starts inside whatever the prompt."""
    tok = load_tokenizer(TARGET)
    vocab = tok.vocab_size
    spec = GrammarSpec("regex", r"(yes|no), [a-z]+\.")
    start, end = vocab - 3, vocab - 2  # stand-ins: the embedded tokenizer has no marker tokens
    for forced in (False, True):
        args = EngineArgs(model_path=TARGET, device="cpu", reasoning_parser="deepseek-r1" if forced else "kimi_k2")
        backend = GrammarBackend.for_engine(args, tok, vocab, [tok.eos_token_id])
        backend.compile(spec)
        backend._think_ids = (start, end)
        prompt = tok.encode("Is the sky blue?")
        states = {name: backend.matcher(spec, ids).state
                  for name, ids in (("opened", prompt + [start]), ("plain", prompt), ("closed", prompt + [start, end]),
                                    ("none", None))}
        if forced:
            assert set(states.values()) == {"thinking"}, states
        else:
            assert states == {"opened": "thinking", "plain": "open", "closed": "open", "none": "open"}, states
        m = backend.matcher(spec, prompt + [start])
        assert _allowed(m.fill, vocab) == set(range(vocab))  # thinking: every token, not the grammar's first
        assert m.accept(tok.encode(" hm")[0]) and m.accept(end) and m.state == "answer"
