"""Reasoning models: the markers around their thinking (SGLang's ``--reasoning-parser`` names), and a grammar that
waits for the thinking to end.

The server splits a chat answer's thinking from its answer with these formats (server/reasoning.py). The engine
uses them for structured output: with ``reasoning_parser`` set (EngineArgs, the launch flag), a request's grammar
(json_schema / regex / ebnf, response_format) constrains the answer, not the thinking before it
(``ThinkingMatcher``), as SGLang's reasoner grammar backend does. Without that a thinking model asked for JSON has
to write the JSON at once: its first token would have to open the JSON, its thinking cut off.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ReasoningFormat:
    start: str
    end: str
    forced: bool = False  # the output begins inside the reasoning (the chat template wrote its start)
    tool_start: str | None = None  # a marker that ends the reasoning too, kept in the content
    forced_by: str | None = None  # a chat_template_kwargs switch that makes the template open the reasoning

    def markers(self) -> tuple[str, ...]:
        return (self.start, self.end) + ((self.tool_start,) if self.tool_start else ())


_THINK = ("<think>", "</think>")
REASONING_FORMATS = {
    "kimi_k2": ReasoningFormat(*_THINK, tool_start="<|tool_calls_section_begin|>"),
    "deepseek-r1": ReasoningFormat(*_THINK, forced=True),
    "deepseek-v3": ReasoningFormat(*_THINK, forced_by="thinking"),
    "qwen3": ReasoningFormat(*_THINK),
    "qwen3-thinking": ReasoningFormat(*_THINK, forced=True),
    "kimi": ReasoningFormat("◁think▷", "◁/think▷"),
}
REASONING_PARSERS = tuple(REASONING_FORMATS)

def _allow(bitmask: torch.Tensor, row: int, token: int) -> None:
    """Sets ``token``'s bit in bitmask[row] (int32 words)."""
    word, bit = divmod(token, 32)
    bitmask[row, word] |= (1 << bit) - (1 << 32 if bit == 31 else 0)


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
    token remembers the state it was accepted in."""

    def __init__(self, inner, start_id: int | None, end_id: int, thinking: bool):
        self.inner, self.start_id, self.end_id = inner, start_id, end_id
        self.state = THINKING if thinking else OPEN
        self._log: list[tuple[str, bool]] = []  # per accepted token: (state before it, whether inner accepted it)

    def accept(self, token: int) -> bool:
        state = self.state
        if state == THINKING:
            if token == self.end_id:
                self.state = ANSWER
            self._log.append((state, False))
            return True
        if state == OPEN and token == self.start_id:
            self.state = THINKING
            self._log.append((state, False))
            return True
        if not self.inner.accept(token):
            return False
        self.state = ANSWER
        self._log.append((state, True))
        return True

    @property
    def terminated(self) -> bool:
        return self.state == ANSWER and self.inner.terminated

    @property
    def fill_seconds(self) -> float:
        return self.inner.fill_seconds

    @property
    def kind(self) -> str:
        return self.inner.kind

    @property
    def filler(self):
        return self.inner.filler

    def fill(self, bitmask: torch.Tensor, row: int) -> None:
        if self.state == THINKING:
            bitmask[row] = -1
            return
        self.inner.fill(bitmask, row)
        if self.state == OPEN and self.start_id is not None:
            _allow(bitmask, row, self.start_id)

    def row_job(self):
        """GrammarMatcher.row_job's: None inside the thinking (every token), else the inner grammar's fork, and at
        the output's start the start marker allowed after it (decided now: the state moves on before the row is
        filled)."""
        if self.state == THINKING:
            return None
        fork = self.inner.row_job()[0]
        if self.state == OPEN and self.start_id is not None:
            return fork, functools.partial(_allow, token=self.start_id)
        return fork, None

    def rollback(self, n: int) -> None:
        if not n:
            return
        undone = self._log[-n:]
        del self._log[-n:]
        self.inner.rollback(sum(1 for _, inner in undone if inner))
        self.state = undone[0][0]
