"""Unlucky and adversarial clients on real sockets against the live server: clients that leave while sending their
body or while their request runs, and many requests of which some are dropped. Each ends with the engine as it
was: no request running or queued, every KV page free, nothing logged as an error."""

from __future__ import annotations

import json
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from sglang_eagle3.tokenizer import load_tokenizer

from .conftest import CONTEXT
from .test_server import _wait_pages_free, server_info

MODEL = "tiny"


@pytest.fixture(scope="module")
def tok(tiny_model):
    return load_tokenizer(tiny_model.target)


def _send_head(port: int, path: str, head: str, body: bytes = b"") -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    s.sendall(f"POST {path} HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n{head}\r\n".encode() + body)
    return s


def _post_raw(port: int, path: str, body: dict) -> socket.socket:
    data = json.dumps(body).encode()
    return _send_head(port, path, f"Content-Length: {len(data)}\r\n", data)


def _log_since(server, offset: int) -> str:
    return server.log()[offset:]


def _idle(info: dict) -> bool:
    return (info["kv_pages_free"] == info["kv_pages_total"] and info["running_requests"] == 0
            and info["waiting_requests"] == 0 and info["server_stats"]["inflight_requests"] == 0)


def test_disconnect_while_the_body_is_sent_is_not_an_error(server):
    """A client that goes away halfway through its body (a declared length or chunked) was logged as a 500 with
    a traceback. It is a client leaving: one info line, nothing queued, no error."""
    offset = len(server.log())
    cases = [(path, "Content-Length: 1000\r\n", b'{"model": "tiny", "prompt": "The qu')
             for path in ("/generate", "/v1/completions", "/v1/chat/completions")]
    cases.append(("/generate", "Transfer-Encoding: chunked\r\n", b'9\r\n{"text": "\r\n'))
    for path, head, part in cases:
        s = _send_head(server.port, path, head, part)
        time.sleep(0.1)  # the handler is reading the body now
        s.close()
    deadline = time.monotonic() + 10
    while _log_since(server, offset).count("disconnected before its request body was complete") < len(cases):
        assert time.monotonic() < deadline, _log_since(server, offset)
        time.sleep(0.05)
    log = _log_since(server, offset)
    assert "ERROR" not in log and "Traceback" not in log, log
    assert _idle(server_info(server.url))
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200


def test_disconnect_while_waiting_for_a_non_streaming_answer_aborts_it(server):
    before = server_info(server.url)["server_stats"]["aborted_requests"]
    body = {"model": MODEL, "prompt": "The quick", "max_tokens": 200, "ignore_eos": True, "temperature": 0}
    s = _post_raw(server.port, "/v1/completions", body)
    deadline = time.monotonic() + 30
    while True:  # until the request holds KV pages in the running batch
        info = server_info(server.url)
        if info["running_requests"] == 1 and info["kv_pages_free"] < info["kv_pages_total"]:
            break
        assert time.monotonic() < deadline, info
        time.sleep(0.02)
    s.close()
    after = _wait_pages_free(server.url)
    assert _idle(after), after
    assert after["server_stats"]["aborted_requests"] == before + 1


def test_many_requests_some_dropped_leave_the_engine_idle(server):
    """Streaming and non-streaming requests at once, every third dropped by its client at a different point
    (before the answer, after a few bytes of it): the others are answered in full, the engine ends idle."""
    offset = len(server.log())

    def one(i: int):
        body = {"model": MODEL, "prompt": f"Sphinx {i}", "max_tokens": 40, "ignore_eos": True, "temperature": 0,
                "stream": i % 2 == 0}
        if i % 3 == 0:
            s = _post_raw(server.port, "/v1/completions", body)
            if i % 2 == 0:
                s.recv(100)  # the stream's headers have come: drop it mid-stream
            s.close()
            return "dropped"
        r = httpx.post(server.url + "/v1/completions", json=body, timeout=120)
        assert r.status_code == 200, r.text
        if body["stream"]:
            assert r.text.endswith("data: [DONE]\n\n"), r.text[-200:]
        else:
            assert r.json()["usage"]["completion_tokens"] == 40
        return r.status_code

    with ThreadPoolExecutor(12) as pool:
        results = list(pool.map(one, range(12)))
    assert results.count(200) == 8
    after = _wait_pages_free(server.url)
    assert _idle(after), after
    log = _log_since(server, offset)
    assert "ERROR" not in log and "Traceback" not in log, log


def test_one_request_cannot_ask_for_unbounded_work(server):
    """By default a request may not ask for more than 20 top logprobs a position (a long output with all of a
    163840-token vocabulary's is gigabytes of response) nor for more than 128 stop strings (100000 of them, a
    1.4 MB body, slowed every step of the whole batch by ~35 ms): 400, naming the value and the limit, and the
    error does not echo the list."""
    r = httpx.post(server.url + "/generate", timeout=60,
                   json={"input_ids": [5, 6], "return_logprob": True, "logprob_start_len": 0,
                         "top_logprobs_num": 21, "sampling_params": {"max_new_tokens": 2}})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "top_logprobs_num" and "max_top_logprobs_num=20" in err["message"], err
    stop = [f"stop string {i}" for i in range(100_000)]
    r = httpx.post(server.url + "/v1/completions", timeout=60, json={"model": MODEL, "prompt": "The", "stop": stop})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "stop" and "stop=[100000 strings]" in err["message"], err
    assert "max_stop_strings=128" in err["message"] and len(r.content) < 1000, err
    assert _idle(server_info(server.url))


def test_a_stop_string_before_min_tokens_is_text(server, tok):
    """Stop strings are not looked for in the first min_tokens - 1 tokens, so an occurrence there is text. The
    scheduler's stop check (the last 16+ tokens' text) found that occurrence again at token min_tokens and ended
    the request there, and the final text was cut at it: shorter than min_tokens tokens, and shorter than the
    stream had already shown."""
    prompt, sp = "The quick brown", {"max_new_tokens": 30, "temperature": 0}
    base = httpx.post(server.url + "/generate", json={"text": prompt, "sampling_params": sp}, timeout=60).json()
    ids = base["output_ids"]
    # A stop string that the greedy output holds early: token i's text, new at token i.
    i, stop = next((i, s) for i in range(1, 8) if (s := tok.decode(ids[i:i + 1])).strip()
                   and "\ufffd" not in s and s not in tok.decode(ids[:i]))
    low = i + 4
    out = httpx.post(server.url + "/generate", timeout=60, json={
        "text": prompt, "sampling_params": {**sp, "stop": [stop], "min_new_tokens": low}}).json()
    assert len(out["output_ids"]) > low and out["output_ids"] == ids[:len(out["output_ids"])], (out, ids)
    assert stop in out["text"] and base["text"].startswith(out["text"]), (stop, out["text"])
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 30, "temperature": 0, "stop": [stop], "min_tokens": low}
    plain = httpx.post(server.url + "/v1/completions", json=body, timeout=60).json()["choices"][0]
    assert plain["text"] == out["text"], (plain, out["text"])
    r = httpx.post(server.url + "/v1/completions", json={**body, "stream": True}, timeout=60)
    chunks = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == out["text"]


def test_min_tokens_is_cut_with_the_default_max_tokens(server):
    """Chat without max_tokens gets what the prompt leaves; min_tokens above that was a 400 naming a
    max_new_tokens the client never sent, where the engine (and SGLang) cut min_new_tokens with its own default.
    A prompt too long was answered with a min_tokens error. The limit is named as the client names it."""
    chat = {"model": MODEL, "temperature": 0, "min_tokens": 200,
            "messages": [{"role": "user", "content": "The quick brown fox jumps over the lazy dog. " * 9}]}
    r = httpx.post(server.url + "/v1/chat/completions", json=chat, timeout=60)
    assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    assert usage["completion_tokens"] < 200 and usage["total_tokens"] > CONTEXT - 8, usage
    long = {**chat, "messages": [{"role": "user", "content": "The quick brown fox. " * 80}]}
    err = httpx.post(server.url + "/v1/chat/completions", json=long, timeout=60).json()["error"]
    assert err["code"] == "context_length_exceeded" and err["param"] == "messages", err
    for path, body, name in [
            ("/v1/chat/completions", {**chat, "max_tokens": 20}, "max_tokens=20"),
            ("/v1/chat/completions", {**chat, "max_completion_tokens": 20}, "max_completion_tokens=20"),
            ("/v1/completions", {"model": MODEL, "prompt": "The", "min_tokens": 20}, "max_tokens=16")]:
        err = httpx.post(server.url + path, json=body, timeout=60).json()["error"]
        assert err["param"] == "min_tokens" and name in err["message"], err


def test_errors_never_echo_a_clients_megabytes(server):
    """A value of a megabyte in a field the server names in its error (a penalty, a sampling parameter's name, the
    model, tool_choice, a rid) came back whole in the message. Every error now stays short and still names the
    field."""
    big, chat = "x" * 1_000_000, {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    sp = {"max_new_tokens": 2}
    cases = [
        ("/generate", {"input_ids": [5], "sampling_params": {**sp, "frequency_penalty": big}}, "frequency_penalty"),
        ("/generate", {"input_ids": [5], "sampling_params": {**sp, "min_new_tokens": big}}, "min_new_tokens"),
        ("/generate", {"input_ids": [5], "sampling_params": {**sp, "seed": big}}, "seed"),
        ("/generate", {"input_ids": [5], "sampling_params": {**sp, big: 1}}, "sampling_params"),
        ("/generate", {"input_ids": [5], "sampling_params": {**sp, **{f"k{i}": 1 for i in range(50_000)}}},
         "sampling_params"),
        ("/generate", {"input_ids": [5], "sampling_params": {**sp, "spaces_between_special_tokens": big}},
         "spaces_between_special_tokens"),
        ("/generate", {"input_ids": [[5], [6]], "rid": [big, big], "sampling_params": sp}, "rid"),
        ("/v1/completions", {"model": MODEL, "prompt": "a", "logit_bias": {big: 1}}, "logit_bias"),
        ("/v1/completions", {"model": MODEL, "prompt": "a", "logit_bias": {big: "x"}}, None),
        ("/v1/completions", {"model": big, "prompt": "a"}, "model"),
        ("/v1/chat/completions", {**chat, "tool_choice": big}, "tool_choice"),
        ("/v1/chat/completions", {**chat, "response_format": {"type": big}}, "response_format.type"),
    ]
    for path, body, param in cases:
        r = httpx.post(server.url + path, json=body, timeout=60)
        assert r.status_code in (400, 404) and len(r.content) < 2000, (path, param, r.status_code, len(r.content))
        err = r.json()["error"]
        assert param is None or err["param"] == param, err
    assert _idle(server_info(server.url))
