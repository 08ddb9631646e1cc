"""Reasoning apart from the answer on /v1/chat/completions (server/reasoning.py, --reasoning-parser).

Checked against: a reference split written here from the documented rules (a regular expression over the whole
text, not the parser's scan), hand-made texts whose parts the test knows, the non-streaming answer (a stream fed
the same text cut at random points must give the same parts, its content growing by extension only), and end to
end through the scripted tiny model of test_tools.py (its tokenizer holding <think> / </think> and Kimi's call
markup as special tokens): reasoning_content, content and tool calls, streamed and whole; separate_reasoning off;
stream_reasoning off; an output cut inside the reasoning; logprobs for every token; an unknown parser refused.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil

import pytest

from sglang_eagle3.server.reasoning import REASONING_FORMATS, ReasoningSplitter, ReasoningStream

from .test_tools import ADD, CE, MODEL, SB, SE, WEATHER, ask, call, scripted_app, write_marker_tokenizer

THINK, END = "<think>", "</think>"


def reference(fmt, text: str) -> tuple[str | None, str]:
    """The documented split, as one regular expression over the whole output."""
    start = re.escape(fmt.start)
    lead = rf"(?P<before>\s*)(?:{start})?" if fmt.forced else rf"(?P<before>.*?){start}"
    stops = [re.escape(fmt.end)] + ([re.escape(fmt.tool_start)] if fmt.tool_start else [])
    m = re.fullmatch(lead + rf"(?P<r>.*?)(?:(?P<stop>{'|'.join(stops)})(?P<after>.*))?", text, re.DOTALL)
    if m is None:
        return None, text
    before = "" if fmt.forced else m["before"]
    if m["stop"] is None:
        return m["r"].strip(), before
    if m["stop"] == fmt.end:
        return m["r"].strip(), before + m["after"].lstrip()
    return m["r"].strip(), before + m["stop"] + m["after"]


CASES = [  # (parser, text, reasoning, content): written from the rules
    ("kimi_k2", "<think> Let me see.\n</think>\n\nThe answer is 4.", "Let me see.", "The answer is 4."),
    ("kimi_k2", "No thinking here.", None, "No thinking here."),
    ("kimi_k2", "<think>call it" + SB + "x" + SE, "call it", SB + "x" + SE),
    ("kimi_k2", "<think>cut short", "cut short", ""),
    ("kimi_k2", "Hi <think>a</think>b</think>", "a", "Hi b</think>"),
    ("deepseek-r1", "plain thoughts</think>answer", "plain thoughts", "answer"),
    ("deepseek-r1", "\n<think>thoughts</think> answer <think>x", "thoughts", "answer <think>x"),
    ("deepseek-r1", "no end at all", "no end at all", ""),
    ("qwen3", "<think></think>\n\nfast", "", "fast"),
    ("kimi", "◁think▷hm◁/think▷ok", "hm", "ok"),
    ("kimi", "<think>not Kimi-VL's markers</think>", None, "<think>not Kimi-VL's markers</think>"),
]


@pytest.mark.parametrize("parser,text,reasoning,content", CASES)
def test_known_splits(parser, text, reasoning, content):
    fmt = REASONING_FORMATS[parser]
    assert ReasoningSplitter(fmt).split(text) == (reasoning, content)
    assert reference(fmt, text) == (reasoning, content)


def _random_text(rng: random.Random, fmt) -> str:
    pieces = [fmt.start, fmt.end, " ", "\n", "ok", "a b", "<", "</", "think", "◁", "x" * 5]
    if fmt.tool_start:
        pieces += [fmt.tool_start, fmt.tool_start[:7]]
    return "".join(rng.choice(pieces) for _ in range(rng.randint(0, 14)))


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("parser", sorted(REASONING_FORMATS))
def test_split_matches_the_reference_and_streams_the_same(parser, seed):
    fmt = REASONING_FORMATS[parser]
    rng = random.Random(hash((parser, seed)) & 0xFFFF)
    for _ in range(150):
        text = _random_text(rng, fmt)
        whole = ReasoningSplitter(fmt).split(text)
        assert whole == reference(fmt, text), text
        for stream_reasoning in (True, False):
            s = ReasoningStream(fmt, stream_reasoning)
            cuts = sorted(rng.sample(range(len(text) + 1), min(len(text) + 1, rng.randint(1, 6))))
            thoughts, last = [], ""
            for i, cut in enumerate(cuts + [len(text)]):
                finished = i == len(cuts)
                delta, content = s.feed(text[:cut], finished)
                thoughts.append(delta)
                assert content.startswith(last), (text, cut, last, content)  # content only grows at its end
                last = content
            assert "".join(thoughts) == (whole[0] or ""), (text, cuts)
            assert last == whole[1], (text, cuts)
            if not stream_reasoning:
                assert sum(1 for t in thoughts if t) <= 1, (text, thoughts)


def test_unknown_reasoning_parser_is_refused():
    from sglang_eagle3.launch_server import build_parser, server_config
    from sglang_eagle3.server.config import ServerConfig, ServerConfigError

    with pytest.raises(ServerConfigError, match="kimi_k2"):
        ServerConfig(reasoning_parser="deepseek-v9")
    args = build_parser().parse_args(["--reasoning-parser", "kimi_k2"])
    assert server_config(args).reasoning_parser == "kimi_k2"
    assert server_config(build_parser().parse_args([])).reasoning_parser is None


def chat_body(separate_reasoning: bool = True, chat_template_kwargs: dict | None = None):
    """A chat request's fields _reasoning_format reads (no reasoning_effort / reasoning: they set
    chat_template_kwargs' thinking, tests/server/test_reasoning_effort.py)."""
    from types import SimpleNamespace

    return SimpleNamespace(separate_reasoning=separate_reasoning, chat_template_kwargs=chat_template_kwargs,
                           reasoning_effort=None, reasoning=None)


# -- end to end: the scripted tiny model (test_tools.py) with <think> / </think> as special tokens ---------------

@pytest.fixture(scope="module")
def thinking(tiny_model, tmp_path_factory, torch_one_thread):
    yield from scripted_app(tiny_model, str(tmp_path_factory.mktemp("thinking_model")), (THINK, END),
                            tool_call_parser="kimi_k2", reasoning_parser="kimi_k2")


def _streamed(chunks: list[dict]) -> tuple[str, str, list[dict], str]:
    choices = [c["choices"][0] for c in chunks]
    reasoning = "".join(c["delta"].get("reasoning_content") or "" for c in choices)
    content = "".join(c["delta"].get("content") or "" for c in choices)
    calls = [tc for c in choices for tc in c["delta"].get("tool_calls", [])]
    return reasoning, content, calls, choices[-1]["finish_reason"]


THOUGHT = "The user wants the weather; I should call the tool."
SCRIPT = (THINK + THOUGHT + END + "\n\nLet me look. " + SB + call("functions.get_weather:0", '{"city": "Oslo"}')
          + SE)


@pytest.mark.parametrize("closed", [True, False])
def test_reasoning_then_content_and_calls(thinking, closed):
    """Reasoning, then content and a call; Kimi may open its call section straight from the reasoning (closed
    False): the section ends the reasoning."""
    script = SCRIPT if closed else THINK + THOUGHT + SB + call("functions.get_weather:0", '{"city": "Oslo"}') + SE
    room = len(thinking.tokenizer.encode(script)) + 2
    whole, chunks = ask(thinking, script, {"tools": [WEATHER, ADD], "max_tokens": room, "temperature": 0})
    assert thinking.seen and all(p.skip_special_tokens is False for p in thinking.seen)
    ch = whole["choices"][0]
    msg = ch["message"]
    assert msg["reasoning_content"] == THOUGHT and ch["finish_reason"] == "tool_calls", ch
    assert msg["content"] == ("Let me look. " if closed else None), msg
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in msg["tool_calls"]] == [
        ("get_weather", {"city": "Oslo"})]
    reasoning, content, calls, reason = _streamed(chunks)
    assert (reasoning, content, reason) == (THOUGHT, msg["content"] or "", "tool_calls")
    assert [c["function"] for c in calls] == [c["function"] for c in msg["tool_calls"]]
    # Reasoning deltas come before any content.
    kinds = [k for c in chunks for k in ("reasoning_content", "content")
             if c["choices"][0]["delta"].get(k)]
    assert kinds == sorted(kinds, key=lambda k: k == "content"), kinds


def test_without_tools_cut_short_and_buffered(thinking):
    script = THINK + " " + THOUGHT + " " + END + " Sunny."
    n = len(thinking.tokenizer.encode(script))
    whole, chunks = ask(thinking, script, {"max_tokens": n + 2, "temperature": 0})
    msg = whole["choices"][0]["message"]
    assert (msg["reasoning_content"], msg["content"]) == (THOUGHT, "Sunny."), msg
    assert _streamed(chunks)[:2] == (THOUGHT, "Sunny.")
    # Cut inside the reasoning: all of it is reasoning, no content.
    cut = len(thinking.tokenizer.encode(THINK + " " + THOUGHT[:20]))
    whole, chunks = ask(thinking, script, {"max_tokens": cut, "temperature": 0})
    ch = whole["choices"][0]
    assert ch["finish_reason"] == "length" and ch["message"]["content"] == "", ch
    assert THOUGHT.startswith(ch["message"]["reasoning_content"]) and ch["message"]["reasoning_content"], ch
    assert _streamed(chunks)[:2] == (ch["message"]["reasoning_content"], "")
    # stream_reasoning false: the reasoning in one delta.
    whole, chunks = ask(thinking, script, {"max_tokens": n + 2, "temperature": 0, "stream_reasoning": False})
    deltas = [c["choices"][0]["delta"]["reasoning_content"] for c in chunks
              if c["choices"][0]["delta"].get("reasoning_content")]
    assert deltas == [THOUGHT]


def test_separate_reasoning_off_and_logprobs(thinking):
    script = THINK + THOUGHT + END + "Sunny."
    n = len(thinking.tokenizer.encode(script))
    whole, chunks = ask(thinking, script, {"max_tokens": n + 2, "temperature": 0, "separate_reasoning": False})
    msg = whole["choices"][0]["message"]
    plain = thinking.tokenizer.decode(thinking.tokenizer.encode(script))  # (the markers are special: skipped)
    assert msg == {"role": "assistant", "content": plain}
    assert all(p.skip_special_tokens is True for p in thinking.seen)
    # logprobs: one entry for every output token, streamed or not, the reasoning's included.
    whole, chunks = ask(thinking, script, {"max_tokens": n + 2, "temperature": 0, "logprobs": True,
                                           "top_logprobs": 2})
    ch = whole["choices"][0]
    assert ch["message"]["reasoning_content"] == THOUGHT and ch["message"]["content"] == "Sunny."
    tokens = [t["token"] for t in ch["logprobs"]["content"]]
    assert len(tokens) == whole["usage"]["completion_tokens"] == n
    streamed = [t["token"] for c in chunks for t in ((c["choices"][0].get("logprobs") or {}).get("content") or [])]
    assert streamed == tokens
    # The reasoning's tokens come with the reasoning's chunks, as its text does (not held for the content).
    during = [t for c in chunks if c["choices"][0]["delta"].get("reasoning_content")
              for t in (c["choices"][0].get("logprobs") or {}).get("content") or []]
    assert during and len(during) < n, during


def test_config_reaches_a_live_app(thinking):
    """A request against the server's model name with a parser set: the answer carries reasoning_content (null
    where the output has none)."""
    whole, _ = ask(thinking, "Just text.", {"max_tokens": 20, "temperature": 0, "model": MODEL})
    assert whole["choices"][0]["message"] == {"role": "assistant", "content": "Just text.",
                                              "reasoning_content": None}
    assert CE not in whole["choices"][0]["message"]["content"]


@pytest.mark.parametrize("parser", sorted(REASONING_FORMATS))
def test_a_grammar_leaves_forced_formats_whole(parser):
    """response_format / a forced tool call shape the output from its first token (unless the engine's grammars
    wait for the thinking): a format that starts inside the reasoning (deepseek-r1) would take the whole JSON for
    reasoning, so such a request is not split; the others split as usual (a grammar's output without markers is all
    content)."""
    from types import SimpleNamespace

    from sglang_eagle3.server.openai_api import _reasoning_format

    serving = SimpleNamespace(config=SimpleNamespace(reasoning_parser=parser), tokenizer=None, engine=None)
    body = chat_body(True, None)
    fmt = REASONING_FORMATS[parser]
    assert _reasoning_format(body, serving, {"temperature": 0}) is fmt
    for kind in ("json_schema", "regex", "ebnf"):
        assert _reasoning_format(body, serving, {kind: "x"}) is (None if fmt.forced else fmt)
    # An engine whose grammars wait for the thinking (EngineArgs.reasoning_parser): split as usual.
    serving.engine = SimpleNamespace(args=SimpleNamespace(reasoning_parser=parser))
    assert _reasoning_format(body, serving, {"regex": "x"}) is fmt
    assert _reasoning_format(chat_body(False, None), serving, {}) is None


def test_a_template_switch_opens_the_reasoning():
    """deepseek-v3: chat_template_kwargs thinking true makes the template open the reasoning, so the output starts
    inside it (as deepseek-r1's); without it, reasoning only where the model opens it (as qwen3's)."""
    from types import SimpleNamespace

    from sglang_eagle3.server.openai_api import _reasoning_format

    serving = SimpleNamespace(config=SimpleNamespace(reasoning_parser="deepseek-v3"), tokenizer=None, engine=None)
    text = "weighing it</think>\n42"
    for kwargs, want in ((None, (None, text)), ({"thinking": False}, (None, text)),
                         ({"thinking": True}, ("weighing it", "42"))):
        fmt = _reasoning_format(chat_body(True, kwargs), serving, {})
        assert ReasoningSplitter(fmt).split(text) == want, kwargs
        assert reference(fmt, text) == want
    # With a grammar on an engine whose grammars do not wait for the thinking, the output is held to it from its
    # first token: the answer is content.
    on = chat_body(True, {"thinking": True})
    fmt = _reasoning_format(on, serving, {"json_schema": "{}"})
    assert ReasoningSplitter(fmt).split('{"a": 1}') == (None, '{"a": 1}')
    # Where they wait (EngineArgs.reasoning_parser, the launch flag): the matcher starts inside the thinking the
    # template opened (runtime/grammar.py), so the output is thoughts</think>JSON and splits so.
    waiting = SimpleNamespace(config=serving.config, tokenizer=None,
                              engine=SimpleNamespace(args=SimpleNamespace(reasoning_parser="deepseek-v3")))
    fmt = _reasoning_format(on, waiting, {"json_schema": "{}"})
    assert ReasoningSplitter(fmt).split('weighing it</think>{"a": 1}') == ("weighing it", '{"a": 1}')


# -- structured output that waits for the thinking (EngineArgs.reasoning_parser) -----------------------------

@pytest.fixture(scope="module")
def thinking_model(tiny_model, tmp_path_factory):
    """The tiny pair with <think> / </think> (and Kimi's call markup) as special tokens of its tokenizer."""
    target = str(tmp_path_factory.mktemp("thinking_target"))
    for f in os.listdir(tiny_model.target):
        if f != "tokenizer.json":
            shutil.copy(os.path.join(tiny_model.target, f), target)
    write_marker_tokenizer(target, tiny_model.vocab_size, (THINK, END))
    return target, tiny_model.draft


@pytest.mark.parametrize("parser", ["kimi_k2", "deepseek-r1"])
def test_the_grammar_waits_for_the_thinking(thinking_model, torch_one_thread, parser):
    """EngineArgs.reasoning_parser (runtime/reasoning.py ThinkingMatcher): the output (thinking pushed by
    logit_bias, then the answer) is the grammar's after the thinking, EAGLE-3's equal to plain decoding's; without
    the parser the same request's output is the grammar's from its first token, the markers never in it."""
    pytest.importorskip("xgrammar")
    import regex

    from sglang_eagle3 import Engine
    from sglang_eagle3.runtime.reasoning import REASONING_FORMATS as FORMATS

    target, draft = thinking_model
    pattern = r"(yes|no)! [a-z]+\."

    def run(**kw):
        eng = Engine(model_path=target, device="cpu", log_level="warning", **kw)
        [think_id], [end_id] = eng.tokenizer.encode(THINK), eng.tokenizer.encode(END)
        # Thinking pushed (the start where it is allowed, the end above it once inside), then the answer.
        sp = {"regex": pattern, "temperature": 0, "max_new_tokens": 24, "skip_special_tokens": False,
              "logit_bias": {think_id: 40.0, end_id: 60.0}}
        out = eng.generate(["Pack my box", "Five quacking zephyrs"], [sp, dict(sp, temperature=0.9, seed=4)])
        eng.shutdown()
        return [o["text"] for o in out], [o["output_ids"] for o in out]

    plain_text, plain_ids = run(reasoning_parser=parser)
    spec_text, spec_ids = run(reasoning_parser=parser, speculative_algorithm="EAGLE3",
                              speculative_draft_model_path=draft, speculative_num_steps=3)
    assert spec_ids == plain_ids
    forced = FORMATS[parser].forced
    for text in plain_text:
        head = END if forced else THINK + END
        assert text.startswith(head), text
        assert regex.fullmatch(pattern, text[len(head):], partial=True), text
    strict_text, _ = run()  # no parser: the grammar from the first token, the markers never allowed
    for text in strict_text:
        assert THINK not in text and END not in text and regex.fullmatch(pattern, text, partial=True), text
