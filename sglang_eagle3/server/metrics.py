"""Prometheus text exposition (format 0.0.4) for the server: counters and histograms updated by the engine
thread, gauges filled from an engine snapshot at scrape time. Names use SGLang's ``sglang:`` prefix; where
SGLang has a metric of the same meaning the name matches it (``sglang:prompt_tokens_total``, ...).
"""

from __future__ import annotations

import bisect
import math
import threading

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _fmt(v: float) -> str:
    if v == math.inf:
        return "+Inf"
    if float(v).is_integer():
        return str(int(v))
    return repr(float(v))


def _labels(names: tuple[str, ...], values: tuple[str, ...], extra: str = "") -> str:
    parts = [f'{n}="{_escape(v)}"' for n, v in zip(names, values, strict=True)]
    if extra:
        parts.append(extra)
    return "{" + ",".join(parts) + "}" if parts else ""


def _escape(v: str) -> str:
    return str(v).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class _Metric:
    kind = ""

    def __init__(self, name: str, help_text: str, labelnames: tuple[str, ...] = ()):
        self.name, self.help, self.labelnames = name, help_text, tuple(labelnames)
        self._lock = threading.Lock()

    def _key(self, labels: dict[str, str]) -> tuple[str, ...]:
        if set(labels) != set(self.labelnames):
            raise ValueError(f"{self.name}: labels {sorted(labels)} != declared {sorted(self.labelnames)}")
        return tuple(str(labels[n]) for n in self.labelnames)

    def header(self) -> list[str]:
        return [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} {self.kind}"]


class Counter(_Metric):
    kind = "counter"

    def __init__(self, name, help_text, labelnames=()):
        super().__init__(name, help_text, labelnames)
        self._values: dict[tuple[str, ...], float] = {} if labelnames else {(): 0.0}

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        if amount < 0:
            raise ValueError(f"{self.name}: counters only go up (amount={amount})")
        key = self._key(labels)
        with self._lock:
            self._values[key] = self._values.get(key, 0.0) + amount

    def value(self, **labels: str) -> float:
        return self._values.get(self._key(labels), 0.0)

    def render(self) -> list[str]:
        with self._lock:
            items = sorted(self._values.items())
        return self.header() + [f"{self.name}{_labels(self.labelnames, k)} {_fmt(v)}" for k, v in items]


class Gauge(Counter):
    kind = "gauge"

    def set(self, value: float, **labels: str) -> None:
        key = self._key(labels)
        with self._lock:
            self._values[key] = float(value)


class SnapshotCounter(Gauge):
    """A counter kept by the engine, copied in at scrape time (monotonic there, so exported as a counter)."""

    kind = "counter"


class Histogram(_Metric):
    kind = "histogram"

    def __init__(self, name, help_text, buckets: tuple[float, ...], labelnames=()):
        super().__init__(name, help_text, labelnames)
        self.buckets = tuple(sorted(buckets))
        # per label set: [counts per bucket (non-cumulative) + overflow], sum, count
        self._series: dict[tuple[str, ...], list] = {}

    def observe(self, value: float, **labels: str) -> None:
        key = self._key(labels)
        i = bisect.bisect_left(self.buckets, value)  # first bucket with le >= value
        with self._lock:
            s = self._series.setdefault(key, [[0] * (len(self.buckets) + 1), 0.0, 0])
            s[0][i] += 1
            s[1] += value
            s[2] += 1

    def count(self, **labels: str) -> int:
        s = self._series.get(self._key(labels))
        return s[2] if s else 0

    def render(self) -> list[str]:
        with self._lock:
            items = sorted((k, (list(s[0]), s[1], s[2])) for k, s in self._series.items())
        out = self.header()
        for key, (counts, total, n) in items:
            cum = 0
            for le, c in zip((*self.buckets, math.inf), counts, strict=True):
                cum += c
                le_label = 'le="' + _fmt(le) + '"'
                out.append(f"{self.name}_bucket{_labels(self.labelnames, key, le_label)} {cum}")
            out.append(f"{self.name}_sum{_labels(self.labelnames, key)} {_fmt(total)}")
            out.append(f"{self.name}_count{_labels(self.labelnames, key)} {n}")
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


class ServerMetrics:
    """Every metric the server exports. Counters/histograms are fed by the engine driver; the gauges are
    refreshed from ``Engine.get_server_info()`` by ``update_from_info`` just before a scrape."""

    def __init__(self, max_accept_length: int = 16):
        latency = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
        request_latency = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
        self.requests = Counter("sglang:num_requests_total", "Requests that reached the engine, by outcome "
                                "(finished, aborted = client went away, failed = engine error or shutdown).",
                                ("outcome",))
        self.rejected = Counter("sglang:num_rejected_requests_total", "Requests answered without reaching the "
                                "engine, by HTTP status (400 invalid, 404 unknown model, 413 body too large, "
                                "503 queue full).", ("status",))
        self.prompt_tokens = Counter("sglang:prompt_tokens_total", "Prompt tokens of admitted requests.")
        self.generation_tokens = Counter("sglang:generation_tokens_total", "Tokens generated (streamed or not).")
        self.step_latency = Histogram("sglang:step_latency_seconds", "Wall time of one engine step, by phase "
                                      "(prefill admits new requests; decode is one round for every running one).",
                                      latency, ("phase",))
        self.ttft = Histogram("sglang:time_to_first_token_seconds", "From the request reaching the engine "
                              "thread to its first token.", request_latency)
        self.e2e = Histogram("sglang:e2e_request_latency_seconds", "From the request reaching the engine thread "
                             "to its end.", request_latency)
        self.engine_errors = Counter("sglang:engine_errors_total", "Engine steps that raised (their requests "
                                     "failed with 500; the server kept serving).")
        # From the engine snapshot at scrape time.
        self.running = Gauge("sglang:num_running_reqs", "Requests in the running batch.")
        self.queued = Gauge("sglang:num_queue_reqs", "Requests waiting for admission (the queue depth).")
        self.inflight = Gauge("sglang:num_inflight_reqs", "Requests accepted by the server and not finished.")
        self.kv_free = Gauge("sglang:kv_pages_free", "Free KV-cache pages.")
        self.kv_total = Gauge("sglang:kv_pages_total", "KV-cache pages in the pool.")
        self.token_usage = Gauge("sglang:token_usage", "Fraction of the KV-cache pool in use (SGLang's gauge of "
                                 "the same name: used / total tokens; pages here).")
        self.used_tokens = Gauge("sglang:num_used_tokens", "KV-cache slots held by requests (pages in use x "
                                 "page size; SGLang's gauge of the same name).")
        self.avg_accept = Gauge("sglang:spec_accept_length", "Average tokens per verify round since start "
                                "(SGLang's gauge of the same name).")
        self.num_steps = Gauge("sglang:spec_num_steps", "Draft steps of the next speculative round (with "
                               "--speculative-adaptive, the k its policy chose; 0 without speculation).")
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
        self._all = [self.requests, self.rejected, self.prompt_tokens, self.generation_tokens, self.step_latency,
                     self.ttft, self.e2e, self.engine_errors, self.running, self.queued, self.inflight, self.kv_free,
                     self.kv_total, self.token_usage, self.used_tokens, self.avg_accept, self.verify_forwards,
                     self.accept_length, self.forwards, self.grammar_drafts, self.num_steps, self.adaptive_switches]

    def update_from_info(self, info: dict, inflight: int) -> None:
        self.running.set(info.get("running_requests", 0))
        self.queued.set(info.get("waiting_requests", 0))
        self.inflight.set(inflight)
        self.kv_free.set(info.get("kv_pages_free", 0))
        self.kv_total.set(info.get("kv_pages_total", 0))
        total = info.get("kv_pages_total", 0)
        used = max(total - info.get("kv_pages_free", 0), 0)
        self.token_usage.set(used / total if total else 0.0)
        self.used_tokens.set(used * info.get("page_size", 0))
        self.avg_accept.set(info.get("avg_spec_accept_length", 0.0))
        self.verify_forwards.set(info.get("verify_forwards", 0))
        hist = {int(k): int(v) for k, v in (info.get("accept_length_hist") or {}).items()}
        candidates = (info.get("adaptive") or {}).get("candidates") or ()
        self.accept_length.cover(max([*hist, *(k + 1 for k in candidates)], default=0))
        self.accept_length.set(hist, float(info.get("accepted_tokens", sum(k * v for k, v in hist.items()))))
        for name, counts in (info.get("forward_counts") or {}).items():
            self.forwards.set(counts.get("graph", 0), name=name, path="graph")
            self.forwards.set(counts.get("eager", 0), name=name, path="eager")
        for outcome, n in (info.get("grammar_proposals") or {}).items():
            self.grammar_drafts.set(n, outcome=outcome)
        self.num_steps.set(info.get("speculative_num_steps") or 0)
        self.adaptive_switches.set((info.get("adaptive") or {}).get("switches", 0))

    def render(self) -> str:
        lines: list[str] = []
        for m in self._all:
            lines += m.render()
        return "\n".join(lines) + "\n"
