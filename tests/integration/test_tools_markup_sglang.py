"""Kimi-K2's forced tool calls, and strict tools under tool_choice auto, against SGLang 0.5.23's (ours: server/tools.py
ToolPlan.use_markup). Whatever our grammar lets a model write (random walks through its masks, a fresh seed, over a
byte-level tokenizer with Kimi's markers as special tokens) is accepted by the structural tag SGLang uses for the
same request (KimiK2Detector.get_structural_tag: xgrammar's builtin "kimi" tag, compiled here over a byte
vocabulary), and SGLang's kimi_k2 parser reads the same content and calls out of it as ours does."""

from __future__ import annotations

import json
import random

import pytest

from tests.test_auto_parsers import make_tokenizer

from .conftest import needs_sglang

pytestmark = needs_sglang

MARKERS = ("<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "<|tool_call_begin|>",
           "<|tool_call_argument_begin|>", "<|tool_call_end|>")
IM_END = "<|im_end|>"
# Strict tools: SGLang then holds the arguments to the schema, as ours always does. (For a non-strict tool it holds
# them to {"type": "object"} only, whose xgrammar grammar refuses raw control characters in a string that a schema's
# string grammar lets through, so ours would not be within SGLang's there.)
TOOLS = [
    {"type": "function", "function": {"name": "flag", "strict": True, "parameters": {
        "type": "object", "properties": {"on": {"type": "boolean"}}, "required": ["on"]}}},
    {"type": "function", "function": {"name": "count", "strict": True, "parameters": {
        "type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99},
                                         "tag": {"enum": ["a", "b c", "Δ"]}}, "required": ["n"],
        "additionalProperties": False}}},
    {"type": "function", "function": {"name": "web.search-v2", "strict": True, "parameters": {
        "type": "object", "properties": {"q": {"type": "string", "maxLength": 6}}, "required": ["q"],
        "additionalProperties": False}}},
]


def _walks_read_alike(tool_choice, sglang_choice, parallel: bool, walks: int, section: bool = False) -> tuple:
    """Random walks through our markup grammar for ``tool_choice`` (ToolPlan.use_markup over a byte tokenizer with
    Kimi's markers as special tokens; ``section``: the section's marker drawn first with probability 0.6 where
    allowed), each accepted byte by byte by SGLang's Kimi tag for ``sglang_choice`` and read by its kimi_k2 parser
    as ours reads it (content and calls). (seed, walks that finished, those with calls)."""
    import xgrammar as xgr
    from sglang.srt.entrypoints.openai.protocol import Tool
    from sglang.srt.function_call.function_call_parser import FunctionCallParser
    from sglang.srt.function_call.kimik2_detector import KimiK2Detector

    from sglang_eagle3.runtime.grammar import GrammarBackend, GrammarSpec
    from tests.server.grammar_walk import random_walk
    from tests.server.test_tools import plan_for

    tok = make_tokenizer(None, (*MARKERS, IM_END))
    stop, sb = tok.encode(IM_END)[0], tok.encode(MARKERS[0])[0]
    ours = GrammarBackend(tok, tok.vocab_size, [stop])
    plan = plan_for(TOOLS, tool_choice=tool_choice, parallel=parallel)
    spec = GrammarSpec("structural_tag", plan.use_markup(plan.markup_ids(tok)))
    sgl_tools = [Tool.model_validate(t) for t in TOOLS]
    tag = KimiK2Detector().get_structural_tag(tools=sgl_tools, tool_choice=sglang_choice, parallel_tool_calls=parallel)
    info = xgr.TokenizerInfo([bytes([i]) for i in range(256)] + [b""], xgr.VocabType.RAW, vocab_size=257,
                             stop_token_ids=[256])
    theirs = xgr.GrammarCompiler(info).compile_structural_tag(tag)
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    done = with_calls = 0
    for _ in range(walks):
        out = random_walk(ours, spec, stop, rng, 700, prefer=sb if section else None, p_prefer=0.6)
        if out is None:
            continue
        done += 1
        text = tok.decode(out, skip_special_tokens=False)
        m = xgr.GrammarMatcher(theirs)
        assert all(m.accept_token(b) for b in text.encode()) and m.accept_token(256) and m.is_terminated(), \
            (seed, text)
        msg, _ = plan.message(text, "stop")
        normal, calls = FunctionCallParser(tools=sgl_tools, tool_call_parser="kimi_k2").parse_non_stream(text)
        ours_calls = [(c["function"]["name"], json.loads(c["function"]["arguments"]))
                      for c in msg.get("tool_calls", [])]
        assert ours_calls == [(c.name, json.loads(c.parameters, strict=False)) for c in calls], (seed, text)
        assert (msg["content"] or "") == normal, (seed, text)
        with_calls += bool(ours_calls)
    return seed, done, with_calls


@pytest.mark.parametrize("choice", ["required", "count"])
@pytest.mark.parametrize("parallel", [True, False])
def test_forced_markup_is_within_sglangs_and_reads_the_same(choice, parallel):
    from sglang.srt.entrypoints.openai.protocol import ToolChoice

    named = {"type": "function", "function": {"name": choice}}
    ours, theirs = ("required", "required") if choice == "required" else (named, ToolChoice.model_validate(named))
    seed, done, with_calls = _walks_read_alike(ours, theirs, parallel, 15)
    assert done >= 3 and with_calls == done, seed  # (forced: every finished walk is calls)


@pytest.mark.parametrize("parallel", [True, False])
def test_auto_with_strict_tools_is_within_sglangs_and_reads_the_same(parallel):
    """tool_choice auto with strict tools: text, and calls where the section's marker is drawn."""
    seed, _, with_calls = _walks_read_alike("auto", "auto", parallel, 20, section=True)
    assert with_calls >= 2, seed
