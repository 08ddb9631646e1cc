"""Reasoning models: the markers around their thinking (SGLang's ``--reasoning-parser`` names), and a grammar that
waits for the thinking to end.

The server splits a chat answer's thinking from its answer with these formats (server/reasoning.py). The engine
uses them for structured output: with ``reasoning_parser`` set (EngineArgs, the launch flag), a request's grammar
(json_schema / regex / ebnf, response_format) constrains the answer, not the thinking before it
(``ThinkingMatcher``), as SGLang's reasoner grammar backend does. Without that a thinking model asked for JSON has
to write the JSON at once: its first token would have to open the JSON, its thinking cut off.

Strict thinking (EngineArgs.enable_strict_thinking, SGLang 0.5.23's --enable-strict-thinking) holds the thinking
itself to rules: the format's excluded tokens (a tool call's markers, the turn's end: SGLang's detectors'
think_excluded_tokens) are refused inside it, and a request's thinking budget (SGLang's ``max_thinking_tokens`` /
``custom_params.thinking_budget``, SGLANG_MAX_THINK_TOKENS for every request) ends it: once the thinking holds that
many tokens, its end marker is the only token allowed. Like a grammar's, these are masks on the target's logits, so
speculative output stays exactly the plain output under the same masks.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ReasoningFormat:
    start: str
    end: str
    forced: bool = False  # the output begins inside the reasoning (the chat template wrote its start)
    tool_start: str | None = None  # a marker that ends the reasoning too, kept in the content
    forced_by: str | None = None  # a chat_template_kwargs switch that makes the template open the reasoning
    # Tokens strict thinking refuses inside the reasoning (SGLang 0.5.23's detector's think_excluded_tokens; those
    # that are one token of the tokenizer: GrammarBackend.thinking_ids reads them).
    excluded: tuple[str, ...] = ()

    def markers(self) -> tuple[str, ...]:
        return (self.start, self.end) + ((self.tool_start,) if self.tool_start else ())


_THINK = ("<think>", "</think>")
# SGLang's Qwen3Detector's (which its deepseek-v3 detector inherits) and KimiK2Detector's lists, as 0.5.23 has them.
_QWEN3_EXCLUDED = ("<tool_call>", "</tool_call>", "<|im_end|>", "<|endoftext|>")
_KIMI_K2_EXCLUDED = ("<think>", "<|tool_calls_section_begin|>", "<|tool_call_begin|>", "<|tool_call_argument_begin|>",
                     "<|tool_call_section_end|>", "<|tool_call_end|>", "[EOS]", "<|im_end|>", "<|end_header_id|>",
                     "[EOT]")
REASONING_FORMATS = {
    "kimi_k2": ReasoningFormat(*_THINK, tool_start="<|tool_calls_section_begin|>", excluded=_KIMI_K2_EXCLUDED),
    "deepseek-r1": ReasoningFormat(*_THINK, forced=True),
    "deepseek-v3": ReasoningFormat(*_THINK, forced_by="thinking", excluded=_QWEN3_EXCLUDED),
    "qwen3": ReasoningFormat(*_THINK, excluded=_QWEN3_EXCLUDED),
    "qwen3-thinking": ReasoningFormat(*_THINK, forced=True, excluded=_QWEN3_EXCLUDED),
    "kimi": ReasoningFormat("◁think▷", "◁/think▷"),
}
REASONING_PARSERS = tuple(REASONING_FORMATS)

def _bit(token: int) -> tuple[int, int]:
    """(the int32 word of a bitmask row that holds ``token``'s bit, that bit as an int32 value)."""
    word, bit = divmod(token, 32)
    return word, (1 << bit) - (1 << 32 if bit == 31 else 0)


def _allow(bitmask: torch.Tensor, row: int, token: int) -> None:
    """Sets ``token``'s bit in bitmask[row] (int32 words)."""
    word, value = _bit(token)
    bitmask[row, word] |= value


def _not_in(excluded: frozenset[int], token: int) -> bool:
    return token not in excluded


def _is(only: int, token: int) -> bool:
    return token == only


def _anything(token: int) -> bool:
    return True


@functools.lru_cache(maxsize=16)
def _all_but(excluded: frozenset[int], words: int) -> torch.Tensor:
    """A bitmask row (int32 [words], on the host) allowing every token but ``excluded``: made once, copied into each
    row (clearing the bits row by row cost ~4 ms a verify of 8 x 4 rows at Kimi's vocabulary, per-element ops)."""
    row = torch.full((words,), -1, dtype=torch.int32)
    for t in excluded:
        word, value = _bit(t)
        row[word] &= ~value
    return row


# ThinkingMatcher's states.
OPEN, THINKING, ANSWER = "open", "thinking", "answer"


class ThinkingMatcher:
    """A request's grammar (runtime/grammar.GrammarMatcher's interface) that leaves a reasoning model's thinking
    free: ``open`` (the output's start, where the model may open its thinking: the grammar's tokens and the start
    marker allowed), ``thinking`` (every token allowed, until the end marker) and ``answer`` (the grammar). A format
    whose template opens the thinking (``forced``), or a prompt that ends with the start marker
    (GrammarBackend.matcher: Kimi-K2.5's template), starts in ``thinking``; an output that starts with a grammar
    token goes straight to ``answer``. The markers are single tokens (``start_id``, None where the format's start is not
    one: then ``open`` allows the grammar's tokens alone, and ``end_id``). Rollback crosses the states: each accepted
    token remembers the state it was accepted in.

    Strict thinking (the module's docstring): ``excluded`` token ids are refused inside the thinking, and once it
    holds ``budget`` tokens (None: no limit) the end marker is the only token allowed. ``inner`` None: no grammar (a
    request under strict thinking alone): every token allowed outside the thinking, and ``spent`` once the answer
    begins, where nothing is left to enforce."""

    def __init__(self, inner, start_id: int | None, end_id: int, thinking: bool, *, budget: int | None = None,
                 excluded: frozenset[int] = frozenset()):
        if budget is not None and budget < 0:
            raise ValueError(f"thinking budget={budget} must be >= 0 or None (no limit)")
        self.inner, self.start_id, self.end_id = inner, start_id, end_id
        self.budget, self.excluded = budget, frozenset(excluded) - {end_id}
        self.state = THINKING if thinking else OPEN
        self.thought = 0  # tokens inside the thinking so far (its markers not counted)
        # per accepted token: (state before it, whether inner accepted it, thought before it)
        self._log: list[tuple[str, bool, int]] = []

    def _over_budget(self) -> bool:
        return self.budget is not None and self.thought >= self.budget

    def accept(self, token: int) -> bool:
        state, thought = self.state, self.thought
        if state == THINKING:
            if token == self.end_id:
                self.state = ANSWER
            elif token in self.excluded or self._over_budget():
                return False
            else:
                self.thought += 1
            self._log.append((state, False, thought))
            return True
        if state == OPEN and token == self.start_id:
            self.state = THINKING
            self._log.append((state, False, thought))
            return True
        if self.inner is not None and not self.inner.accept(token):
            return False
        self.state = ANSWER
        self._log.append((state, self.inner is not None, thought))
        return True

    @property
    def terminated(self) -> bool:
        return self.state == ANSWER and self.inner is not None and self.inner.terminated

    @property
    def spent(self) -> bool:
        """Nothing left to enforce: the answer, without a grammar (the scheduler then drops the matcher, so that the
        request's rounds are plain ones again)."""
        return self.state == ANSWER and self.inner is None

    @property
    def fill_seconds(self) -> float:
        return 0.0 if self.inner is None else self.inner.fill_seconds

    @property
    def kind(self) -> str:
        return "thinking" if self.inner is None else self.inner.kind

    @property
    def filler(self):
        return None if self.inner is None else self.inner.filler

    def fill(self, bitmask: torch.Tensor, row: int) -> None:
        if self.state == THINKING:
            if self._over_budget():
                bitmask[row] = 0
                _allow(bitmask, row, self.end_id)
                return
            bitmask[row] = _all_but(self.excluded, bitmask.shape[1]) if self.excluded else -1
            return
        if self.inner is None:
            bitmask[row] = -1
            return
        self.inner.fill(bitmask, row)
        if self.state == OPEN and self.start_id is not None:
            _allow(bitmask, row, self.start_id)

    def row_job(self):
        """GrammarMatcher.row_job's: None where no grammar decides the row (inside the thinking, or without a
        grammar: fill() makes it at once), else the inner grammar's fork, and at the output's start the start marker
        allowed after it (decided now: the state moves on before the row is filled)."""
        if self.state == THINKING or self.inner is None:
            return None
        fork = self.inner.row_job()[0]
        if self.state == OPEN and self.start_id is not None:
            return fork, functools.partial(_allow, token=self.start_id)
        return fork, None

    def past_rules(self, n: int) -> list[Callable[[int], bool] | None]:
        """For each of the last ``n`` tokens accepted, oldest first, the rule a round's draft of it was chosen under,
        as a test of a token id: inside the thinking all but the excluded (the end marker alone once over the
        budget), outside it every token where there is no grammar; None where the grammar decided (its past states
        are not kept) or the token is older than the log. The scheduler's catch-up checks read it (runtime/adaptive.py:
        a draft's proposal there would have been a round's d_1 if the rule allowed it)."""
        rules = []
        for state, _, thought in self._log[-n:] if n else ():
            if state == THINKING:
                if self.budget is not None and thought >= self.budget:
                    rules.append(functools.partial(_is, self.end_id))
                else:
                    rules.append(functools.partial(_not_in, self.excluded))
            else:
                rules.append(_anything if self.inner is None else None)
        return [None] * (n - len(rules)) + rules

    def rollback(self, n: int) -> None:
        if not n:
            return
        undone = self._log[-n:]
        del self._log[-n:]
        if self.inner is not None:
            self.inner.rollback(sum(1 for _, inner, _ in undone if inner))
        self.state, _, self.thought = undone[0]
