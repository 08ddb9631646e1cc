"""Requests and flags found wrong in an audit of the server as a client uses it: SGLang's ``max_new_tokens: null``,
completions on a server without a tokenizer, a ``response_format`` without a type, and an ``--api-key`` (or
``--served-model-name``) that is empty."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys

import httpx
import pytest
import torch

from sglang_eagle3.engine import Engine
from sglang_eagle3.launch_server import build_parser, server_config
from sglang_eagle3.server import EngineDriver, ServerConfig, create_app
from sglang_eagle3.server.config import ServerConfigError

from .conftest import CONTEXT

MODEL = "tiny"


def _error(r: httpx.Response, status: int = 400) -> dict:
    assert r.status_code == status, r.text
    return r.json()["error"]


def test_generate_null_max_new_tokens_is_what_the_prompt_leaves(server):
    """SGLang reads ``"max_new_tokens": null`` as no limit but the context's (its scheduler cuts it to what the prompt
    leaves); it was a 400 "max_new_tokens=None must be an integer". It gets exactly the most an explicit value may
    ask for: the boundary is found by asking (that many is accepted, one more refused), not computed here."""
    ids = [5] * (CONTEXT - 60)
    sp = {"temperature": 0}
    post = lambda body: httpx.post(server.url + "/generate", json=body, timeout=120)  # noqa: E731
    err = _error(post({"input_ids": ids, "sampling_params": {**sp, "max_new_tokens": CONTEXT}}))
    most = int(re.search(r"at most (\d+) new tokens", err["message"])[1])
    assert 0 < most < 60, err
    assert post({"input_ids": ids, "sampling_params": {**sp, "max_new_tokens": most + 1}}).status_code == 400
    explicit = post({"input_ids": ids, "sampling_params": {**sp, "max_new_tokens": most}})
    assert explicit.status_code == 200, explicit.text
    r = post({"input_ids": ids, "sampling_params": {**sp, "max_new_tokens": None}})
    assert r.status_code == 200, r.text
    out = r.json()
    # (the tiny model has no EOS: it runs to its limit)
    assert out["meta_info"]["completion_tokens"] == most and out["output_ids"] == explicit.json()["output_ids"]
    # Per prompt of a batch, and left out it stays SGLang's default (128, cut to what the prompt leaves).
    r = post({"input_ids": [ids, [5, 6]], "sampling_params": [{**sp, "max_new_tokens": None}, sp]})
    assert r.status_code == 200, r.text
    assert [o["meta_info"]["completion_tokens"] for o in r.json()] == [most, 128]


def test_response_format_without_a_type_is_a_400(server):
    """OpenAI, vLLM and SGLang require response_format.type; one without it was read as plain text, so a schema sent
    in a malformed object was dropped without a word."""
    base = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    schema = {"name": "x", "schema": {"type": "object"}}
    for fmt in ({}, {"type": None}, {"json_schema": schema}):
        err = _error(httpx.post(server.url + "/v1/chat/completions", json={**base, "response_format": fmt},
                                timeout=60))
        assert err["param"] == "response_format.type" and "type" in err["message"], (fmt, err)
    ok = httpx.post(server.url + "/v1/chat/completions", json={**base, "response_format": {"type": "text"}},
                    timeout=60)
    assert ok.status_code == 200, ok.text


@pytest.fixture(scope="module")
def tokenizerless(tiny_model):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    engine = Engine(model_path=tiny_model.target, speculative_algorithm="EAGLE3", skip_tokenizer_init=True,
                    speculative_draft_model_path=tiny_model.draft, speculative_num_steps=3, device="cpu",
                    max_running_requests=2)
    driver = EngineDriver(engine, max_inflight=8)
    app = create_app(engine, driver, ServerConfig(served_model_name=MODEL))
    driver.start()
    yield app
    driver.stop()
    engine.shutdown()
    torch.set_num_threads(threads)


def _post(app, path: str, body: dict) -> httpx.Response:
    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t", timeout=60) as c:
            return await c.post(path, json=body)

    return asyncio.run(go())


def test_completions_without_a_tokenizer_is_a_400(tokenizerless):
    """With --skip-tokenizer-init a token prompt's completion came back 200 with "" for text, whatever was
    generated: the tokens were thrown away. It is a 400 naming the flag (as chat is); /generate answers the ids."""
    for body in ({"model": MODEL, "prompt": [5, 6, 7], "max_tokens": 3},
                 {"model": MODEL, "prompt": [[5, 6], [7]], "max_tokens": 3, "stream": True}):
        err = _error(_post(tokenizerless, "/v1/completions", body))
        assert err["param"] == "prompt" and "--skip-tokenizer-init" in err["message"], err
    r = _post(tokenizerless, "/generate", {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 3}})
    assert r.status_code == 200 and len(r.json()["output_ids"]) == 3, r.text


def test_generate_text_in_logprobs_needs_a_tokenizer(tokenizerless):
    """SGLang's return_text_in_logprobs without a tokenizer: no text to give, a 400 naming the field (SGLang fails
    on an assertion); logprobs alone still answer, with null text."""
    body = {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 2}, "return_logprob": True}
    err = _error(_post(tokenizerless, "/generate", {**body, "return_text_in_logprobs": True}))
    assert err["param"] == "return_text_in_logprobs" and "--skip-tokenizer-init" in err["message"], err
    r = _post(tokenizerless, "/generate", body)
    assert r.status_code == 200 and [row[2] for row in r.json()["meta_info"]["output_token_logprobs"]] == [None] * 2


@pytest.mark.parametrize("argv,says", [
    (["--api-key", ""], "api_key is empty"),
    (["--api-key", " sekret"], "whitespace"),
    (["--api-key", "sekret\n"], "whitespace"),
    (["--served-model-name", ""], "served_model_name must not be empty"),
])
def test_empty_api_key_or_served_name_is_refused(argv, says):
    """``--api-key "$KEY"`` with KEY unset served everyone without a word (an empty key turned authentication
    off); a key with surrounding whitespace could never be sent. An empty --served-model-name was silently
    replaced by the default. Each is refused before the engine loads, and the key is not written to the log."""
    with pytest.raises(ServerConfigError, match=says) as e:
        server_config(build_parser().parse_args(argv))
    if argv[0] == "--api-key" and argv[1].strip():
        assert argv[1].strip() not in str(e.value)


def test_empty_api_key_stops_the_launcher():
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-m", "sglang_eagle3.launch_server", "--port", "0", "--api-key", ""],
                         capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 2, out.stderr[-2000:]
    assert "api_key is empty" in out.stderr and "Uvicorn running" not in out.stderr, out.stderr[-2000:]


@pytest.mark.parametrize("field,value", [
    ("image_data", "https://example.com/cat.png"), ("image_data", [None, "data:image/png;base64,AAAA"]),
    ("lora_path", "/adapters/x"), ("return_hidden_states", True), ("input_embeds", [[0.5, 0.25]]),
    ("token_ids_logprob", [5, 6]), ("custom_logit_processor", "{}"), ("session_params", {"id": "s"}),
])
def test_generate_refuses_sglang_fields_it_cannot_honour(server, field, value):
    """SGLang's /generate takes images, LoRA adapters, hidden states, ...; here they were dropped without a word
    (an image missing from the prompt, an adapter not applied). Set, they are a 400 naming the field; null, false
    or a list of nulls (SGLang's "not given", per prompt) is accepted."""
    texts = ["The quick", "Pack my"] if isinstance(value, list) and field == "image_data" else "The quick"
    body = {"text": texts, "sampling_params": {"max_new_tokens": 2}}
    err = _error(httpx.post(server.url + "/generate", json={**body, field: value}, timeout=60))
    assert err["param"] == field and field in err["message"], err
    unset = [None] * len(texts) if isinstance(texts, list) else False if field == "return_hidden_states" else None
    r = httpx.post(server.url + "/generate", json={**body, field: unset, "return_text_in_logprobs": True}, timeout=60)
    assert r.status_code == 200, r.text


def _stream_text(r: httpx.Response, chat: bool) -> str:
    assert r.status_code == 200 and r.text.endswith("data: [DONE]\n\n"), r.text[-300:]
    chunks = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
    if chat:
        return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    return "".join(c["choices"][0]["text"] for c in chunks if c["choices"])


def test_openai_endpoints_take_sglangs_no_stop_trim(server):
    """SGLang's OpenAI endpoints take ``no_stop_trim`` (and ``skip_special_tokens``); here they were ignored: the
    stop string was cut from the text all the same. Kept, the text runs through the stop string, streamed or not."""
    base = {"model": MODEL, "prompt": "The quick brown", "max_tokens": 30, "temperature": 0}
    full = httpx.post(server.url + "/v1/completions", json=base, timeout=60).json()["choices"][0]["text"]
    i = next(i for i in range(2, len(full) - 3) if full[i:i + 3].isprintable() and "\ufffd" not in full[i:i + 3]
             and full[i:i + 3].strip() and full[i:i + 3] not in full[:i + 2])
    stop = full[i:i + 3]
    cut = httpx.post(server.url + "/v1/completions", json={**base, "stop": [stop]}, timeout=60).json()["choices"][0]
    assert cut["text"] == full[:i] and cut["matched_stop"] == stop, (cut, stop)
    body = {**base, "stop": [stop], "no_stop_trim": True}
    kept = httpx.post(server.url + "/v1/completions", json=body, timeout=60).json()["choices"][0]
    assert kept["text"].startswith(full[:i] + stop) and full.startswith(kept["text"]), (kept, stop, full)
    assert kept["finish_reason"] == "stop" and kept["matched_stop"] == stop, kept
    streamed = httpx.post(server.url + "/v1/completions", json={**body, "stream": True}, timeout=60)
    assert _stream_text(streamed, chat=False) == kept["text"]
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "The quick"}], "max_tokens": 30,
            "temperature": 0}
    reply = httpx.post(server.url + "/v1/chat/completions", json=chat, timeout=60).json()
    text = reply["choices"][0]["message"]["content"]
    j = next(j for j in range(2, len(text) - 3) if text[j:j + 3].isprintable() and "\ufffd" not in text[j:j + 3]
             and text[j:j + 3].strip() and text[j:j + 3] not in text[:j + 2])
    chat["stop"], chat["no_stop_trim"] = [text[j:j + 3]], True
    kept = httpx.post(server.url + "/v1/chat/completions", json=chat, timeout=60).json()["choices"][0]["message"]
    assert kept["content"].startswith(text[:j + 3]) and text.startswith(kept["content"]), (kept, text)
    streamed = httpx.post(server.url + "/v1/chat/completions", json={**chat, "stream": True}, timeout=60)
    assert _stream_text(streamed, chat=True) == kept["content"]


def test_openai_endpoints_take_sglangs_skip_special_tokens(server, tiny_model):
    """``skip_special_tokens: false`` keeps special tokens in the text (SGLang's extension), and each token's
    text_offset is where its text starts in that text, special tokens counted, streamed or not."""
    from sglang_eagle3.tokenizer import load_tokenizer

    special = "<|bos|>"  # conftest's tokenizer: its one special token
    (tid,) = load_tokenizer(tiny_model.target).encode(special)
    base = {"model": MODEL, "prompt": "The quick", "max_tokens": 3, "temperature": 0, "logit_bias": {str(tid): 100}}
    plain = httpx.post(server.url + "/v1/completions", json=base, timeout=60).json()["choices"][0]
    assert plain["text"] == "", plain
    body = {**base, "skip_special_tokens": False, "logprobs": 0}
    kept = httpx.post(server.url + "/v1/completions", json=body, timeout=60).json()["choices"][0]
    assert kept["text"] == special * 3, kept
    assert kept["logprobs"]["text_offset"] == [0, len(special), 2 * len(special)], kept["logprobs"]
    r = httpx.post(server.url + "/v1/completions", json={**body, "stream": True}, timeout=60)
    assert _stream_text(r, chat=False) == special * 3
    chunks = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
    offsets = [o for c in chunks if c["choices"] for o in c["choices"][0]["logprobs"]["text_offset"]]
    assert offsets == [0, len(special), 2 * len(special)], offsets
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "temperature": 0,
            "logit_bias": {str(tid): 100}, "skip_special_tokens": False}
    reply = httpx.post(server.url + "/v1/chat/completions", json=chat, timeout=60).json()
    assert reply["choices"][0]["message"]["content"] == special * 3, reply
