"""/metrics against SGLang's: a dashboard or an alert written for SGLang's default metrics (``--enable-metrics``)
reads this server unchanged where it has the quantity (docs/SERVER.md, "Metrics").

- The names, types and label names such a dashboard reads (SGLang's own Grafana dashboard: end-to-end latency and
  time to first token by ``model_name``, running and queued requests, ``gen_throughput``, ``cache_hit_rate``; and
  the request, token, KV-cache, speculative and HTTP metrics beside them), written here from SGLang v0.5.23's
  defaults, SGLang's histogram buckets among ours. This check needs no SGLang.
- Their values against what the test did: requests and tokens by ``is_streaming`` (an OpenAI stream included), one
  inter-token latency a token after the first, the prompt/output length histograms, the KV pool in tokens, HTTP
  requests by route and status, an abort; the latencies start when the HTTP handler gets the request.
- SGLang's windowed scheduler gauges (``gen_throughput``, ``spec_accept_length``, ``decode_sum_seq_lens``) against
  their definition over hand-fed steps, and live.
- Where SGLang's source is at hand (an importable ``sglang``, or its virtualenv at /tmp/venv-sglang), its collectors'
  declarations, read with ``ast`` (nothing of SGLang is imported): every metric this server exports under one of
  SGLang's names has SGLang's type, label names and default buckets. Skipped without it.
"""

from __future__ import annotations

import ast
import asyncio
import glob
import importlib.util
import json
import os
import re
import time

import httpx
import pytest

from sglang_eagle3.server import EngineDriver, ServerConfig, create_app
from sglang_eagle3.server.metrics import ServerMetrics

from .conftest import spec_engine

MODEL = "tiny-parity"
WINDOW = 4  # decode steps a window of the windowed gauges spans here (SGLang's default: 40)

REQUEST_LABELS = {"model_name", "engine_type"}  # SGLang's tokenizer-side collector's
SCHEDULER_LABELS = REQUEST_LABELS | {"tp_rank", "pp_rank", "moe_ep_rank"}  # its scheduler-side one's, by default
# name -> (type, label names); what a dashboard on SGLang's default metrics reads, as SGLang v0.5.23 declares it.
SGLANG_METRICS = {
    "sglang:num_requests_total": ("counter", REQUEST_LABELS | {"is_streaming"}),
    "sglang:num_aborted_requests_total": ("counter", REQUEST_LABELS),
    "sglang:prompt_tokens_total": ("counter", REQUEST_LABELS | {"is_streaming"}),
    "sglang:generation_tokens_total": ("counter", REQUEST_LABELS | {"is_streaming"}),
    "sglang:num_so_requests_total": ("counter", REQUEST_LABELS),
    "sglang:spec_verify_calls_total": ("counter", REQUEST_LABELS),
    "sglang:time_to_first_token_seconds": ("histogram", REQUEST_LABELS | {"is_streaming"}),
    "sglang:e2e_request_latency_seconds": ("histogram", REQUEST_LABELS | {"is_streaming"}),
    "sglang:inter_token_latency_seconds": ("histogram", REQUEST_LABELS),
    "sglang:request_time_per_output_token_seconds": ("histogram", REQUEST_LABELS | {"is_streaming"}),
    "sglang:prompt_tokens_histogram": ("histogram", REQUEST_LABELS),
    "sglang:uncached_prompt_tokens_histogram": ("histogram", REQUEST_LABELS),
    "sglang:generation_tokens_histogram": ("histogram", REQUEST_LABELS),
    **{f"sglang:{name}": ("gauge", SCHEDULER_LABELS) for name in (
        "num_running_reqs", "num_queue_reqs", "gen_throughput", "cache_hit_rate", "decode_sum_seq_lens",
        "token_usage", "full_token_usage", "num_used_tokens", "kv_used_tokens", "kv_available_tokens",
        "kv_evictable_tokens", "spec_accept_length", "spec_num_steps", "spec_num_draft_tokens",
        "max_total_num_tokens", "page_size", "num_pages", "context_len")},
    "sglang:http_requests_total": ("counter", {"endpoint", "method"}),
    "sglang:http_responses_total": ("counter", {"endpoint", "status_code", "method"}),
    "sglang:http_requests_active": ("gauge", {"endpoint", "method"}),
}
# Labels ours has beyond SGLang's (docs/SERVER.md): the outcome our num_requests_total had before; summed over it,
# the count is SGLang's.
OUR_EXTRA_LABELS = {"sglang:num_requests_total": {"outcome"}}
# Our own metrics, which must keep their names and labels.
OURS = {"sglang:num_rejected_requests_total": ("counter", {"status"}),
        "sglang:step_latency_seconds": ("histogram", {"phase"}),
        "sglang:engine_errors_total": ("counter", set()), "sglang:num_inflight_reqs": ("gauge", set()),
        "sglang:kv_pages_free": ("gauge", set()), "sglang:kv_pages_total": ("gauge", set()),
        "sglang:spec_verify_forwards_total": ("counter", set()),
        "sglang:spec_accept_length_per_round": ("histogram", set()),
        "sglang:spec_adaptive_switches_total": ("counter", set()),
        "sglang:forward_total": ("counter", {"name", "path"})}

# SGLang's default buckets (v0.5.23).
TTFT_BUCKETS = [0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400]
E2E_BUCKETS = [*TTFT_BUCKETS, 600, 1200, 1800, 2400]
TOKEN_LATENCY_BUCKETS = [0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.025, 0.03, 0.035, 0.04, 0.06, 0.08, 0.1,
                         0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8]
TOKEN_COUNT_BUCKETS = [100, 300, 500, 700, 1000, 1500, 2000, 3000, 4000, 5000, 6000, 7000, 8000, 9000, 10000, 12500,
                       15000, 17500, 20000, 22500, 25000, 27500, 30000, 35000, 40000, 60000, 80000, 100000, 200000,
                       300000, 400000, 600000, 800000, 1000000, 1100000]
SGLANG_BUCKETS = {"sglang:time_to_first_token_seconds": TTFT_BUCKETS, "sglang:e2e_request_latency_seconds": E2E_BUCKETS,
                  "sglang:inter_token_latency_seconds": TOKEN_LATENCY_BUCKETS,
                  "sglang:request_time_per_output_token_seconds": TOKEN_LATENCY_BUCKETS,
                  "sglang:prompt_tokens_histogram": TOKEN_COUNT_BUCKETS,
                  "sglang:uncached_prompt_tokens_histogram": TOKEN_COUNT_BUCKETS,
                  "sglang:generation_tokens_histogram": TOKEN_COUNT_BUCKETS}
# The buckets our two request-latency histograms had before, kept beside SGLang's.
OUR_OLD_LATENCY_BUCKETS = [0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0]


# -- the exposition text ------------------------------------------------------------------------------------------

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse(text: str) -> dict[str, dict]:
    """metric -> {"type", "samples": [(sample name, labels, value)]}, by the text format's rules: a sample belongs
    to the family of the TYPE line before it (a histogram's _bucket, _sum and _count included)."""
    families: dict[str, dict] = {}
    family = None
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            assert name not in families, f"{name} declared twice"
            family = families[name] = {"type": kind, "samples": []}
            current = name
        elif line and not line.startswith("#"):
            m = _SAMPLE.match(line)
            assert m, line
            name, labels, value = m.groups()
            assert family is not None and name in (current, *(current + s for s in ("_bucket", "_sum", "_count"))), line
            family["samples"].append((name, dict(_LABEL.findall(labels or "")), float(value)))
    return families


def total(families: dict, sample: str, **labels: str) -> float:
    """The sum of the samples named ``sample`` whose labels include ``labels``."""
    family = families[re.sub(r"_(bucket|sum|count)$", "", sample) if sample not in families else sample]
    return sum(v for n, lab, v in family["samples"] if n == sample and labels.items() <= lab.items())


def buckets(families: dict, name: str) -> list[float]:
    return sorted({float(lab["le"]) for n, lab, _ in families[name]["samples"] if n == name + "_bucket"})


# -- the app ------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def engine(tiny_model):
    with spec_engine(tiny_model, max_running_requests=4) as eng:
        yield eng


@pytest.fixture
def served(engine):
    """A fresh app, driver and metrics over the module's engine (windows of WINDOW decode steps)."""
    driver = EngineDriver(engine, ServerMetrics(max_accept_length=4, decode_log_interval=WINDOW), max_inflight=8)
    app = create_app(engine, driver, ServerConfig(served_model_name=MODEL))
    driver.start()
    yield app
    driver.stop()


def _client(app) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t", timeout=120)


async def _scrape(c: httpx.AsyncClient) -> dict:
    r = await c.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain"), r.text
    return parse(r.text)


def _events(text: str) -> list:
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ") and line != "data: [DONE]"]


# -- names, types, labels, buckets and values ----------------------------------------------------------------------

def test_a_dashboard_on_sglangs_metrics_reads_this_server(served):
    """Four requests, two of them streamed (one an OpenAI stream, one /generate's), a wrong method and an unknown
    route; then every metric of SGLANG_METRICS and OURS is there with its type and label names, labelled with the
    served name, and counts what was done."""
    async def go():
        async with _client(served) as c:
            comp = await c.post("/v1/completions", json={"model": MODEL, "prompt": "The quick brown fox",
                                                         "max_tokens": 12, "temperature": 0})
            chat = await c.post("/v1/chat/completions", json={
                "model": MODEL, "messages": [{"role": "user", "content": "Pack my box"}], "max_tokens": 10,
                "temperature": 0, "stream": True, "stream_options": {"include_usage": True}})
            gen_stream = await c.post("/generate", json={"text": "How vexingly", "stream": True,
                                                         "sampling_params": {"max_new_tokens": 9, "temperature": 0}})
            gen = await c.post("/generate", json={"input_ids": [5, 6, 7, 8],
                                                  "sampling_params": {"max_new_tokens": 7, "temperature": 0}})
            assert (await c.get("/generate")).status_code == 405
            assert (await c.get("/no/such/route")).status_code == 404
            assert (await c.request("FROBNICATE", "/generate")).status_code == 405  # one "other" series
            for r in (comp, chat, gen_stream, gen):
                assert r.status_code == 200, r.text
            return comp.json(), _events(chat.text), _events(gen_stream.text), gen.json(), await _scrape(c), \
                (await c.get("/get_server_info")).json()

    comp, chat, gen_stream, gen, m, info = asyncio.run(go())
    # (prompt tokens, output tokens) of each request, by is_streaming
    done = {"false": [(comp["usage"]["prompt_tokens"], comp["usage"]["completion_tokens"]),
                      (gen["meta_info"]["prompt_tokens"], gen["meta_info"]["completion_tokens"])],
            "true": [(chat[-1]["usage"]["prompt_tokens"], chat[-1]["usage"]["completion_tokens"]),
                     (gen_stream[-1]["meta_info"]["prompt_tokens"], gen_stream[-1]["meta_info"]["completion_tokens"])]}
    assert [o for _, o in done["false"] + done["true"]] == [12, 7, 10, 9]  # (no EOS: every request runs its length)

    for name, (kind, labels) in {**SGLANG_METRICS, **OURS}.items():
        assert name in m, name
        assert m[name]["type"] == kind, (name, m[name]["type"])
        for sample, lab, _ in m[name]["samples"]:
            assert set(lab) == labels | OUR_EXTRA_LABELS.get(name, set()) | ({"le"} if sample.endswith("_bucket")
                                                                            else set()), (sample, lab)
            if REQUEST_LABELS <= labels:
                assert (lab["model_name"], lab["engine_type"]) == (MODEL, "unified"), (sample, lab)
            if SCHEDULER_LABELS <= labels:
                assert (lab["tp_rank"], lab["pp_rank"], lab["moe_ep_rank"]) == ("0", "0", "0"), (sample, lab)
    for name, want in SGLANG_BUCKETS.items():
        assert set(map(float, want)) <= set(buckets(m, name)), name
    for name in ("sglang:time_to_first_token_seconds", "sglang:e2e_request_latency_seconds"):
        assert set(OUR_OLD_LATENCY_BUCKETS) <= set(buckets(m, name)), name

    for flag, reqs in done.items():
        n, prompt, out = len(reqs), sum(p for p, _ in reqs), sum(o for _, o in reqs)
        assert total(m, "sglang:num_requests_total", is_streaming=flag) == n
        assert total(m, "sglang:num_requests_total", is_streaming=flag, outcome="finished") == n
        assert total(m, "sglang:prompt_tokens_total", is_streaming=flag) == prompt
        assert total(m, "sglang:generation_tokens_total", is_streaming=flag) == out
        for hist in ("sglang:time_to_first_token_seconds", "sglang:e2e_request_latency_seconds",
                     "sglang:request_time_per_output_token_seconds"):
            assert total(m, hist + "_count", is_streaming=flag) == n, (hist, flag)
    everything = done["false"] + done["true"]
    # One inter-token latency a token after each request's first; their sum the time from first token to last.
    assert total(m, "sglang:inter_token_latency_seconds_count") == sum(o - 1 for _, o in everything)
    assert total(m, "sglang:prompt_tokens_histogram_count") == 4
    assert total(m, "sglang:prompt_tokens_histogram_sum") == sum(p for p, _ in everything)
    assert total(m, "sglang:uncached_prompt_tokens_histogram_sum") == sum(p for p, _ in everything)
    assert total(m, "sglang:generation_tokens_histogram_sum") == sum(o for _, o in everything)
    assert total(m, "sglang:num_aborted_requests_total") == 0 and total(m, "sglang:num_so_requests_total") == 0
    for name in SGLANG_BUCKETS:  # Prometheus' histogram: cumulative, +Inf = count
        for flag in (("true", "false") if "is_streaming" in SGLANG_METRICS[name][1] else (None,)):
            sel = {} if flag is None else {"is_streaming": flag}
            rows = sorted((float(lab["le"]), v) for n, lab, v in m[name]["samples"]
                          if n == name + "_bucket" and sel.items() <= lab.items())
            assert [v for _, v in rows] == sorted(v for _, v in rows), name
            assert rows[-1] == (float("inf"), total(m, name + "_count", **sel)), name

    # The scheduler's gauges, idle: the pool in tokens, no prefix cache, the draft length.
    page, pages, free = info["page_size"], info["kv_pages_total"], info["kv_pages_free"]
    assert total(m, "sglang:num_running_reqs") == total(m, "sglang:num_queue_reqs") == 0
    assert total(m, "sglang:kv_available_tokens") == free * page
    assert total(m, "sglang:kv_used_tokens") == total(m, "sglang:num_used_tokens") == (pages - free) * page
    assert total(m, "sglang:full_token_usage") == total(m, "sglang:token_usage")
    assert total(m, "sglang:kv_evictable_tokens") == total(m, "sglang:cache_hit_rate") == 0
    assert total(m, "sglang:max_total_num_tokens") == info["max_total_num_tokens"] > 0
    assert (total(m, "sglang:page_size"), total(m, "sglang:num_pages")) == (page, pages)
    assert total(m, "sglang:context_len") == info["model"]["context_length"]
    assert total(m, "sglang:spec_num_draft_tokens") == total(m, "sglang:spec_num_steps") + 1 == 4
    assert total(m, "sglang:spec_verify_calls_total") == total(m, "sglang:spec_verify_forwards_total") > 0
    assert total(m, "sglang:gen_throughput") == 0  # nothing runs
    # 38 tokens over decode steps of up to 4 tokens a request: windows of 4 steps have ended.
    assert 1 <= total(m, "sglang:spec_accept_length") <= 4

    # HTTP, by route template and status; the scrape itself is the one request being served.
    assert total(m, "sglang:http_requests_total", endpoint="/generate", method="POST") == 2
    assert total(m, "sglang:http_responses_total", endpoint="/v1/chat/completions", status_code="200") == 1
    assert total(m, "sglang:http_responses_total", endpoint="/generate", method="GET", status_code="405") == 1
    assert total(m, "sglang:http_responses_total", endpoint="unmatched", status_code="404") == 1
    assert total(m, "sglang:http_requests_total", endpoint="/generate", method="other") == 1  # a made-up method
    assert total(m, "sglang:http_requests_active", endpoint="/metrics", method="GET") == 1
    assert total(m, "sglang:http_requests_active") == 1


def test_server_info_counts_still_read_the_labelled_counters(served):
    """/get_server_info's server_stats sum the counters now labelled by is_streaming (and model_name)."""
    async def go():
        async with _client(served) as c:
            for stream in (False, True):
                r = await c.post("/generate", json={"input_ids": [9, 10, 11], "stream": stream,
                                                    "sampling_params": {"max_new_tokens": 5}})
                assert r.status_code == 200, r.text
            return (await c.get("/get_server_info")).json()["server_stats"]

    stats = asyncio.run(go())
    assert (stats["finished_requests"], stats["prompt_tokens"], stats["generation_tokens"]) == (2, 6, 10)


def test_latency_starts_when_the_handler_gets_the_request(served, monkeypatch):
    """SGLang's time to first token and end-to-end latency start at the request's arrival (its received_time),
    validation and tokenization included; ours started when the engine thread took the request, after them."""
    serving = served.state.serving
    off_loop = serving.off_loop

    async def slow_validation(fn, *args):
        await asyncio.sleep(0.5)
        return await off_loop(fn, *args)

    monkeypatch.setattr(serving, "off_loop", slow_validation)

    async def go():
        async with _client(served) as c:
            r = await c.post("/generate", json={"input_ids": [5, 6], "sampling_params": {"max_new_tokens": 2}})
            assert r.status_code == 200, r.text
            return await _scrape(c)

    m = asyncio.run(go())
    assert total(m, "sglang:time_to_first_token_seconds_sum") >= 0.5
    assert total(m, "sglang:e2e_request_latency_seconds_sum") >= 0.5
    assert total(m, "sglang:time_to_first_token_seconds_bucket", le="0.4") == 0


def test_is_streaming_waits_for_the_consumer_to_say(served):
    """A submission that does not say whether it streams (the OpenAI endpoints submit before they stream or wait)
    has its requests' labelled observations held back, not guessed: those made before the consumer says so count
    under what it says; a consumer that never says counts as not streaming."""
    serving = served.state.serving
    metrics = serving.metrics

    def request(n: int):
        return serving.make_request(input_ids=[5, 6, 7], sampling_params={"max_new_tokens": n},
                                    prompt_param="input_ids")

    async def go():
        sub = serving.submit([request(6)])
        updates = sub.updates()
        first = await updates.__anext__()  # its prompt and first token are observed by now
        assert first.new_ids
        assert metrics.ttft.count() == 0 and metrics.prompt_tokens.value() == 0
        sub.streaming = True
        async for _ in updates:
            pass
        assert metrics.ttft.count(is_streaming="true") == 1
        assert metrics.prompt_tokens.value(is_streaming="true") == 3
        assert metrics.generation_tokens.value(is_streaming="true") == 6
        silent = serving.submit([request(4)])
        await silent.results()  # never said: "false"
        assert metrics.ttft.count(is_streaming="false") == 1
        assert metrics.requests.value(is_streaming="false", outcome="finished") == 1

    asyncio.run(go())


def test_an_abort_counts_as_sglang_counts_it(served):
    """A client that goes away: SGLang's num_aborted_requests_total, and our num_requests_total{outcome="aborted"}."""
    serving = served.state.serving

    async def go():
        sub = serving.submit([serving.make_request(input_ids=[5, 6, 7], sampling_params={"max_new_tokens": 200},
                                                   prompt_param="input_ids")], stream=True)
        updates = sub.updates()
        await updates.__anext__()
        sub.close()
        await updates.aclose()
        deadline = time.monotonic() + 30
        while serving.metrics.aborted.value() == 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        async with _client(served) as c:
            return await _scrape(c)

    m = asyncio.run(go())
    assert total(m, "sglang:num_aborted_requests_total") == 1
    assert total(m, "sglang:num_requests_total", outcome="aborted", is_streaming="true") == 1
    assert total(m, "sglang:generation_tokens_histogram_count") == 1


def test_structured_output_requests_are_counted(served):
    pytest.importorskip("xgrammar")

    async def go():
        async with _client(served) as c:
            r = await c.post("/generate", json={"text": "Sphinx", "sampling_params": {
                "max_new_tokens": 6, "temperature": 0, "regex": "[a-z ]{1,12}"}})
            assert r.status_code == 200, r.text
            return await _scrape(c)

    assert total(asyncio.run(go()), "sglang:num_so_requests_total") == 1


def test_gen_throughput_while_a_request_runs(served):
    """Live: while a long request runs, gen_throughput reads the last window's tokens a second (> 0) and
    decode_sum_seq_lens its sequence length; once it ended, gen_throughput reads 0 as SGLang's does."""
    async def go():
        async with _client(served) as c:
            task = asyncio.create_task(c.post("/generate", json={
                "input_ids": [5, 6, 7, 8], "sampling_params": {"max_new_tokens": 120, "temperature": 0}}))
            seen = []
            while not task.done():
                m = await _scrape(c)
                if total(m, "sglang:num_running_reqs") == 1 and total(m, "sglang:gen_throughput") > 0:
                    seen.append((total(m, "sglang:gen_throughput"), total(m, "sglang:decode_sum_seq_lens")))
                await asyncio.sleep(0.005)
            assert (await task).status_code == 200
            return seen, await _scrape(c)

    seen, after = asyncio.run(go())
    assert seen, "gen_throughput never read > 0 while the request ran"
    assert all(4 < seq <= 4 + 120 for _, seq in seen), seen
    assert total(after, "sglang:gen_throughput") == 0


def test_windowed_gauges_by_definition():
    """SGLang's scheduler reports, every decode_log_interval decode steps: gen_throughput = the window's generated
    tokens / its time (ours: the engine's busy time, idle gaps left out), spec_accept_length = the tokens of its
    verify rounds / those rounds, decode_sum_seq_lens = the last batch's; between reports they hold, and
    gen_throughput reads 0 once nothing runs or its window is over 30 s old."""
    m = ServerMetrics(decode_log_interval=3)

    def read(running: int = 1) -> dict:
        m.update_from_info({"running_requests": running}, inflight=running)
        f = parse(m.render())
        return {k: total(f, f"sglang:{k}") for k in ("gen_throughput", "spec_accept_length", "decode_sum_seq_lens")}

    m.note_step(0.5, decode=False)  # a prefill: busy time, no decode step
    m.note_step(0.25, decode=True, tokens=6, rounds=2, round_tokens=6, seq_lens=30)
    m.note_step(0.25, decode=True, tokens=4, rounds=2, round_tokens=4, seq_lens=34)
    assert read() == {"gen_throughput": 0, "spec_accept_length": 0, "decode_sum_seq_lens": 0}  # no window yet
    m.note_step(0.5, decode=True, tokens=5, rounds=1, round_tokens=3, seq_lens=20)
    assert read() == {"gen_throughput": 15 / 1.5, "spec_accept_length": 13 / 5, "decode_sum_seq_lens": 20}
    m.note_step(1.0, decode=True, tokens=7, rounds=0, seq_lens=50)  # (a window starts: the gauges hold)
    assert read() == {"gen_throughput": 10, "spec_accept_length": 13 / 5, "decode_sum_seq_lens": 20}
    assert read(running=0)["gen_throughput"] == 0
    m._window_at -= 31  # the last window ended 31 s ago
    assert read()["gen_throughput"] == 0


# -- against SGLang's own declarations ------------------------------------------------------------------------------

def _sglang_srt() -> str | None:
    """The directory of SGLang's srt package, read from disk (never imported): an installed sglang, else the
    virtualenv this project keeps it in."""
    spec = importlib.util.find_spec("sglang")
    roots = [os.path.dirname(spec.origin)] if spec is not None and spec.origin else []
    roots += sorted(glob.glob("/tmp/venv-sglang/lib/python3*/site-packages/sglang"))
    return next((os.path.join(r, "srt") for r in roots if os.path.isdir(os.path.join(r, "srt"))), None)


class _Declarations:
    """The metrics SGLang's collectors declare (``Counter(name=..., labelnames=..., buckets=...)`` calls), with their
    label names where they are written out from the collector's ``labels`` (plus extras) or literally, and their
    buckets where they are a literal list or a name bound to one in the same function."""

    KINDS = {"Counter": "counter", "Gauge": "gauge", "Histogram": "histogram", "Summary": "summary"}

    def __init__(self):
        self.metrics: dict[str, tuple[str, set[str] | None, list[float] | None]] = {}

    def read(self, tree: ast.AST, base: set[str] | None) -> None:
        for fn in [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]:
            lists = {t.id: v for a in ast.walk(fn) if isinstance(a, ast.Assign) and isinstance(a.value, ast.List)
                     for t in a.targets if isinstance(t, ast.Name) for v in [self._numbers(a.value)] if v}
            for call in [n for n in ast.walk(fn) if isinstance(n, ast.Call)]:
                kind = self.KINDS.get(getattr(call.func, "id", None))
                kw = {k.arg: k.value for k in call.keywords}
                name = kw.get("name")
                if kind is None or not (isinstance(name, ast.Constant) and str(name.value).startswith("sglang:")):
                    continue
                labels = self._labels(kw["labelnames"], base) if "labelnames" in kw else set()
                self.metrics.setdefault(name.value, (kind, labels, self._buckets(kw.get("buckets"), lists)))

    @staticmethod
    def _numbers(node) -> list[float] | None:
        if isinstance(node, (ast.List, ast.Tuple)) and all(isinstance(e, ast.Constant) for e in node.elts):
            return [float(e.value) for e in node.elts]
        return None

    def _buckets(self, node, lists: dict) -> list[float] | None:
        if isinstance(node, ast.Name):
            return lists.get(node.id)
        if isinstance(node, ast.Call) and len(node.args) == 2:  # generate_buckets(flag, default)
            return self._buckets(node.args[1], lists)
        return self._numbers(node) if node is not None else None

    def _labels(self, node, base: set[str] | None) -> set[str] | None:
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "keys":
            return None if base is None else set(base)  # labels.keys()
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "list" and len(node.args) == 1:
            return self._labels(node.args[0], base)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            left, right = self._labels(node.left, base), self._labels(node.right, base)
            return None if left is None or right is None else left | right
        if isinstance(node, (ast.List, ast.Tuple)):
            out: set[str] = set()
            for e in node.elts:
                part = self._labels(e.value, base) if isinstance(e, ast.Starred) else (
                    {e.value} if isinstance(e, ast.Constant) else None)
                if part is None:
                    return None
                out |= part
            return out
        return None


def _dict_keys(tree: ast.AST, function: str) -> set[str] | None:
    """The keys of the ``labels = {...}`` literal in ``function`` (the default labels SGLang puts on a collector)."""
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and fn.name == function:
            for a in ast.walk(fn):
                if isinstance(a, ast.Assign) and isinstance(a.value, ast.Dict) and \
                        any(isinstance(t, ast.Name) and t.id == "labels" for t in a.targets):
                    return {k.value for k in a.value.keys if isinstance(k, ast.Constant)}
    return None


def _sglang_declarations(srt: str) -> _Declarations:
    found = [p for p in ("observability/metrics_collector.py", "metrics/collector.py")
             if os.path.exists(os.path.join(srt, p))]
    if not found:
        pytest.skip(f"no metrics collector in SGLang's source at {srt}")
    tree = ast.parse(open(os.path.join(srt, found[0])).read())
    classes = {c.name: c for c in ast.walk(tree) if isinstance(c, ast.ClassDef)}
    if "SchedulerMetricsCollector" not in classes or "TokenizerMetricsCollector" not in classes:
        pytest.skip("this SGLang's collectors are not where this test reads them")
    decl = _Declarations()
    decl.read(classes["TokenizerMetricsCollector"], _dict_keys(tree, "tokenizer_metric_labels"))
    decl.read(classes["SchedulerMetricsCollector"], _dict_keys(classes["SchedulerMetricsCollector"], "init_new"))
    for path in glob.glob(os.path.join(srt, "*", "http_request_metrics.py")):
        decl.read(ast.parse(open(path).read()), None)
    return decl


def test_against_sglangs_collector_source(served):
    """Every metric this server exports under a name SGLang's collectors declare has SGLang's type, label names
    (but the extra ones listed in OUR_EXTRA_LABELS) and default buckets; the names this file expects are SGLang's."""
    srt = _sglang_srt()
    if srt is None:
        pytest.skip("SGLang's source is not installed (no sglang package, no /tmp/venv-sglang)")
    decl = _sglang_declarations(srt)
    if not {"sglang:num_running_reqs", "sglang:time_to_first_token_seconds"} <= decl.metrics.keys():
        pytest.skip(f"no SGLang metric declarations read from {srt}")

    async def go():
        async with _client(served) as c:
            assert (await c.post("/generate", json={"input_ids": [5, 6], "stream": True,
                                                    "sampling_params": {"max_new_tokens": 3}})).status_code == 200
            return await _scrape(c)

    ours = asyncio.run(go())
    assert set(SGLANG_METRICS) <= decl.metrics.keys(), sorted(set(SGLANG_METRICS) - decl.metrics.keys())
    assert not set(OURS) & decl.metrics.keys()  # (ours are not SGLang's)
    checked = 0
    for name, family in ours.items():
        if name not in decl.metrics:
            continue
        kind, labels, want_buckets = decl.metrics[name]
        assert family["type"] == kind, (name, family["type"], kind)
        if labels is not None:
            for _, lab, _ in family["samples"]:
                got = set(lab) - {"le"} - OUR_EXTRA_LABELS.get(name, set())
                assert got == labels, (name, sorted(got), sorted(labels))
        if want_buckets is not None and kind == "histogram" and family["samples"]:
            assert set(want_buckets) <= set(buckets(ours, name)), (name, want_buckets)
        checked += 1
    assert checked >= len(SGLANG_METRICS)
