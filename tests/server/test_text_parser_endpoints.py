"""SGLang's /separate_reasoning and /parse_function_call (server/reasoning.py separated, server/tools.py
parsed_calls) over HTTP: answers from the formats' rules (docs/SERVER.md), the server's --tool-call-parser as the
default, and 400s naming the field. Against SGLang's own parsers on random texts:
tests/integration/test_text_parsers_sglang.py."""

from __future__ import annotations

import json

import pytest

from .test_client_compat import _call, _error, engine, make_app  # noqa: F401  (fixtures)

pytestmark = pytest.mark.usefixtures("torch_one_thread")
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}


def _post(app, path: str, body) -> dict:
    r = _call(app, "POST", path, json=body)
    assert r.status_code == 200, r.text
    return r.json()


def test_separate_reasoning(make_app):  # noqa: F811
    app = make_app()
    assert _post(app, "/separate_reasoning", {"text": "<think> a plan \n</think>\n\nThe answer.",
                                              "reasoning_parser": "kimi_k2"}) == {
        "reasoning_text": "a plan", "text": "The answer."}
    # deepseek-r1: the output starts inside the thinking (the template opened it); cut short: all reasoning
    got = _post(app, "/separate_reasoning", {"text": "step one</think>done", "reasoning_parser": "deepseek-r1",
                                             "return_blocks": True})
    assert got == {"reasoning_text": "step one", "text": "done", "reasoning_blocks": ["step one"],
                   "text_blocks": ["done"], "blocks": [{"type": "reasoning", "text": "step one"},
                                                       {"type": "text", "text": "done"}]}
    assert _post(app, "/separate_reasoning", {"text": "still thinking", "reasoning_parser": "deepseek-r1"}) == {
        "reasoning_text": "still thinking", "text": ""}
    got = _post(app, "/separate_reasoning", {"text": "no thoughts", "reasoning_parser": "qwen3", "return_blocks": True})
    assert got == {"reasoning_text": "", "text": "no thoughts", "reasoning_blocks": [], "text_blocks": ["no thoughts"],
                   "blocks": [{"type": "text", "text": "no thoughts"}]}
    err = _error(_call(app, "POST", "/separate_reasoning", json={"text": "x", "reasoning_parser": "r2d2"}))
    assert err["param"] == "reasoning_parser" and "'r2d2' must be one of kimi_k2" in err["message"]
    assert _error(_call(app, "POST", "/separate_reasoning", json={"reasoning_parser": "qwen3"}))["param"] == "text"


def test_parse_function_call(make_app):  # noqa: F811
    text = ("Let me look.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
            '<|tool_call_argument_begin|>{"city": "Oslo"}<|tool_call_end|><|tool_call_begin|>functions.launch:1'
            '<|tool_call_argument_begin|>{"now": true}<|tool_call_end|><|tool_call_begin|>2'
            '<|tool_call_argument_begin|>{"city": "Rome"}<|tool_call_end|><|tool_calls_section_end|>')
    want = {"normal_text": "Let me look.", "calls": [
        {"tool_index": 0, "name": "get_weather", "parameters": json.dumps({"city": "Oslo"})},
        # (launch is not among the tools: left out; a bare counter's call goes to the only tool)
        {"tool_index": 1, "name": "get_weather", "parameters": json.dumps({"city": "Rome"})}]}
    plain, parsing = make_app(), make_app(tool_call_parser="kimi_k2")
    assert _post(plain, "/parse_function_call", {"text": text, "tools": [WEATHER], "tool_call_parser": "kimi_k2"}) \
        == want
    assert _post(parsing, "/parse_function_call", {"text": text, "tools": [WEATHER]}) == want  # the server's parser
    assert _post(parsing, "/parse_function_call", {"text": text}) == {"normal_text": text, "calls": []}  # no tools
    assert _post(parsing, "/parse_function_call", {"text": "just words", "tools": [WEATHER]}) == {
        "normal_text": "just words", "calls": []}
    err = _error(_call(plain, "POST", "/parse_function_call", json={"text": text, "tools": [WEATHER]}))
    assert err["param"] == "tool_call_parser" and "left out: the server's --tool-call-parser" in err["message"]
    err = _error(_call(parsing, "POST", "/parse_function_call", json={"text": text, "tool_call_parser": "llama3"}))
    assert err["param"] == "tool_call_parser" and "'llama3' must be one of kimi_k2" in err["message"]
    bad = {"type": "function", "function": {"name": "no spaces allowed"}}
    err = _error(_call(parsing, "POST", "/parse_function_call", json={"text": text, "tools": [WEATHER, bad]}))
    assert err["param"] == "tools.1.function.name", err
