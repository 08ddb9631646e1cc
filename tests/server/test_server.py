"""End to end against a real server subprocess (CPU, tiny random EAGLE-3 pair): the openai SDK for the OpenAI
endpoints, plain HTTP for /generate, continuous batching, the bad-input matrix and client disconnects."""

from __future__ import annotations

import json
import re
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from .conftest import CONTEXT, running_server

MODEL = "tiny"
PROMPTS = [f"{w} quick brown fox {i}" for i, w in enumerate(
    ["The", "A", "Pack", "How", "Sphinx", "Jump", "Judge", "Box", "Lazy", "Dog", "Five", "Dozen", "Black", "Vow",
     "Daft", "Zebra"])]


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def sse_events(response: httpx.Response) -> list:
    """The JSON payloads of an SSE body, with the final [DONE] kept as the string."""
    events = []
    for line in response.iter_lines():
        if line.startswith("data: "):
            data = line[len("data: "):]
            events.append(data if data == "[DONE]" else json.loads(data))
    return events


def server_info(url: str) -> dict:
    r = httpx.get(url + "/get_server_info", timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


# -- basics -----------------------------------------------------------------------------------------------

def test_health_models_and_info(server, client):
    r = httpx.get(server.url + "/health")
    assert r.status_code == 200
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    info = server_info(server.url)
    assert info["model"]["context_length"] == CONTEXT
    assert info["draft"]["num_steps"] == 3
    assert info["server"]["served_model_name"] == MODEL
    assert info["kv_pages_free"] <= info["kv_pages_total"]


def test_generate_text_and_input_ids(server, tiny_model):
    sp = {"max_new_tokens": 12, "temperature": 0}
    r = httpx.post(server.url + "/generate", json={"text": "The quick brown fox", "sampling_params": sp}, timeout=60)
    assert r.status_code == 200, r.text
    out = r.json()
    assert len(out["output_ids"]) == 12
    meta = out["meta_info"]
    assert meta["completion_tokens"] == 12 and meta["finish_reason"]["type"] == "length"
    assert meta["spec_verify_ct"] >= 1  # EAGLE-3 rounds ran
    ids = list(range(5, 5 + meta["prompt_tokens"]))
    r2 = httpx.post(server.url + "/generate", json={"input_ids": ids, "sampling_params": sp,
                                                    "return_logprob": True, "top_logprobs_num": 2}, timeout=60)
    assert r2.status_code == 200, r2.text
    meta2 = r2.json()["meta_info"]
    assert len(meta2["output_token_logprobs"]) == 12
    assert all(len(top) == 2 for top in meta2["output_top_logprobs"])
    # A batch: one result per prompt, each equal to its own single request.
    r3 = httpx.post(server.url + "/generate", json={"text": ["The quick brown fox", "Pack my box"],
                                                    "sampling_params": sp}, timeout=60)
    assert r3.status_code == 200, r3.text
    batch = r3.json()
    assert isinstance(batch, list) and len(batch) == 2
    assert batch[0]["output_ids"] == out["output_ids"]


def test_generate_stream_is_cumulative_and_matches(server):
    body = {"text": "Sphinx of black quartz", "sampling_params": {"max_new_tokens": 20, "temperature": 0}}
    full = httpx.post(server.url + "/generate", json=body, timeout=60).json()
    with httpx.stream("POST", server.url + "/generate", json={**body, "stream": True}, timeout=60) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        events = sse_events(r)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert len(chunks) > 1
    for a, b in zip(chunks, chunks[1:], strict=False):  # SGLang's stream: every chunk is cumulative
        assert b["output_ids"][: len(a["output_ids"])] == a["output_ids"]
        assert b["text"].startswith(a["text"])
    assert chunks[-1]["output_ids"] == full["output_ids"] and chunks[-1]["text"] == full["text"]
    assert chunks[-1]["meta_info"]["finish_reason"]["type"] == "length"


# -- OpenAI SDK -----------------------------------------------------------------------------------------------

def test_completions_nonstream_and_stream(client):
    res = client.completions.create(model=MODEL, prompt="How vexingly quick", max_tokens=16, temperature=0)
    choice = res.choices[0]
    assert choice.finish_reason == "length"
    assert res.usage.completion_tokens == 16 and res.usage.total_tokens == res.usage.prompt_tokens + 16
    stream = client.completions.create(model=MODEL, prompt="How vexingly quick", max_tokens=16, temperature=0,
                                       stream=True, stream_options={"include_usage": True})
    text, reasons, usage = "", [], None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            text += c.text
            reasons.append(c.finish_reason)
    assert text == choice.text
    assert reasons[-1] == "length" and all(r is None for r in reasons[:-1])
    assert usage is not None and usage.completion_tokens == 16


def test_completions_token_prompt_and_batch(client):
    one = client.completions.create(model=MODEL, prompt=[10, 20, 30, 40], max_tokens=8, temperature=0)
    batch = client.completions.create(model=MODEL, prompt=[[10, 20, 30, 40], [50, 60]], max_tokens=8, temperature=0)
    assert [c.index for c in batch.choices] == [0, 1]
    assert batch.choices[0].text == one.choices[0].text
    assert batch.usage.prompt_tokens == 6 and batch.usage.completion_tokens == 16


def test_chat_nonstream_and_stream(client):
    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a fox."}]
    res = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=16, temperature=0)
    msg = res.choices[0].message
    assert msg.role == "assistant" and isinstance(msg.content, str)
    assert res.choices[0].finish_reason == "length" and res.usage.completion_tokens == 16
    assert res.object == "chat.completion" and res.id.startswith("chatcmpl-")
    stream = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=16, temperature=0,
                                            stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == msg.content
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 16


def test_stop_strings_trim_stream_and_nonstream(client):
    base = client.completions.create(model=MODEL, prompt="Judge my vow", max_tokens=24, temperature=0).choices[0].text
    # A stop string from the middle of the greedy output (skipping replacement characters a random model emits).
    start = next(i for i in range(4, len(base) - 2) if "\ufffd" not in base[i:i + 2])
    stop = base[start:start + 2]
    cut = base[: base.index(stop)]
    res = client.completions.create(model=MODEL, prompt="Judge my vow", max_tokens=24, temperature=0, stop=[stop])
    assert res.choices[0].text == cut and res.choices[0].finish_reason == "stop"
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=MODEL, prompt="Judge my vow", max_tokens=24, temperature=0, stop=stop, stream=True) if c.choices)
    assert streamed == cut


def test_stop_regex_trims_stream_and_nonstream(client, server, tiny_model):
    """SGLang's stop_regex (an OpenAI extension there, extra_body here): the streamed text never shows the start of
    the match (held back by the pattern's longest match) and joins to the non-streaming text."""
    from sglang_eagle3.tokenizer import load_tokenizer

    tok = load_tokenizer(tiny_model.target)
    ids = tok.encode("Judge my vow")
    out = httpx.post(server.url + "/generate", json={"input_ids": ids, "sampling_params": {
        "max_new_tokens": 24, "temperature": 0}}, timeout=60).json()["output_ids"]
    base = tok.decode(out)
    # A pattern whose match spans three tokens (one a round here: the tiny draft is seldom accepted), so that a
    # stream not holding it back would show its start before it completes.
    i = next(i for i in range(3, len(out) - 3)
             if all(tok.decode([t]).strip() and "\ufffd" not in tok.decode([t]) for t in out[i:i + 3]))
    pattern = "".join(f"(?:{re.escape(tok.decode([t]))})" for t in out[i:i + 3])
    m = next(m for m in re.finditer(pattern, base))
    kw = dict(model=MODEL, prompt="Judge my vow", max_tokens=24, temperature=0, extra_body={"stop_regex": pattern})
    res = client.completions.create(**kw).choices[0]
    assert res.text == base[:m.start()] and res.finish_reason == "stop"
    streamed = "".join(c.choices[0].text for c in client.completions.create(**kw, stream=True) if c.choices)
    assert streamed == res.text


def test_seeded_sampling_repeats(client):
    kw = dict(model=MODEL, prompt="Five dozen", max_tokens=16, temperature=1.0, top_p=0.9, seed=1234)
    a = client.completions.create(**kw).choices[0].text
    b = client.completions.create(**kw).choices[0].text
    assert a == b


# -- continuous batching ----------------------------------------------------------------------------------------

def test_16_concurrent_greedy_equal_sequential(server, client):
    def complete(prompt: str, stream: bool) -> str:
        kw = dict(model=MODEL, prompt=prompt, max_tokens=24, temperature=0)
        if not stream:
            return client.completions.create(**kw).choices[0].text
        return "".join(c.choices[0].text for c in client.completions.create(**kw, stream=True) if c.choices)

    decode_steps = 'sglang:step_latency_seconds_count{phase="decode"}'
    s0 = metric_samples(server.url)[decode_steps]
    sequential = [complete(p, False) for p in PROMPTS]
    s1 = metric_samples(server.url)[decode_steps]
    with ThreadPoolExecutor(len(PROMPTS)) as pool:  # half of them streaming
        futures = [pool.submit(complete, p, i % 2 == 1) for i, p in enumerate(PROMPTS)]
        concurrent = [f.result(timeout=120) for f in futures]
    s2 = metric_samples(server.url)[decode_steps]
    assert concurrent == sequential
    # They shared steps: far fewer decode rounds than one request at a time.
    assert s2 - s1 < (s1 - s0) / 2, (s0, s1, s2)
    info = server_info(server.url)
    assert info["running_requests"] == 0 and info["kv_pages_free"] == info["kv_pages_total"]


# -- bad input --------------------------------------------------------------------------------------------------

_CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
_LONG_TEXT = "quick brown fox " * 200  # far more tokens than the 256-token context

BAD_INPUTS = [
    # (id, method, path, body (dict, or bytes sent as-is), status, param)
    ("chat-negative-max-tokens", "POST", "/v1/chat/completions", {**_CHAT, "max_tokens": -1}, 400, "max_tokens"),
    ("chat-huge-max-tokens", "POST", "/v1/chat/completions", {**_CHAT, "max_tokens": 10**9}, 400, "max_tokens"),
    ("chat-negative-temperature", "POST", "/v1/chat/completions", {**_CHAT, "temperature": -0.5}, 400, "temperature"),
    ("chat-top-p-zero", "POST", "/v1/chat/completions", {**_CHAT, "top_p": 0}, 400, "top_p"),
    ("chat-top-p-above-one", "POST", "/v1/chat/completions", {**_CHAT, "top_p": 1.5}, 400, "top_p"),
    ("chat-n-0", "POST", "/v1/chat/completions", {**_CHAT, "n": 0}, 400, "n"),
    ("chat-max-tokens-string", "POST", "/v1/chat/completions", {**_CHAT, "max_tokens": "8"}, 400, "max_tokens"),
    ("chat-messages-string", "POST", "/v1/chat/completions", {**_CHAT, "messages": "hi"}, 400, "messages"),
    ("chat-bad-role", "POST", "/v1/chat/completions", {**_CHAT, "messages": [{"role": "x", "content": "hi"}]}, 400,
     "messages.0.role"),
    ("chat-no-messages", "POST", "/v1/chat/completions", {**_CHAT, "messages": []}, 400, "messages"),
    ("chat-unknown-model", "POST", "/v1/chat/completions", {**_CHAT, "model": "gpt-9"}, 404, "model"),
    ("chat-prompt-too-long", "POST", "/v1/chat/completions",
     {**_CHAT, "messages": [{"role": "user", "content": _LONG_TEXT}]}, 400, "messages"),
    ("chat-malformed-json", "POST", "/v1/chat/completions", b'{"model": "tiny", "messages": [', 400, None),
    ("chat-empty-body", "POST", "/v1/chat/completions", b"", 400, None),
    ("chat-body-not-object", "POST", "/v1/chat/completions", b"[1, 2]", 400, None),
    ("completion-ids-outside-vocab", "POST", "/v1/completions", {"model": MODEL, "prompt": [1, 2, 10**6]}, 400,
     "prompt"),
    ("completion-prompt-too-long", "POST", "/v1/completions", {"model": MODEL, "prompt": _LONG_TEXT}, 400, "prompt"),
    ("completion-negative-max-tokens", "POST", "/v1/completions", {"model": MODEL, "prompt": "a", "max_tokens": -5},
     400, "max_tokens"),
    ("completion-stream-wrong-type", "POST", "/v1/completions", {"model": MODEL, "prompt": "a", "stream": "yes"},
     400, "stream"),
    ("completion-prompt-wrong-type", "POST", "/v1/completions", {"model": MODEL, "prompt": {"text": "a"}}, 400,
     "prompt"),
    ("completion-temperature-wrong-type", "POST", "/v1/completions",
     {"model": MODEL, "prompt": "a", "temperature": "hot"}, 400, "temperature"),
    ("completion-empty-prompt", "POST", "/v1/completions", {"model": MODEL, "prompt": ""}, 400, "prompt"),
    ("generate-ids-outside-vocab", "POST", "/generate", {"input_ids": [1, 2, 10**6]}, 400, "input_ids"),
    ("generate-negative-id", "POST", "/generate", {"input_ids": [1, -2]}, 400, "input_ids"),
    ("generate-prompt-too-long", "POST", "/generate", {"input_ids": [5] * (CONTEXT + 10)}, 400, "input_ids"),
    ("generate-negative-max-new-tokens", "POST", "/generate",
     {"text": "a", "sampling_params": {"max_new_tokens": -1}}, 400, "max_new_tokens"),
    ("generate-huge-max-new-tokens", "POST", "/generate",
     {"text": "a", "sampling_params": {"max_new_tokens": 10**9}}, 400, "max_new_tokens"),
    ("generate-negative-temperature", "POST", "/generate",
     {"text": "a", "sampling_params": {"temperature": -1}}, 400, "temperature"),
    ("generate-top-p-above-one", "POST", "/generate", {"text": "a", "sampling_params": {"top_p": 2.0}}, 400, "top_p"),
    ("generate-unknown-sampling-param", "POST", "/generate", {"text": "a", "sampling_params": {"beam": 4}}, 400,
     "sampling_params"),
    ("generate-text-and-ids", "POST", "/generate", {"text": "a", "input_ids": [1]}, 400, "text"),
    ("generate-no-prompt", "POST", "/generate", {"sampling_params": {}}, 400, "text"),
    ("generate-text-wrong-type", "POST", "/generate", {"text": 123}, 400, "text"),
    ("generate-bad-logprob-start", "POST", "/generate", {"text": "a", "return_logprob": True,
                                                         "logprob_start_len": -7}, 400, "logprob_start_len"),
    ("unknown-route", "GET", "/v2/everything", None, 404, None),
    ("unknown-model-card", "GET", "/v1/models/gpt-9", None, 404, "model"),
    # OpenAI: user / system / tool messages need content; an assistant's only with tool_calls; no empty parts.
    ("chat-user-no-content", "POST", "/v1/chat/completions", {**_CHAT, "messages": [{"role": "user"}]}, 400,
     "messages.0.content"),
    ("chat-user-null-content", "POST", "/v1/chat/completions",
     {**_CHAT, "messages": [{"role": "user", "content": None}]}, 400, "messages.0.content"),
    ("chat-user-empty-parts", "POST", "/v1/chat/completions",
     {**_CHAT, "messages": [{"role": "user", "content": []}]}, 400, "messages.0.content"),
    ("chat-assistant-no-content", "POST", "/v1/chat/completions",
     {**_CHAT, "messages": [{"role": "user", "content": "hi"}, {"role": "assistant"}]}, 400, "messages.1.content"),
    ("chat-huge-max-completion-tokens", "POST", "/v1/chat/completions", {**_CHAT, "max_completion_tokens": 10**9},
     400, "max_completion_tokens"),
    ("chat-empty-stop", "POST", "/v1/chat/completions", {**_CHAT, "stop": ""}, 400, "stop"),
    ("chat-repetition-penalty", "POST", "/v1/chat/completions", {**_CHAT, "repetition_penalty": 2.5}, 400,
     "repetition_penalty"),
    ("chat-frequency-penalty", "POST", "/v1/chat/completions", {**_CHAT, "frequency_penalty": -2.1}, 400,
     "frequency_penalty"),
    ("completion-min-tokens", "POST", "/v1/completions", {"model": MODEL, "prompt": "a", "min_tokens": 17}, 400,
     "min_tokens"),
    ("completion-logit-bias-range", "POST", "/v1/completions",
     {"model": MODEL, "prompt": "a", "logit_bias": {"5": 150}}, 400, "logit_bias"),
    ("completion-logit-bias-key", "POST", "/v1/completions",
     {"model": MODEL, "prompt": "a", "logit_bias": {"five": 1}}, 400, "logit_bias"),
    ("completion-logit-bias-vocab", "POST", "/v1/completions",
     {"model": MODEL, "prompt": "a", "logit_bias": {"10000000": 1}}, 400, "logit_bias"),
    ("completion-huge-max-tokens", "POST", "/v1/completions", {"model": MODEL, "prompt": "a", "max_tokens": 10**9},
     400, "max_tokens"),
    # In a batch the bad prompt is named by its index.
    ("completion-batch-empty-item", "POST", "/v1/completions", {"model": MODEL, "prompt": ["a", ""]}, 400,
     "prompt.1"),
    ("generate-batch-id-outside-vocab", "POST", "/generate", {"input_ids": [[1, 2], [3, 10**6]]}, 400,
     "input_ids.1"),
    ("generate-batch-duplicate-rid", "POST", "/generate", {"text": ["a", "b"], "rid": ["x", "x"]}, 400, "rid"),
    ("generate-rid-list-for-one-prompt", "POST", "/generate", {"text": "a", "rid": ["x"]}, 400, "rid"),
    ("generate-empty-stop", "POST", "/generate", {"text": "a", "sampling_params": {"stop": [""]}}, 400, "stop"),
    # SGLang's penalties: their ranges (test_penalties_through_both_apis for values within them).
    ("generate-frequency-penalty", "POST", "/generate", {"text": "a", "sampling_params": {"frequency_penalty": 2.5}},
     400, "frequency_penalty"),
    ("generate-presence-penalty-bool", "POST", "/generate",
     {"text": "a", "sampling_params": {"presence_penalty": False}}, 400, "presence_penalty"),
    ("generate-repetition-penalty", "POST", "/generate", {"text": "a", "sampling_params": {"repetition_penalty": 0}},
     400, "repetition_penalty"),
    ("generate-min-new-tokens", "POST", "/generate", {"text": "a", "sampling_params": {"min_new_tokens": -4}}, 400,
     "min_new_tokens"),
    ("generate-no-spaces-between-special-tokens", "POST", "/generate",
     {"text": "a", "sampling_params": {"spaces_between_special_tokens": False}}, 400,
     "spaces_between_special_tokens"),
    ("flush-cache-wrong-method", "PUT", "/flush_cache", None, 405, None),
]


@pytest.mark.parametrize("method,path,body,status,param", [b[1:] for b in BAD_INPUTS], ids=[b[0] for b in BAD_INPUTS])
def test_bad_input_gets_documented_status(server, method, path, body, status, param):
    kw = {"content": body, "headers": {"content-type": "application/json"}} if isinstance(body, bytes) else \
        {"json": body} if body is not None else {}
    r = httpx.request(method, server.url + path, timeout=30, **kw)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    assert err["param"] == param, err


def _error(r: httpx.Response, status: int = 400) -> dict:
    assert r.status_code == status, r.text
    return r.json()["error"]


def test_max_tokens_error_names_the_clients_field(server):
    """The engine's "max_new_tokens=..." refusal comes back in the endpoint's own field name, with OpenAI's code."""
    cases = [("/v1/chat/completions", {**_CHAT, "max_tokens": 10**9}, "max_tokens"),
             ("/v1/chat/completions", {**_CHAT, "max_completion_tokens": 10**9}, "max_completion_tokens"),
             ("/v1/completions", {"model": MODEL, "prompt": "a", "max_tokens": 10**9}, "max_tokens"),
             ("/generate", {"text": "a", "sampling_params": {"max_new_tokens": 10**9}}, "max_new_tokens")]
    for path, body, field in cases:
        err = _error(httpx.post(server.url + path, json=body, timeout=30))
        assert err["param"] == field and err["code"] == "context_length_exceeded", err
        assert err["message"].startswith(f"{field}=1000000000 with a prompt of "), err
        assert "at most" in err["message"]


def test_batch_errors_name_the_prompt(server):
    err = _error(httpx.post(server.url + "/v1/completions", json={"model": MODEL, "prompt": ["a", "b", ""]},
                            timeout=30))
    assert err["param"] == "prompt.2" and err["message"].startswith("prompt 2 of the batch: "), err
    err = _error(httpx.post(server.url + "/generate", json={"text": ["a", "b"], "rid": ["x", "x"]}, timeout=30))
    assert err["message"] == "duplicate rid 'x' within the batch", err


def test_one_rid_for_a_batch_names_each_prompt(server):
    """SGLang (io_struct._normalize_rid): a string rid for a batch becomes <rid>_<i>."""
    r = httpx.post(server.url + "/generate", json={"text": ["a", "b"], "rid": "job",
                                                   "sampling_params": {"max_new_tokens": 2}}, timeout=60)
    assert r.status_code == 200, r.text
    assert [o["meta_info"]["id"] for o in r.json()] == ["job_0", "job_1"]


def test_generate_accepts_neutral_sglang_params(server):
    sp = {"max_new_tokens": 8, "temperature": 0}
    plain = httpx.post(server.url + "/generate", json={"text": "Pack my box", "sampling_params": sp}, timeout=60)
    neutral = {**sp, "frequency_penalty": 0.0, "presence_penalty": 0, "repetition_penalty": 1.0,
               "min_new_tokens": 0, "spaces_between_special_tokens": True}
    r = httpx.post(server.url + "/generate", json={"text": "Pack my box", "sampling_params": neutral}, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["output_ids"] == plain.json()["output_ids"]
    nulls = {**sp, "frequency_penalty": None, "repetition_penalty": None}
    assert httpx.post(server.url + "/generate", json={"text": "a", "sampling_params": nulls},
                      timeout=60).status_code == 200


def test_penalties_through_both_apis(server):
    """frequency / presence / repetition_penalty, min_tokens (min_new_tokens) and logit_bias reach the engine from
    /v1/completions as from /generate (the same tokens for the same values), change the output, and a token
    biased to the top is all a greedy request emits."""
    body = {"model": MODEL, "prompt": "Pack my box", "max_tokens": 12, "temperature": 0, "frequency_penalty": 1.5,
            "presence_penalty": -0.5, "repetition_penalty": 1.3, "min_tokens": 10, "logit_bias": {"40": 3.0}}
    oa = httpx.post(server.url + "/v1/completions", json=body, timeout=60)
    assert oa.status_code == 200, oa.text
    sp = {"max_new_tokens": 12, "temperature": 0, "frequency_penalty": 1.5, "presence_penalty": -0.5,
          "repetition_penalty": 1.3, "min_new_tokens": 10, "logit_bias": {"40": 3.0}}
    gen = httpx.post(server.url + "/generate", json={"text": "Pack my box", "sampling_params": sp}, timeout=60).json()
    assert oa.json()["choices"][0]["text"] == gen["text"]
    plain = httpx.post(server.url + "/generate", json={"text": "Pack my box", "sampling_params": {
        "max_new_tokens": 12, "temperature": 0}}, timeout=60).json()
    assert gen["output_ids"] != plain["output_ids"]
    forced = httpx.post(server.url + "/generate", json={"text": "Pack my box", "sampling_params": {
        "max_new_tokens": 5, "temperature": 0, "logit_bias": {"40": 100}}}, timeout=60).json()
    assert forced["output_ids"] == [40] * 5
    # min_tokens holds back a stop string the output meets at once.
    stop = plain["text"][:3]
    assert stop.strip()
    short = httpx.post(server.url + "/v1/completions", json={**body, "stop": [stop], "min_tokens": None,
                                                             "frequency_penalty": None, "presence_penalty": None,
                                                             "repetition_penalty": None, "logit_bias": None},
                       timeout=60).json()
    held = httpx.post(server.url + "/v1/completions", json={"model": MODEL, "prompt": "Pack my box", "max_tokens": 12,
                                                            "temperature": 0, "stop": [stop], "min_tokens": 8},
                      timeout=60).json()
    assert short["usage"]["completion_tokens"] < 8 <= held["usage"]["completion_tokens"], (short, held)


def test_head_health_model_info_and_flush_cache(server):
    assert httpx.head(server.url + "/health").status_code == 200
    info = httpx.get(server.url + "/get_model_info", timeout=30).json()
    assert info["is_generation"] is True and info["served_model_name"] == MODEL
    assert info["model_path"] == info["tokenizer_path"] == server_info(server.url)["model"]["path"]
    assert httpx.get(server.url + "/model_info", timeout=30).json() == info
    for method in ("GET", "POST"):
        r = httpx.request(method, server.url + "/flush_cache", timeout=30)
        assert r.status_code == 200 and "no prefix cache" in r.text


def test_huge_top_k_leaves_other_requests_alone(server):
    """A top_k past the sampler's integer range (2**63) once failed the whole engine step: every request in
    flight got a 500. It reads as "all tokens" (SGLang's meaning of a top_k of the vocabulary or more), while a
    stream in flight runs to its end."""
    body = {"text": "The quick", "stream": True, "sampling_params": {"max_new_tokens": 200, "temperature": 0}}
    with httpx.stream("POST", server.url + "/generate", json=body, timeout=60) as stream:
        assert stream.status_code == 200
        lines = stream.iter_lines()
        first = next(line for line in lines if line.startswith("data: "))
        assert json.loads(first[len("data: "):])["meta_info"]["completion_tokens"] < 200  # still running
        r = httpx.post(server.url + "/generate", json={"text": "a", "sampling_params": {
            "top_k": 2**63, "temperature": 1.0, "max_new_tokens": 4}}, timeout=60)
        assert r.status_code == 200 and r.json()["meta_info"]["completion_tokens"] == 4, r.text
        events = [line[len("data: "):] for line in lines if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    last = json.loads(events[-2])
    assert "error" not in last, last
    assert last["meta_info"]["finish_reason"]["type"] == "length" and len(last["output_ids"]) == 200


def test_server_survives_bad_input(server, client):
    for _, method, path, body, _status, _param in BAD_INPUTS[:5]:
        httpx.request(method, server.url + path, json=body, timeout=30)
    assert httpx.get(server.url + "/health").status_code == 200
    res = client.completions.create(model=MODEL, prompt="still alive", max_tokens=4, temperature=0)
    assert res.usage.completion_tokens == 4
    with pytest.raises(openai.BadRequestError) as e:  # the SDK sees OpenAI-shaped errors
        client.completions.create(model=MODEL, prompt="x", max_tokens=-1)
    assert e.value.status_code == 400
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-9", messages=[{"role": "user", "content": "hi"}])


# -- disconnects and metrics --------------------------------------------------------------------------------------

def _wait_pages_free(url: str, timeout: float = 10.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        info = server_info(url)
        if info["kv_pages_free"] == info["kv_pages_total"] and info["running_requests"] == 0:
            return info
        if time.monotonic() > deadline:
            return info
        time.sleep(0.05)


@pytest.mark.parametrize("path,body", [
    ("/v1/chat/completions", {**_CHAT, "max_tokens": 200, "stream": True}),
    ("/generate", {"text": "The quick", "sampling_params": {"max_new_tokens": 200}, "stream": True}),
], ids=["chat", "generate"])
def test_dropped_stream_frees_kv_pages(server, path, body):
    before = server_info(server.url)
    aborted = before["server_stats"]["aborted_requests"]
    with httpx.stream("POST", server.url + path, json=body, timeout=60) as r:
        assert r.status_code == 200
        seen = 0
        for line in r.iter_lines():
            seen += line.startswith("data: ")
            if seen == 3:
                during = server_info(server.url)
                assert during["kv_pages_free"] < during["kv_pages_total"]  # the request holds pages now
                break
    # Leaving the block closes the connection mid-stream.
    after = _wait_pages_free(server.url)
    assert after["kv_pages_free"] == after["kv_pages_total"], after
    assert after["running_requests"] == 0 and after["waiting_requests"] == 0
    assert after["server_stats"]["aborted_requests"] == aborted + 1


def metric_samples(url: str) -> dict[str, float]:
    r = httpx.get(url + "/metrics", timeout=30)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    samples = {}
    for line in r.text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    return samples


def metric_sum(samples: dict[str, float], metric: str, /, **labels: str) -> float | None:
    """The sum over the series of ``metric`` whose labels include ``labels`` (SGLang's metrics carry model_name,
    engine_type, ... besides); None when there is none."""
    found = [v for k, v in samples.items() if (k == metric or k.startswith(metric + "{"))
             and labels.items() <= dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', k[len(metric):])).items()]
    return sum(found) if found else None


def test_metrics_prometheus_text(server):
    httpx.post(server.url + "/generate", json={"text": "metrics", "sampling_params": {"max_new_tokens": 8}}, timeout=60)
    samples = metric_samples(server.url)
    for name in ("sglang:prompt_tokens_total", "sglang:generation_tokens_total", "sglang:spec_verify_forwards_total",
                 "sglang:num_queue_reqs", "sglang:kv_pages_free", "sglang:spec_accept_length_per_round_count"):
        assert metric_sum(samples, name) is not None, name
    for name, labels in (("sglang:num_requests_total", {"outcome": "finished"}),
                         ("sglang:forward_total", {"name": "target_verify", "path": "eager"}),
                         ("sglang:step_latency_seconds_count", {"phase": "decode"})):
        assert metric_sum(samples, name, **labels) is not None, (name, labels)
    assert metric_sum(samples, "sglang:generation_tokens_total") >= 8
    assert samples["sglang:spec_verify_forwards_total"] == samples["sglang:spec_accept_length_per_round_count"] > 0
    assert samples['sglang:forward_total{name="target_verify",path="graph"}'] == 0  # CPU: no CUDA graphs


def test_server_speculative_adaptive(server, tiny_model, tmp_path):
    """--speculative-adaptive: the policy's state in /get_server_info (its timed round costs, the k it chose) and
    /metrics (sglang:spec_num_steps, sglang:spec_adaptive_switches_total), and the output of a greedy request
    equal to the non-adaptive server's (the session's)."""
    body = {"text": "The quick brown fox", "sampling_params": {"max_new_tokens": 40, "temperature": 0}}
    with running_server(tiny_model, str(tmp_path), "--speculative-adaptive") as srv:
        r = httpx.post(srv.url + "/generate", json=body, timeout=60)
        assert r.status_code == 200, r.text
        info = httpx.get(srv.url + "/get_server_info", timeout=30).json()
        samples = metric_samples(srv.url)
    ad = info["adaptive"]
    assert ad["candidates"] == [0, 1, 3, 5] and ad["rounds"] > 0
    assert sorted(ad["round_ms"]) == ["0", "1", "3", "5", "catch_up", "decode", "sampled"]  # (JSON keys)
    assert sorted(ad["round_ms"]["sampled"]) == ["0", "1", "3", "5", "catch_up", "decode"]
    assert metric_sum(samples, "sglang:spec_num_steps") == info["speculative_num_steps"] == ad["num_steps"]
    assert samples["sglang:spec_adaptive_switches_total"] == ad["switches"]
    fixed = httpx.post(server.url + "/generate", json=body, timeout=60)
    assert r.json()["output_ids"] == fixed.json()["output_ids"]


def test_server_over_worker_processes(tiny_model, tmp_path):
    """The same server over the TP code path (the scheduler in a spawned worker behind add/abort/step)."""
    with running_server(tiny_model, str(tmp_path), "--use-worker-processes", "--served-model-name", MODEL) as srv:
        body = {"text": "The quick brown fox", "sampling_params": {"max_new_tokens": 12, "temperature": 0}}
        r = httpx.post(srv.url + "/generate", json=body, timeout=60)
        assert r.status_code == 200, r.text
        assert len(r.json()["output_ids"]) == 12
        with httpx.stream("POST", srv.url + "/generate", json={**body, "stream": True,
                                                                "sampling_params": {"max_new_tokens": 200}},
                          timeout=60) as s:
            seen = 0
            for line in s.iter_lines():
                seen += line.startswith("data: ")
                if seen == 3:
                    break
        after = _wait_pages_free(srv.url)
        assert after["kv_pages_free"] == after["kv_pages_total"] and after["running_requests"] == 0
