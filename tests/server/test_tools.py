"""OpenAI function calling on /v1/chat/completions (server/tools.py): tools, tool_choice, parallel_tool_calls.

Checked against what the tests build or know independently: Kimi-K2 texts written here from its documented markup
(the calls put in are the calls expected out), ``json.loads``, a JSON-schema check written here, OpenAI's response
shape, the non-streaming answer (streams must give the same), and the chat template's own rendering.

- The kimi_k2 parser, unit level (no model): content, calls, ids, finish_reason; a streamed output (ToolStream fed
  the same text cut at random points, inside markers too) equals the whole one.
- Forced calls (tool_choice "required" / a named function) through a live tiny server (random EAGLE-3 pair, no eos,
  a chat template that lists the tools by name: the default one writes their JSON, which leaves the 256-token
  context no room): every finished output is calls of allowed tools whose arguments satisfy their schemas.
- tool_choice "auto" end to end in-process: the tiny model cannot write Kimi's markup by itself, so its output is
  scripted: a tokenizer with Kimi's markers as special tokens, and a scripted "grammar" matcher (the scheduler's
  real masking path, speculation on) that allows exactly the script's next token.
- Errors: 400s naming the field, never 500; ServerConfig refuses an unknown parser.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import shutil

import httpx
import pytest
import regex

from sglang_eagle3.server.protocol import ChatCompletionRequest
from sglang_eagle3.server.tools import ToolPlan
from sglang_eagle3.tokenizer import DEFAULT_CHAT_TEMPLATE, Tokenizer, load_tokenizer

from .conftest import _CORPUS, running_server

MODEL = "tiny"
CHAT = [{"role": "user", "content": "Pack my box"}]

# Kimi-K2's markup, spelled out here (its tokenizer's special tokens).
SB, SE = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
CB, AB, CE = "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"
MARKERS = (SB, SE, CB, AB, CE)
IM_END = "<|im_end|>"  # Kimi's end of a turn (its eos)

# A chat template that hands the model the tools by name only (the tiny model's context is 256 tokens).
NAMES_TEMPLATE = ("{% if tools %}<|tools|>{% for t in tools %} {{ t['function']['name'] }}{% endfor %}\n{% endif %}"
                  "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
                  "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")


def fn(name: str, parameters: dict | None = None, **more) -> dict:
    f = {"name": name, **more}
    if parameters is not None:
        f["parameters"] = parameters
    return {"type": "function", "function": f}


def obj(props: dict, required: list[str] | None = None) -> dict:
    return {"type": "object", "properties": props, "required": list(props) if required is None else required,
            "additionalProperties": False}


PICK = fn("pick", obj({"color": {"enum": ["red", "green", "blue"]}, "ok": {"type": "boolean"}}))
COUNT = fn("count", obj({"n": {"type": "integer", "minimum": 0, "maximum": 9},
                         "tag": {"type": "string", "maxLength": 3}}))
FLAG = fn("flag", obj({"on": {"type": "boolean"}}))
PING = fn("ping")  # no parameters: {} (OpenAI's default, an object without properties)
FORCED_TOOLS = [PICK, COUNT, FLAG, PING]


def schema_errors(value, schema: dict, at: str = "$") -> list[str]:
    """What ``value`` breaks of the few JSON-schema keywords the tests use (checked by hand, not by our code)."""
    if "enum" in schema:
        return [] if value in schema["enum"] else [f"{at}={value!r} not in {schema['enum']}"]
    kind = schema.get("type")
    if kind == "boolean":
        return [] if isinstance(value, bool) else [f"{at}={value!r} is not a boolean"]
    if kind == "integer":
        if not isinstance(value, int) or isinstance(value, bool):
            return [f"{at}={value!r} is not an integer"]
        lo, hi = schema.get("minimum", value), schema.get("maximum", value)
        return [] if lo <= value <= hi else [f"{at}={value} outside [{lo}, {hi}]"]
    if kind == "string":
        if not isinstance(value, str):
            return [f"{at}={value!r} is not a string"]
        return [] if len(value) <= schema.get("maxLength", len(value)) else [f"{at}={value!r} too long"]
    if kind == "object":
        if not isinstance(value, dict):
            return [f"{at}={value!r} is not an object"]
        props = schema.get("properties", {})
        errs = [f"{at}.{k} missing" for k in schema.get("required", []) if k not in value]
        # (additionalProperties false, or an object schema without properties: {} only)
        errs += [f"{at}.{k} not allowed" for k in value if k not in props]
        for k, v in value.items():
            if k in props:
                errs += schema_errors(v, props[k], f"{at}.{k}")
        return errs
    raise AssertionError(f"schema keyword not handled here: {schema}")


def params_of(tool: dict) -> dict:
    return tool["function"].get("parameters", {"type": "object", "properties": {}})


# -- the kimi_k2 parser, unit level ----------------------------------------------------------------------------------

def plan_for(tools: list[dict], messages: list[dict] | None = None, tool_choice=None, parser="kimi_k2",
             parallel=None) -> ToolPlan:
    messages = messages or CHAT
    body = ChatCompletionRequest.model_validate({"model": MODEL, "messages": messages, "tools": tools,
                                                 "tool_choice": tool_choice, "parallel_tool_calls": parallel})
    return ToolPlan.of(body, parser, messages)


def call(call_id: str, args: str, ws: str = "", end: bool = True) -> str:
    """One call in Kimi's markup (``ws`` between every two markers; ``end`` False: cut short, no end marker)."""
    return f"{CB}{ws}{call_id}{ws}{AB}{ws}{args}{ws}{CE if end else ''}"


WEATHER = fn("get_weather", obj({"city": {"type": "string"}}))
ADD = fn("add", obj({"a": {"type": "integer"}, "b": {"type": "integer"}}))
SEARCH = fn("web.search-v2", obj({"q": {"type": "string"}}))  # a name with '.' and '-'
KIMI_TOOLS = [WEATHER, ADD, SEARCH]


def check_message(plan: ToolPlan, text: str, reason: str, content, calls: list[tuple[str, dict]], first: int = 0):
    """plan.message against what the text was built from: OpenAI's message shape, arguments that parse to the
    objects written in, Kimi's ids counting from ``first``, finish_reason tool_calls only for a stopped output."""
    msg, got_reason = plan.message(text, reason)
    assert msg["role"] == "assistant"
    if not calls:
        assert "tool_calls" not in msg and msg["content"] == content and got_reason == reason, msg
        return msg
    assert msg["content"] == (content or None), msg
    assert got_reason == ("tool_calls" if reason == "stop" else reason)
    got = msg["tool_calls"]
    assert [set(c) for c in got] == [{"id", "type", "function"}] * len(calls), got
    assert [c["type"] for c in got] == ["function"] * len(calls)
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in got] == calls
    assert [c["id"] for c in got] == [f"functions.{name}:{first + i}" for i, (name, _) in enumerate(calls)]
    return msg


def test_kimi_content_then_calls():
    plan = plan_for(KIMI_TOOLS)
    text = ("Let me check the weather first. " + SB + call("functions.get_weather:0", '{"city": "Paris"}')
            + call("functions.add:1", '{"a": 1, "b": 2}') + SE)
    calls = [("get_weather", {"city": "Paris"}), ("add", {"a": 1, "b": 2})]
    check_message(plan, text, "stop", "Let me check the weather first. ", calls)
    # Complete calls of an output cut by max_tokens are calls; the reason stays "length".
    check_message(plan, text, "length", "Let me check the weather first. ", calls)
    # (the calls as OpenAI's message carries them: the arguments are the model's JSON text)
    msg, _ = plan.message(text, "stop")
    assert msg["tool_calls"][1]["function"]["arguments"] == '{"a": 1, "b": 2}'


def test_kimi_bare_ids_whitespace_and_dotted_names():
    plan = plan_for(KIMI_TOOLS)
    text = (SB + "\n" + call("get_weather:0", '{"city": "Oslo"}', ws="\n ") + "\n\n"
            + call("functions.web.search-v2:1", '{"q": "x"}', ws=" ") + "\n" + call("add:2", '{"a": 3, "b": 4}')
            + "\n" + SE)
    check_message(plan, text, "stop", "", [("get_weather", {"city": "Oslo"}), ("web.search-v2", {"q": "x"}),
                                           ("add", {"a": 3, "b": 4})])
    # A call without a section (a bare call marker) is read too; the text before it is the content.
    check_message(plan, "Hm." + call("functions.add:0", '{"a": 0, "b": 0}'), "stop", "Hm.",
                  [("add", {"a": 0, "b": 0})])


def test_kimi_unknown_function_and_bad_id_are_dropped():
    plan = plan_for(KIMI_TOOLS)
    text = ("ok" + SB + call("functions.nope:0", '{"a": 1}') + call("functions.add:1", '{"a": 1, "b": 1}')
            + call("functions.add", '{"a": 2, "b": 2}')  # no index: not a Kimi id
            + call("functions.get_weather:3", '{"city": "Rome"}') + SE)
    check_message(plan, text, "stop", "ok", [("add", {"a": 1, "b": 1}), ("get_weather", {"city": "Rome"})])
    # Only unknown calls: no tool_calls, the reason stays; the content is still the text before the section.
    msg, reason = plan.message("ok" + SB + call("functions.nope:0", "{}") + SE, "stop")
    assert msg == {"role": "assistant", "content": "ok"} and reason == "stop"


def test_kimi_call_cut_short_is_dropped():
    plan = plan_for(KIMI_TOOLS)
    good = call("functions.add:1", '{"a": 5, "b": 6}')
    # At the end (max_tokens): the complete calls before it stay.
    text = "x" + SB + good + call("functions.get_weather:2", '{"city": "Li', end=False)
    check_message(plan, text, "length", "x", [("add", {"a": 5, "b": 6})])
    # In the middle: the next call is its own call, not the cut one's arguments.
    text = SB + call("functions.get_weather:0", '{"city": "Li', end=False) + good + SE
    check_message(plan, text, "stop", "", [("add", {"a": 5, "b": 6})])
    # Cut short by the section's end, with a complete call after a new section.
    text = SB + call("functions.get_weather:0", '{"city"', end=False) + SE + SB + good + SE
    check_message(plan, text, "stop", "", [("add", {"a": 5, "b": 6})])
    # Cut inside the markers themselves.
    for cut in (SB + CB + "functions.ad", SB + CB + "functions.add:0" + AB[:9], SB + good[:-3]):
        check_message(plan, "y" + cut, "length", "y", [])


def test_kimi_arguments_with_braces_strings_and_marker_like_text():
    plan = plan_for(KIMI_TOOLS)
    tricky = {"q": 'a}b{c"}', "nested": {"x": [1, {"y": "}}]"}], "z": {}}, "m": "<|tool_call", "n": "<|im_end|>",
              "s": "functions.add:7 <|tool_calls_section", "t": "|> :0 {", "u": "ünï\u00e7ødé \n\t"}
    args = json.dumps(tricky, ensure_ascii=False)
    text = "Q: {x}? " + SB + call("functions.web.search-v2:0", args, ws="\n") + SE
    check_message(plan, text, "stop", "Q: {x}? ", [("web.search-v2", tricky)])
    # Pretty-printed (multi-line) arguments too.
    text = SB + call("functions.web.search-v2:0", json.dumps(tricky, indent=2)) + SE
    check_message(plan, text, "stop", "", [("web.search-v2", tricky)])


def test_kimi_ids_count_the_conversations_earlier_calls():
    def tc(name, i):
        return {"id": f"functions.{name}:{i}", "type": "function",
                "function": {"name": name, "arguments": "{}"}}

    messages = [{"role": "user", "content": "go"},
                {"role": "assistant", "content": None, "tool_calls": [tc("add", 0), tc("get_weather", 1)]},
                {"role": "tool", "tool_call_id": "functions.add:0", "content": "3"},
                {"role": "tool", "tool_call_id": "functions.get_weather:1", "content": "sunny"},
                {"role": "assistant", "content": "one more", "tool_calls": [tc("add", 2)]},
                {"role": "tool", "tool_call_id": "functions.add:2", "content": "4"},
                {"role": "user", "content": "and now?"},
                # a user message's "tool_calls" is not a call; nor is an assistant's that is not a list
                {"role": "user", "content": "x", "tool_calls": [tc("add", 9)]},
                {"role": "assistant", "content": "y", "tool_calls": 5}]
    plan = plan_for(KIMI_TOOLS, messages)
    text = SB + call("functions.add:3", '{"a": 1, "b": 2}') + call("functions.add:4", '{"a": 2, "b": 3}') + SE
    check_message(plan, text, "stop", "", [("add", {"a": 1, "b": 2}), ("add", {"a": 2, "b": 3})], first=3)


def test_kimi_text_without_calls_and_after_the_section():
    plan = plan_for(KIMI_TOOLS)
    for text in ("Plain answer.", "", "a <|tool b", "ends with <|tool_call", "x" + CE + SE + "y"):
        check_message(plan, text, "stop", text, [])
    # Text after the section is not content (as SGLang's and vLLM's kimi_k2 parsers read it; streamed the same).
    check_message(plan, "a" + SB + call("add:0", '{"a": 1, "b": 1}') + SE + "tail", "stop", "a",
                  [("add", {"a": 1, "b": 1})])


def test_forced_output_is_read_as_json():
    plan = plan_for(FORCED_TOOLS, tool_choice="required", parser=None)
    args = {"n": 3, "tag": "a\x18b"}  # a raw control character in a string (xgrammar lets a model write one)
    text = '[{"name": "count", "parameters": {"n": 3, "tag": "a\x18b"}}, {"name": "ping", "parameters": {}}]'
    msg, reason = plan.message(text, "stop")
    assert reason == "tool_calls" and msg["content"] is None, msg
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in msg["tool_calls"]] == \
        [("count", args), ("ping", {})]
    ids = [c["id"] for c in msg["tool_calls"]]
    assert all(re.fullmatch(r"call_[0-9a-f]{24}", i) for i in ids) and len(set(ids)) == 2, ids
    cut = text[:40]  # max_tokens: no calls, the raw text, the reason kept
    assert plan.message(cut, "length") == ({"role": "assistant", "content": cut}, "length")


# -- streaming == non-streaming (ToolStream) --------------------------------------------------------------------

_CONTENT_BITS = ["Sure", " ", "\n", "<", "<|", "<|tool", "<|tool_call", "<|tool_calls_sec", "|>", "{", "}", "[",
                 "functions.add:0", ":", "é", "好", "\U0001f600", "ok."]
_STRINGS = ["}", "{", "}}", '"', "<|tool_call", "<|tool_calls_section", "|>", "functions.x:1", "a b", "", "ü"]


def _random_value(rng: random.Random, depth: int = 0):
    kind = rng.randrange(6 if depth < 2 else 3)
    if kind == 0:
        return rng.randrange(-5, 100)
    if kind == 1:
        return "".join(rng.choice(_STRINGS) for _ in range(rng.randrange(4)))
    if kind == 2:
        return rng.choice([True, False, None])
    if kind == 3:
        return [_random_value(rng, depth + 1) for _ in range(rng.randrange(3))]
    return {f"k{i}": _random_value(rng, depth + 1) for i in range(rng.randrange(3))}


def random_output(rng: random.Random, names: list[str]) -> tuple[str, str, list[tuple[str, dict]]]:
    """(a model's text in Kimi's markup, its content, its calls of known functions in order)."""
    while True:
        content = "".join(rng.choice(_CONTENT_BITS) for _ in range(rng.randrange(6)))
        if not any(m in content for m in MARKERS):  # (bits put together may not make a marker)
            break
    if rng.random() < 0.2:
        return content, content, []
    ws = lambda: rng.choice(["", "", " ", "\n", "\n  "])  # noqa: E731
    section = rng.random() < 0.85  # else the calls start with a bare call marker: at least one
    text, calls = content + (SB if section else ""), []
    for i in range(rng.randrange(0 if section else 1, 4)):
        name = rng.choice(names + ["nope"])
        args = {f"p{j}": _random_value(rng) for j in range(rng.randrange(3))}
        cid = f"functions.{name}:{i}" if rng.random() < 0.7 else f"{name}:{i}"
        cut = rng.random() < 0.15
        lead = ws() if section or i else ""  # (whitespace before the first marker would be content)
        text += lead + call(cid, json.dumps(args, ensure_ascii=False, indent=rng.choice([None, 1])), ws(), end=not cut)
        if name != "nope" and not cut:
            calls.append((name, args))
    if rng.random() < 0.7:
        text += ws() + SE + rng.choice(["", "", "trailing text", " <|tool"])
    return text, content, calls


def stream_through(plan: ToolPlan, text: str, cuts: list[int], repeat: bool = False):
    """ToolStream fed the cumulative text at each cut (then the whole, finished): (content after each feed,
    tool_call deltas in order)."""
    s = plan.streamer()
    sent, so_far, deltas = "", [], []
    feeds = [text[:c] for c in sorted(cuts)] + [text]
    for i, part in enumerate(feeds):
        for _ in range(2 if repeat else 1):  # an update without new text (the driver may send one)
            for d in s.feed(part, i == len(feeds) - 1):
                assert set(d) in ({"content"}, {"tool_calls"}), d
                if "content" in d:
                    assert d["content"], "an empty content delta"
                    sent += d["content"]
                else:
                    deltas += d["tool_calls"]
            so_far.append(sent)
    return so_far, deltas, s


@pytest.mark.parametrize("seed", range(6))
def test_stream_equals_whole_output(seed):
    rng = random.Random(seed)
    plan = plan_for(KIMI_TOOLS, tool_choice="auto")
    names = [t["function"]["name"] for t in KIMI_TOOLS]
    for _ in range(60):
        text, content, calls = random_output(rng, names)
        msg, reason = plan.message(text, "stop")
        assert (msg["content"] or "") == content, (text, msg)
        assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in msg.get("tool_calls", [])] \
            == calls, text
        whole = [{"index": i, **c} for i, c in enumerate(msg.get("tool_calls", []))]
        splits = [rng.sample(range(len(text) + 1), k=min(len(text) + 1, rng.randrange(1, 12))) for _ in range(4)]
        splits += [list(range(len(text) + 1))]  # every character its own update
        for cuts in splits:
            so_far, deltas, s = stream_through(plan, text, cuts, repeat=rng.random() < 0.3)
            for sent in so_far:  # nothing is sent that is not content (no marker, no part of one)
                assert content.startswith(sent), (text, cuts, sent)
            assert so_far[-1] == content, (text, cuts)
            assert deltas == whole, (text, cuts)  # each call once, in order, as the whole output has it
            assert s.finish_reason("stop") == reason and s.finish_reason("length") == "length"


def test_stream_sends_each_call_as_soon_as_it_is_complete():
    plan = plan_for(KIMI_TOOLS)
    first = "Hi" + SB + call("functions.add:0", '{"a": 1, "b": 2}')
    text = first + call("functions.get_weather:1", '{"city": "Nice"}') + SE
    s = plan.streamer()
    assert s.feed(first[:-1], False) == [{"content": "Hi"}]
    out = s.feed(first, False)
    assert [d["tool_calls"][0]["function"]["name"] for d in out] == ["add"], out
    out = s.feed(text, True)
    assert [(c["index"], c["function"]["name"]) for d in out for c in d["tool_calls"]] == [(1, "get_weather")]


# -- the chat template receives tools ---------------------------------------------------------------------------

def test_chat_template_receives_tools(tiny_model):
    tok = load_tokenizer(tiny_model.target)
    assert tok.chat_template == DEFAULT_CHAT_TEMPLATE  # (the tiny model has none of its own)
    tools = [fn("say", obj({"text": {"type": "string", "description": "<b>bold</b> & 'quoted'"}})), PING]
    text = tok.apply_chat_template(CHAT, True, tools)
    lines = text.split("\n")
    assert lines[0] == "<|tools|>" and json.loads(lines[1]) == tools, text
    assert "\n".join(lines[2:]) == tok.apply_chat_template(CHAT, True)  # the rest as without tools
    assert "<|tools|>" not in tok.apply_chat_template(CHAT, True) and "<|tools|>" not in \
        tok.apply_chat_template(CHAT, True, None)
    assert tok.encode_chat(CHAT, True, tools) == tok.encode(text)
    own = Tokenizer(lambda t, s: [], lambda ids, s: "", 1, None, None,
                    "{% if tools is none %}none{% else %}{{ tools | length }}:{% for t in tools %}"
                    "{{ t['function']['name'] }}({{ t['function']['parameters']['required'] | join(',') }});"
                    "{% endfor %}{% endif %}")
    assert own.apply_chat_template(CHAT, True, [WEATHER, ADD]) == "2:get_weather(city);add(a,b);"
    assert own.apply_chat_template(CHAT, True) == "none"


# -- forced calls through a live server -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tool_server(tiny_model, tmp_path_factory):
    d = tmp_path_factory.mktemp("tool_server")
    template = d / "names.jinja"
    template.write_text(NAMES_TEMPLATE)
    with running_server(tiny_model, str(d), "--served-model-name", MODEL, "--max-running-requests", "16",
                        "--chat-template", str(template), "--tool-call-parser", "kimi_k2") as srv:
        yield srv


def _post(url: str, body: dict) -> httpx.Response:
    return httpx.post(url + "/v1/chat/completions", json={"model": MODEL, "messages": CHAT, **body}, timeout=60)


def _ok(url: str, body: dict) -> dict:
    r = _post(url, body)
    assert r.status_code == 200, r.text
    return r.json()


async def _post_all(url: str, bodies: list[dict]) -> list[dict]:
    async with httpx.AsyncClient(base_url=url, timeout=60) as c:
        rs = await asyncio.gather(*(c.post("/v1/chat/completions", json={"model": MODEL, "messages": CHAT, **b})
                                    for b in bodies))
    for r in rs:
        assert r.status_code == 200, r.text
    return [r.json() for r in rs]


def _stream(url: str, body: dict) -> list[dict]:
    with httpx.stream("POST", url + "/v1/chat/completions",
                      json={"model": MODEL, "messages": CHAT, **body, "stream": True}, timeout=60) as r:
        assert r.status_code == 200, r.read()
        events = [line[len("data: "):] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def _array_pattern(tools: list[dict]) -> str:
    """A regular expression for JSON arrays of {"name", "parameters"} objects of ``tools`` (written from the
    schemas here, any JSON whitespace): a forced output cut by max_tokens is a prefix of one."""
    ws = r"[ \t\n\r]*"
    values = {"boolean": "(true|false)", "integer": r"-?(0|[1-9][0-9]*)", "string": r'"([^"\\]|\\.)*"'}

    def value(s: dict) -> str:
        return "(" + "|".join(re.escape(json.dumps(v)) for v in s["enum"]) + ")" if "enum" in s else values[s["type"]]

    def members(props: dict) -> str:
        return f",{ws}".join(f'"{k}"{ws}:{ws}{value(s)}' for k, s in props.items())

    objs = [rf'\{{{ws}"name"{ws}:{ws}"{t["function"]["name"]}"{ws},{ws}"parameters"{ws}:{ws}\{{{ws}'
            rf'{members(params_of(t)["properties"])}{ws}\}}{ws}\}}' for t in tools]
    one = "(" + "|".join(objs) + ")"
    return rf"{ws}\[{ws}{one}({ws},{ws}{one})*{ws}\]{ws}"


def check_forced(res: dict, body: dict, allowed: list[dict], parser_ids: bool = True) -> list[str]:
    """Every choice of a forced request: calls of allowed tools whose arguments satisfy their schemas when it
    stopped; the raw (cut) text, no calls, when it ran out of tokens. Returns the finish reasons."""
    by_name = {t["function"]["name"]: t for t in allowed}
    reasons = []
    for ch in res["choices"]:
        msg, reason = ch["message"], ch["finish_reason"]
        reasons.append(reason)
        assert msg["role"] == "assistant"
        if reason == "tool_calls":
            assert msg["content"] is None and ch["matched_stop"] is None, ch
            calls = msg["tool_calls"]
            assert calls and (body.get("parallel_tool_calls", True) or len(calls) == 1), ch  # maxItems 1
            for i, c in enumerate(calls):
                assert set(c) == {"id", "type", "function"} and c["type"] == "function", c
                assert set(c["function"]) == {"name", "arguments"}, c
                name = c["function"]["name"]
                assert name in by_name, (name, list(by_name))
                args = json.loads(c["function"]["arguments"])
                assert not schema_errors(args, params_of(by_name[name])), (args, schema_errors(args, params_of(
                    by_name[name])))
                if parser_ids:  # the server's parser is kimi_k2: Kimi's ids, counting from the conversation's 0
                    assert c["id"] == f"functions.{name}:{i}", c
                else:
                    assert re.fullmatch(r"call_[0-9a-f]{24}", c["id"]), c
            assert len({c["id"] for c in calls}) == len(calls)
        else:
            assert reason == "length", ch
            assert "tool_calls" not in msg and isinstance(msg["content"], str), ch
            if len(res["choices"]) == 1:
                assert res["usage"]["completion_tokens"] == body["max_tokens"], res
            text = msg["content"]
            assert regex.fullmatch(_array_pattern(allowed), text, partial=True), text
            assert not regex.fullmatch(_array_pattern(allowed), text), text  # it was cut: not a whole array
    return reasons


def _named(name: str) -> dict:
    return {"type": "function", "function": {"name": name}}


CHOICES = [("required", FORCED_TOOLS), (_named("pick"), [PICK]), (_named("count"), [COUNT]),
           (_named("flag"), [FLAG]), (_named("ping"), [PING])]


def test_forced_calls_follow_the_schemas(tool_server):
    """Greedy and sampled (n=4), with and without parallel calls, a few prompts: finished outputs are calls
    that satisfy the schemas; some finish, some are cut; parallel outputs with several calls come too."""
    bodies, meta = [], []
    for choice, allowed in CHOICES:
        for parallel in (True, False):
            for prompt in ("Pack my box", "Sphinx of black quartz"):
                for sampling in ({"temperature": 0}, {"temperature": 1.0, "seed": 11, "n": 4}):
                    body = {"messages": [{"role": "user", "content": prompt}], "tools": FORCED_TOOLS,
                            "tool_choice": choice, "parallel_tool_calls": parallel, "max_tokens": 90, **sampling}
                    bodies.append(body)
                    meta.append((choice, allowed, parallel))
    results = asyncio.run(_post_all(tool_server.url, bodies))
    seen: dict = {}
    multi = 0
    for body, res, (choice, allowed, parallel) in zip(bodies, results, meta, strict=True):
        reasons = check_forced(res, body, allowed)
        seen.setdefault((json.dumps(choice), parallel), set()).update(reasons)
        multi += sum(len(c["message"].get("tool_calls") or []) > 1 for c in res["choices"])
    for key, reasons in seen.items():
        assert "tool_calls" in reasons, key  # every mode finishes some outputs
    assert any("length" in r for r in seen.values())  # and some are cut
    assert multi > 0  # parallel calls were made


def test_forced_stream_equals_the_answer(tool_server):
    """Greedy forced requests streamed: the calls come at the end as one tool_calls delta equal to the
    non-streaming answer's (with their index); an output cut by max_tokens streams its raw text."""
    for choice, _ in CHOICES[:3]:
        for parallel, max_tokens in ((False, 90), (True, 90), (True, 12)):
            body = {"tools": FORCED_TOOLS, "tool_choice": choice, "parallel_tool_calls": parallel,
                    "max_tokens": max_tokens, "temperature": 0}
            whole = _ok(tool_server.url, body)["choices"][0]
            chunks = _stream(tool_server.url, body)
            choices = [c["choices"][0] for c in chunks]
            assert choices[0]["delta"] == {"role": "assistant", "content": ""}
            content = "".join(c["delta"].get("content") or "" for c in choices)
            calls = [tc for c in choices for tc in c["delta"].get("tool_calls", [])]
            assert [c["finish_reason"] for c in choices] == [None] * (len(choices) - 1) + [whole["finish_reason"]]
            assert choices[-1]["matched_stop"] == whole["matched_stop"]
            if whole["finish_reason"] == "tool_calls":
                assert content == ""
                assert calls == [{"index": i, **c} for i, c in enumerate(whole["message"]["tool_calls"])]
            else:
                assert whole["finish_reason"] == "length" and calls == []
                assert content == whole["message"]["content"]


def test_forced_without_a_parser_has_openai_ids(server, tiny_model):
    """The session server (default template, which writes the tools' JSON; no parser): forced calls work, with
    ids call_<24 hex>; the tools reached the template (the prompt is the template's rendering with them)."""
    tok = load_tokenizer(tiny_model.target)
    body = {"tools": [PING], "tool_choice": "required", "max_tokens": 60, "temperature": 1.0, "seed": 3, "n": 4}
    res = _ok(server.url, body)
    reasons = check_forced(res, body, [PING], parser_ids=False)
    assert "tool_calls" in reasons
    assert res["usage"]["prompt_tokens"] == len(tok.encode_chat(CHAT, True, [PING]))
    assert res["usage"]["prompt_tokens"] > len(tok.encode_chat(CHAT, True))


def test_tools_reach_the_servers_template(tool_server, tiny_model):
    """The template shows the tools the model may call: all of them for "required", only the named one for a
    named function (as SGLang renders it)."""
    tok = load_tokenizer(tiny_model.target)
    tok.set_chat_template(NAMES_TEMPLATE)
    for choice, shown, head in (("required", FORCED_TOOLS, "<|tools|> pick count flag ping<|user|>"),
                                (_named("ping"), [PING], "<|tools|> ping<|user|>"),
                                (_named("count"), [COUNT], "<|tools|> count<|user|>")):
        res = _ok(tool_server.url, {"tools": FORCED_TOOLS, "tool_choice": choice, "max_tokens": 60,
                                    "temperature": 0})
        prompt = tok.apply_chat_template(CHAT, True, shown)
        assert prompt.startswith(head), prompt
        assert res["usage"]["prompt_tokens"] == len(tok.encode(prompt)), choice


def test_tool_choice_none_is_plain_chat(server):
    """tool_choice none: the tools are not rendered, and greedy output is what the request without tools gives."""
    plain = _ok(server.url, {"max_tokens": 12, "temperature": 0})
    for tools in ([PING], [PICK, COUNT]):
        res = _ok(server.url, {"tools": tools, "tool_choice": "none", "max_tokens": 12, "temperature": 0})
        assert res["choices"] == plain["choices"] and res["usage"] == plain["usage"], (res, plain)


# -- errors ----------------------------------------------------------------------------------------------------

BAD = [
    ({"tools": "get_weather"}, "tools"),
    ({"tools": {"type": "function"}}, "tools"),
    ({"tools": []}, "tools"),
    ({"tools": [5]}, "tools.0"),
    ({"tools": [{"type": "function"}]}, "tools.0"),
    ({"tools": [{"type": "function", "function": "f"}]}, "tools.0"),
    ({"tools": [{"type": "retrieval", "function": {"name": "f"}}]}, "tools.0"),
    ({"tools": [PING, {"type": "function", "function": {"description": "no name"}}]}, "tools.1.function.name"),
    ({"tools": [fn("get weather")]}, "tools.0.function.name"),
    ({"tools": [fn("")]}, "tools.0.function.name"),
    ({"tools": [fn("x" * 65)]}, "tools.0.function.name"),
    ({"tools": [{"type": "function", "function": {"name": 5}}]}, "tools.0.function.name"),
    ({"tools": [PING, FLAG, fn("ping")]}, "tools.2.function.name"),
    ({"tools": [fn("f", [1])]}, "tools.0.function.parameters"),
    ({"tools": [fn("f", "object")]}, "tools.0.function.parameters"),
    ({"tools": [PING], "tool_choice": _named("pong")}, "tool_choice"),
    ({"tools": [PING], "tool_choice": {"type": "function"}}, "tool_choice"),
    ({"tools": [PING], "tool_choice": "sometimes"}, "tool_choice"),
    ({"tools": [PING], "tool_choice": 5}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tool_choice": _named("ping")}, "tool_choice"),
    ({"tools": [PING], "tool_choice": "auto"}, "tool_choice"),  # the session server has no --tool-call-parser
    ({"tools": [PING]}, "tool_choice"),  # (auto is the default with tools)
    ({"tools": [PING], "tool_choice": "required", "logprobs": True}, "logprobs"),
    ({"tools": [PING], "tool_choice": "required", "response_format": {"type": "json_object"}}, "tool_choice"),
    ({"tools": [PING], "tool_choice": _named("ping"), "regex": "[a-z]+"}, "tool_choice"),
    ({"tools": [PING], "tool_choice": "required", "ebnf": 'root ::= "a"'}, "tool_choice"),
    ({"tools": [PING], "tool_choice": "required", "json_schema": '{"type": "integer"}'}, "tool_choice"),
    ({"tools": [fn("f", {"type": "nonsense"})], "tool_choice": "required"}, "tools"),
]


@pytest.mark.parametrize("body,param", BAD, ids=[f"{i}-{p}" for i, (_, p) in enumerate(BAD)])
def test_bad_tool_requests_are_400_naming_the_field(server, body, param):
    r = _post(server.url, {"max_tokens": 4, **body})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error", err
    assert ".cc:" not in err["message"], err  # (no C++ log prefix from xgrammar)


def test_odd_earlier_tool_calls_are_no_500(tool_server):
    """An earlier assistant message's tool_calls that is not a list (the ids count the conversation's calls)."""
    for odd in (5, {"id": "x"}, "calls", [5]):
        messages = CHAT + [{"role": "assistant", "content": "x", "tool_calls": odd}, {"role": "user", "content": "y"}]
        r = _post(tool_server.url, {"messages": messages, "tools": [PING], "tool_choice": "required",
                                    "parallel_tool_calls": False, "max_tokens": 60, "temperature": 0})
        assert r.status_code in (200, 400), r.text
        if r.status_code == 400:
            assert r.json()["error"]["param"].startswith("messages"), r.text
        else:
            first = 1 if isinstance(odd, list) else 0
            assert r.json()["choices"][0]["message"]["tool_calls"][0]["id"] == f"functions.ping:{first}", r.text


def test_auto_tools_with_a_grammar_are_400(tool_server):
    """tool_choice auto reads calls written in special tokens, which no grammar allows: a grammar beside it would
    forbid every call, so it is refused naming tool_choice."""
    for extra in ({"regex": "[a-z]+"}, {"ebnf": 'root ::= "a"'}, {"response_format": {"type": "json_object"}}):
        r = _post(tool_server.url, {"messages": CHAT, "tools": [PING], "max_tokens": 4, **extra})
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == "tool_choice" and "no grammar allows" in err["message"], err
    assert _post(tool_server.url, {"messages": CHAT, "tools": [PING], "max_tokens": 4}).status_code == 200


def test_chat_template_kwargs(server):
    """chat_template_kwargs reach the template (the default reads none of them: the same prompt); the variables
    the server sets itself are refused naming the field."""
    plain = _ok(server.url, {"max_tokens": 4, "temperature": 0})
    kw = _ok(server.url, {"max_tokens": 4, "temperature": 0, "chat_template_kwargs": {"thinking": True}})
    assert kw["usage"] == plain["usage"] and kw["choices"][0]["message"] == plain["choices"][0]["message"]
    for key in ("messages", "tools", "add_generation_prompt"):
        r = _post(server.url, {"max_tokens": 4, "chat_template_kwargs": {key: 1}})
        assert r.status_code == 400 and r.json()["error"]["param"] == "chat_template_kwargs", r.text
        assert key in r.json()["error"]["message"]


def test_unknown_tool_call_parser_is_refused():
    from sglang_eagle3.launch_server import build_parser, server_config
    from sglang_eagle3.server import ServerConfig
    from sglang_eagle3.server.config import ServerConfigError

    assert ServerConfig(tool_call_parser="kimi_k2").tool_call_parser == "kimi_k2"
    with pytest.raises(ServerConfigError, match="hermes"):
        ServerConfig(tool_call_parser="hermes")
    with pytest.raises(ServerConfigError, match="qwen25"):
        server_config(build_parser().parse_args(["--tool-call-parser", "qwen25"]))
    assert server_config(build_parser().parse_args(["--tool-call-parser", "kimi_k2"])).tool_call_parser == "kimi_k2"
    assert server_config(build_parser().parse_args([])).tool_call_parser is None


# -- tool_choice auto end to end (in-process, scripted output) -------------------------------------------------

class ScriptMatcher:
    """A "grammar" that allows exactly the script's next token (runtime/grammar.py's GrammarMatcher interface):
    the scheduler's own masking (drafts and verify, speculation on) makes the model write the script, then the
    output ends (finish_reason stop, nothing matched) as a complete grammar's does on an engine without eos."""

    def __init__(self, ids: list[int]):
        self.ids, self.pos = ids, 0
        self.fill_seconds, self.kind = 0.0, "ebnf"  # cheap: its rows are filled ahead of the draft's steps

    def accept(self, token: int) -> bool:
        if self.pos < len(self.ids) and token == self.ids[self.pos]:
            self.pos += 1
            return True
        return False

    @property
    def terminated(self) -> bool:
        return self.pos >= len(self.ids)

    def fill(self, bitmask, row: int) -> None:
        t = self.ids[self.pos]
        bitmask[row].zero_()
        bit = 1 << (t % 32)
        bitmask[row, t // 32] = bit - (1 << 32) if bit >= 1 << 31 else bit  # (int32 words)

    def rollback(self, n: int) -> None:
        self.pos -= n


def write_marker_tokenizer(path: str, vocab_size: int, more: tuple[str, ...] = ()) -> None:
    """The conftest's byte-level BPE, with Kimi's markers and turn end (and ``more``) as special tokens (the same
    vocabulary size)."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=1,
                                  special_tokens=["<|bos|>", *MARKERS, IM_END, *more],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([_CORPUS], trainer)
    assert tok.get_vocab_size() == vocab_size
    tok.save(os.path.join(path, "tokenizer.json"))


@pytest.fixture(scope="module")
def scripted(tiny_model, tmp_path_factory, torch_one_thread):
    """An in-process app over the tiny pair with Kimi's markers in its tokenizer and --tool-call-parser kimi_k2;
    ``scripted.script`` (a text) set: the next requests' output is that text's tokens. ``scripted.seen``: the
    sampling params each request reached the engine with."""
    yield from scripted_app(tiny_model, str(tmp_path_factory.mktemp("marker_model")), tool_call_parser="kimi_k2")


def scripted_app(tiny_model, target: str, specials: tuple[str, ...] = (), engine_args: dict | None = None,
                 eos: str | None = None, **config):
    """The ``scripted`` fixture's body (a generator: yields the app's holder, then shuts it down): the model
    written to ``target`` with ``specials`` as special tokens too (``eos``, one of them or IM_END, its EOS in
    generation_config.json: the tiny pair has none), the Engine given ``engine_args`` besides the pair's, the
    app's ServerConfig given ``config``."""
    from sglang_eagle3.engine import Engine
    from sglang_eagle3.runtime.grammar import GrammarSpec
    from sglang_eagle3.server import EngineDriver, ServerConfig, create_app

    for f in os.listdir(tiny_model.target):
        if f != "tokenizer.json":
            shutil.copy(os.path.join(tiny_model.target, f), target)
    write_marker_tokenizer(target, tiny_model.vocab_size, specials)
    if eos is not None:
        gen_path = os.path.join(target, "generation_config.json")
        gen = {}
        if os.path.exists(gen_path):
            with open(gen_path) as f:
                gen = json.load(f)
        gen["eos_token_id"] = load_tokenizer(target).encode(eos)
        with open(gen_path, "w") as f:
            json.dump(gen, f)
    engine = Engine(model_path=target, speculative_algorithm="EAGLE3", speculative_draft_model_path=tiny_model.draft,
                    speculative_num_steps=3, device="cpu", log_level="warning", **(engine_args or {}))
    engine.tokenizer.set_chat_template(NAMES_TEMPLATE)
    marker_ids = [engine.tokenizer.encode(m) for m in MARKERS]
    assert all(len(i) == 1 and i[0] in engine.tokenizer.special_ids for i in marker_ids), marker_ids

    class Scripted:
        script: str | None = None
        seen: list = []

    spec = GrammarSpec("regex", "(scripted)")
    real_make, real_matcher = engine.make_request, engine.grammar.matcher

    def make_request(*args, **kwargs):
        r = real_make(*args, **kwargs)
        Scripted.seen.append(r.params)
        if Scripted.script is not None:
            assert r.params.grammar is None
            r.params.regex = spec.text  # (after the engine's checks: the scheduler then asks for its matcher)
        return r

    def matcher(s, prompt_ids=None, thinking_budget=None):
        if s == spec:
            return ScriptMatcher(engine.tokenizer.encode(Scripted.script))
        return real_matcher(s, prompt_ids, thinking_budget)

    engine.make_request, engine.grammar.matcher = make_request, matcher
    driver = EngineDriver(engine, max_inflight=8)
    app = create_app(engine, driver, ServerConfig(served_model_name=MODEL, **config))
    driver.start()
    Scripted.app, Scripted.tokenizer, Scripted.driver = app, engine.tokenizer, driver
    yield Scripted
    driver.stop()
    engine.shutdown()


def ask(scripted, script: str, body: dict) -> tuple[dict, list[dict]]:
    """The non-streaming answer and the stream's chunks for one request whose output is ``script``."""
    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=scripted.app), base_url="http://t",
                                     timeout=60) as c:
            full = {"model": MODEL, "messages": CHAT, **body}
            whole = await c.post("/v1/chat/completions", json=full)
            streamed = await c.post("/v1/chat/completions", json={**full, "stream": True})
            return whole, streamed

    scripted.script, scripted.seen[:] = script, []
    try:
        whole, streamed = asyncio.run(go())
    finally:
        scripted.script = None
    assert whole.status_code == 200 and streamed.status_code == 200, (whole.text, streamed.text)
    events = [line[len("data: "):] for line in streamed.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return whole.json(), [json.loads(e) for e in events[:-1]]


def streamed_message(chunks: list[dict]) -> tuple[str, list[dict], str, object]:
    choices = [c["choices"][0] for c in chunks]
    assert choices[0]["delta"] == {"role": "assistant", "content": ""}
    assert all(c["finish_reason"] is None for c in choices[:-1]) and choices[-1]["delta"] == {}
    content = "".join(c["delta"].get("content") or "" for c in choices)
    for c in choices:
        assert not any(m in (c["delta"].get("content") or "") for m in MARKERS), c
    calls = [tc for c in choices for tc in c["delta"].get("tool_calls", [])]
    return content, calls, choices[-1]["finish_reason"], choices[-1]["matched_stop"]


AUTO_CONTENT = "Let me look. "
TRICKY = {"city": 'Só "P" }{', "n": "<|tool_call|>"}
AUTO_SCRIPT = (AUTO_CONTENT + SB + "\n" + call("functions.get_weather:0", json.dumps(TRICKY, ensure_ascii=False))
               + call("functions.nope:1", "{}") + "\n" + call("functions.add:2", '{"a": 2, "b": {"c": "}"}}',
                                                                     ws=" ") + SE)


def check_auto(whole: dict, chunks: list[dict], content: str, calls: list[tuple[str, dict]], reason: str,
               first: int = 0):
    ch = whole["choices"][0]
    msg = ch["message"]
    assert ch["finish_reason"] == reason, ch
    if calls:
        assert msg["content"] == (content or None) and ch["matched_stop"] is None, ch
        assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in msg["tool_calls"]] == calls
        assert [c["id"] for c in msg["tool_calls"]] == [f"functions.{n}:{first + i}" for i, (n, _) in enumerate(calls)]
        assert all(c["type"] == "function" for c in msg["tool_calls"])
    else:
        assert msg == {"role": "assistant", "content": content}, ch
    s_content, s_calls, s_reason, s_matched = streamed_message(chunks)
    assert (s_content, s_reason, s_matched) == (content, reason, ch["matched_stop"])
    assert s_calls == [{"index": i, **c} for i, c in enumerate(msg.get("tool_calls", []))]


def test_auto_calls_end_to_end(scripted):
    calls = [("get_weather", TRICKY), ("add", {"a": 2, "b": {"c": "}"}})]
    room = len(scripted.tokenizer.encode(AUTO_SCRIPT)) + 2  # (the context is 256 tokens)
    whole, chunks = ask(scripted, AUTO_SCRIPT, {"tools": [WEATHER, ADD], "max_tokens": room, "temperature": 0})
    assert scripted.seen and all(p.skip_special_tokens is False for p in scripted.seen)  # the markup is special
    assert whole["usage"]["completion_tokens"] == len(scripted.tokenizer.encode(AUTO_SCRIPT))  # (the script ran)
    check_auto(whole, chunks, AUTO_CONTENT, calls, "tool_calls")
    # Sampled, with earlier calls in the conversation (Kimi's ids count them).
    earlier = [{"role": "user", "content": "go"},
               {"role": "assistant", "content": "", "tool_calls": [
                   {"id": "functions.add:0", "type": "function", "function": {"name": "add", "arguments": "{}"}}]},
               {"role": "tool", "tool_call_id": "functions.add:0", "content": "1"}] + CHAT
    whole, chunks = ask(scripted, AUTO_SCRIPT, {"messages": earlier, "tools": [WEATHER, ADD], "tool_choice": "auto",
                                                "max_tokens": room, "temperature": 1.0, "seed": 5})
    check_auto(whole, chunks, AUTO_CONTENT, calls, "tool_calls", first=1)


def test_auto_cut_by_max_tokens(scripted):
    ids = scripted.tokenizer.encode(AUTO_SCRIPT)
    # Cut inside the last call: the complete first call is a call; the reason stays "length".
    [cb], [ce] = scripted.tokenizer.encode(CB), scripted.tokenizer.encode(CE)
    cut = ids.index(cb, ids.index(ce) + 1) + 3
    whole, chunks = ask(scripted, AUTO_SCRIPT, {"tools": [WEATHER, ADD], "max_tokens": cut, "temperature": 0})
    check_auto(whole, chunks, AUTO_CONTENT, [("get_weather", TRICKY)], "length")
    # Cut before any call is complete: the text before the markup, however far it got.
    for n in (3, ids.index(cb) + 2):
        whole, chunks = ask(scripted, AUTO_SCRIPT, {"tools": [WEATHER, ADD], "max_tokens": n, "temperature": 0})
        text = scripted.tokenizer.decode(ids[:n], skip_special_tokens=False)
        check_auto(whole, chunks, text.split(SB)[0], [], "length")


def test_auto_without_calls_and_without_tools(scripted):
    text = "Nothing to call: <|tool is not a marker {}."
    whole, chunks = ask(scripted, text, {"tools": [WEATHER], "max_tokens": 200, "temperature": 0})
    check_auto(whole, chunks, text, [], "stop")
    # Without tools the same script is plain text: special tokens skipped (so the auto mode's False mattered).
    whole, chunks = ask(scripted, AUTO_SCRIPT, {"max_tokens": 200, "temperature": 0})
    assert all(p.skip_special_tokens is True for p in scripted.seen)
    plain = scripted.tokenizer.decode(scripted.tokenizer.encode(AUTO_SCRIPT))
    assert not any(m in plain for m in MARKERS) and plain.startswith(AUTO_CONTENT)
    assert whole["choices"][0]["message"] == {"role": "assistant", "content": plain}
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks) == plain


def test_auto_output_ended_by_a_stop_token(scripted):
    """As Kimi ends its turn (<|im_end|>, here a stop token id): calls -> finish_reason tool_calls, matched_stop
    null (SGLang's); without calls the stop token stays the match; its text is trimmed either way."""
    [im_end] = scripted.tokenizer.encode(IM_END)
    room = len(scripted.tokenizer.encode(AUTO_SCRIPT)) + 3
    body = {"tools": [WEATHER, ADD], "max_tokens": room, "temperature": 0, "stop_token_ids": [im_end]}
    whole, chunks = ask(scripted, AUTO_SCRIPT + IM_END, body)
    check_auto(whole, chunks, AUTO_CONTENT, [("get_weather", TRICKY), ("add", {"a": 2, "b": {"c": "}"}})],
               "tool_calls")
    whole, chunks = ask(scripted, "No calls." + IM_END, body)
    check_auto(whole, chunks, "No calls.", [], "stop")
    assert whole["choices"][0]["matched_stop"] == im_end


def test_auto_on_the_live_server_with_text_only(tool_server):
    """tool_choice auto with the kimi_k2 parser and a model that writes no markup: its text, streamed the same."""
    body = {"tools": FORCED_TOOLS, "tool_choice": "auto", "max_tokens": 24, "temperature": 0}
    whole = _ok(tool_server.url, body)["choices"][0]
    assert whole["finish_reason"] == "length" and set(whole["message"]) == {"role", "content"}, whole
    choices = [c["choices"][0] for c in _stream(tool_server.url, body)]
    assert "".join(c["delta"].get("content") or "" for c in choices) == whole["message"]["content"]
    assert not any("tool_calls" in c["delta"] for c in choices) and choices[-1]["finish_reason"] == "length"
