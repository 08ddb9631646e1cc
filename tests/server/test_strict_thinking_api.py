"""Strict thinking through the HTTP server (--enable-strict-thinking; the engine's side: test_strict_thinking.py):
the thinking budget reaches the engine from /generate's ``max_thinking_tokens``, the OpenAI endpoints'
``custom_params`` and Anthropic's ``thinking.budget_tokens``; what cannot be served is a 400 naming the field.

Checked against: the rules (a thinking opened by a logit_bias on <think> holds exactly the budget's tokens, then
</think>: read from /generate's output_ids and from the OpenAI endpoints' logprobs tokens), the sampling params the
engine received (Anthropic's budgets are >= 1024 tokens, past the tiny model's context), SGLang 0.5.23's rules for
``max_thinking_tokens`` (refused without strict thinking, in its words; over a budget in custom_params) and the
launcher's flag reaching EngineArgs.
"""

from __future__ import annotations

import asyncio
import random

import httpx
import pytest

from sglang_eagle3.env import MAX_THINK_TOKENS, overrides
from sglang_eagle3.launch_server import NATIVE_ONLY_FLAGS, build_parser, engine_kwargs, main, sglang_argv

from .conftest import asgi_post, random_words, served_app
from .test_reasoning import thinking_model  # noqa: F401  (a fixture)
from .test_strict_thinking import END, THINK, _engine
from .test_tools import NAMES_TEMPLATE

pytestmark = pytest.mark.usefixtures("torch_one_thread")
MODEL = "tiny"
DEFAULT_BUDGET = random.randint(2, 6)  # SGLANG_MAX_THINK_TOKENS of the strict engine


class Served:
    """An app over an engine whose make_request records the sampling params each request reached it with."""

    def __init__(self, engine, app):
        self.engine, self.app, self.seen = engine, app, []
        [self.think], [self.end] = engine.tokenizer.encode(THINK), engine.tokenizer.encode(END)
        # <think> above everything at the start; </think> below everything, so that a sampled thinking never ends
        # by itself before its budget (past it the mask leaves the end marker alone, whatever its bias)
        self.bias = {str(self.think): 100.0, str(self.end): -100.0}
        real = engine.make_request

        def make_request(*args, **kwargs):
            r = real(*args, **kwargs)
            self.seen.append(r.params)
            return r

        engine.make_request = make_request

    def post(self, path: str, body: dict) -> httpx.Response:
        self.seen.clear()
        return asgi_post(self.app, path, body)

    def ok(self, path: str, body: dict) -> dict | list:
        r = self.post(path, body)
        assert r.status_code == 200, r.text
        return r.json()


def _served(thinking_model, strict: bool):  # noqa: F811
    with overrides({MAX_THINK_TOKENS.name: str(DEFAULT_BUDGET)}):  # (read when the engine starts)
        eng = _engine(thinking_model, False, enable_strict_thinking=strict)
    eng.tokenizer.set_chat_template(NAMES_TEMPLATE)
    try:
        with served_app(eng, served_model_name=MODEL, reasoning_parser="kimi_k2") as app:
            yield Served(eng, app)
    finally:
        eng.shutdown()


@pytest.fixture(scope="module")
def strict(thinking_model):  # noqa: F811
    yield from _served(thinking_model, True)


@pytest.fixture(scope="module")
def loose(thinking_model):  # noqa: F811
    yield from _served(thinking_model, False)


def _assert_thinks(tokens: list, budget: int, think, end) -> None:
    """The output opens its thinking and holds exactly ``budget`` tokens in it, then the end marker."""
    assert tokens[0] == think, tokens
    assert tokens[budget + 1] == end and end not in tokens[1:budget + 1], (budget, tokens)


def test_generate_max_thinking_tokens_is_each_prompts_budget(strict):
    rng = random.Random()
    prompts = [random_words(rng, rng.randint(2, 8)) for _ in range(3)]
    budget = rng.randint(0, 7)
    sp = {"temperature": 0, "max_new_tokens": 12, "logit_bias": strict.bias}
    # One value for the whole batch, over a budget given in custom_params (SGLang's order).
    outs = strict.ok("/generate", {"text": prompts, "max_thinking_tokens": budget,
                                   "sampling_params": [sp, {**sp, "custom_params": {"thinking_budget": budget + 3}},
                                                       {**sp, "custom_params": {}}]})
    assert [p.thinking_budget for p in strict.seen] == [budget] * 3
    for out in outs:
        _assert_thinks(out["output_ids"], budget, strict.think, strict.end)
    # Left out (or null): the request's custom_params, else the engine's default (SGLANG_MAX_THINK_TOKENS).
    own = rng.randint(0, 7)
    [mine, default] = strict.ok("/generate", {"text": prompts[:2], "max_thinking_tokens": None, "sampling_params": [
        {**sp, "custom_params": {"thinking_budget": own}}, sp]})
    assert [p.thinking_budget for p in strict.seen] == [own, None]
    _assert_thinks(mine["output_ids"], own, strict.think, strict.end)
    _assert_thinks(default["output_ids"], DEFAULT_BUDGET, strict.think, strict.end)


def test_openai_custom_params_reach_the_engine(strict):
    rng = random.Random()
    budget = rng.randint(0, 7)
    common = {"model": MODEL, "temperature": 0, "max_tokens": 12, "logit_bias": strict.bias,
              "custom_params": {"thinking_budget": budget}, "skip_special_tokens": False}
    chat = strict.ok("/v1/chat/completions", {**common, "messages": [{"role": "user", "content": random_words(rng, 4)}],
                                              "logprobs": True, "separate_reasoning": False})
    assert [p.thinking_budget for p in strict.seen] == [budget]
    _assert_thinks([t["token"] for t in chat["choices"][0]["logprobs"]["content"]], budget, THINK, END)
    # The split answer: the reasoning is the thinking's text.
    split = strict.ok("/v1/chat/completions", {**common, "messages": [{"role": "user", "content": "hi"}]})
    message = split["choices"][0]["message"]
    assert message["reasoning_content"] is not None and END not in message["reasoning_content"], message
    done = strict.ok("/v1/completions", {**common, "prompt": random_words(rng, 5), "logprobs": 0, "n": 2,
                                         "seed": rng.randrange(2 ** 31), "temperature": 0.7})
    assert [p.thinking_budget for p in strict.seen] == [budget] * 2
    for choice in done["choices"]:
        _assert_thinks(choice["logprobs"]["tokens"], budget, THINK, END)
    # custom_params {} or null asks for nothing: the engine's default budget.
    for empty in ({}, None):
        strict.ok("/v1/chat/completions", {**common, "custom_params": empty, "messages": [{"role": "user",
                                                                                          "content": "hi"}]})
        assert [p.thinking_budget for p in strict.seen] == [None]


def test_anthropic_budget_tokens_is_enforced_only_under_strict_thinking(strict, loose):
    budget = random.randint(1024, 40000)
    body = {"model": MODEL, "max_tokens": 3, "messages": [{"role": "user", "content": "Pack my box"}]}
    for served, expected in ((strict, budget), (loose, None)):
        for stream in (False, True):
            r = served.post("/v1/messages", {**body, "stream": stream,
                                             "thinking": {"type": "enabled", "budget_tokens": budget}})
            assert r.status_code == 200 and ("message_stop" in r.text if stream else r.json()["content"]), r.text
            assert [p.thinking_budget for p in served.seen] == [expected], served.seen
    for thinking in ({"type": "adaptive"}, {"type": "disabled"}, None):
        strict.ok("/v1/messages", {**body, "thinking": thinking} if thinking else body)
        assert [p.thinking_budget for p in strict.seen] == [None]
    # count_tokens takes the same request (no budget to enforce there)
    r = strict.post("/v1/messages/count_tokens", {**body, "thinking": {"type": "enabled", "budget_tokens": budget}})
    assert r.status_code == 200 and r.json()["input_tokens"] > 0, r.text


def _refused(served: Served, path: str, body: dict, param: str, *needles: str) -> None:
    r = served.post(path, body)
    assert r.status_code == 400, (body, r.text)
    err = r.json()["error"]
    assert err["param"] == param, (body, err)
    for needle in needles:
        assert needle in err["message"], (needle, err)


def test_what_the_server_cannot_serve_is_a_400_naming_the_field(strict, loose):
    rng = random.Random()
    gen = {"text": random_words(rng, 3), "sampling_params": {"max_new_tokens": 2}}
    # SGLang's words: nothing would enforce it.
    budget = rng.randint(0, 10 ** 6)
    _refused(loose, "/generate", {**gen, "max_thinking_tokens": budget}, "max_thinking_tokens",
             f"max_thinking_tokens={budget}",
             "max_thinking_tokens requires the server to be launched with --enable-strict-thinking")
    for bad, shown in ((-rng.randint(1, 99), None), ("5", "'5'"), (1.5, "1.5"), (True, "True"), ([3], "[3]"),
                       ({"n": 1}, None)):
        for served in (strict, loose):
            _refused(served, "/generate", {**gen, "max_thinking_tokens": bad}, "max_thinking_tokens",
                     "max_thinking_tokens", shown if shown is not None else str(bad))
    chat = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    other = f"k{rng.randrange(1000)}"
    for served in (strict, loose):
        for path, body in (("/v1/chat/completions", chat), ("/v1/completions", {**chat, "prompt": "hi"})):
            _refused(served, path, {**body, "custom_params": {"thinking_budget": 4, other: 1}}, "custom_params",
                     other, "no custom logit processors")
            _refused(served, path, {**body, "custom_params": "thinking_budget=4"}, "custom_params",
                     "'thinking_budget=4'")
            _refused(served, path, {**body, "custom_params": {"thinking_budget": "4"}},
                     "custom_params.thinking_budget", "custom_params.thinking_budget='4' must be an integer")
        _refused(served, "/generate", {**gen, "sampling_params": {"custom_params": {other: 2}}}, "custom_params",
                 other)
    # Without strict thinking a budget would not be enforced: refused (the engine's rule), on every path to it.
    _refused(loose, "/v1/chat/completions", {**chat, "custom_params": {"thinking_budget": 9}},
             "custom_params.thinking_budget", "thinking_budget=9 needs strict thinking", "--enable-strict-thinking")
    _refused(loose, "/generate", {**gen, "sampling_params": {"custom_params": {"thinking_budget": 9}}},
             "custom_params.thinking_budget", "needs strict thinking")


def _get(app, path: str) -> dict:
    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t", timeout=60) as c:
            return await c.get(path)

    r = asyncio.run(go())
    assert r.status_code == 200, r.text
    return r.json()


def test_server_info_and_the_launch_flag(strict, loose, capsys):
    for served, on in ((strict, True), (loose, False)):
        info = _get(served.app, "/get_server_info")
        assert info["enable_strict_thinking"] is on and info["args"]["enable_strict_thinking"] is on
    argv = ["--model-path", "/m", "--reasoning-parser", "kimi_k2"]
    assert engine_kwargs(build_parser().parse_args([*argv, "--enable-strict-thinking"]))["enable_strict_thinking"]
    assert "enable_strict_thinking" not in engine_kwargs(build_parser().parse_args(argv))
    # --backend sglang: SGLang's own flag, handed on as written.
    assert "--enable-strict-thinking" not in NATIVE_ONLY_FLAGS
    assert sglang_argv([*argv, "--enable-strict-thinking"]) == [*argv, "--enable-strict-thinking"]
    # The engine's refusal names the flag (no reasoning parser), before any weight loads.
    assert main(["--backend", "native", "--model-path", strict.engine.args.model_path, "--device", "cpu",
                 "--enable-strict-thinking"]) == 2
    err = capsys.readouterr().err
    assert "cannot start the engine" in err and "--enable-strict-thinking" in err and "reasoning_parser" in err, err
