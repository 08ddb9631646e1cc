"""``--reasoning-parser auto`` / ``--tool-call-parser auto`` (SGLang 0.5.23's flags): the parsers read from the
checkpoint's chat template and tokenizer.

SGLang runs an ordered list of rules over the template's text and the vocabulary, for every family it serves; this
engine loads DeepSeek-V3-architecture checkpoints only (Kimi-K2 / K2.5, DeepSeek-V3 / V3.1 / R1), so only the rules
that tell those families apart are here, in SGLang's order (the first that holds decides):

reasoning
  1. ``◁think▷`` in the template: ``kimi`` (the Kimi-VL / 1.5 thinking markers);
  2. ``<|tool_calls_section_begin|>`` one token of the tokenizer: ``kimi_k2`` (Kimi-K2, K2-Thinking, K2.5);
  3. a working ``enable_thinking`` switch, on by default: ``qwen3``;
  4. a working ``thinking`` switch, off by default: ``deepseek-v3`` (DeepSeek-V3.1 / V3.2's templates: the thinking
     is opened by the template only when a request turns it on);
  5. ``<think>`` or ``</think>`` in the template: ``deepseek-r1`` (R1's templates, which open the thinking in the
     generation prompt or strip it from past turns);
  else none (logged, as SGLang does: the server then splits no reasoning).

tool calls
  1. ``<|tool_calls_section_begin|>`` one token: ``kimi_k2``;
  2. DeepSeek's call markup (``<｜tool▁calls▁begin｜>``) in the template: SGLang's ``deepseekv3`` / ``deepseekv31``,
     which this server does not read: none, with a warning naming it (tool_choice auto then answers a 400 saying a
     parser is needed; named and required tool choices work without one);
  else none.

A switch is found by rendering, not by reading the template's syntax: the same one-message conversation rendered
with the variable unset, true and false; it works when true and false render differently, and its default is the
one the unset render equals. (SGLang matches the ``{% if not thinking is defined %}{% set thinking = false %}``
spelling and Jinja ``default`` filters; a template that spells the same default otherwise, e.g. with ``{%-``, is a
``deepseek-v3`` template here and a ``deepseek-r1`` one there.)
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from sglang_eagle3.tokenizer import Tokenizer

logger = logging.getLogger(__name__)

AUTO = "auto"
_KIMI_K2_CALLS = "<|tool_calls_section_begin|>"
_DEEPSEEK_CALLS = "<｜tool▁calls▁begin｜>"
_PROBE = [{"role": "user", "content": "Hello"}]


@dataclass(frozen=True)
class Detected:
    """What the template and tokenizer say: each parser's name (None: none found or none this server reads) and
    why, for the log."""

    reasoning_parser: str | None
    tool_call_parser: str | None
    reasoning_why: str
    tool_call_why: str


def _one_token(tok: Tokenizer, text: str) -> bool:
    ids = tok.encode(text)
    return len(ids) == 1 and tok.decode(ids, skip_special_tokens=False) == text


def switch_default(tok: Tokenizer, name: str) -> bool | None:
    """The default of the template's switch ``name`` (True / False), or None where it is no working switch (true
    and false render alike) or the template cannot render the probe conversation."""
    try:
        unset, on, off = (tok.apply_chat_template(_PROBE, True, extra=extra)
                          for extra in (None, {name: True}, {name: False}))
    except Exception:  # (a template that does not compile, or fails in its own code: no switch read, no start-up lost)
        return None
    if on == off:
        return None
    return True if unset == on else False if unset == off else None


def detect(tok: Tokenizer) -> Detected:
    """The parsers for ``tok``'s chat template and vocabulary (the module's rules)."""
    template = tok.chat_template if tok.has_own_chat_template else ""
    kimi_k2 = _one_token(tok, _KIMI_K2_CALLS)
    if "◁think▷" in template:
        reasoning = "kimi", "the template writes ◁think▷"
    elif kimi_k2:
        reasoning = "kimi_k2", f"{_KIMI_K2_CALLS} is one token"
    elif switch_default(tok, "enable_thinking") is True:
        reasoning = "qwen3", "the template's enable_thinking switch is on by default"
    elif switch_default(tok, "thinking") is False:
        reasoning = "deepseek-v3", "the template's thinking switch is off by default"
    elif "<think>" in template or "</think>" in template:
        reasoning = "deepseek-r1", "the template writes <think> / </think>"
    else:
        reasoning = None, ("the tokenizer has no chat template of its own" if not tok.has_own_chat_template else
                           "no thinking markers or switch in the chat template")
    if kimi_k2:
        tool = "kimi_k2", f"{_KIMI_K2_CALLS} is one token"
    elif _DEEPSEEK_CALLS in template:
        tool = None, (f"the template writes DeepSeek's tool calls ({_DEEPSEEK_CALLS}: SGLang's deepseekv3 / "
                      "deepseekv31 parsers), which this server does not read")
    else:
        tool = None, "no tool-call markup this server reads in the chat template or vocabulary"
    return Detected(reasoning[0], tool[0], reasoning[1], tool[1])


def resolve(tok: Tokenizer | None, reasoning_parser: str | None, tool_call_parser: str | None, source: str, *,
            strict_thinking: bool = False) -> tuple[str | None, str | None]:
    """``(reasoning_parser, tool_call_parser)`` with each ``auto`` replaced by what ``detect`` finds (logged, with
    why; ``source`` names the template's origin for the log); others as given. Raises ValueError where ``auto``
    has no tokenizer to read, and where ``strict_thinking`` (which needs a reasoning format) finds none."""
    asked = [name for name, value in (("reasoning_parser", reasoning_parser), ("tool_call_parser", tool_call_parser))
             if value == AUTO]
    if not asked:
        return reasoning_parser, tool_call_parser
    if tok is None:
        raise ValueError(f"{' and '.join(f'{a}={AUTO!r}' for a in asked)} reads the chat template, and there is "
                         "no tokenizer (name the parser, or drop skip_tokenizer_init)")
    found = detect(tok)
    out = {"reasoning_parser": reasoning_parser, "tool_call_parser": tool_call_parser}
    for name in asked:
        value, why = getattr(found, name), getattr(found, name.replace("_parser", "_why"))
        out[name] = value
        if value is None:
            logger.warning("%s=auto: none detected from %s (%s)", name, source, why)
        else:
            logger.info("%s=auto: %r detected from %s (%s)", name, value, source, why)
    if strict_thinking and reasoning_parser == AUTO and out["reasoning_parser"] is None:
        raise ValueError(f"strict thinking with reasoning_parser='auto': no reasoning format was found in {source} "
                         f"({found.reasoning_why}; name the parser)")
    return out["reasoning_parser"], out["tool_call_parser"]
