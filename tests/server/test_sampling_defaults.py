"""SGLang 0.5.23's --sampling-defaults (default "model"): a chat request's unset temperature / top_p / top_k / min_p /
repetition_penalty take the checkpoint's generation_config.json values (entrypoints/openai/protocol.py
ChatCompletionRequest.to_sampling_params: "user value > model generation_config > OpenAI defaults"); /v1/completions
and /generate do not; "openai" turns it off. Checked on what the endpoint hands the engine, and end to end: a
generation_config.json of top_k 1 makes a chat request without sampling fields greedy."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil

import httpx
import pytest
import torch

from sglang_eagle3.engine import Engine
from sglang_eagle3.launch_server import build_parser, server_config
from sglang_eagle3.server import EngineDriver, ServerConfig, create_app

MODEL = "tiny"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "The quick brown"}], "max_tokens": 6}


@pytest.fixture(scope="module")
def engine(tiny_model, tmp_path_factory):
    """The tiny target with a generation_config.json of its own."""
    root = tmp_path_factory.mktemp("gencfg") / "target"
    shutil.copytree(tiny_model.target, root)
    (root / "generation_config.json").write_text(json.dumps({"eos_token_id": None, "top_k": 1, "min_p": 0.05,
                                                             "max_length": 4096}))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    eng = Engine(model_path=str(root), device="cpu", max_running_requests=2)
    yield eng
    eng.shutdown()
    torch.set_num_threads(threads)


def _app(engine, monkeypatch, **config):
    """An app over ``engine`` whose requests' sampling params are recorded as the endpoint hands them over."""
    seen: list[dict] = []
    make = engine.make_request

    def recording(prompt, sp, *args, **kw):
        seen.append(dict(sp or {}))
        return make(prompt, sp, *args, **kw)

    monkeypatch.setattr(engine, "make_request", recording)
    driver = EngineDriver(engine, max_inflight=8)
    app = create_app(engine, driver, ServerConfig(served_model_name=MODEL, **config))
    return app, driver, seen


def _post(app, path: str, body: dict) -> httpx.Response:
    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t", timeout=120) as c:
            return await c.post(path, json=body)

    return asyncio.run(go())


@contextlib.contextmanager
def _running(driver):
    driver.start()
    try:
        yield
    finally:
        driver.stop()


def test_chat_takes_the_model_defaults_where_the_client_sets_none(engine, monkeypatch):
    app, driver, seen = _app(engine, monkeypatch)
    with _running(driver):
        for body in (CHAT, {**CHAT, "top_k": None}, {**CHAT, "top_k": 5, "temperature": 0.5},
                     {**CHAT, "stream": True}):
            r = _post(app, "/v1/chat/completions", body)
            assert r.status_code == 200, r.text
        r = _post(app, "/v1/completions", {"model": MODEL, "prompt": "The quick", "max_tokens": 3})
        assert r.status_code == 200, r.text
        r = _post(app, "/generate", {"text": "The quick", "sampling_params": {"max_new_tokens": 3}})
        assert r.status_code == 200, r.text
    picked = [{k: sp.get(k) for k in ("temperature", "top_k", "min_p", "top_p")} for sp in seen]
    model = {"temperature": None, "top_k": 1, "min_p": 0.05, "top_p": None}
    assert picked == [model, model, {**model, "top_k": 5, "temperature": 0.5}, model,
                      dict.fromkeys(model), dict.fromkeys(model)], picked


def test_openai_defaults_leave_them_out(engine, monkeypatch):
    app, driver, seen = _app(engine, monkeypatch, sampling_defaults="openai")
    with _running(driver):
        assert _post(app, "/v1/chat/completions", CHAT).status_code == 200
    assert "top_k" not in seen[0] and "min_p" not in seen[0], seen


def test_model_defaults_decide_the_output(engine, monkeypatch):
    """top_k 1 from generation_config.json: a chat request without sampling fields answers as temperature 0 does
    (sampled at temperature 1 over the whole vocabulary otherwise)."""
    app, driver, _ = _app(engine, monkeypatch)
    with _running(driver):
        plain = [_post(app, "/v1/chat/completions", {**CHAT, "seed": s}).json() for s in (1, 2)]
        greedy = _post(app, "/v1/chat/completions", {**CHAT, "temperature": 0}).json()
    texts = {p["choices"][0]["message"]["content"] for p in plain}
    assert texts == {greedy["choices"][0]["message"]["content"]}, (texts, greedy)


def test_flag_reaches_the_server_config():
    p = build_parser()
    assert server_config(p.parse_args([])).sampling_defaults == "model"
    assert server_config(p.parse_args(["--sampling-defaults", "openai"])).sampling_defaults == "openai"
    with pytest.raises(SystemExit):
        p.parse_args(["--sampling-defaults", "vendor"])

