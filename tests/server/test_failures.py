"""In-process (ASGI) tests of what a subprocess cannot easily provoke: an engine that raises, a full queue, a
handler bug. The engine is real (tiny random pair on CPU); faults are injected by wrapping scheduler.step."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import httpx
import pytest
import torch

from sglang_eagle3.engine import Engine
from sglang_eagle3.server import EngineDriver, ServerConfig, create_app
from sglang_eagle3.server.driver import BatchTooLargeError, DuplicateRequestIdError
from sglang_eagle3.server.serving import Serving


@pytest.fixture(scope="module")
def engine(tiny_model):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model; OpenMP spin-waits only hurt on a shared 2-core box
    yield Engine(model_path=tiny_model.target, speculative_algorithm="EAGLE3",
                 speculative_draft_model_path=tiny_model.draft, speculative_num_steps=3, device="cpu",
                 max_running_requests=1)
    torch.set_num_threads(threads)


@pytest.fixture
def make_app(engine):
    drivers = []

    def make(max_queued: int | None = 8):
        driver = EngineDriver(engine, max_inflight=None if max_queued is None else 1 + max_queued)
        app = create_app(engine, driver, ServerConfig(served_model_name="tiny", max_queued_requests=max_queued))
        driver.start()
        drivers.append(driver)
        return app, driver

    yield make
    for d in drivers:
        d.stop()


class FailingStep:
    """Wraps scheduler.step: raises on the given call numbers (1-based), delegates otherwise."""

    def __init__(self, scheduler, fail_on: set[int]):
        self.scheduler, self.fail_on, self.calls = scheduler, fail_on, 0
        self.real = scheduler.step

    def __call__(self):
        self.calls += 1
        if self.calls in self.fail_on:
            raise RuntimeError(f"injected fault on step {self.calls}")
        return self.real()


@pytest.fixture
def failing_step(engine, monkeypatch):
    def install(fail_on: set[int]) -> FailingStep:
        f = FailingStep(engine.scheduler, fail_on)
        monkeypatch.setattr(engine.scheduler, "step", f)
        return f

    return install


def run(coro):
    return asyncio.run(coro)


async def _post(app, path: str, body: dict) -> httpx.Response:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t", timeout=60) as c:
        return await c.post(path, json=body)


async def _get(app, path: str) -> httpx.Response:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t", timeout=60) as c:
        return await c.get(path)


def _events(text: str) -> list:
    out = []
    for line in text.splitlines():
        if line.startswith("data: "):
            data = line[len("data: "):]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


GEN = {"text": "The quick brown fox", "sampling_params": {"max_new_tokens": 16, "temperature": 0}}


def test_engine_fault_fails_request_with_500_and_server_keeps_serving(make_app, failing_step, engine):
    app, driver = make_app()
    failing_step({1})  # the prefill of the first request
    r = run(_post(app, "/generate", GEN))
    assert r.status_code == 500, r.text
    err = r.json()["error"]
    assert err["code"] == "engine_error" and "injected fault" in err["message"]
    ok = run(_post(app, "/generate", GEN))
    assert ok.status_code == 200 and len(ok.json()["output_ids"]) == 16
    assert run(_get(app, "/health")).status_code == 200
    info = run(_get(app, "/get_server_info")).json()
    assert info["kv_pages_free"] == info["kv_pages_total"]  # the failed request's pages came back
    assert info["server_stats"]["engine_errors"] == 1 and info["server_stats"]["failed_requests"] == 1


def test_engine_fault_mid_stream_ends_with_error_event(make_app, failing_step):
    app, _ = make_app()
    failing_step({4})  # prefill, two decode rounds, then the fault
    r = run(_post(app, "/v1/completions", {"model": "tiny", "prompt": "Sphinx", "max_tokens": 40,
                                           "temperature": 0, "stream": True}))
    assert r.status_code == 200  # headers went out with the first token
    events = _events(r.text)
    assert events[-1] == "[DONE]"
    assert events[-2]["error"]["code"] == "engine_error"
    assert any("choices" in e for e in events[:-2])
    assert run(_post(app, "/generate", GEN)).status_code == 200


def test_engine_fault_before_first_token_of_stream_is_http_500(make_app, failing_step):
    app, _ = make_app()
    failing_step({1})
    r = run(_post(app, "/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "hi"}],
                                                "max_tokens": 8, "stream": True}))
    assert r.status_code == 500 and r.json()["error"]["code"] == "engine_error"


def test_unexpected_handler_error_is_logged_500(make_app, engine, monkeypatch, caplog):
    app, _ = make_app()

    def broken(*args, **kwargs):
        raise KeyError("bug")

    monkeypatch.setattr(engine, "make_request", broken)
    r = run(_post(app, "/generate", GEN))
    assert r.status_code == 500 and "KeyError" in r.json()["error"]["message"]
    assert any("unexpected error" in rec.message for rec in caplog.records)
    monkeypatch.undo()
    assert run(_post(app, "/generate", GEN)).status_code == 200


def test_full_queue_answers_503(make_app):
    app, _ = make_app(max_queued=1)  # 1 running + 1 queued

    async def burst():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t", timeout=60) as c:
            body = {"text": "The quick", "sampling_params": {"max_new_tokens": 60, "temperature": 0}}
            return await asyncio.gather(*(c.post("/generate", json=body) for _ in range(4)))

    responses = run(burst())
    assert sorted(r.status_code for r in responses) == [200, 200, 503, 503]
    assert all(r.json()["error"]["code"] == "queue_full" for r in responses if r.status_code == 503)
    assert run(_post(app, "/generate", GEN)).status_code == 200  # room again once they finished


def test_validation_runs_off_the_event_loop(make_app, engine, monkeypatch):
    """Tokenizing a prompt of megabytes takes seconds: meanwhile /health (and every stream) must be served."""
    app, _ = make_app()
    real = engine.make_request
    entered, release = threading.Event(), threading.Event()
    blocked = []

    def slow_make_request(*args, **kwargs):
        blocked.append(True)
        entered.set()
        release.wait(5)  # the test sets it once /health answered; on the event loop it could not have
        blocked.append(False)
        return real(*args, **kwargs)

    monkeypatch.setattr(engine, "make_request", slow_make_request)

    async def scenario():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t", timeout=60) as c:
            gen = asyncio.create_task(c.post("/generate", json=GEN))
            await asyncio.to_thread(entered.wait, 5)
            health = await c.get("/health")
            still_blocked = blocked[-1]
            release.set()
            return health, still_blocked, await gen

    health, still_blocked, gen = run(scenario())
    assert health.status_code == 200 and still_blocked, "/health waited for a request's validation"
    assert gen.status_code == 200 and len(gen.json()["output_ids"]) == 16


def test_shutdown_ends_requests_in_flight_with_an_error(make_app, engine, monkeypatch):
    """After begin_shutdown's grace a stream still running ends with an error event and [DONE], a waiting
    non-streaming request gets a 503, and new requests and /health are refused at once."""
    app, driver = make_app()
    real_step = engine.scheduler.step
    steps = [0]

    def slow_step():
        time.sleep(0.05)  # keeps the requests in flight while the test acts (200 tokens: >= 2.5 s)
        out = real_step()
        steps[0] += 1
        return out

    monkeypatch.setattr(engine.scheduler, "step", slow_step)
    long = {"max_tokens": 200, "temperature": 0, "ignore_eos": True}
    # The stream has answered 200 once Serving.stream returns (it awaits the first chunk first); until then a
    # shutdown is its 503. Polling the steps and sleeping was not enough on a loaded 2-core box.
    answered: list[asyncio.Event] = []
    real_stream = Serving.stream

    async def stream_answered(self, *args):
        response = await real_stream(self, *args)
        answered[0].set()
        return response

    monkeypatch.setattr(Serving, "stream", stream_answered)

    async def scenario():
        answered.append(asyncio.Event())
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t", timeout=60) as c:
            stream = asyncio.create_task(c.post("/v1/completions", json={"model": "tiny", "prompt": "Sphinx",
                                                                        "stream": True, **long}))
            waiting = asyncio.create_task(c.post("/v1/completions", json={"model": "tiny", "prompt": "Jump", **long}))
            await answered[0].wait()
            while driver.inflight < 2 or steps[0] < 3:  # (both admitted, and the stream holds token events)
                await asyncio.sleep(0.01)
            t0 = time.monotonic()
            driver.begin_shutdown(2.0)
            refused, health = await c.post("/generate", json=GEN), await c.get("/health")
            refused_after = time.monotonic() - t0
            return await stream, await waiting, refused, health, refused_after

    stream, waiting, refused, health, refused_after = run(scenario())
    assert refused_after < 1.0  # at once, not at the end of the grace
    assert stream.status_code == 200
    events = _events(stream.text)
    assert events[-1] == "[DONE]" and any("choices" in e for e in events[:-2])
    assert events[-2]["error"]["code"] == "server_shutting_down", events[-2]
    assert waiting.status_code == 503 and waiting.json()["error"]["code"] == "server_shutting_down", waiting.text
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "server_shutting_down", refused.text
    assert health.status_code == 503


def test_driver_refuses_a_batch_it_can_never_admit_and_duplicate_rids(make_app, engine):
    _, driver = make_app(max_queued=2)  # 1 running + 2 queued
    reqs = [engine.make_request(input_ids=[5, 6], rid=f"r{i}") for i in range(4)]
    with pytest.raises(BatchTooLargeError, match="batch of 4 requests can never be admitted: at most 3"):
        driver.submit(reqs)
    twice = [engine.make_request(input_ids=[5], rid="x"), engine.make_request(input_ids=[6], rid="x")]
    with pytest.raises(DuplicateRequestIdError, match="duplicate rid 'x' within the batch"):
        driver.submit(twice)
    assert driver.inflight == 0


def test_abort_after_finish_spares_a_new_request_with_the_same_rid(make_app, engine):
    """A client whose request finished while it was going away (the final answer still unread) aborts it by
    rid; by then a retry may carry the same rid. The abort must not hit the retry, which would never get an
    answer (its client hangs)."""
    _, driver = make_app()

    async def scenario():
        first = driver.submit([engine.make_request(input_ids=[5, 6], sampling_params={"max_new_tokens": 2},
                                                   rid="job")])
        while driver.inflight:  # finished in the engine; its final update waits, unread, in first's queue
            await asyncio.sleep(0.01)
        retry = driver.submit([engine.make_request(input_ids=[5, 6], sampling_params={"max_new_tokens": 40},
                                                   rid="job")])
        first.close()  # the first client's disconnect, seen only now
        (u,) = await asyncio.wait_for(retry.results(), 10)  # hangs without the fix
        return u

    u = run(scenario())
    assert u.error is None and len(u.result["output_ids"]) == 40
    assert driver.inflight == 0


# A template in the style of Hugging Face's, written for well-formed messages: it iterates tool_calls and
# concatenates strings, which raises TypeError (not a jinja2 TemplateError) on a client's odd values. (An extra key,
# "speaker": a message's name is typed as a string now, a 400 before any template.)
_STRICT_TEMPLATE = ("{% for m in messages %}{{ '<|' + m['role'] + '|>' }}{% if m.speaker is defined %}"
                    "{{ 'speaker: ' + m.speaker }}{% endif %}{% if m.tool_calls %}{% for tc in m.tool_calls %}"
                    "{{ tc.function.name }}{% endfor %}{% else %}{{ m['content'] }}{% endif %}\n{% endfor %}")


@pytest.mark.parametrize("message", [
    {"role": "assistant", "content": None, "tool_calls": 5},
    {"role": "user", "content": "hi", "speaker": {"first": "Ada"}},
], ids=["tool-calls-int", "extra-key-object"])
def test_chat_template_failing_on_odd_values_is_a_400(make_app, engine, monkeypatch, caplog, message):
    app, _ = make_app()
    monkeypatch.setattr(engine.tokenizer, "chat_template", _STRICT_TEMPLATE)
    monkeypatch.setattr(engine.tokenizer, "_compiled_template", None)
    r = run(_post(app, "/v1/chat/completions", {"model": "tiny", "messages": [message], "max_tokens": 4}))
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "messages" and "TypeError" in err["message"], err
    assert err["message"].startswith("the chat template cannot render these messages"), err
    assert not any(rec.levelname == "ERROR" for rec in caplog.records), caplog.text
    ok = {"role": "user", "content": "hi", "speaker": "Ada"}
    assert run(_post(app, "/v1/chat/completions", {"model": "tiny", "messages": [ok], "max_tokens": 4})).status_code \
        == 200


def test_engine_info_after_the_engine_thread_is_gone_is_a_503(make_app):
    """/get_server_info and /metrics ask the engine thread; once it is gone they answer 503 engine_unavailable
    (as generation does), not a logged 500 every time a scraper comes by."""
    app, driver = make_app()
    driver.stop()
    for path in ("/get_server_info", "/metrics"):
        r = run(_get(app, path))
        assert r.status_code == 503, r.text
        assert r.json()["error"]["code"] == "engine_unavailable"


def test_backend_that_cannot_recover_turns_the_server_unavailable(make_app, engine, monkeypatch):
    """A TP worker group whose rank died (distributed/workers.py: WorkerError, the group stopped, ``failure`` set)
    can never step again: the request in flight fails with the cause, and from then on /health answers 503 and new
    requests a 503 naming the cause, instead of /health 200 and a 500 for every request; /get_server_info answers
    503 with the whole cause (it asked the stopped group, which raised: a 500)."""
    from sglang_eagle3.distributed.workers import WorkerError

    cause = "TP worker rank 1 failed: killed by SIGKILL (the kernel's OOM killer sends it: see dmesg)"

    def dead_group():
        monkeypatch.setattr(engine.scheduler, "failure", cause, raising=False)
        raise WorkerError(cause)

    app, driver = make_app()
    assert run(_get(app, "/health")).status_code == 200
    monkeypatch.setattr(engine.scheduler, "step", dead_group)
    r = run(_post(app, "/generate", GEN))
    assert r.status_code == 500 and "killed by SIGKILL" in r.json()["error"]["message"], r.text
    assert run(_get(app, "/health")).status_code == 503
    for path, body in (("/generate", GEN), ("/v1/completions", {"model": "tiny", "prompt": "x", "max_tokens": 2})):
        r = run(_post(app, path, body))
        err = r.json()["error"]
        assert r.status_code == 503 and err["code"] == "engine_unavailable", r.text
        assert "rank 1 failed" in err["message"] and "restart the server" in err["message"]
    r = run(_get(app, "/get_server_info"))
    assert r.status_code == 503 and "killed by SIGKILL" in r.json()["error"]["message"]
    assert driver.alive  # the thread runs on: the server answers, it does not hang or exit


ANTHROPIC = {"model": "tiny", "max_tokens": 40, "temperature": 0, "stream": True,
             "messages": [{"role": "user", "content": "Sphinx"}]}


def _anthropic_events(text: str) -> list[tuple[str, dict]]:
    """(event, data) of an Anthropic stream: each event's `event:` line and the `data:` line after it."""
    out, name = [], None
    for line in text.splitlines():
        if line.startswith("event: "):
            name = line[len("event: "):]
        elif line.startswith("data: "):
            out.append((name, json.loads(line[len("data: "):])))
    return out


def test_engine_fault_mid_anthropic_stream_ends_with_its_error_event(make_app, failing_step):
    """/v1/messages: a fault after the first tokens ends the stream with Anthropic's error event (no OpenAI [DONE]),
    and the server serves on."""
    app, _ = make_app()
    failing_step({4})  # prefill, two decode rounds, then the fault
    r = run(_post(app, "/v1/messages", ANTHROPIC))
    assert r.status_code == 200  # headers went out with the first tokens
    events = _anthropic_events(r.text)
    assert events[0][0] == "message_start" and "[DONE]" not in r.text
    name, data = events[-1]
    assert name == "error" and data["type"] == "error", events[-1]
    assert data["error"]["type"] == "api_error" and "injected fault" in data["error"]["message"], data
    assert not any(n == "message_stop" for n, _ in events)
    assert run(_post(app, "/generate", GEN)).status_code == 200


def test_engine_fault_before_first_token_of_anthropic_stream_is_its_500(make_app, failing_step):
    app, _ = make_app()
    failing_step({1})
    r = run(_post(app, "/v1/messages", ANTHROPIC))
    assert r.status_code == 500, r.text
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == "api_error", body
