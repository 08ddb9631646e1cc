"""SGLang's scheduler metrics that need the scheduler's own counters: the queue time, retractions and the speculative
acceptance rate (docs/SERVER.md, "Metrics"), each against what the test made happen.

- ``sglang:queue_time_seconds``: one observation a request, from entering the scheduler's waiting queue to its first
  admission; a request held behind a running one (max_running_requests=1, steps slowed) or an engine thread held
  while it waits shows at least that wait; a readmission after a retraction is not observed again.
- ``sglang:num_retracted_requests_total``, ``..._input_tokens_total``, ``..._output_tokens_total`` and the
  ``sglang:num_retracted_reqs`` gauge: a KV pool too small for the batch retracts, and the counters move by the
  retracted requests' prompts and outputs; the gauge by its definition over hand-fed windows.
- ``sglang:spec_accept_rate``: accepted drafts / proposed drafts over the window, live with a pinned acceptance
  (one draft of k = 3 accepted every round: 1/3, where the accept length reads 2) and by definition; the DSpark-only
  ``sglang:spec_cap_length`` and ``sglang:spec_block_accept_length`` read 0, as SGLang's under EAGLE-3.
"""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
import torch

from sglang_eagle3.engine import Engine
from sglang_eagle3.server import EngineDriver, ServerConfig, create_app
from sglang_eagle3.server.metrics import SGLANG_QUEUE_TIME_BUCKETS, ServerMetrics

from .test_metrics_sglang_parity import SCHEDULER_LABELS, buckets, parse, total

MODEL = "tiny-gaps"
WINDOW = 4  # decode steps a window of the windowed gauges spans here (SGLang's default: 40)
K = 3

# name -> type; every one carries SGLang's scheduler labels (as SGLang v0.5.23 declares them).
NEW_METRICS = {"sglang:queue_time_seconds": "histogram", "sglang:num_retracted_reqs": "gauge",
               "sglang:num_retracted_requests_total": "counter", "sglang:num_retracted_input_tokens_total": "counter",
               "sglang:num_retracted_output_tokens_total": "counter", "sglang:spec_accept_rate": "gauge",
               "sglang:spec_cap_length": "gauge", "sglang:spec_block_accept_length": "gauge"}
# SGLang v0.5.23's queue-time buckets, written out here from its SchedulerMetricsCollector.
QUEUE_BUCKETS = [0.0, 0.001, 0.005, 0.01, 0.05, 0.1, 0.2, 0.5, 1, 2, 3, 4, 5, 10, 15, 20, 30, 40, 50, 60, 70, 80, 90,
                 100, 200, 300, 400, 500, 600, 700, 800, 900, 1000, 1200, 1400, 1600, 1800, 2000, 2500, 3000]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model; OpenMP spin-waits only hurt on a shared box
    yield
    torch.set_num_threads(threads)


def _engine(tiny_model, **kw) -> Engine:
    return Engine(model_path=tiny_model.target, speculative_algorithm="EAGLE3",
                  speculative_draft_model_path=tiny_model.draft, speculative_num_steps=K, device="cpu", **kw)


@pytest.fixture(scope="module")
def one_at_a_time(tiny_model):
    """One running request at a time, every verify round accepting exactly one of its K drafts (a pinned acceptance,
    as SGLang's SGLANG_SIMULATE_ACC_LEN: the output is not the target's, which nothing here reads)."""
    eng = _engine(tiny_model, max_running_requests=1, speculative_simulate_accept_length=2.0)
    yield eng
    eng.shutdown()


@pytest.fixture(scope="module")
def tight_pool(tiny_model):
    """A KV pool of 64 tokens in pages of 4: four requests of 10 + 30 tokens do not fit together."""
    eng = _engine(tiny_model, max_total_tokens=64, page_size=4, max_running_requests=4)
    yield eng
    eng.shutdown()


class _Served:
    def __init__(self, engine: Engine):
        self.engine = engine
        self.driver = EngineDriver(engine, ServerMetrics(max_accept_length=K + 1, decode_log_interval=WINDOW),
                                   max_inflight=16)
        self.app = create_app(engine, self.driver, ServerConfig(served_model_name=MODEL))

    def __enter__(self):
        self.driver.start()
        return self

    def __exit__(self, *exc):
        self.driver.stop()

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.ASGITransport(app=self.app), base_url="http://t", timeout=120)


async def _generate(c: httpx.AsyncClient, ids: list[int], n: int, **extra) -> dict:
    r = await c.post("/generate", json={"input_ids": ids, "sampling_params": {"max_new_tokens": n, "temperature": 0},
                                        **extra})
    assert r.status_code == 200, r.text
    return r.json()


async def _scrape(c: httpx.AsyncClient) -> dict:
    r = await c.get("/metrics")
    assert r.status_code == 200, r.text
    return parse(r.text)


def _observations(m: dict, name: str) -> list[float]:
    """(le, cumulative count) rows of an unlabelled-but-constant histogram, in order."""
    return sorted((float(lab["le"]), v) for n, lab, v in m[name]["samples"] if n == name + "_bucket")


# -- names, types, labels, buckets --------------------------------------------------------------------------------

def test_declared_as_sglang_declares_them(one_at_a_time):
    with _Served(one_at_a_time) as s:
        async def go():
            async with s.client() as c:
                await _generate(c, [5, 6, 7], 6)
                return await _scrape(c)

        m = asyncio.run(go())
    for name, kind in NEW_METRICS.items():
        assert name in m, name
        assert m[name]["type"] == kind, (name, m[name]["type"])
        assert m[name]["samples"], f"{name} has no series"
        for sample, lab, _ in m[name]["samples"]:
            assert set(lab) == SCHEDULER_LABELS | ({"le"} if sample.endswith("_bucket") else set()), (sample, lab)
            assert (lab["model_name"], lab["engine_type"], lab["tp_rank"]) == (MODEL, "unified", "0"), (sample, lab)
    assert buckets(m, "sglang:queue_time_seconds") == [*map(float, QUEUE_BUCKETS), float("inf")]
    assert list(SGLANG_QUEUE_TIME_BUCKETS) == QUEUE_BUCKETS
    assert total(m, "sglang:spec_cap_length") == total(m, "sglang:spec_block_accept_length") == 0


# -- queue time ----------------------------------------------------------------------------------------------------

def test_a_request_behind_a_running_one_waits_its_turn(one_at_a_time, monkeypatch):
    """max_running_requests=1 and every engine step slowed to >= 50 ms: the second request, queued once the first
    streams, waits for the first's remaining rounds (at least (40 - 1) / 4 of them: a round gives at most K + 1
    tokens); the first was admitted at once. One observation a request."""
    worker = one_at_a_time.scheduler
    step = worker.step
    min_step_s = 0.05

    def slow_step():
        t0 = time.perf_counter()
        out = step()
        time.sleep(max(0.0, min_step_s - (time.perf_counter() - t0)))
        return out

    monkeypatch.setattr(worker, "step", slow_step)
    with _Served(one_at_a_time) as s:
        serving = s.app.state.serving

        def request(ids: list[int], n: int):
            return serving.make_request(input_ids=ids, sampling_params={"max_new_tokens": n, "temperature": 0},
                                        prompt_param="input_ids")

        async def go():
            first = serving.submit([request([5, 6, 7, 8], 40)], stream=True)
            updates = first.updates()
            assert (await updates.__anext__()).new_ids  # its first token: it runs
            second = serving.submit([request([9, 10, 11], 4)], stream=False)
            async for _ in updates:
                pass
            await second.results()
            async with s.client() as c:
                return await _scrape(c)

        m = asyncio.run(go())
    rows = _observations(m, "sglang:queue_time_seconds")
    assert total(m, "sglang:queue_time_seconds_count") == 2
    least = (40 - 1) // (K + 1) * min_step_s  # the first's remaining steps
    assert dict(rows)[0.2] == 1, rows  # the first: admitted at its first step
    assert total(m, "sglang:queue_time_seconds_sum") >= least, rows


def test_a_held_engine_thread_shows_in_the_queue_time(one_at_a_time, monkeypatch):
    """A request whose arrival in the waiting queue is followed by 0.5 s in which the engine thread does nothing
    (held right after the scheduler queued it, before the next step admits it) has a queue time of at least 0.5 s."""
    worker = one_at_a_time.scheduler
    add = worker.add

    def add_then_hold(req):
        add(req)
        time.sleep(0.5)

    monkeypatch.setattr(worker, "add", add_then_hold)
    with _Served(one_at_a_time) as s:
        async def go():
            async with s.client() as c:
                await _generate(c, [5, 6, 7], 3)
                return await _scrape(c)

        m = asyncio.run(go())
    assert total(m, "sglang:queue_time_seconds_count") == 1
    assert total(m, "sglang:queue_time_seconds_sum") >= 0.5
    assert dict(_observations(m, "sglang:queue_time_seconds"))[0.2] == 0


# -- retractions ---------------------------------------------------------------------------------------------------

def test_a_tight_kv_pool_moves_the_retraction_counters(tight_pool):
    """Four requests of 10 prompt + 30 output tokens in a pool of 64 tokens: requests are retracted (a request is
    retracted only after it gained a token: tests/test_scheduler_audit.py); the counters count them, their prompts
    (all 10 tokens long) and the outputs they had; every request's queue time is observed once, readmissions not."""
    with _Served(tight_pool) as s:
        async def go():
            async with s.client() as c:
                before = await _scrape(c)
                outs = await asyncio.gather(*[_generate(c, [5 + i] * 10, 30) for i in range(4)])
                return before, outs, await _scrape(c), (await c.get("/get_server_info")).json()

        before, outs, m, info = asyncio.run(go())
    assert all(o["meta_info"]["completion_tokens"] == 30 for o in outs)
    assert total(before, "sglang:num_retracted_requests_total") == 0
    n = total(m, "sglang:num_retracted_requests_total")
    assert n > 0, "the pool was never short: nothing was tested"
    assert n == info["retracted_requests"]
    assert total(m, "sglang:num_retracted_input_tokens_total") == 10 * n
    assert n <= total(m, "sglang:num_retracted_output_tokens_total") <= 29 * n
    assert total(m, "sglang:num_retracted_output_tokens_total") == info["retracted_output_tokens"]
    assert 0 <= total(m, "sglang:num_retracted_reqs") <= 3
    assert total(m, "sglang:queue_time_seconds_count") == 4  # one a request, however often it was readmitted


def test_retracted_reqs_gauge_by_definition():
    """SGLang reports the requests of its latest retraction at the end of the window it fell in and holds them
    there for the next window; here they show from the retraction (the worker's age of it) till that next window
    ends, then 0."""
    m = ServerMetrics(decode_log_interval=2)
    at = time.monotonic()

    def read(n: int = 3) -> float:
        m.update_from_info({"running_requests": 1, "last_retraction_requests": n,
                            "last_retraction_age_s": time.monotonic() - at, "retracted_requests": 5}, inflight=1)
        return total(parse(m.render()), "sglang:num_retracted_reqs")

    assert read() == 3  # in the window running now
    m.note_step(0.01, decode=True)
    m.note_step(0.01, decode=True)  # its window ends
    assert read() == 3
    m.note_step(0.01, decode=True)
    assert read() == 3  # (the next one runs)
    m.note_step(0.01, decode=True)  # the next one ends
    assert read() == 0
    at = time.monotonic()  # a new retraction
    assert read(2) == 2
    m.update_from_info({"running_requests": 1}, inflight=1)  # never retracted
    assert total(parse(m.render()), "sglang:num_retracted_reqs") == 0


# -- acceptance rate -----------------------------------------------------------------------------------------------

def test_accept_rate_live_with_a_pinned_acceptance(one_at_a_time):
    """Every verify round accepts exactly one of its K = 3 drafts: spec_accept_rate = 1/3 (accepted / proposed), while
    spec_accept_length reads 2 (accepted + 1): the rate is not the length over k."""
    with _Served(one_at_a_time) as s:
        async def go():
            async with s.client() as c:
                out = await _generate(c, [5, 6, 7, 8], 1 + 2 * 32)  # the prefill's token, then 2 a round
                assert out["meta_info"]["spec_verify_ct"] == 32
                return await _scrape(c)

        m = asyncio.run(go())
    assert total(m, "sglang:spec_accept_rate") == pytest.approx(1 / K)
    assert total(m, "sglang:spec_accept_length") == pytest.approx(2)


def test_accept_rate_by_definition():
    """Over a window of decode_log_interval decode steps: the drafts its verifies accepted / those they verified;
    it holds between windows; 0 for a window without proposals (no speculation, or a resting draft)."""
    m = ServerMetrics(decode_log_interval=2)

    def rate() -> float:
        return total(parse(m.render()), "sglang:spec_accept_rate")

    m.note_step(0.1, decode=False)
    m.note_step(0.1, decode=True, rounds=2, round_tokens=5, drafts_accepted=3, drafts_proposed=6)
    assert rate() == 0  # no window yet
    m.note_step(0.1, decode=True, rounds=2, round_tokens=4, drafts_accepted=3, drafts_proposed=6)
    assert rate() == pytest.approx(6 / 12)
    m.note_step(0.1, decode=True, rounds=1, drafts_accepted=1, drafts_proposed=3)
    assert rate() == pytest.approx(6 / 12)  # holds
    m.note_step(0.1, decode=True, rounds=1, drafts_accepted=0, drafts_proposed=0)
    assert rate() == pytest.approx(1 / 3)
    m.note_step(0.1, decode=True, tokens=2)
    m.note_step(0.1, decode=True, tokens=2)
    assert rate() == 0


# -- through worker processes (the TP path: rank 0's scheduler reports) ----------------------------------------------

def test_through_a_worker_process(tiny_model):
    """The model in a spawned worker (the path of tensor parallelism, rank 0 reporting): the queue times and draft
    counts ride on the requests' copies, the retraction counters and the latest retraction's age on the worker's
    info. (Acceptance pinned to one draft of K a round, as in one_at_a_time.)"""
    eng = _engine(tiny_model, max_total_tokens=64, page_size=4, max_running_requests=4, use_worker_processes=True,
                  speculative_simulate_accept_length=2.0)
    try:
        with _Served(eng) as s:
            async def go():
                async with s.client() as c:
                    await asyncio.gather(*[_generate(c, [5 + i] * 10, 30) for i in range(4)])
                    return await _scrape(c), (await c.get("/get_server_info")).json()

            m, info = asyncio.run(go())
    finally:
        eng.shutdown()
    n = total(m, "sglang:num_retracted_requests_total")
    assert n == info["retracted_requests"] > 0, "the pool was never short: nothing was tested"
    assert total(m, "sglang:num_retracted_input_tokens_total") == 10 * n
    assert info["last_retraction_age_s"] >= 0 and 1 <= info["last_retraction_requests"] <= 3
    assert total(m, "sglang:queue_time_seconds_count") == 4
    assert total(m, "sglang:spec_accept_rate") == pytest.approx(1 / K)
