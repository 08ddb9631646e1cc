"""Findings of an audit of the HTTP endpoints against SGLang 0.5.23's (sglang/srt/entrypoints/http_server.py and
openai/protocol.py, serving_*.py), as a client written for SGLang meets them:

- ``POST /abort_request`` (``{"rid"}`` or ``{"abort_all": true}``) was a 404. SGLang ends every request whose rid
  starts with the given one, and each answers what it generated so far with finish_reason type ``abort``.
- ``rid`` on /v1/completions and /v1/chat/completions was dropped unread (SGLang passes it on as the request id,
  which /abort_request then names).
- SGLang's OpenAI fields this server cannot honour (``return_hidden_states``, ``lora_path``, ``return_token_ids``,
  ...) were dropped unread: the client got a reply without what it asked for. Now a 400 naming the field; their
  neutral values pass.
- ``model`` left out was a 400; SGLang's requests default it to ``"default"``.
- ``/server_info`` (SGLang's name; ``/get_server_info`` is its deprecated alias) and ``/ready`` were 404s;
  ``/get_model_info`` lacked SGLang's newer fields (model_type, architectures, the parsers).
- An unknown model's 404 had type ``not_found_error``; OpenAI and SGLang answer ``invalid_request_error``.
"""

from __future__ import annotations

import asyncio
import json
import threading

import httpx
import pytest

from sglang_eagle3.server import EngineDriver, ServerConfig, create_app

from .conftest import spec_engine

MODEL = "tiny"
CHAT = [{"role": "user", "content": "The quick brown fox"}]


@pytest.fixture(scope="module")
def engine(tiny_model):
    with spec_engine(tiny_model, max_running_requests=4) as eng:
        yield eng


@pytest.fixture
def served(engine):
    """(app, driver) over the module's engine; the driver is stopped after the test."""
    driver = EngineDriver(engine, max_inflight=8)
    app = create_app(engine, driver, ServerConfig(served_model_name=MODEL))
    driver.start()
    yield app, driver
    driver.stop()


def _client(app) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t", timeout=60)


def _call(app, method: str, path: str, json_body=None) -> httpx.Response:
    async def go():
        async with _client(app) as c:
            return await c.request(method, path, json=json_body)

    return asyncio.run(go())


def _events(r: httpx.Response) -> list:
    """The SSE data payloads of a stream, [DONE] included."""
    out = []
    for line in r.text.splitlines():
        if line.startswith("data: "):
            data = line[len("data: "):]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


async def _held(driver: EngineDriver, client: httpx.AsyncClient, requests: list[tuple[str, dict]], abort: dict,
                inflight: int) -> list[httpx.Response]:
    """Sends ``requests`` while the engine thread is held (so none has run a step), waits until ``inflight`` of
    their engine requests are queued, posts /abort_request ``abort``, then lets the engine go: the aborted ones
    end in the waiting queue, as SGLang's ``Abort in waiting queue``."""
    gate = threading.Event()
    hold = asyncio.ensure_future(driver.call(gate.wait, 60))
    try:
        sent = [asyncio.ensure_future(client.post(path, json=body)) for path, body in requests]
        for _ in range(600):
            if driver.inflight >= inflight:
                break
            await asyncio.sleep(0.05)
        assert driver.inflight == inflight
        r = await client.post("/abort_request", json=abort)
        assert r.status_code == 200 and r.content == b"", r.text
    finally:
        gate.set()
    await hold
    return list(await asyncio.gather(*sent))


def test_abort_request_ends_named_requests_with_finish_reason_abort(served, engine):
    """SGLang's /abort_request {"rid"}: the named request (and those whose rid starts with it: a chat's n samples
    <rid>_<j>) answers 200 with finish_reason abort; the others run to their end; every KV page comes back."""
    app, driver = served
    free = engine.get_server_info()["kv_pages_free"]

    async def go():
        async with _client(app) as c:
            return await _held(driver, c, [
                ("/v1/chat/completions", {"model": MODEL, "messages": CHAT, "max_tokens": 8, "n": 2, "rid": "job-1",
                                          "temperature": 0}),
                ("/v1/completions", {"model": MODEL, "prompt": "Pack my box", "max_tokens": 5, "temperature": 0,
                                     "rid": "other"}),
                ("/generate", {"text": "Sphinx", "rid": "job-1-gen", "stream": True,
                               "sampling_params": {"max_new_tokens": 8, "temperature": 0}}),
            ], {"rid": "job-1"}, inflight=4)

    chat, other, gen = asyncio.run(go())
    assert chat.status_code == 200, chat.text
    assert [c["finish_reason"] for c in chat.json()["choices"]] == ["abort", "abort"]
    assert chat.json()["usage"]["completion_tokens"] == 0
    assert other.status_code == 200 and other.json()["choices"][0]["finish_reason"] == "length"
    events = _events(gen)
    assert events[-1] == "[DONE]"
    assert events[-2]["meta_info"]["finish_reason"]["type"] == "abort"
    assert events[-2]["meta_info"]["id"] == "job-1-gen"
    assert engine.get_server_info()["kv_pages_free"] == free


def test_abort_all_and_nothing_named(served):
    """abort_all ends every request in flight (streams too: their finish chunk says abort, then [DONE]); an empty
    body names nothing and aborts nothing (SGLang ignores it); a rid that is not a string is a 400."""
    app, driver = served

    async def go():
        async with _client(app) as c:
            nothing = await _held(driver, c, [("/v1/completions", {"model": MODEL, "prompt": "Pack", "max_tokens": 3,
                                                                    "temperature": 0})], {}, inflight=1)
            everything = await _held(driver, c, [
                ("/v1/completions", {"model": MODEL, "prompt": "Pack", "max_tokens": 3, "stream": True,
                                     "stream_options": {"include_usage": True}}),
                ("/v1/chat/completions", {"model": MODEL, "messages": CHAT, "max_tokens": 3, "stream": True}),
            ], {"abort_all": True}, inflight=2)
            return nothing, everything

    (kept,), (completion, chat) = asyncio.run(go())
    assert kept.json()["choices"][0]["finish_reason"] == "length"
    for r in (completion, chat):
        events = _events(r)
        assert events[-1] == "[DONE]"
        finals = [e for e in events[:-1] if e["choices"] and e["choices"][0]["finish_reason"] is not None]
        assert [e["choices"][0]["finish_reason"] for e in finals] == ["abort"]
    assert _events(completion)[-2]["usage"]["completion_tokens"] == 0
    bad = _call(app, "POST", "/abort_request", {"rid": 5})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "rid"


def test_abort_request_keeps_the_tokens_generated_so_far(served, engine):
    """A request aborted while it runs answers the tokens it has (as SGLang's running-batch abort): its text is the
    decode of its output_ids, fewer than it asked for, and its logprob rows one per token."""
    app, driver = served
    tok = engine.tokenizer

    async def go():
        req = engine.make_request("The quick brown", {"max_new_tokens": 200, "temperature": 0, "ignore_eos": True},
                                  None, True, None, 0, "running-1")
        sub = driver.submit([req])
        updates = sub.updates()
        first = await updates.__anext__()
        gate = threading.Event()
        hold = asyncio.ensure_future(driver.call(gate.wait, 60))  # at most one more step before the abort
        driver.abort_by_client("running")
        gate.set()
        await hold
        rest = [u async for u in updates]
        return first, rest[-1]

    first, final = asyncio.run(go())
    assert not first.finished and first.new_ids
    assert final.finished and final.error is None
    out = final.result
    assert out["meta_info"]["finish_reason"]["type"] == "abort"
    assert len(first.new_ids) <= len(out["output_ids"]) < 200
    assert out["text"] == tok.decode(out["output_ids"])
    assert len(out["meta_info"]["output_token_logprobs"]) == len(out["output_ids"])


@pytest.mark.parametrize("path, body", [
    ("/v1/completions", {"prompt": "Pack my box"}),
    ("/v1/chat/completions", {"messages": CHAT}),
])
@pytest.mark.parametrize("field, value", [
    ("return_hidden_states", True), ("lora_path", "my-adapter"), ("return_token_ids", True),
    ("custom_logit_processor", "{}"), ("priority", 3), ("session_params", {"id": "s"}),
])
def test_sglang_openai_fields_it_cannot_honour_are_a_400(served, path, body, field, value):
    """SGLang's OpenAI requests carry these fields; dropped unread, the reply lacked what the client asked for."""
    app, _ = served
    r = _call(app, "POST", path, {"model": MODEL, "max_tokens": 2, **body, field: value})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == field


@pytest.mark.parametrize("path, body", [
    ("/v1/completions", {"prompt": "Pack my box"}),
    ("/v1/chat/completions", {"messages": CHAT}),
])
def test_model_may_be_left_out_and_neutral_sglang_fields_pass(served, path, body):
    """SGLang's requests default ``model`` to "default" (which this server serves); code written for SGLang sends
    its fields' defaults explicitly."""
    app, _ = served
    neutral = {"return_hidden_states": False, "lora_path": None, "return_token_ids": False, "priority": None,
               "rid": None}
    r = _call(app, "POST", path, {"max_tokens": 2, "temperature": 0, **body, **neutral})
    assert r.status_code == 200, r.text
    assert r.json()["model"] == "default"


def test_server_info_ready_and_model_not_found(served):
    """SGLang 0.5.23 serves /server_info (/get_server_info is its deprecated alias) and /ready; an unknown model is
    a 404 of type invalid_request_error, code model_not_found (OpenAI's and SGLang's)."""
    app, _ = served
    info = _call(app, "GET", "/server_info")
    assert info.status_code == 200, info.text
    assert set(info.json()) == set(_call(app, "GET", "/get_server_info").json())
    assert _call(app, "GET", "/ready").status_code == 200
    for r in (_call(app, "GET", "/v1/models/nope"),
              _call(app, "POST", "/v1/chat/completions", {"model": "nope", "messages": CHAT})):
        assert r.status_code == 404
        err = r.json()["error"]
        assert (err["type"], err["code"], err["param"]) == ("invalid_request_error", "model_not_found", "model")


def test_model_info_has_sglangs_fields(served, tiny_model):
    """SGLang 0.5.23's /model_info adds reasoning_parser, tool_call_parser, disaggregation_mode, model_type and
    architectures (config.json's) to the older fields; a client reading them got a KeyError here."""
    app, _ = served
    with open(f"{tiny_model.target}/config.json") as f:
        hf = json.load(f)
    for path in ("/get_model_info", "/model_info"):
        info = _call(app, "GET", path).json()
        assert info["model_type"] == hf["model_type"]
        assert info["architectures"] == hf["architectures"]
        assert (info["reasoning_parser"], info["tool_call_parser"], info["disaggregation_mode"]) == (None, None,
                                                                                                    "null")


@pytest.mark.parametrize("path, body", [
    ("/v1/chat/completions", {"messages": CHAT, "n": 2}),
    ("/v1/completions", {"prompt": ["Pack my box", "Sphinx of"], "n": 2}),
    ("/v1/completions", {"prompt": "Pack my box", "stream": True}),
])
def test_the_response_id_is_what_abort_request_takes(served, monkeypatch, path, body):
    """SGLang answers with the request's rid as the response id, so a client aborts what it reads there; ours were
    chatcmpl- / cmpl- ids no engine request had, and /abort_request with them aborted nothing. Without a rid, the
    response's id is the one prefix of its engine requests (which /abort_request matches: the abort tests above);
    with one, the id is the client's rid."""
    app, driver = served
    seen = []
    real = driver.submit

    def submit(reqs, *args, **kwargs):
        seen.append([r.rid for r in reqs])
        return real(reqs, *args, **kwargs)

    monkeypatch.setattr(driver, "submit", submit)
    req = {"model": MODEL, "max_tokens": 3, "temperature": 0, **body}
    r = _call(app, "POST", path, req)
    assert r.status_code == 200, r.text
    ids = {e["id"] for e in _events(r) if e != "[DONE]"} if body.get("stream") else {r.json()["id"]}
    (cid,) = ids
    (rids,) = seen
    assert len(rids) == body.get("n", 1) * (len(body["prompt"]) if isinstance(body.get("prompt"), list) else 1)
    assert all(rid == cid or rid.startswith(cid + "_") for rid in rids), (cid, rids)
    r = _call(app, "POST", path, {**req, "rid": "mine"})
    assert r.status_code == 200
    assert (r.json()["id"] if not body.get("stream") else _events(r)[0]["id"]) == "mine"
    assert all(rid == "mine" or rid.startswith("mine_") for rid in seen[1])
