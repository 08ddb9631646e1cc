"""Reasoning models on /v1/chat/completions: the thinking text apart from the answer (``--reasoning-parser``).

A reasoning model writes its thoughts between markers before the answer (``<think>`` ... ``</think>``). With a
parser the chat response carries them in ``message.reasoning_content`` (streamed as ``delta.reasoning_content``)
and the rest in ``content``, as SGLang's and DeepSeek's API give them. Per request (SGLang's fields):
``separate_reasoning: false`` leaves the output whole in ``content``; ``stream_reasoning: false`` sends the
reasoning in one delta once it has ended.

Parsers (SGLang's names; the markers, whether the output starts inside the reasoning, and what else ends it):

- ``kimi_k2`` (Kimi-K2-Thinking, Kimi-K2.5): ``<think>`` ... ``</think>``; a tool-call section
  (``<|tool_calls_section_begin|>``) ends the reasoning too, and stays in the content for ``--tool-call-parser``.
- ``deepseek-r1``: ``<think>`` ... ``</think>``, the output starts inside (the chat template opened it; a leading
  ``<think>`` is dropped), except where a grammar shapes the output from its first token (response_format, a
  forced tool call) on an engine whose grammars do not wait for the thinking (EngineArgs.reasoning_parser, which
  the launch flag sets too: runtime/reasoning.py): the answer is then all content.
- ``deepseek-v3`` (DeepSeek-V3.1 / V3.2): ``<think>`` ... ``</think>``; the output starts inside where the request
  asks its chat template to think (``chat_template_kwargs: {"thinking": true}``: the template opens it).
- ``qwen3``: ``<think>`` ... ``</think>``, reasoning only where the model opens it; ``qwen3-thinking`` (Qwen3's
  thinking-only models): the output starts inside.
- ``kimi`` (Kimi-VL thinking models): ``◁think▷`` ... ``◁/think▷``.

Any format: where the rendered prompt ends with the start marker (the chat template opened the reasoning, as
Kimi-K2.5's does unless ``thinking`` is false), the output starts inside it (``opened_by_prompt``), as for
``deepseek-r1``; not with a grammar, which holds the output to it from its first token.

One reasoning block a response: text before its start is content, and everything after its end is content, markers
included. The reasoning is stripped of surrounding whitespace and the content of the whitespace right after the
end; an output cut short inside the reasoning (max_tokens) is all reasoning. Streamed and whole responses split the
same way (the stream holds back a trailing piece that may be the start of a marker, or whitespace the end may
strip). Where the tokenizer holds a marker as a special token, a request decodes with its special tokens (as with
the kimi_k2 tool parser), or the markers would never reach the text.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

from sglang_eagle3.runtime.reasoning import REASONING_FORMATS, REASONING_PARSERS, ReasoningFormat
from sglang_eagle3.runtime.sampling import short_repr
from sglang_eagle3.server.protocol import APIError

__all__ = ["REASONING_FORMATS", "REASONING_PARSERS", "Parts", "ReasoningFormat", "ReasoningSplitter",
           "ReasoningStream", "opened_by_prompt", "separated"]


def held_back(text: str, markers: tuple[str, ...]) -> int:
    """Length of the longest end of ``text`` that is a proper prefix of one of ``markers`` (a stream holds it back:
    the next tokens may complete the marker). The tool-call parser's too (server/tools.py)."""
    for n in range(min(len(text), max(map(len, markers)) - 1), 0, -1):
        if any(m.startswith(text[-n:]) for m in markers):
            return n
    return 0


def opened_by_prompt(fmt: ReasoningFormat, prompt_end: str) -> ReasoningFormat:
    """``fmt`` for an output that follows a prompt ending in ``prompt_end`` (its rendered text's last characters):
    where the chat template opened the reasoning there (the prompt ends with the start marker), the output starts
    inside it. Kimi-K2.5's template does so unless ``chat_template_kwargs`` sets ``thinking`` false (then it writes
    ``<think></think>``), so its output is ``thoughts</think>answer``; SGLang's kimi_k2 parser reads it so too,
    starting inside the reasoning unless ``thinking`` is false."""
    if fmt.forced or not prompt_end.rstrip().endswith(fmt.start):
        return fmt
    return dataclasses.replace(fmt, forced=True)


class Parts(NamedTuple):
    """One split of an output text. ``start`` / ``end`` bound the reasoning's span in the text itself (what
    server/openai_api.py places tokens by): from its start marker (0 for formats that start inside) to the end of
    its end marker (the start of a tool section, which stays in the content); ``start`` None: no reasoning (yet),
    ``end`` None: it runs on to the end of the text. Text before ``start`` and from ``end`` on is the content."""

    reasoning: str | None  # None where the output has none
    content: str
    ended: bool  # its end marker or the tool section came
    start: int | None
    end: int | None


class ReasoningSplitter:
    """Splits one choice's output text (as it grows) into (reasoning, content). ``split(text, finished)`` reads the
    whole text so far; while not finished it leaves out what the next tokens may still change (a partial marker,
    whitespace the end would strip), so each call's parts extend the last call's."""

    def __init__(self, fmt: ReasoningFormat):
        self.fmt = fmt

    def split(self, text: str, finished: bool = True) -> tuple[str | None, str]:
        """(reasoning or None where the output has none, content)."""
        return self.parts(text, finished)[:2]

    def parts(self, text: str, finished: bool) -> Parts:
        """split()'s parts, whether the reasoning has ended, and where it lies in ``text``."""
        fmt = self.fmt
        if fmt.forced:
            body = len(text) - len(text.lstrip())
            if text.startswith(fmt.start, body):
                body += len(fmt.start)
            elif not finished and fmt.start.startswith(text[body:]):
                return Parts("", "", False, 0, None)  # (the start marker may be coming)
            before, start = "", 0
        else:
            start = text.find(fmt.start)
            if start < 0:
                keep = len(text) if finished else len(text) - held_back(text, (fmt.start,))
                return Parts(None, text[:keep], False, None, None)
            before, body = text[:start], start + len(fmt.start)
        # The reasoning runs to the first end marker (or tool section), else to the end of the text.
        ends = [(j, m) for m in (fmt.end, fmt.tool_start) if m for j in (text.find(m, body),) if j >= 0]
        if not ends:
            stop = len(text) if finished else len(text) - held_back(text, fmt.markers()[1:])
            # (stripped at both ends while it grows too: trailing whitespace goes if the end marker comes next)
            return Parts(text[body:stop].strip(), before, False, start, None)
        j, marker = min(ends)
        reasoning = text[body:j].strip()
        if marker == fmt.end:
            end = j + len(marker)
            rest = text[end:].lstrip()
            if not finished and not rest:  # (whitespace so far: wait for what follows)
                return Parts(reasoning, before, True, start, end)
            return Parts(reasoning, before + rest, True, start, end)
        # the tool section is content, for the tool-call parser
        return Parts(reasoning, before + text[j:], True, start, j)


def separated(text: str, parser: str, blocks: bool = False) -> dict:
    """SGLang's /separate_reasoning answer: ``text`` split by ``parser``'s format as the chat splits an answer (the
    format as it stands: no prompt opened the thinking), ``{"reasoning_text", "text"}`` ("" where there is no
    reasoning), with ``blocks`` the parts as blocks too (``blocks``: the reasoning's where there is one, then the
    text's; ``reasoning_blocks`` / ``text_blocks``: their texts). An unknown format is an APIError 400 naming it."""
    fmt = REASONING_FORMATS.get(parser)
    if fmt is None:
        raise APIError(400, f"reasoning_parser={short_repr(parser)} must be one of {', '.join(REASONING_PARSERS)}",
                       param="reasoning_parser")
    reasoning, content = ReasoningSplitter(fmt).split(text)
    out: dict = {"reasoning_text": reasoning or "", "text": content}
    if blocks:
        parts = ([{"type": "reasoning", "text": reasoning}] if reasoning else []) + [{"type": "text", "text": content}]
        out |= {"reasoning_blocks": [reasoning] if reasoning else [], "text_blocks": [content], "blocks": parts}
    return out


class ReasoningStream:
    """One streamed choice: ``feed(text so far, finished)`` -> (reasoning delta, content so far). With
    ``stream_reasoning`` off the reasoning comes as one delta once it has ended (or the output has). ``last``: the
    latest feed's Parts (where the reasoning lies in the text, whether it has ended)."""

    def __init__(self, fmt: ReasoningFormat, stream_reasoning: bool = True):
        self.splitter = ReasoningSplitter(fmt)
        self.stream_reasoning = stream_reasoning
        self.sent = 0  # characters of reasoning sent
        self.last = Parts(None, "", False, None, None)

    def feed(self, text: str, finished: bool) -> tuple[str, str]:
        self.last = parts = self.splitter.parts(text, finished)
        if not self.stream_reasoning and not (finished or parts.ended):
            return "", parts.content
        reasoning = parts.reasoning or ""
        delta = reasoning[self.sent:]
        self.sent = max(self.sent, len(reasoning))
        return delta, parts.content

    def decided(self, text: str, finished: bool) -> int:
        """How much of ``text`` the split has placed: all but a trailing piece that may start a marker (a whole
        marker at the end is placed: the split has read it, and its tokens go with the reasoning's delta)."""
        if finished:
            return len(text)
        markers = tuple(m for m in self.splitter.fmt.markers() if not text.endswith(m))
        return len(text) - (held_back(text, markers) if markers else 0)
