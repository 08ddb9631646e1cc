"""Prometheus text exposition (format 0.0.4) for the server: counters and histograms updated by the engine
thread and the HTTP middleware, gauges filled from an engine snapshot at scrape time.

Where SGLang's server (``--enable-metrics``) exports a metric of the same meaning, ours has its name, type, label
names and buckets (SGLang's histogram buckets, plus the ones ours had before), so that dashboards and alerts written
for SGLang read this server unchanged. Request-level metrics carry the labels of SGLang's tokenizer-side collector
(``model_name``: the served model name, ``engine_type``: ``unified`` without prefill/decode disaggregation, and
``is_streaming`` where SGLang has it); scheduler-level ones those of its scheduler-side collector (the same plus
``tp_rank``, ``pp_rank``, ``moe_ep_rank``: one series, TP rank 0's, which is the one SGLang exports by default).
Our own metrics, which SGLang does not have, keep their names and labels. docs/SERVER.md, "Metrics", lists both,
and the SGLang metrics this server does not export, with why.
"""

from __future__ import annotations

import bisect
import math
import threading
import time

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# SGLang's engine_type label of a server that runs prefill and decode together (no disaggregation).
ENGINE_TYPE = "unified"
# SGLang's --decode-log-interval default: its windowed scheduler gauges (gen_throughput, spec_accept_length,
# decode_sum_seq_lens) are recomputed every this many decode steps.
DECODE_LOG_INTERVAL = 40
# A gen_throughput window older than this reads 0 (decode starved, e.g. behind long prefills), as SGLang's does.
GEN_THROUGHPUT_STALE_S = 30.0

# Buckets of SGLang's default histograms (v0.5.23), which dashboards' `le` selectors and heatmaps read.
SGLANG_TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
SGLANG_E2E_BUCKETS = (*SGLANG_TTFT_BUCKETS, 600, 1200, 1800, 2400)
# inter-token latency and per-request time per output token (seconds)
SGLANG_TOKEN_LATENCY_BUCKETS = (0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.025, 0.03, 0.035, 0.04, 0.06, 0.08,
                                0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8)
# prompt and generation lengths (tokens)
SGLANG_TOKEN_COUNT_BUCKETS = (100, 300, 500, 700, 1000, 1500, 2000, 3000, 4000, 5000, 6000, 7000, 8000, 9000, 10000,
                              12500, 15000, 17500, 20000, 22500, 25000, 27500, 30000, 35000, 40000, 60000, 80000,
                              100000, 200000, 300000, 400000, 600000, 800000, 1000000, 1100000)
# queue time: from entering the scheduler's waiting queue to the first admission into a prefill batch (seconds)
SGLANG_QUEUE_TIME_BUCKETS = (0.0, 0.001, 0.005, 0.01, 0.05, 0.1, 0.2, 0.5, 1, 2, 3, 4, 5, 10, 15, 20, 30, 40, 50, 60,
                             70, 80, 90, 100, 200, 300, 400, 500, 600, 700, 800, 900, 1000, 1200, 1400, 1600, 1800,
                             2000, 2500, 3000)
# The buckets our time-to-first-token and end-to-end latency histograms had before SGLang's: kept beside them, so
# that an alert on one of their `le` values keeps its series.
_OUR_REQUEST_LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


def _fmt(v: float) -> str:
    if v == math.inf:
        return "+Inf"
    if float(v).is_integer():
        return str(int(v))
    return repr(float(v))


def _escape(v: str) -> str:
    return str(v).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class _Metric:
    kind = ""

    def __init__(self, name: str, help_text: str, labelnames: tuple[str, ...] = (),
                 const: dict[str, str] | None = None):
        self.name, self.help, self.labelnames = name, help_text, tuple(labelnames)
        # Labels every series carries, first (SGLang's model_name, ...): a dict shared with ServerMetrics, which
        # fills in the served model's name once the app knows it.
        self.const = const if const is not None else {}
        self._lock = threading.Lock()

    def _key(self, labels: dict[str, str]) -> tuple[str, ...]:
        if set(labels) != set(self.labelnames):
            raise ValueError(f"{self.name}: labels {sorted(labels)} != declared {sorted(self.labelnames)}")
        return tuple(str(labels[n]) for n in self.labelnames)

    def _matcher(self, labels: dict[str, str]) -> list[tuple[int, str]]:
        """(position, value) of each given label, for sums over the series that have them."""
        unknown = set(labels) - set(self.labelnames)
        if unknown:
            raise ValueError(f"{self.name}: no labels {sorted(unknown)} (declared {sorted(self.labelnames)})")
        return [(self.labelnames.index(n), str(v)) for n, v in labels.items()]

    def _series(self, key: tuple[str, ...], extra: str = "") -> str:
        parts = [f'{n}="{_escape(v)}"' for n, v in self.const.items()]
        parts += [f'{n}="{_escape(v)}"' for n, v in zip(self.labelnames, key, strict=True)]
        if extra:
            parts.append(extra)
        return "{" + ",".join(parts) + "}" if parts else ""

    def header(self) -> list[str]:
        return [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} {self.kind}"]


class Counter(_Metric):
    kind = "counter"

    def __init__(self, name, help_text, labelnames=(), const=None):
        super().__init__(name, help_text, labelnames, const)
        self._values: dict[tuple[str, ...], float] = {} if labelnames else {(): 0.0}

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        if amount < 0:
            raise ValueError(f"{self.name}: counters only go up (amount={amount})")
        key = self._key(labels)
        with self._lock:
            self._values[key] = self._values.get(key, 0.0) + amount

    def seed(self, **labels: str) -> None:
        """Exports the series at 0 before its first increment (a rate over it then starts from the start)."""
        key = self._key(labels)
        with self._lock:
            self._values.setdefault(key, 0.0)

    def value(self, **labels: str) -> float:
        """The sum over the series whose labels include ``labels`` (every series without any)."""
        match = self._matcher(labels)
        with self._lock:
            return sum(v for k, v in self._values.items() if all(k[i] == s for i, s in match))

    def render(self) -> list[str]:
        with self._lock:
            items = sorted(self._values.items())
        return self.header() + [f"{self.name}{self._series(k)} {_fmt(v)}" for k, v in items]


class Gauge(Counter):
    kind = "gauge"

    def set(self, value: float, **labels: str) -> None:
        key = self._key(labels)
        with self._lock:
            self._values[key] = float(value)

    def add(self, amount: float, **labels: str) -> None:
        key = self._key(labels)
        with self._lock:
            self._values[key] = self._values.get(key, 0.0) + amount


class SnapshotCounter(Gauge):
    """A counter kept by the engine, copied in at scrape time (monotonic there, so exported as a counter)."""

    kind = "counter"


class Histogram(_Metric):
    kind = "histogram"

    def __init__(self, name, help_text, buckets: tuple[float, ...], labelnames=(), const=None):
        super().__init__(name, help_text, labelnames, const)
        self.buckets = tuple(sorted(set(float(b) for b in buckets)))
        # per label set: [counts per bucket (non-cumulative) + overflow], sum, count
        self._series_data: dict[tuple[str, ...], list] = {}

    def observe(self, value: float, **labels: str) -> None:
        self.observe_many(value, 1, value, **labels)

    def observe_many(self, value: float, n: int, total: float | None = None, **labels: str) -> None:
        """``n`` observations of ``value`` at once, summing to ``total`` (n x value without it)."""
        if n <= 0:
            return
        key = self._key(labels)
        i = bisect.bisect_left(self.buckets, value)  # first bucket with le >= value
        with self._lock:
            s = self._series_data.setdefault(key, [[0] * (len(self.buckets) + 1), 0.0, 0])
            s[0][i] += n
            s[1] += value * n if total is None else total
            s[2] += n

    def count(self, **labels: str) -> int:
        """Observations in the series whose labels include ``labels``."""
        match = self._matcher(labels)
        with self._lock:
            return sum(s[2] for k, s in self._series_data.items() if all(k[i] == v for i, v in match))

    def render(self) -> list[str]:
        with self._lock:
            items = sorted((k, (list(s[0]), s[1], s[2])) for k, s in self._series_data.items())
        out = self.header()
        for key, (counts, total, n) in items:
            cum = 0
            for le, c in zip((*self.buckets, math.inf), counts, strict=True):
                cum += c
                le_label = 'le="' + _fmt(le) + '"'
                out.append(f"{self.name}_bucket{self._series(key, le_label)} {cum}")
            out.append(f"{self.name}_sum{self._series(key)} {_fmt(total)}")
            out.append(f"{self.name}_count{self._series(key)} {n}")
        return out


class SnapshotHistogram(_Metric):
    """A histogram whose counts come whole from elsewhere (the engine's per-value tally) at scrape time."""

    kind = "histogram"

    def __init__(self, name, help_text, buckets: tuple[float, ...]):
        super().__init__(name, help_text)
        self.buckets = tuple(sorted(buckets))
        self._counts: dict[float, int] = {}
        self._sum = 0.0

    def set(self, counts: dict[float, int], total: float) -> None:
        with self._lock:
            self._counts, self._sum = dict(counts), total

    def cover(self, upto: int) -> None:
        """Adds a bucket for each integer up to ``upto`` past the last one (buckets never go away: a series that
        vanished between scrapes would read as a reset)."""
        last = int(self.buckets[-1]) if self.buckets else 0
        if upto > last:
            with self._lock:
                self.buckets = (*self.buckets, *(float(i) for i in range(last + 1, int(upto) + 1)))

    def render(self) -> list[str]:
        with self._lock:
            counts, total = dict(self._counts), self._sum
        out = self.header()
        for le in (*self.buckets, math.inf):
            cum = sum(c for v, c in counts.items() if v <= le)
            out.append(f'{self.name}_bucket{{le="{_fmt(le)}"}} {cum}')
        out.append(f"{self.name}_sum {_fmt(total)}")
        out.append(f"{self.name}_count {sum(counts.values())}")
        return out


class _DecodeWindow:
    """What SGLang's scheduler gauges average over: the decode steps since the last report, and the engine's busy
    time meanwhile (every step's wall time, prefill steps included; the idle time between requests left out)."""

    def __init__(self):
        self.steps = 0
        self.busy_s = 0.0
        self.tokens = 0  # generated by the window's decode steps
        self.rounds = 0  # verify rounds among them, one a request a round
        self.round_tokens = 0  # the tokens those rounds gave their requests
        self.drafts_accepted = 0  # draft tokens those rounds' verifies accepted
        self.drafts_proposed = 0  # and those they verified (k a request a round)


class ServerMetrics:
    """Every metric the server exports. Counters/histograms are fed by the engine driver (and the HTTP middleware);
    the gauges are refreshed from ``Engine.get_server_info()`` by ``update_from_info`` just before a scrape.

    ``decode_log_interval``: decode steps a window of SGLang's windowed gauges spans (SGLang's flag of that name,
    default 40). ``model_name``: the served model name, SGLang's ``model_name`` label (``set_model_name``)."""

    def __init__(self, max_accept_length: int = 16, decode_log_interval: int = DECODE_LOG_INTERVAL,
                 model_name: str = "default"):
        assert decode_log_interval >= 1, f"{decode_log_interval=} must be at least 1"
        self.decode_log_interval = decode_log_interval
        # SGLang's label sets: its tokenizer-side collector's (request-level metrics) and its scheduler-side one's.
        # Shared by the metrics, so that set_model_name reaches every series.
        tok = self._request_labels = {"model_name": model_name, "engine_type": ENGINE_TYPE}
        sch = self._scheduler_labels = {**tok, "tp_rank": "0", "pp_rank": "0", "moe_ep_rank": "0"}
        ttft_buckets = (*SGLANG_TTFT_BUCKETS, *_OUR_REQUEST_LATENCY_BUCKETS)
        e2e_buckets = (*SGLANG_E2E_BUCKETS, *_OUR_REQUEST_LATENCY_BUCKETS)
        step_latency = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

        # -- SGLang's request-level metrics (its TokenizerMetricsCollector's names, labels and buckets) -----------
        self.requests = Counter("sglang:num_requests_total", "Requests that reached the engine and ended, by "
                                "outcome (finished, aborted = client went away, failed = engine error or shutdown; "
                                "SGLang counts all three, without the label) and is_streaming.",
                                ("outcome", "is_streaming"), tok)
        self.aborted = Counter("sglang:num_aborted_requests_total", "Requests aborted because their client went "
                               "away.", const=tok)
        self.prompt_tokens = Counter("sglang:prompt_tokens_total", "Prompt tokens of the requests that reached "
                                     "the engine (counted on arrival).", ("is_streaming",), tok)
        self.generation_tokens = Counter("sglang:generation_tokens_total", "Tokens generated (counted as they come, "
                                         "streamed or not).", ("is_streaming",), tok)
        for flag in ("false", "true"):
            self.prompt_tokens.seed(is_streaming=flag)
            self.generation_tokens.seed(is_streaming=flag)
        self.so_requests = Counter("sglang:num_so_requests_total", "Requests with structured output (json_schema, "
                                   "regex, ebnf, structural_tag, response_format) that ended.", const=tok)
        self.spec_verify_calls = SnapshotCounter("sglang:spec_verify_calls_total", "Speculative verify rounds, one "
                                                 "per request per round (the same count as "
                                                 "sglang:spec_verify_forwards_total).", const=tok)
        self.ttft = Histogram("sglang:time_to_first_token_seconds", "From the request reaching its HTTP handler "
                              "to its first token, in seconds.", ttft_buckets, ("is_streaming",), tok)
        self.e2e = Histogram("sglang:e2e_request_latency_seconds", "From the request reaching its HTTP handler to "
                             "its end (finished or failed), in seconds.", e2e_buckets, ("is_streaming",), tok)
        self.itl = Histogram("sglang:inter_token_latency_seconds", "Time between a request's tokens after its "
                             "first, in seconds (a step's wait shared by the tokens it gave at once).",
                             SGLANG_TOKEN_LATENCY_BUCKETS, const=tok)
        self.tpot = Histogram("sglang:request_time_per_output_token_seconds", "Per request that finished on a stop "
                              "or its length: (end - first token) / (output tokens - 1), in seconds.",
                              SGLANG_TOKEN_LATENCY_BUCKETS, ("is_streaming",), tok)
        self.prompt_len = Histogram("sglang:prompt_tokens_histogram", "Prompt tokens per request that ended.",
                                    SGLANG_TOKEN_COUNT_BUCKETS, const=tok)
        self.uncached_prompt_len = Histogram("sglang:uncached_prompt_tokens_histogram", "Prompt tokens computed "
                                             "per request that ended: all of them (no prefix cache).",
                                             SGLANG_TOKEN_COUNT_BUCKETS, const=tok)
        self.generation_len = Histogram("sglang:generation_tokens_histogram", "Output tokens per request that "
                                        "ended.", SGLANG_TOKEN_COUNT_BUCKETS, const=tok)

        # -- SGLang's scheduler-level gauges (its SchedulerMetricsCollector's), from the engine at scrape time -----
        self.running = Gauge("sglang:num_running_reqs", "Requests in the running batch.", const=sch)
        self.queued = Gauge("sglang:num_queue_reqs", "Requests waiting for admission (the queue depth).",
                            const=sch)
        self.gen_throughput = Gauge("sglang:gen_throughput", "Tokens a second the decode steps of the last window "
                                    "(decode_log_interval of them) generated over the engine's busy time; 0 "
                                    "while nothing runs.", const=sch)
        self.cache_hit_rate = Gauge("sglang:cache_hit_rate", "Fraction of prompt tokens served from a prefix "
                                    "cache: always 0, this server keeps no prefix cache.", const=sch)
        self.decode_sum_seq_lens = Gauge("sglang:decode_sum_seq_lens", "Sum of the sequence lengths (prompt + "
                                         "output) of the decode batch at the last window's end.", const=sch)
        self.token_usage = Gauge("sglang:token_usage", "Fraction of the KV-cache pool in use (used / total "
                                 "tokens; whole pages here).", const=sch)
        self.full_token_usage = Gauge("sglang:full_token_usage", "Fraction of the full-attention KV-cache pool in "
                                      "use (the only pool: the same as sglang:token_usage).", const=sch)
        self.used_tokens = Gauge("sglang:num_used_tokens", "KV-cache slots held by requests (pages in use x page "
                                 "size).", const=sch)
        self.kv_used_tokens = Gauge("sglang:kv_used_tokens", "KV-cache slots held by requests (the same as "
                                    "sglang:num_used_tokens).", const=sch)
        self.kv_available_tokens = Gauge("sglang:kv_available_tokens", "Free KV-cache slots (free pages x page "
                                         "size).", const=sch)
        self.kv_evictable_tokens = Gauge("sglang:kv_evictable_tokens", "KV-cache slots of cached prefixes that "
                                         "could be evicted: always 0, no prefix cache.", const=sch)
        self.avg_accept = Gauge("sglang:spec_accept_length", "Tokens per verify round (accepted drafts + 1) over "
                                "the last window's decode steps (0 without speculation).", const=sch)
        self.accept_rate = Gauge("sglang:spec_accept_rate", "Accepted draft tokens / proposed draft tokens over the "
                                 "last window's verify rounds (0 without speculation).", const=sch)
        self.cap_length = Gauge("sglang:spec_cap_length", "SGLang's DSpark confidence-capped verify window per "
                                "round: always 0, EAGLE-3 verifies every draft it proposes.", const=sch)
        self.block_accept_length = Gauge("sglang:spec_block_accept_length", "SGLang's DSpark uncapped block accept "
                                         "length: always 0 (no capped verify, as SGLang's under EAGLE-3).", const=sch)
        self.num_steps = Gauge("sglang:spec_num_steps", "Draft steps of the next speculative round (with "
                               "--speculative-adaptive, the k its policy chose; 0 without speculation).", const=sch)
        self.num_draft_tokens = Gauge("sglang:spec_num_draft_tokens", "Tokens the next speculative round verifies "
                                      "(draft steps + 1; 0 without speculation).", const=sch)
        self.max_total_tokens = Gauge("sglang:max_total_num_tokens", "KV-cache pool size in tokens.", const=sch)
        self.page_size = Gauge("sglang:page_size", "KV-cache page size in tokens.", const=sch)
        self.num_pages = Gauge("sglang:num_pages", "KV-cache pages in the pool.", const=sch)
        self.context_len = Gauge("sglang:context_len", "Maximum context length (prompt + output tokens).",
                                 const=sch)
        self.queue_time = Histogram("sglang:queue_time_seconds", "From a request entering the scheduler's waiting "
                                    "queue to its first admission into a prefill batch, in seconds (one observation "
                                    "a request; a readmission after a retraction is not observed).",
                                    SGLANG_QUEUE_TIME_BUCKETS, const=sch)
        self.retracted_recent = Gauge("sglang:num_retracted_reqs", "Requests the latest retraction (KV pool full) "
                                      "sent back to the waiting queue, while it falls in the last window or the one "
                                      "now running; else 0.", const=sch)
        self.retracted = SnapshotCounter("sglang:num_retracted_requests_total", "Requests retracted (sent back to "
                                         "the waiting queue to re-prefill later, the KV pool full).", const=sch)
        self.retracted_input_tokens = SnapshotCounter("sglang:num_retracted_input_tokens_total", "Prompt tokens of "
                                                      "the retracted requests.", const=sch)
        self.retracted_output_tokens = SnapshotCounter("sglang:num_retracted_output_tokens_total", "Output tokens "
                                                       "the retracted requests had when retracted.", const=sch)

        # -- SGLang's HTTP metrics (no model label, as SGLang's) --------------------------------------------------
        self.http_requests = Counter("sglang:http_requests_total", "HTTP requests, by endpoint (the route's path "
                                     "template; unmatched for a path no route serves) and method.",
                                     ("endpoint", "method"))
        self.http_responses = Counter("sglang:http_responses_total", "HTTP responses, by endpoint, status code and "
                                      "method.", ("endpoint", "status_code", "method"))
        self.http_active = Gauge("sglang:http_requests_active", "HTTP requests being served (until their answer "
                                 "is sent), by endpoint and method.", ("endpoint", "method"))

        # -- ours (no SGLang counterpart) -------------------------------------------------------------------------
        self.rejected = Counter("sglang:num_rejected_requests_total", "Requests answered without reaching the "
                                "engine, by HTTP status (400 invalid, 404 unknown model, 413 body too large, "
                                "503 queue full).", ("status",))
        self.step_latency = Histogram("sglang:step_latency_seconds", "Wall time of one engine step, by phase "
                                      "(prefill admits new requests; decode is one round for every running one).",
                                      step_latency, ("phase",))
        self.engine_errors = Counter("sglang:engine_errors_total", "Engine steps that raised (their requests "
                                     "failed with 500; the server kept serving).")
        self.inflight = Gauge("sglang:num_inflight_reqs", "Requests accepted by the server and not finished.")
        self.kv_free = Gauge("sglang:kv_pages_free", "Free KV-cache pages.")
        self.kv_total = Gauge("sglang:kv_pages_total", "KV-cache pages in the pool.")
        self.adaptive_switches = SnapshotCounter("sglang:spec_adaptive_switches_total", "Times the adaptive draft "
                                                 "length changed k (--speculative-adaptive).")
        self.verify_forwards = SnapshotCounter("sglang:spec_verify_forwards_total", "EAGLE-3 verify rounds since "
                                               "start, one per request per round (spec_verify_ct summed).")
        self.accept_length = SnapshotHistogram("sglang:spec_accept_length_per_round", "Tokens emitted per verify "
                                               "round (accepted draft tokens + 1).",
                                               tuple(float(i) for i in range(1, max_accept_length + 1)))
        # NOTE: max_accept_length is the launch's k + 1; the adaptive policy may run larger candidates, whose
        # lengths update_from_info adds as buckets (else they would count under +Inf alone, and quantiles read
        # from the histogram would stop at k + 1).
        self.forwards = SnapshotCounter("sglang:forward_total", "Forwards of each captured function, by path "
                                        "(graph = CUDA-graph replay, eager = not; on CPU all are eager).",
                                        ("name", "path"))
        self.grammar_drafts = SnapshotCounter("sglang:grammar_draft_steps_total", "Draft proposals of requests with "
                                              "a grammar in speculative rounds (proposed), and those none of whose "
                                              "candidates the grammar allowed, chosen again under its mask (refilled).",
                                              ("outcome",))
        self._all = [m for m in vars(self).values() if isinstance(m, _Metric)]

        self._window = _DecodeWindow()
        self._window_lock = threading.Lock()
        self._window_throughput = 0.0
        self._window_at: float | None = None  # time.monotonic() of the last window's end
        self._prev_window_at: float | None = None  # and of the one before it

    def set_model_name(self, name: str) -> None:
        """The served model name, SGLang's ``model_name`` label on its metrics (create_app sets it)."""
        self._request_labels["model_name"] = name
        self._scheduler_labels["model_name"] = name

    def note_step(self, seconds: float, *, decode: bool, tokens: int = 0, rounds: int = 0, round_tokens: int = 0,
                  seq_lens: int = 0, drafts_accepted: int = 0, drafts_proposed: int = 0) -> None:
        """Engine thread, after each step: its wall time; for a decode step (a round for the running batch read)
        also the tokens it generated, its verify rounds (one a request), the tokens those rounds gave, the sum of
        the batch's sequence lengths, and the draft tokens its verifies accepted of those they were proposed. Every
        ``decode_log_interval`` decode steps the windowed gauges take the window's values, as SGLang's scheduler
        reports them."""
        with self._window_lock:
            w = self._window
            w.busy_s += seconds
            if not decode:
                return
            w.steps += 1
            w.tokens += tokens
            w.rounds += rounds
            w.round_tokens += round_tokens
            w.drafts_accepted += drafts_accepted
            w.drafts_proposed += drafts_proposed
            if w.steps < self.decode_log_interval:
                return
            self._window_throughput = w.tokens / w.busy_s if w.busy_s > 0 else 0.0
            self._prev_window_at, self._window_at = self._window_at, time.monotonic()
            self._window = _DecodeWindow()
        self.avg_accept.set(w.round_tokens / w.rounds if w.rounds else 0.0)
        self.accept_rate.set(w.drafts_accepted / w.drafts_proposed if w.drafts_proposed else 0.0)
        self.decode_sum_seq_lens.set(seq_lens)

    def update_from_info(self, info: dict, inflight: int) -> None:
        running = info.get("running_requests", 0)
        self.running.set(running)
        self.queued.set(info.get("waiting_requests", 0))
        self.inflight.set(inflight)
        total, free, page = info.get("kv_pages_total", 0), info.get("kv_pages_free", 0), info.get("page_size", 0)
        used = max(total - free, 0)
        self.kv_free.set(free)
        self.kv_total.set(total)
        self.token_usage.set(used / total if total else 0.0)
        self.full_token_usage.set(used / total if total else 0.0)
        self.used_tokens.set(used * page)
        self.kv_used_tokens.set(used * page)
        self.kv_available_tokens.set(free * page)
        self.kv_evictable_tokens.set(0)
        self.cache_hit_rate.set(0.0)
        self.max_total_tokens.set(info.get("max_total_num_tokens") or total * page)
        self.page_size.set(page)
        self.num_pages.set(total)
        self.context_len.set((info.get("model") or {}).get("context_length", 0))
        with self._window_lock:
            fresh = self._window_at is not None and time.monotonic() - self._window_at <= GEN_THROUGHPUT_STALE_S
            # NOTE: SGLang's scheduler reports 0 once its running batch is empty, and lets a window go stale to 0.
            self.gen_throughput.set(self._window_throughput if running and fresh else 0.0)
            # SGLang reports the latest retraction at the end of the window it fell in and holds it for the next;
            # here it shows from the retraction itself (the worker says how long ago, in its own clock) until then.
            age = info.get("last_retraction_age_s")
            recent = age is not None and (self._prev_window_at is None
                                          or time.monotonic() - age > self._prev_window_at)
        self.retracted_recent.set(info.get("last_retraction_requests", 0) if recent else 0)
        self.retracted.set(info.get("retracted_requests", 0))
        self.retracted_input_tokens.set(info.get("retracted_input_tokens", 0))
        self.retracted_output_tokens.set(info.get("retracted_output_tokens", 0))
        self.cap_length.set(0)
        self.block_accept_length.set(0)
        self.verify_forwards.set(info.get("verify_forwards", 0))
        self.spec_verify_calls.set(info.get("verify_forwards", 0))
        hist = {int(k): int(v) for k, v in (info.get("accept_length_hist") or {}).items()}
        candidates = (info.get("adaptive") or {}).get("candidates") or ()
        self.accept_length.cover(max([*hist, *(k + 1 for k in candidates)], default=0))
        self.accept_length.set(hist, float(info.get("accepted_tokens", sum(k * v for k, v in hist.items()))))
        for name, counts in (info.get("forward_counts") or {}).items():
            self.forwards.set(counts.get("graph", 0), name=name, path="graph")
            self.forwards.set(counts.get("eager", 0), name=name, path="eager")
        for outcome, n in (info.get("grammar_proposals") or {}).items():
            self.grammar_drafts.set(n, outcome=outcome)
        steps = info.get("speculative_num_steps")
        self.num_steps.set(steps or 0)
        self.num_draft_tokens.set(steps + 1 if steps is not None else 0)
        self.adaptive_switches.set((info.get("adaptive") or {}).get("switches", 0))

    def render(self) -> str:
        lines: list[str] = []
        for m in self._all:
            lines += m.render()
        return "\n".join(lines) + "\n"
