"""Strict thinking's matcher (runtime/reasoning.py ThinkingMatcher with a budget and excluded tokens; SGLang 0.5.23's
--enable-strict-thinking): inside the thinking the excluded tokens are refused and, once it holds ``budget`` tokens,
the end marker is the only token allowed; outside it the grammar (or, with none, every token).

Checked against: a reference written here from those rules (the allowed set after a token walk, recomputed from the
whole walk each time: no state carried over), over random walks that draw refused tokens too and roll back at random,
with and without an inner grammar (a stand-in written here whose allowed set depends on the answer so far), and
GrammarBatch.host_masks' verify rows against the same reference. No xgrammar needed.
"""

from __future__ import annotations

import random

import pytest
import torch

from sglang_eagle3.runtime.grammar import GrammarBatch, allowed_tokens, bitmask_words
from sglang_eagle3.runtime.reasoning import ThinkingMatcher

VOCAB = 70  # three bitmask words, the last partly used


class ParityGrammar:
    """An inner grammar stand-in: after an answer of n tokens it allows the tokens t with t % 3 == n % 3 (ends
    never)."""

    kind, filler, fill_seconds = "ebnf", None, 0.0

    def __init__(self):
        self.walk: list[int] = []

    def allowed(self) -> set[int]:
        return {t for t in range(VOCAB) if t % 3 == len(self.walk) % 3}

    def accept(self, token: int) -> bool:
        if token not in self.allowed():
            return False
        self.walk.append(token)
        return True

    @property
    def terminated(self) -> bool:
        return False

    def fill(self, bitmask: torch.Tensor, row: int) -> None:
        bits = torch.zeros(bitmask.shape[1] * 32, dtype=torch.bool)
        bits[sorted(self.allowed())] = True
        words = (bits.view(-1, 32).to(torch.int64) << torch.arange(32)).sum(-1)
        bitmask[row] = torch.where(words >= 2 ** 31, words - 2 ** 32, words).to(torch.int32)

    def rollback(self, n: int) -> None:
        if n:
            del self.walk[-n:]


def walk_state(walk: list[int], *, start, end, forced) -> tuple[str, int, int]:
    """(state, thinking tokens, answer tokens) after ``walk``, from the rules alone."""
    state, thought, answer = ("thinking" if forced else "open"), 0, 0
    for t in walk:
        if state == "thinking":
            if t == end:
                state = "answer"
            else:
                thought += 1
        elif state == "open" and t == start:
            state = "thinking"
        else:
            state, answer = "answer", answer + 1
    return state, thought, answer


def reference(walk: list[int], *, start, end, forced, budget, excluded, grammar: bool) -> set[int]:
    """The tokens allowed after ``walk``, from the rules alone."""
    state, thought, answer = walk_state(walk, start=start, end=end, forced=forced)
    everything = set(range(VOCAB))
    if state == "thinking":
        if budget is not None and thought >= budget:
            return {end}
        return everything - (set(excluded) - {end})
    allowed = {t for t in everything if t % 3 == answer % 3} if grammar else everything
    return allowed | {start} if state == "open" and start is not None else allowed


def row_set(fill) -> set[int]:
    mask = torch.zeros(1, bitmask_words(VOCAB), dtype=torch.int32)
    fill(mask, 0)
    return set(torch.nonzero(allowed_tokens(mask, VOCAB)[0]).view(-1).tolist())


def random_setup(rng: random.Random):
    start, end = rng.sample(range(VOCAB), 2)
    return dict(start=rng.choice([start, None]), end=end, forced=rng.random() < 0.5,
                budget=rng.choice([None, 0, 1, rng.randint(2, 9)]),
                excluded=frozenset(rng.sample(range(VOCAB), rng.randint(0, 6)) + rng.choice([[], [end]])))


def matcher_of(setup: dict, grammar: bool) -> ThinkingMatcher:
    return ThinkingMatcher(ParityGrammar() if grammar else None, setup["start"], setup["end"], setup["forced"],
                           budget=setup["budget"], excluded=setup["excluded"])


@pytest.mark.parametrize("grammar", [False, True])
def test_walks_against_the_rules(grammar):
    rng = random.Random()
    for _ in range(60):
        setup = random_setup(rng)
        m = matcher_of(setup, grammar)
        walk: list[int] = []
        for _ in range(rng.randint(5, 40)):
            want = reference(walk, grammar=grammar, **setup)
            assert row_set(m.fill) == want, (setup, walk)
            state = walk_state(walk, start=setup["start"], end=setup["end"], forced=setup["forced"])[0]
            assert m.spent == (not grammar and state == "answer")
            if walk and rng.random() < 0.2:
                n = rng.randint(1, min(5, len(walk)))
                m.rollback(n)
                del walk[-n:]
                continue
            # Mostly tokens the rules allow, the markers and excluded ones often, refused ones too.
            pool = [setup["end"], *setup["excluded"]] + ([setup["start"]] if setup["start"] is not None else [])
            t = rng.choice(pool) if rng.random() < 0.4 else rng.randrange(VOCAB)
            assert m.accept(t) == (t in want), (setup, walk, t)
            if t in want:
                walk.append(t)


def test_a_budget_of_zero_ends_an_opened_thinking_at_once_and_spent_drops_nothing_early():
    m = ThinkingMatcher(None, 5, 6, thinking=False, budget=0, excluded=frozenset({7}))
    assert not m.spent and row_set(m.fill) == set(range(VOCAB))  # the output's start: anything, the start too
    assert m.accept(5) and row_set(m.fill) == {6}
    assert not m.accept(8) and not m.accept(7) and not m.spent
    assert m.accept(6) and m.spent and row_set(m.fill) == set(range(VOCAB))
    m.rollback(1)
    assert not m.spent and row_set(m.fill) == {6}
    with pytest.raises(ValueError, match="budget=-1"):
        ThinkingMatcher(None, 5, 6, thinking=True, budget=-1)


@pytest.mark.parametrize("grammar", [False, True])
def test_verify_rows_follow_the_rules(grammar):
    """GrammarBatch.host_masks over strict matchers (rows ThinkingMatcher fills at once: row_job None inside the
    thinking) and requests without one: row b * T + j is the reference's allowed set after the request's walk and
    drafts[b][1..j]; rows after a refused draft are never read (left out); the matchers end where they began."""
    rng = random.Random()
    B, T = 5, 4
    setups, matchers, walks = [], [], []
    for b in range(B):
        setup = random_setup(rng)
        m = matcher_of(setup, grammar)
        walk = []
        for _ in range(rng.randint(0, 12)):
            t = rng.choice(sorted(reference(walk, grammar=grammar, **setup)))
            assert m.accept(t)
            walk.append(t)
        setups.append(setup)
        matchers.append(m if b != 2 else None)  # request 2 has no matcher: its rows allow everything
        walks.append(walk)
    drafts = []
    for b in range(B):
        row = [0]
        for _ in range(T - 1):  # drafts the rules allow, mostly
            allowed = sorted(reference(walks[b] + row[1:], grammar=grammar, **setups[b]))
            row.append(rng.choice(allowed) if rng.random() < 0.8 else rng.randrange(VOCAB))
        drafts.append(row)
    states = [(m.state, m.thought) for m in matchers if m is not None]
    mask = GrammarBatch(matchers, VOCAB, upload=lambda x: x).host_masks(drafts, T)
    allowed = allowed_tokens(mask, VOCAB)
    for b in range(B):
        for j in range(T):
            got = set(torch.nonzero(allowed[b * T + j]).view(-1).tolist())
            if matchers[b] is None:
                assert got == set(range(VOCAB))
                continue
            want = reference(walks[b] + drafts[b][1:j + 1], grammar=grammar, **setups[b])
            assert got == want, (b, j, setups[b])
            if drafts[b][j + 1:j + 2] and drafts[b][j + 1] not in want:
                break
    assert [(m.state, m.thought) for m in matchers if m is not None] == states


@pytest.mark.parametrize("grammar", [False, True])
def test_past_rules_are_the_rules_each_token_was_chosen_under(grammar):
    """ThinkingMatcher.past_rules(n) (what the adaptive policy's catch-up checks read): for each of the walk's last n
    tokens the set it allows is the reference's allowed set before that token, inside the thinking and, without a
    grammar, outside it; None where the grammar decided or before the walk's start. After random walks with
    rollbacks and refused tokens."""
    rng = random.Random()
    for _ in range(40):
        setup = random_setup(rng)
        m = matcher_of(setup, grammar)
        walk: list[int] = []
        for _ in range(rng.randint(0, 30)):
            if walk and rng.random() < 0.15:
                n = rng.randint(1, min(4, len(walk)))
                m.rollback(n)
                del walk[-n:]
                continue
            allowed = reference(walk, grammar=grammar, **setup)
            t = rng.choice(sorted(allowed)) if rng.random() < 0.8 else rng.randrange(VOCAB)
            if m.accept(t):
                walk.append(t)
        n = rng.randint(0, len(walk) + 3)
        rules = m.past_rules(n)
        assert len(rules) == n
        for j, rule in enumerate(rules):
            i = len(walk) - n + j  # the rule of walk[i]: the state after walk[:i]
            state = walk_state(walk[:max(i, 0)], start=setup["start"], end=setup["end"], forced=setup["forced"])[0]
            if i < 0 or (grammar and state != "thinking"):
                assert rule is None, (setup, walk, n, j)
                continue
            assert {t for t in range(VOCAB) if rule(t)} == reference(walk[:i], grammar=grammar, **setup), \
                (setup, walk, n, j)
