"""Every endpoint fuzzed with generated bad input, in process (httpx.ASGITransport over the tiny pair).

The rule (docs/SERVER.md, "Errors"): a client's mistake is a 4xx in the documented error body ``{"error": {"message",
"type", "param", "code"}}``, never a 500, never a hang; it never takes the server or its engine thread down, and a
valid request afterwards still works. Each property test draws requests from strategies that mix valid values (so
that odd combinations reach the engine: streams, n, logprobs, grammars, tools, continue_final_message) with wrong
JSON at every field and nesting level (null, booleans, 2**70, NaN / Infinity, floats for ints, strings for numbers,
empty and long strings and lists, deep nesting, lone surrogates), unknown fields, and non-object bodies. Hypothesis
runs derandomized with a fixed number of examples, so CI sees the same cases every time;
``SGLANG_EAGLE3_FUZZ_EXAMPLES=2000`` runs more of them locally.

The failures the fuzzing found are kept as explicit regression tests at the end.
"""

from __future__ import annotations

import asyncio
import json
import os

import httpx
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from sglang_eagle3.runtime.sampling import SamplingParams, SamplingParamsError  # noqa: E402
from sglang_eagle3.server import EngineDriver, ServerConfig, create_app  # noqa: E402

from .conftest import spec_engine  # noqa: E402

MODEL = "tiny"
BODY_LIMIT = 64 * 1024  # max_request_bytes of the fuzzed apps: "at the size limit" stays cheap
EXAMPLES = int(os.environ.get("SGLANG_EAGLE3_FUZZ_EXAMPLES", "200"))
TIMEOUT_S = 30.0  # one request; longer is a hang
ERROR_KEYS = {"message", "type", "param", "code"}
FUZZ = settings(max_examples=EXAMPLES, derandomize=True, database=None, deadline=None, print_blob=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])

# A Hugging Face style template that walks what clients put in messages (tool_calls, names, tool_call_id, content
# parts), so that their odd shapes reach Jinja, as with a real model's template.
TEMPLATE = """\
{%- if tools %}<|tools|>{{ tools | tojson }}{% endif -%}
{%- for message in messages -%}
<|{{ message['role'] }}|>
{%- if message.tool_calls is defined and message.tool_calls -%}
{%- for tc in message.tool_calls %}{{ tc.function.name }}({{ tc.function.arguments | tojson }}) {{ tc.id }}{% endfor -%}
{%- endif -%}
{%- if message.tool_call_id is defined %}[{{ message.tool_call_id }}]{% endif -%}
{%- if message.content is string %}{{ message.content }}{% else %}{% for p in message.content %}{{ p.text }}\
{% endfor %}{% endif %}
{%- if message.name is defined %} name={{ message.name }}{% endif %}
{% endfor -%}
{%- if thinking is defined and thinking %}<think>{% endif -%}
{%- if add_generation_prompt %}<|assistant|>
{% endif -%}"""


# -- the apps -------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def engine(tiny_model):
    with spec_engine(tiny_model, max_running_requests=4) as eng:
        eng.tokenizer.set_chat_template(TEMPLATE)
        yield eng


@pytest.fixture(scope="module")
def apps(engine):
    """name -> (app, driver): a plain server, and one with the tool-call and reasoning parsers, over one driver (one
    engine thread: two would step the same scheduler)."""
    driver = EngineDriver(engine, max_inflight=16)
    configs = {"plain": {}, "parsers": {"tool_call_parser": "kimi_k2", "reasoning_parser": "kimi_k2"}}
    out = {name: (create_app(engine, driver, ServerConfig(served_model_name=MODEL, max_request_bytes=BODY_LIMIT,
                                                          **cfg)), driver) for name, cfg in configs.items()}
    driver.start()
    yield out
    driver.stop()


def _send(app, method: str, path: str, content: bytes = b"", headers: dict | None = None) -> httpx.Response:
    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t",
                                     timeout=TIMEOUT_S) as c:
            return await asyncio.wait_for(c.request(method, path, content=content, headers=headers), TIMEOUT_S)

    return asyncio.run(go())


def _encode(body) -> bytes:
    """JSON as a client may send it: NaN / Infinity literals, huge ints, lone surrogates as \\ud800 escapes."""
    return json.dumps(body, allow_nan=True).encode()


def check(served, method: str, path: str, content: bytes = b"", headers: dict | None = None) -> httpx.Response:
    """Sends one request and asserts the rule: a 2xx, or a 4xx in the error shape; a stream ends with [DONE] and
    no error event; the engine thread neither raised nor died."""
    app, driver = served
    errors = driver.metrics.engine_errors.value()
    r = _send(app, method, path, content, {"Content-Type": "application/json", **(headers or {})})
    what = f"{method} {path} {content[:600]!r}"
    assert r.status_code < 500, f"{what} -> {r.status_code} {r.text[:600]}"
    if r.status_code >= 400 and method != "HEAD":
        body = r.json()
        assert isinstance(body, dict) and set(body.get("error", ())) == ERROR_KEYS, f"{what} -> {r.text[:600]}"
        assert isinstance(body["error"]["message"], str) and body["error"]["message"], what
    if r.headers.get("content-type", "").startswith("text/event-stream"):
        events = [line[len("data: "):] for line in r.text.splitlines() if line.startswith("data: ")]
        assert events and events[-1] == "[DONE]", f"{what} -> {r.text[-600:]}"
        for e in events[:-1]:
            assert "error" not in json.loads(e), f"{what} -> {e[:600]}"
    assert driver.metrics.engine_errors.value() == errors, f"{what}: the engine raised"
    assert driver.alive, f"{what}: the engine thread died"
    return r


def still_serving(served) -> None:
    """A valid request of each kind works after the fuzzing, and /health is 200."""
    app, _ = served
    r = _send(app, "POST", "/v1/completions", _encode({"model": MODEL, "prompt": "The quick", "max_tokens": 2}))
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2, r.text
    r = _send(app, "POST", "/v1/chat/completions",
              _encode({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "stream": True}))
    assert r.status_code == 200 and r.text.rstrip().endswith("data: [DONE]"), r.text
    assert _send(app, "GET", "/health").status_code == 200


# -- strategies -----------------------------------------------------------------------------------------------------

HUGE = [2 ** 31, 2 ** 63 - 1, 2 ** 63, -(2 ** 63) - 1, 2 ** 70, -(2 ** 70), 10 ** 400]
ODD_TEXT = ["", "8", "0.5", "true", "null", "\ud800", "a\udfffb", "\x00", "é漢🙂", "x" * 3000, "{", "(", "[a-",
            "default", MODEL, "The quick brown fox"]


def _deep(depth: int, list_: bool):
    v: object = 1
    for _ in range(depth):
        v = [v] if list_ else {"a": v}
    return v


scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 3), st.sampled_from(HUGE),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.5, 1.5, -0.0, 1e308, 1e-320]),
    st.sampled_from(ODD_TEXT), st.text(max_size=12),
)
junk = st.one_of(
    scalars,
    st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                  st.dictionaries(st.text(max_size=6), inner, max_size=3)),
                 max_leaves=8),
    st.sampled_from([[], {}, [[]], [None], list(range(500)), ["x"] * 300, _deep(150, True), _deep(150, False),
                     _deep(250, True)]),
)




def _paths(value, prefix: tuple = ()):
    """Every place in a JSON value: dict keys and the first items of lists, at every level."""
    yield prefix
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value[:4]):
            yield from _paths(v, prefix + (i,))


def _copy(value):
    """A deep copy (of values nested deeper than copy.deepcopy's recursion allows, too): a body is changed in place,
    and the strategies' constants must stay as they are."""
    return json.loads(json.dumps(value, allow_nan=True))


@st.composite
def mutated(draw, bodies: st.SearchStrategy, names: list[str]):
    """A body from ``bodies`` with none, one or two places (at any nesting level) replaced by anything, or a field of
    ``names`` (or an unknown one) set to anything: mostly valid requests, each wrong in a few places."""
    body = _copy(draw(bodies))
    for _ in range(draw(st.sampled_from([0, 1, 1, 2]))):
        places = [p for p in _paths(body) if p] if isinstance(body, dict) else []
        if places and draw(st.booleans()):
            *parents, last = draw(st.sampled_from(places))
            target = body
            for p in parents:
                target = target[p]
            target[last] = _copy(draw(junk))
        elif isinstance(body, dict):
            body[draw(st.sampled_from([*names, "unknown", "extra_body"]))] = _copy(draw(junk))
    return body


small_text = st.one_of(st.sampled_from(["The quick", "Pack my box", "hi", " ", "é漢🙂", "\x00x"]),
                       st.text(min_size=1, max_size=12))
token_ids = st.lists(st.integers(0, 299), min_size=1, max_size=6)
stop = st.one_of(st.text(min_size=1, max_size=4), st.lists(st.text(max_size=4), max_size=3))
seeds = st.one_of(st.integers(-5, 5), st.sampled_from([2 ** 63 - 1, -(2 ** 63), 2 ** 63, 2 ** 70]))
logit_bias = st.dictionaries(st.one_of(st.sampled_from(["5", "299", "300", "-1", "05", " 5", "a", "1e3", "", "5.0",
                                                        str(2 ** 70)]), st.text(max_size=3)),
                             st.one_of(st.sampled_from([-100, 100, 0, 1.5, 101, -1e9]),
                                       st.floats(allow_nan=True)), max_size=3)
SCHEMAS = [{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}, {"type": "string"},
           {"type": "bogus"}, {"$ref": "#/nope"}, {"type": "string", "pattern": "(("}, {"enum": []},
           {"type": "integer", "minimum": 5, "maximum": 1}, {"type": "string", "format": "nope"},
           {"type": "number", "minimum": float("nan")}, {"type": "object", "properties": 5}, {"uniqueItems": True},
           {"type": "object", "required": 5}, {"type": "integer", "minimum": 2 ** 70}, True, False, 5, [1], "x", {}]
schema = st.sampled_from(SCHEMAS)
grammars = st.sampled_from([
    ("regex", "[ab]{1,3}"), ("regex", "(a"), ("regex", "[]"), ("regex", ""), ("regex", "a^b"), ("regex", "\\"),
    ("ebnf", 'root ::= "a" | "b"'), ("ebnf", "root ::= "), ("ebnf", "x ::= y"),
    ("json_schema", '{"type": "string", "maxLength": 3}'), ("json_schema", "$$ANY$$"), ("json_schema", "[1]"),
    ("json_schema", "{"), ("json_schema", '{"type": "integer", "minimum": 1e400}'),
    ("stop_regex", "a+"), ("stop_regex", "("), ("stop_regex", "(?<=a+)b"), ("stop_regex", "^$"),
    ("stop_regex", ["x", "y{2}"]),
])
response_formats = st.one_of(
    st.sampled_from([{"type": "text"}, {"type": "json_object"}, {"type": "json_schema"}, {}, {"type": "bogus"},
                     {"type": None}, {"type": ["json_object"]}, {"type": "json_schema", "json_schema": 5}]),
    st.builds(lambda s, name: {"type": "json_schema", "json_schema": {"name": name, "schema": s}}, schema,
              st.just("x")),
)


# A request's new tokens: few (each example stays fast), or anything but null (null asks for the whole context).
max_tokens = st.sampled_from([1, 2, 3, 4, 0])


def sampling_fields() -> dict:
    """Optional sampling fields shared by /generate's sampling_params and the OpenAI bodies."""
    return {
        "temperature": st.sampled_from([0, 0.0, 0.7, 1, 2.5, 1e-7, 10 ** 400, 1e308]),
        "top_p": st.sampled_from([0.5, 1, 1.0, 1e-9]), "top_k": st.sampled_from([-1, 1, 5, 2 ** 70]),
        "min_p": st.sampled_from([0, 0.2, 1]), "stop": stop,
        "stop_token_ids": st.lists(st.integers(-2, 310), max_size=3), "ignore_eos": st.booleans(),
        "seed": seeds, "frequency_penalty": st.sampled_from([-2, 0, 1.5, 2]),
        "presence_penalty": st.sampled_from([-2, 0.5, 2]),
        "repetition_penalty": st.sampled_from([0.5, 1, 2]), "logit_bias": logit_bias,
        "no_stop_trim": st.booleans(), "skip_special_tokens": st.booleans(),
        "n": st.integers(1, 3),
    }


def with_grammar(body_st: st.SearchStrategy, into: str | None = None) -> st.SearchStrategy:
    """Adds at most two grammar fields (two conflict: a 400) to each body (``into``: under that key)."""
    def add(body, gs):
        if not isinstance(body, dict):
            return body
        target = body.setdefault(into, {}) if into else body
        if isinstance(target, dict):
            for k, v in gs:
                target[k] = v
        return body

    return st.builds(add, body_st, st.lists(grammars, max_size=2))


def fields(required: dict, optional: dict, more: tuple[str, ...] = ()) -> st.SearchStrategy:
    """A body of ``required`` and some of ``optional``, wrong in a few places (``mutated``: any of these fields, or
    ``more``, the fields the server refuses unless neutral, set to anything)."""
    return mutated(st.fixed_dictionaries(required, optional=optional), [*required, *optional, *more])


GENERATE_REFUSED = ("lora_path", "return_hidden_states", "image_data", "session_params", "custom_logit_processor")
OPENAI_REFUSED = ("lora_path", "return_hidden_states", "priority", "return_token_ids", "session_params")


def generate_bodies() -> st.SearchStrategy:
    sp = st.fixed_dictionaries({"max_new_tokens": max_tokens}, optional={
        **sampling_fields(), "spaces_between_special_tokens": st.booleans(), "beam_width": st.just(1),
        "stream_interval": st.just(1), "sampling_seed": seeds})
    common = {"stream": st.booleans(), "return_logprob": st.one_of(st.booleans(), st.lists(st.booleans())),
              "logprob_start_len": st.integers(-2, 3), "top_logprobs_num": st.integers(-1, 3),
              "return_text_in_logprobs": st.booleans(), "rid": st.text(max_size=5)}
    one = fields({"text": small_text}, {"sampling_params": sp, **common}, GENERATE_REFUSED)
    ids = fields({"input_ids": token_ids}, {"sampling_params": sp, **common}, GENERATE_REFUSED)
    batch = fields({"text": st.lists(small_text, min_size=1, max_size=3)},
                   {**common, "sampling_params": st.one_of(sp, st.lists(sp, min_size=1, max_size=3)),
                    "rid": st.one_of(st.text(max_size=4), st.lists(st.text(max_size=3), max_size=3))},
                   GENERATE_REFUSED)
    return with_grammar(st.one_of(one, ids, batch), "sampling_params")


def openai_common() -> dict:
    return {**sampling_fields(), "model": st.sampled_from([MODEL, "default", "other"]), "stream": st.booleans(),
            "stream_options": st.fixed_dictionaries({}, optional={"include_usage": st.booleans(),
                                                                  "continuous_usage_stats": st.booleans()}),
            "min_tokens": st.integers(0, 5), "response_format": response_formats, "rid": st.text(max_size=5),
            "user": small_text}


def completion_bodies() -> st.SearchStrategy:
    prompt = st.one_of(small_text, token_ids, st.lists(small_text, min_size=1, max_size=3),
                       st.lists(token_ids, min_size=1, max_size=2))
    body = fields({"prompt": prompt, "max_tokens": max_tokens},
                  {**openai_common(), "logprobs": st.integers(0, 3), "echo": st.booleans(),
                   "suffix": st.sampled_from(["", "x"]), "best_of": st.integers(1, 3)}, OPENAI_REFUSED)
    return with_grammar(body)


tool_names = st.sampled_from(["f", "g", "get_weather", "bad name!", "", "x" * 65])
tools = st.lists(st.one_of(
    st.fixed_dictionaries({"type": st.just("function"),
                           "function": st.fixed_dictionaries({"name": tool_names},
                                                             optional={"description": small_text,
                                                                       "parameters": schema,
                                                                       "strict": st.booleans()})}),
    st.sampled_from([{"type": "other"}, {"type": "function"}, 5, {"function": {"name": "f"}}])), max_size=3)
tool_choice = st.sampled_from(["none", "auto", "required", "bogus", {"type": "function", "function": {"name": "f"}},
                               {"type": "function", "function": {"name": "missing"}}, {"type": "function"},
                               {"type": "function", "function": "f"}])
tool_call = st.fixed_dictionaries({}, optional={
    "id": st.text(max_size=5), "type": st.just("function"),
    "function": st.fixed_dictionaries({}, optional={"name": tool_names,
                                                    "arguments": st.sampled_from(['{"a": 1}', "{", "", "[]"])})})
content = st.one_of(small_text, small_text,
                    st.lists(st.one_of(st.builds(lambda t: {"type": "text", "text": t}, small_text),
                                       st.sampled_from([{"type": "image_url", "image_url": {"url": "x"}},
                                                        {"type": "text"}, {"text": "x"}])), max_size=2),
                    st.none(), st.sampled_from([5, {"text": "x"}, [None]]))
message = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "developer", "user", "assistant", "tool"]), "content": content},
    optional={"name": small_text, "tool_calls": st.lists(tool_call, max_size=2), "tool_call_id": st.text(max_size=4),
              "reasoning_content": small_text})
# (sometimes an assistant message last: what continue_final_message continues)
messages = st.one_of(st.lists(message, min_size=1, max_size=3),
                     st.builds(lambda ms, last: ms + [{"role": "assistant", "content": last}],
                               st.lists(message, max_size=2), small_text))
template_kwargs = st.dictionaries(st.sampled_from(["thinking", "messages", "x", "tools", "bos_token"]),
                                  st.one_of(st.booleans(), small_text), max_size=2)


def chat_bodies() -> st.SearchStrategy:
    body = fields({"messages": messages, "max_tokens": max_tokens},
                  {**openai_common(), "max_completion_tokens": max_tokens, "logprobs": st.booleans(),
                   "top_logprobs": st.integers(0, 3), "tools": tools, "tool_choice": tool_choice,
                   "parallel_tool_calls": st.booleans(), "functions": st.one_of(st.none(), st.just([{"name": "f"}])),
                   "function_call": st.sampled_from(["none", "auto"]), "continue_final_message": st.booleans(),
                   "add_generation_prompt": st.booleans(), "chat_template_kwargs": template_kwargs,
                   "separate_reasoning": st.booleans(), "stream_reasoning": st.booleans()}, OPENAI_REFUSED)
    return with_grammar(body)


def tokenize_bodies() -> st.SearchStrategy:
    prompt = fields({"prompt": st.one_of(small_text, st.lists(small_text, max_size=3))},
                    {"model": st.just(MODEL), "add_special_tokens": st.booleans()})
    chat = fields({"messages": messages},
                  {"model": st.just(MODEL), "tools": tools, "tool_choice": tool_choice,
                   "continue_final_message": st.booleans(), "add_generation_prompt": st.booleans(),
                   "add_special_tokens": st.booleans(), "parallel_tool_calls": st.booleans(),
                   "chat_template_kwargs": template_kwargs})
    return st.one_of(prompt, chat, junk)


def detokenize_bodies() -> st.SearchStrategy:
    tokens = st.one_of(st.lists(st.integers(-1, 301), max_size=5),
                       st.lists(st.lists(st.integers(0, 299), max_size=3), max_size=3))
    return st.one_of(fields({"tokens": tokens}, {"model": st.just(MODEL), "skip_special_tokens": st.booleans()}), junk)


# -- property tests -------------------------------------------------------------------------------------------------

@FUZZ
@given(body=st.one_of(generate_bodies(), junk))
def test_generate_fuzz(apps, body):
    check(apps["plain"], "POST", "/generate", _encode(body))


@FUZZ
@given(body=st.one_of(completion_bodies(), junk))
def test_completions_fuzz(apps, body):
    check(apps["plain"], "POST", "/v1/completions", _encode(body))


@FUZZ
@given(body=st.one_of(chat_bodies(), junk), server=st.sampled_from(["plain", "parsers"]))
def test_chat_completions_fuzz(apps, body, server):
    check(apps[server], "POST", "/v1/chat/completions", _encode(body))


@FUZZ
@given(body=tokenize_bodies(), path=st.sampled_from(["/v1/tokenize", "/tokenize"]))
def test_tokenize_fuzz(apps, body, path):
    check(apps["parsers"], "POST", path, _encode(body))


@FUZZ
@given(body=detokenize_bodies(), path=st.sampled_from(["/v1/detokenize", "/detokenize"]))
def test_detokenize_fuzz(apps, body, path):
    check(apps["plain"], "POST", path, _encode(body))


MARKED = st.lists(st.sampled_from(["<think>", "</think>", "◁think▷", "◁/think▷", "<|tool_calls_section_begin|>",
                                    "<|tool_call_begin|>", "functions.f:0", "3", "<|tool_call_argument_begin|>",
                                    '{"a": 1}', "[1]", "{", "<|tool_call_end|>", "<|tool_calls_section_end|>", " ",
                                    "\n", "word"]), max_size=12).map("".join)


@FUZZ
@given(body=st.fixed_dictionaries({}, optional={
    "text": st.one_of(MARKED, small_text, junk),
    "reasoning_parser": st.one_of(st.sampled_from(["kimi_k2", "deepseek-r1", "deepseek-v3", "qwen3", "qwen3-thinking",
                                                   "kimi", "r2d2", ""]), junk),
    "return_blocks": st.one_of(st.booleans(), junk)}))
def test_separate_reasoning_fuzz(apps, body):
    check(apps["plain"], "POST", "/separate_reasoning", _encode(body))


@FUZZ
@given(body=st.fixed_dictionaries({}, optional={
    "text": st.one_of(MARKED, small_text, junk), "tools": st.one_of(tools, junk),
    "tool_call_parser": st.one_of(st.sampled_from(["kimi_k2", "llama3", ""]), junk)}),
    server=st.sampled_from(["plain", "parsers"]))
def test_parse_function_call_fuzz(apps, body, server):
    check(apps[server], "POST", "/parse_function_call", _encode(body))


ROUTES = ["/generate", "/v1/completions", "/v1/chat/completions", "/v1/tokenize", "/tokenize", "/v1/detokenize",
          "/detokenize", "/abort_request", "/separate_reasoning", "/parse_function_call", "/flush_cache",
          "/get_server_info", "/server_info", "/get_model_info",
          "/model_info", "/v1/models", "/v1/models/tiny", "/v1/models/other", "/v1/models/%ff%fe", "/health",
          "/health_generate", "/ready", "/metrics", "/nope"]
raw_bodies = st.one_of(
    st.sampled_from([b"", b"null", b"[]", b"{}", b"1", b'"x"', b"\xff\xfe", b'{"text": "\xff"}', b"{", b"{}{}",
                     b'{"a": NaN}', b'{"text": "a", "text": 5}', b"\x00", b"{" * 300 + b"}" * 300,
                     b'{"rid": "\\ud800"}', b'{"abort_all": true}', b'{"rid": ""}', b'{"prompt": "x"}',
                     b'{"tokens": [1]}']),
    st.binary(max_size=40), st.builds(_encode, junk))


@FUZZ
@given(method=st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD"]), path=st.sampled_from(ROUTES),
       query=st.sampled_from(["", "?a=1", "?model=%ff", "?stream=true"]), content=raw_bodies,
       ctype=st.sampled_from(["application/json", "text/plain", "application/x-www-form-urlencoded",
                              "multipart/form-data; boundary=x", ""]))
def test_every_route_method_and_raw_body(apps, method, path, query, content, ctype):
    """Every route, every method, bodies that are not JSON objects (invalid UTF-8, truncated, nested past the parser's
    limit), odd content types and query strings. (/abort_request's abort_all ends whatever runs: nothing, here.)"""
    r = check(apps["plain"], method, path + query, content, {"Content-Type": ctype} if ctype else {})
    assert r.status_code in (200, 400, 404, 405), (method, path, r.status_code, r.text[:300])


# -- the body size limit --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("path,build", [
    ("/generate", lambda pad: {"text": "x", "sampling_params": {"max_new_tokens": 1}, "pad": pad}),
    ("/v1/completions", lambda pad: {"prompt": "x", "max_tokens": 1, "user": pad}),
    ("/v1/chat/completions", lambda pad: {"messages": [{"role": "user", "content": "x"}], "max_tokens": 1,
                                          "user": pad}),
    ("/v1/tokenize", lambda pad: {"prompt": "x", "pad": pad}),
    ("/v1/detokenize", lambda pad: {"tokens": [1], "pad": pad}),
    ("/abort_request", lambda pad: {"rid": "none", "pad": pad}),
])
@pytest.mark.parametrize("stream", [False, True])
def test_bodies_at_the_size_limit(apps, path, build, stream):
    """A body of exactly max_request_bytes is served; one byte more is a 413 (request_too_large), streamed or not."""
    def body(size: int) -> bytes:
        b = build("")
        if stream and path in ("/generate", "/v1/completions", "/v1/chat/completions"):
            b["stream"] = True
        raw = _encode(b)
        return _encode(build("p" * (size - len(raw))) | ({"stream": True} if b.get("stream") else {}))

    at = body(BODY_LIMIT)
    assert len(at) == BODY_LIMIT
    check(apps["plain"], "POST", path, at)
    over = body(BODY_LIMIT + 1)
    r = check(apps["plain"], "POST", path, over)
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large", r.text


def test_still_serving_after_the_fuzzing(apps):
    """(Runs after the property tests of this module: every valid kind of request still works.)"""
    for served in apps.values():
        still_serving(served)


# -- regressions: failures the fuzzing found ------------------------------------------------------------------------

@pytest.mark.parametrize("value", [10 ** 400, 2 ** 1024, -(10 ** 400)], ids=["1e400", "2**1024", "-1e400"])
def test_generate_temperature_past_floats_range_is_a_400(apps, value):
    """``sampling_params.temperature`` as an integer past a float's range (JSON has no bound on an integer's size):
    validation took it for a finite number >= 0, and the engine thread's float() raised OverflowError in the batch's
    sampler: a 500 (engine_error) for the client, and every request in that batch failed with it."""
    for stream in (False, True):
        r = check(apps["plain"], "POST", "/generate",
                  _encode({"text": "The quick", "stream": stream,
                           "sampling_params": {"max_new_tokens": 2, "temperature": value}}))
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == "temperature", r.text
    with pytest.raises(SamplingParamsError, match="temperature"):  # (Engine.generate's path too)
        SamplingParams.from_dict({"temperature": value})
    still_serving(apps["plain"])
