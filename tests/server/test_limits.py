"""The server's limits, against a server started with small ones: the request body cap (413), a batch larger than
may ever be in flight (400), a KV cache smaller than the context (the max_tokens limit stated is the one
delivered; no max_tokens is cut to it, not refused), the per-request caps on top_logprobs_num and stop strings
(400) and the API key's scheme."""

from __future__ import annotations

import re
import socket

import httpx
import pytest

from .conftest import running_server

KEY = "sekret"
AUTH = {"Authorization": f"Bearer {KEY}"}
MAX_BODY = 65536
POOL = 192  # KV-cache tokens: below the 256-token context
RUNNING, QUEUED = 2, 2
TOP_LOGPROBS, STOPS, STOP_LEN = 3, 4, 8


@pytest.fixture(scope="module")
def limited(tiny_model, tmp_path_factory):
    with running_server(tiny_model, str(tmp_path_factory.mktemp("limited_logs")), "--max-request-bytes",
                        str(MAX_BODY), "--max-total-tokens", str(POOL), "--max-running-requests", str(RUNNING),
                        "--max-queued-requests", str(QUEUED), "--api-key", KEY, "--served-model-name", "tiny",
                        "--max-top-logprobs-num", str(TOP_LOGPROBS), "--max-stop-strings", str(STOPS),
                        "--max-stop-str-len", str(STOP_LEN)) as srv:
        yield srv


def _post(srv, path: str, **kw) -> httpx.Response:
    return httpx.post(srv.url + path, headers=AUTH, timeout=60, **kw)


def _error(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text
    return r.json()["error"]


def _rejected_413(srv) -> int:
    return httpx.get(srv.url + "/get_server_info", headers=AUTH, timeout=30).json()["server_stats"][
        "rejected_requests"]["413"]


# -- the body cap -------------------------------------------------------------------------------------------------

def test_declared_oversized_body_is_refused_before_it_is_sent(limited):
    """A Content-Length over the cap is answered at once: the server does not wait for (or hold) the body."""
    with socket.create_connection(("127.0.0.1", limited.port), timeout=10) as s:
        s.sendall(f"POST /generate HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
                  f"Content-Type: application/json\r\nContent-Length: {10**9}\r\n\r\n".encode())
        answer = b""
        while not answer.endswith(b"}}"):  # the JSON error ends the answer; a server waiting for the body times out
            chunk = s.recv(65536)
            if not chunk:
                break
            answer += chunk
    text = answer.decode(errors="replace")
    assert text.startswith("HTTP/1.1 413"), text
    assert "request_too_large" in text and str(MAX_BODY) in text, text


def test_oversized_body_is_413_declared_or_chunked(limited):
    before = _rejected_413(limited)
    body = ('{"model": "tiny", "prompt": "' + "x" * (2 * MAX_BODY) + '"}').encode()
    err = _error(_post(limited, "/v1/completions", content=body), 413)
    assert err["code"] == "request_too_large" and str(MAX_BODY) in err["message"], err
    # No Content-Length (chunked): refused once the bytes received pass the cap.
    chunks = (body[i:i + 8192] for i in range(0, len(body), 8192))
    err = _error(_post(limited, "/v1/completions", content=chunks), 413)
    assert err["code"] == "request_too_large", err
    assert _rejected_413(limited) == before + 2
    # A body just under the cap is read as usual.
    ok = _post(limited, "/generate", json={"input_ids": [5] * 8, "sampling_params": {"max_new_tokens": 2}})
    assert ok.status_code == 200, ok.text


# -- batches ---------------------------------------------------------------------------------------------------------

def test_batch_that_can_never_be_admitted_is_400_not_503(limited):
    limit = RUNNING + QUEUED
    err = _error(_post(limited, "/generate", json={"text": ["a"] * (limit + 1)}), 400)
    assert err["param"] == "text" and err["code"] == "batch_too_large", err
    assert f"batch of {limit + 1} prompts" in err["message"] and f"at most {limit}" in err["message"], err
    err = _error(_post(limited, "/v1/completions", json={"model": "tiny", "prompt": [[5, 6]] * (limit + 1)}), 400)
    assert err["param"] == "prompt" and err["code"] == "batch_too_large", err
    ok = _post(limited, "/generate", json={"text": ["a"] * limit, "sampling_params": {"max_new_tokens": 2}})
    assert ok.status_code == 200 and len(ok.json()) == limit, ok.text
    # OpenAI's n counts: prompts x n requests, refused before any is tokenized, naming n.
    err = _error(_post(limited, "/v1/completions", json={"model": "tiny", "prompt": ["a", "b"], "n": 3}), 400)
    assert err["param"] == "n" and err["code"] == "batch_too_large", err
    assert "2 prompts x n=3 = 6 requests" in err["message"] and f"at most {limit}" in err["message"], err
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    err = _error(_post(limited, "/v1/chat/completions", json={**chat, "n": limit + 1}), 400)
    assert err["param"] == "n" and f"1 prompt x n={limit + 1} = {limit + 1} requests" in err["message"], err
    # /generate's n is sampling_params.n: the error names that field.
    err = _error(_post(limited, "/generate", json={"text": ["a", "b"], "sampling_params": {"n": 3}}), 400)
    assert err["param"] == "sampling_params.n" and "2 prompts x sampling_params.n=3" in err["message"], err
    ok = _post(limited, "/v1/completions", json={"model": "tiny", "prompt": ["a", "b"], "n": 2, "max_tokens": 2})
    assert ok.status_code == 200 and len(ok.json()["choices"]) == limit, ok.text


# -- max_tokens against a KV cache smaller than the context -----------------------------------------------------

def _stated_limit(err: dict) -> int:
    m = re.search(r"at most (\d+) new tokens", err["message"])
    assert m, err
    return int(m.group(1))


def test_stated_max_tokens_limit_is_what_is_delivered(limited):
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "Name a fox."}], "temperature": 0}
    err = _error(_post(limited, "/v1/chat/completions", json={**chat, "max_tokens": 10**6}), 400)
    assert err["param"] == "max_tokens" and err["code"] == "context_length_exceeded", err
    limit = _stated_limit(err)
    assert limit > 128  # above /generate's default, so a chat cut to that default would show here
    # No max_tokens: what the context and the KV cache leave, not an error (OpenAI's default for chat).
    r = _post(limited, "/v1/chat/completions", json=chat)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == limit and r.json()["choices"][0]["finish_reason"] == "length"
    r = _post(limited, "/v1/chat/completions", json={**chat, "max_tokens": limit})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == limit, r.text
    err = _error(_post(limited, "/v1/chat/completions", json={**chat, "max_tokens": limit + 1}), 400)
    assert _stated_limit(err) == limit


def test_completion_default_max_tokens_is_cut_to_what_fits(limited):
    """OpenAI's default of 16 is not the client's request: a prompt leaving fewer gets what is left, no error."""
    prompt = [5] * 100
    err = _error(_post(limited, "/v1/completions", json={"model": "tiny", "prompt": prompt, "max_tokens": 10**6}), 400)
    left = _stated_limit(err)
    long_prompt = [5] * (100 + left - 10)  # leaves 10 new tokens
    r = _post(limited, "/v1/completions", json={"model": "tiny", "prompt": long_prompt})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 10
    r = _post(limited, "/v1/completions", json={"model": "tiny", "prompt": prompt})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 16, r.text


# -- per-request caps: top_logprobs_num and stop strings (one request's cost falls on every other) -------------------

def test_top_logprobs_num_over_the_flag_is_400(limited):
    body = {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 2}, "return_logprob": True,
            "logprob_start_len": 0}
    err = _error(_post(limited, "/generate", json={**body, "top_logprobs_num": TOP_LOGPROBS + 1}), 400)
    assert err["param"] == "top_logprobs_num", err
    assert f"top_logprobs_num={TOP_LOGPROBS + 1}" in err["message"], err
    assert f"max_top_logprobs_num={TOP_LOGPROBS}" in err["message"], err
    err = _error(_post(limited, "/generate", json={**body, "input_ids": [[5], [6]],
                                                   "top_logprobs_num": [1, 10**6]}), 400)
    assert err["param"] == "top_logprobs_num" and "prompt 1 of the batch" in err["message"], err
    ok = _post(limited, "/generate", json={**body, "top_logprobs_num": TOP_LOGPROBS})
    assert ok.status_code == 200, ok.text
    assert [len(t) for t in ok.json()["meta_info"]["output_top_logprobs"]] == [TOP_LOGPROBS] * 2


def test_openai_logprobs_over_the_flag_are_400(limited):
    """The OpenAI fields that ask for top logprobs (completions' logprobs, chat's top_logprobs) have the same cap,
    named in their own field."""
    cmpl = {"model": "tiny", "prompt": "The quick", "max_tokens": 2}
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "logprobs": True}
    for path, body, field in (("/v1/completions", cmpl, "logprobs"), ("/v1/chat/completions", chat, "top_logprobs")):
        err = _error(_post(limited, path, json={**body, field: TOP_LOGPROBS + 1}), 400)
        assert err["param"] == field, err
        assert f"{field}={TOP_LOGPROBS + 1} must be an integer in [0, {TOP_LOGPROBS}]" in err["message"], err
        assert "--max-top-logprobs-num" in err["message"], err
        ok = _post(limited, path, json={**body, field: TOP_LOGPROBS})
        assert ok.status_code == 200, ok.text
    top = ok.json()["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
    assert len(top) == TOP_LOGPROBS


def test_stop_strings_over_the_flags_are_400(limited):
    too_many = [f"s{i}" for i in range(STOPS + 1)]
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "Name a fox."}], "max_tokens": 2}
    for path, body in (("/generate", {"text": "The quick", "sampling_params": {"stop": too_many}}),
                       ("/v1/completions", {"model": "tiny", "prompt": "The quick", "stop": too_many}),
                       ("/v1/chat/completions", {**chat, "stop": too_many})):
        err = _error(_post(limited, path, json=body), 400)
        assert err["param"] == "stop", (path, err)
        assert f"stop=[{STOPS + 1} strings]" in err["message"] and f"max_stop_strings={STOPS}" in err["message"], err
    err = _error(_post(limited, "/v1/completions", json={"model": "tiny", "prompt": "The quick",
                                                         "stop": "x" * (STOP_LEN + 1)}), 400)
    assert err["param"] == "stop", err
    assert f"{STOP_LEN + 1} characters" in err["message"] and f"max_stop_str_len={STOP_LEN}" in err["message"], err
    ok = _post(limited, "/v1/completions", json={"model": "tiny", "prompt": "The quick", "max_tokens": 2,
                                                 "stop": too_many[:STOPS - 1] + ["x" * STOP_LEN]})
    assert ok.status_code == 200, ok.text


# -- the API key -----------------------------------------------------------------------------------------------------

def test_api_key_scheme_is_case_insensitive(limited):
    def status(auth: str | None) -> int:
        headers = {} if auth is None else {"Authorization": auth}
        return httpx.get(limited.url + "/v1/models", headers=headers, timeout=30).status_code

    assert [status(a) for a in (f"Bearer {KEY}", f"bearer {KEY}", f"BEARER  {KEY}")] == [200, 200, 200]
    assert [status(a) for a in (None, "Bearer wrong", f"Basic {KEY}", KEY, "bearer")] == [401] * 5
    assert httpx.get(limited.url + "/health", timeout=30).status_code == 200  # public
    assert httpx.head(limited.url + "/health", timeout=30).status_code == 200
