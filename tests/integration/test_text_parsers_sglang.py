"""/separate_reasoning and /parse_function_call (server/reasoning.py separated, server/tools.py parsed_calls) against
SGLang 0.5.23's own parsers on random texts: ReasoningParser(model_type).parse_non_stream / parse_non_stream_blocks
for each reasoning format, FunctionCallParser(tools, "kimi_k2").parse_non_stream for Kimi-K2's calls. Texts are
drawn from words, whitespace and each format's markers in random order and number (several starts and ends, none,
a cut-off end), calls with known, unknown and counter-only ids and object / non-object arguments."""

from __future__ import annotations

import json
import random

import pytest

from sglang_eagle3.server.reasoning import REASONING_FORMATS, separated
from sglang_eagle3.server.tools import parsed_calls

from .conftest import needs_sglang

pytestmark = needs_sglang
WORDS = ["alpha", "beta", "gamma", "Δ", "x y", "{", "}", "\n", " ", "  \n"]


def reasoning_text(rng: random.Random, parser: str) -> str:
    """[a start marker] thinking [an end marker and the rest]: the thinking of words and whitespace (and Kimi-K2's
    tool section, which ends it too), the rest of anything, markers included; or words alone."""
    fmt = REASONING_FORMATS[parser]

    def words(extra=()):
        return "".join(rng.choice(WORDS + list(extra)) for _ in range(rng.randint(0, 5)))

    if rng.random() < 0.15:
        return words()
    start = fmt.start if rng.random() < 0.7 else ""
    ended = rng.random() < 0.7
    # (Kimi-K2's tool section inside a thinking that ends later: SGLang's reasoning runs to the end marker, ours to
    # the section, as the chat's: left out)
    body = words([fmt.tool_start] if fmt.tool_start and not ended else [])
    # (no start marker after the end where the text opened none: SGLang's takes the text as reasoning wherever one is)
    rest = fmt.end + words([fmt.start, fmt.end] if start else [fmt.end]) if ended else ""
    return start + body + rest


@pytest.mark.parametrize("parser", sorted(REASONING_FORMATS))
def test_separate_reasoning_is_sglangs(parser):
    """The same split as SGLang's, up to the whitespace ours takes off (the reasoning's at both ends, the text's right
    after the end marker; as our chat's split: server/reasoning.py), on texts that open the thinking first or never
    (SGLang's puts text before a start marker inside the reasoning, ours in the text)."""
    from sglang.srt.parser.reasoning_parser import ReasoningParser

    rng = random.Random()
    for _ in range(300):
        text = reasoning_text(rng, parser)
        reasoning, normal = ReasoningParser(model_type=parser).parse_non_stream(text)
        blocks = ReasoningParser(model_type=parser).parse_non_stream_blocks(text)
        ours = separated(text, parser, blocks=True)
        fmt = REASONING_FORMATS[parser]
        ended = fmt.end in text and (fmt.forced or fmt.start in text)
        want = ((reasoning or "").strip(), (normal or "").lstrip() if ended else normal or "")
        assert (ours["reasoning_text"], ours["text"]) == want, (parser, text, reasoning, normal)
        kinds = [b["type"] for b in blocks if b["type"] == "text" or b["text"].strip()]
        assert [b["type"] for b in ours["blocks"]] == kinds, (parser, text, blocks)


def kimi_text(rng: random.Random, names: list[str]) -> str:
    def call(i, last):
        name = rng.choice(names + ["unknown_fn"])
        ident = rng.choice([f"functions.{name}:{i}", f"{i}"])
        # (arguments cut short only in the last call: SGLang's pattern reads on to a later call's closing brace)
        args = rng.choice([json.dumps({"city": rng.choice(WORDS)}), json.dumps({"q": 1, "city": "x"}), "[1, 2]"]
                          + (['{"cut": '] if last else []))
        return f"<|tool_call_begin|>{ident}<|tool_call_argument_begin|>{args}<|tool_call_end|>"

    head = "".join(rng.choice(WORDS) for _ in range(rng.randint(0, 4)))
    if rng.random() < 0.2:
        return head
    n = rng.randint(1, 3)
    calls = "".join(call(i, i == n - 1) for i in range(n))
    return f"{head}<|tool_calls_section_begin|>{calls}<|tool_calls_section_end|>"


def test_parse_function_call_is_sglangs():
    """The same calls (name, arguments text, place) and text before them as SGLang's kimi_k2 parser, except the calls
    to a function not among the tools, which SGLang's keeps and ours leaves out (as our chat does)."""
    from sglang.srt.entrypoints.openai.protocol import Tool
    from sglang.srt.function_call.function_call_parser import FunctionCallParser

    rng = random.Random()
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
                 "type": "object", "properties": {"city": {"type": "string"}}}}},
             {"type": "function", "function": {"name": "search", "parameters": {
                 "type": "object", "properties": {"q": {"type": "integer"}}}}}]
    names = [t["function"]["name"] for t in tools]
    for _ in range(300):
        text = kimi_text(rng, names)
        normal, calls = FunctionCallParser(tools=[Tool.model_validate(t) for t in tools],
                                           tool_call_parser="kimi_k2").parse_non_stream(text)
        theirs = [(c.name, c.parameters) for c in calls
                  if c.name in names and isinstance(json.loads(c.parameters or "null"), dict)]
        ours = parsed_calls(text, tools, "kimi_k2")
        assert [(c["name"], c["parameters"]) for c in ours["calls"]] == theirs, text
        assert [c["tool_index"] for c in ours["calls"]] == list(range(len(theirs)))
        assert ours["normal_text"] == normal, text
