"""Findings of an audit against SGLang's server and OpenAI's API, as a client meets them: CORS for browser clients
(SGLang allows every origin), the legacy ``functions`` / ``function_call`` fields and ``continue_final_message`` on
chat (were dropped unread), an empty ``rid`` (answered two ways), and JSON nested too deeply (was reported as "not
valid JSON: recursion limit exceeded")."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from sglang_eagle3.server import EngineDriver, ServerConfig, create_app

from .conftest import spec_engine

MODEL = "tiny"
KEY = "sekret"
ORIGIN = "https://app.example"


@pytest.fixture(scope="module")
def engine(tiny_model):
    with spec_engine(tiny_model, max_running_requests=2) as eng:
        yield eng


@pytest.fixture
def make_app(engine):
    """An app over the module's engine with the given ServerConfig fields (one driver at a time: stopped after the
    test)."""
    drivers = []

    def make(**cfg):
        driver = EngineDriver(engine, max_inflight=8)
        app = create_app(engine, driver, ServerConfig(served_model_name=MODEL, **cfg))
        driver.start()
        drivers.append(driver)
        return app

    yield make
    for d in drivers:
        d.stop()


def _call(app, method: str, path: str, *, json=None, content=None, headers=None) -> httpx.Response:
    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t", timeout=60) as c:
            return await c.request(method, path, json=json, content=content, headers=headers)

    return asyncio.run(go())


def _error(r: httpx.Response, status: int = 400) -> dict:
    assert r.status_code == status, r.text
    return r.json()["error"]


def _preflight(app, path: str) -> httpx.Response:
    return _call(app, "OPTIONS", path, headers={"Origin": ORIGIN, "Access-Control-Request-Method": "POST",
                                                "Access-Control-Request-Headers": "authorization, content-type"})


# -- CORS -------------------------------------------------------------------------------------------------------

def test_cors_allows_every_origin_as_sglang(make_app):
    """SGLang's app takes CORSMiddleware(allow_origins=["*"], allow_credentials=True, allow_methods=["*"],
    allow_headers=["*"]). A browser's preflight is answered for any origin (with credentials allowed the Fetch
    standard wants the origin itself, not "*"), and the answers carry the headers a browser needs to read them."""
    app = make_app()
    pre = _preflight(app, "/v1/chat/completions")
    assert pre.status_code == 200, pre.text
    assert pre.headers["access-control-allow-origin"] == ORIGIN
    assert pre.headers["access-control-allow-credentials"] == "true"
    assert "POST" in [m.strip() for m in pre.headers["access-control-allow-methods"].split(",")]
    allowed = [h.strip().lower() for h in pre.headers["access-control-allow-headers"].split(",")]
    assert "authorization" in allowed and "content-type" in allowed
    r = _call(app, "GET", "/v1/models", headers={"Origin": ORIGIN})
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] in ("*", ORIGIN), r.headers
    # (errors too: a browser client can read why it was refused)
    r = _call(app, "POST", "/v1/chat/completions", json={"model": "nope", "messages": []}, headers={"Origin": ORIGIN})
    assert r.status_code >= 400 and r.headers["access-control-allow-origin"] in ("*", ORIGIN), r.headers


def test_api_key_lets_preflight_through_and_still_guards_endpoints(make_app):
    """SGLang's API-key middleware passes every OPTIONS request (a preflight carries no Authorization header) and
    refuses the real endpoints without the key."""
    app = make_app(api_key=KEY)
    pre = _preflight(app, "/v1/chat/completions")
    assert pre.status_code == 200, pre.text
    assert pre.headers["access-control-allow-origin"] == ORIGIN
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    refused = _call(app, "POST", "/v1/chat/completions", json=body, headers={"Origin": ORIGIN})
    assert refused.status_code == 401 and refused.headers["access-control-allow-origin"] in ("*", ORIGIN)
    assert _call(app, "GET", "/v1/models").status_code == 401
    assert _call(app, "POST", "/generate", json={"text": "a"}).status_code == 401
    # An OPTIONS that is no preflight reaches no endpoint (none takes OPTIONS): no data without the key.
    bare = _call(app, "OPTIONS", "/v1/models")
    assert bare.status_code in (401, 405) and "data" not in bare.text, bare.text
    ok = _call(app, "GET", "/v1/models", headers={"Authorization": f"Bearer {KEY}", "Origin": ORIGIN})
    assert ok.status_code == 200 and ok.json()["data"][0]["id"] == MODEL
    assert ok.headers["access-control-allow-origin"] in ("*", ORIGIN)


def test_probes_answer_without_the_key(make_app):
    """/health, /ready and /metrics answer without the API key, as SGLang 0.5.23's auth lets them (Kubernetes probes
    and Prometheus carry no secret); their neighbours still want it."""
    app = make_app(api_key=KEY)
    for path in ("/health", "/ready", "/metrics"):
        assert _call(app, "GET", path).status_code == 200, path
    for path in ("/get_server_info", "/model_info", "/v1/models"):
        assert _call(app, "GET", path).status_code == 401, path


# -- chat fields ----------------------------------------------------------------------------------------------------

CHAT = [{"role": "user", "content": "The quick brown"}]
FUNCTION = {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}


@pytest.mark.parametrize(("field", "value"), [("functions", [FUNCTION]), ("function_call", {"name": "get_weather"}),
                                              ("function_call", "auto")])
def test_legacy_functions_are_refused_naming_the_field(make_app, field, value):
    """SGLang's ChatCompletionRequest has neither functions nor function_call (pydantic drops them): the answer is
    as if no function had been offered. Here a 400 naming the field."""
    app = make_app()
    body = {"model": MODEL, "messages": CHAT, "max_tokens": 2, field: value}
    err = _error(_call(app, "POST", "/v1/chat/completions", json=body))
    assert err["param"] == field and field in err["message"] and "tools" in err["message"], err
    # "none" (and null) ask for no function call, which is what the server does
    for neutral in ("none", None):
        r = _call(app, "POST", "/v1/chat/completions", json={**body, field: None, "function_call": neutral})
        assert r.status_code == 200, r.text


def test_continue_final_message_continues_the_assistant_text(make_app, engine):
    """SGLang's continue_final_message: the last assistant message is taken off, the rest rendered with the
    generation prompt, and its text appended; the reply is what follows. The prompt is built here from the
    tokenizer's template by that rule, and greedy /generate on it must give the chat's content."""
    app = make_app()
    tok = engine.tokenizer
    partial = "The lazy dog"
    messages = [*CHAT, {"role": "assistant", "content": partial}]
    want_ids = tok.encode(tok.apply_chat_template(CHAT, True) + partial, add_special_tokens=False)
    body = {"model": MODEL, "messages": messages, "max_tokens": 4, "temperature": 0, "continue_final_message": True}
    r = _call(app, "POST", "/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    res = r.json()
    assert res["usage"]["prompt_tokens"] == len(want_ids), res["usage"]
    gen = _call(app, "POST", "/generate", json={"input_ids": want_ids,
                                                  "sampling_params": {"max_new_tokens": 4, "temperature": 0}})
    assert gen.status_code == 200, gen.text
    assert res["choices"][0]["message"]["content"] == gen.json()["text"]
    # Without the flag the assistant message is a finished turn of the prompt (SGLang's default); with it but no
    # assistant message last, nothing is continued.
    plain = _call(app, "POST", "/v1/chat/completions", json={**body, "continue_final_message": False}).json()
    assert plain["usage"]["prompt_tokens"] != len(want_ids)
    alone = _call(app, "POST", "/v1/chat/completions", json={**body, "messages": CHAT}).json()
    assert alone["usage"]["prompt_tokens"] == len(tok.encode(tok.apply_chat_template(CHAT, True),
                                                             add_special_tokens=False))


def test_continue_final_message_with_a_reasoning_parser_is_a_400(make_app):
    """Whether the continued text is reasoning or answer depends on the text continued; not supported with the
    reasoning split: a 400 naming the field rather than a split that may be wrong."""
    app = make_app(reasoning_parser="qwen3")
    messages = [*CHAT, {"role": "assistant", "content": "<think>so"}]
    body = {"model": MODEL, "messages": messages, "max_tokens": 2, "continue_final_message": True}
    err = _error(_call(app, "POST", "/v1/chat/completions", json=body))
    assert err["param"] == "continue_final_message", err
    r = _call(app, "POST", "/v1/chat/completions", json={**body, "separate_reasoning": False})
    assert r.status_code == 200, r.text


# -- rid, JSON depth ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("prompt", "rid"), [("a", ""), (["a", "b"], ""), (["a", "b"], ["x", ""])])
def test_empty_rid_is_a_400(make_app, prompt, rid):
    """SGLang has no meaning for an empty rid (one prompt keeps "" as its id, a batch gets "_0", "_1"); it was a
    generated id for one prompt and "_0", "_1" for a batch here. Now a 400 naming rid, whatever the shape."""
    app = make_app()
    err = _error(_call(app, "POST", "/generate", json={"text": prompt, "rid": rid,
                                                        "sampling_params": {"max_new_tokens": 1}}))
    assert err["param"] == "rid" and "empty" in err["message"], err


def test_json_nested_too_deeply_says_so(make_app):
    """A body nested past the JSON parser's limit is a 400 that says it nests too deeply (it said "not valid JSON:
    recursion limit exceeded"); the limit it names is where bodies start being refused."""
    app = make_app()
    deep = lambda d: b'{"model": "tiny", "x": ' + b"[" * d + b"]" * d + b', "prompt": "a", "max_tokens": 1}'  # noqa: E731
    err = _error(_call(app, "POST", "/v1/completions", content=deep(1000),
                       headers={"Content-Type": "application/json"}))
    assert "nest" in err["message"] and "recursion" not in err["message"], err
    limit = int(next(w for w in err["message"].split() if w.isdigit()))
    r = _call(app, "POST", "/v1/completions", content=deep(limit), headers={"Content-Type": "application/json"})
    assert r.status_code == 200, r.text
    assert _error(_call(app, "POST", "/v1/completions", content=deep(limit + 1),
                        headers={"Content-Type": "application/json"}))["message"] == err["message"]
