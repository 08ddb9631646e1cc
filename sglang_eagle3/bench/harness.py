"""End-to-end benchmark harness with provenance. Talks HTTP only (our server or SGLang's); imports no runtime.

Why it exists: a remembered "89 tok/s" baseline from another session and environment cost hours of chasing a
regression that never was, and a decode-only internal metric was compared with an end-to-end one. So every
result here carries where it came from (server args, model, GPU, worker environment, the client's git commit,
command, time), names what it measures (end-to-end output tokens/s over wall time; time to first token;
inter-token latency; accept length and verify graph/eager counts), counts failed requests apart, and `compare`
puts runs side by side only after printing every provenance field in which they differ.

Two servers' /get_server_info are read (``server_kind`` tells them apart):
- ours (``sglang_eagle3``): ``args``, ``model``, ``draft``, ``device``, ``tp_size``, ``worker_env`` (one report
  per TP worker process; the server process's own, as rank 0, when the model runs there), ``kernels``,
  ``git_commit`` (the server's checkout), and the counters
  ``verify_forwards`` / ``accepted_tokens`` / ``forward_counts``, read as deltas over the run.
- SGLang 0.5.23 (``sglang``): the resolved server args flat at the top level (``ServerArgs.resolved_dict()``),
  worker 0's scheduler handshake merged in, ``launch_command``, ``internal_states`` (one dict per DP rank) and
  ``version``. With our overlay, worker 0's handshake carries ``sglang_eagle3`` = {"worker_env", "overlay"}
  and each internal state ``sglang_eagle3`` = the overlay's live status (its ``verify`` counters). The accept
  length is SGLang's own per-request one: completion tokens over ``meta_info["spec_verify_ct"]``.
"""

from __future__ import annotations

import collections
import importlib.metadata
import json
import os
import platform
import shlex
import statistics
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import asdict, dataclass, field

from sglang_eagle3.env_report import PER_RANK_KEYS, git_commit, is_reported

DEFAULT_PROMPTS = [
    "And God said, Let there be light:",
    "In the beginning",
    "The Lord is my shepherd;",
    "Blessed are the poor in spirit:",
    "And it came to pass, when",
    "Now the serpent was more subtil than any beast",
    "Give ear to my words, O Lord,",
    "A soft answer turneth away wrath:",
]

OURS, SGLANG = "sglang_eagle3", "sglang"
# The keys by which each server's /get_server_info is recognised.
_OUR_KEYS = ("args", "model", "device", "tp_size", "worker_env")
_SGLANG_KEYS = ("model_path", "tp_size", "internal_states", "version")
# SGLang 0.5.23's top-level /get_server_info keys that are not server arguments: build_server_info adds
# launch_command, kv_events and worker 0's scheduler handshake (Scheduler.get_init_info); server_info() adds
# startup_time, internal_states, version, frontend. Keys starting with "sglang_eagle3" are our overlay's.
_SGLANG_NOT_ARGS = frozenset({
    "launch_command", "kv_events", "status", "max_total_num_tokens", "max_req_input_len", "startup_time",
    "hicache_object_layout", "kv_event_sources", "internal_states", "version", "frontend",
})
# The overlay status fields fixed at start (the rest are live counters and the pid).
_OVERLAY_FIXED = ("applied", "sglang_version", "config", "patched", "skipped", "draft_wiring",
                  "env_overridden_by_sglang")


class BenchError(RuntimeError):
    """A server, input or result file the harness cannot use; the message is one line naming it."""


def check_name(name: str) -> str:
    """A run's name becomes its file name in the output folder: no path separators, no '..', not empty."""
    if not name or "/" in name or "\\" in name or ".." in name or (os.altsep and os.altsep in name):
        raise ValueError(f"run name {name!r} must be a plain file name (no '/', '\\' or '..')")
    return name


def _check_url(base: str) -> str:
    parts = urllib.parse.urlsplit(base)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise BenchError(f"server URL {base!r} must look like http://HOST:PORT")
    return base.rstrip("/")


def _get(url: str, timeout: float = 30.0) -> dict:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            body = r.read()
    except urllib.error.HTTPError as e:
        raise BenchError(f"GET {url} answered HTTP {e.code}: {_http_error_message(e)}") from None
    except (urllib.error.URLError, OSError) as e:
        raise BenchError(f"cannot reach {url}: {getattr(e, 'reason', e)}") from None
    try:
        info = json.loads(body)
    except ValueError:
        raise BenchError(f"GET {url} did not answer JSON: {body[:80]!r}") from None
    if not isinstance(info, dict):
        raise BenchError(f"GET {url} answered a JSON {type(info).__name__}, not an object")
    return info


def server_info(base: str, timeout: float = 30.0) -> dict:
    """The server's /get_server_info; raises BenchError naming the URL when it cannot be had."""
    return _get(base + "/get_server_info", timeout)


def _error_message(err) -> str:
    """The message of an `{"error": ...}` payload: OpenAI-style {"message": ...}, or a plain value."""
    if isinstance(err, dict) and "message" in err:
        return str(err["message"])
    return err if isinstance(err, str) else json.dumps(err, default=str)


def _http_error_message(e: urllib.error.HTTPError) -> str:
    try:
        body = e.read().decode(errors="replace")
    except OSError:
        return str(e.reason)
    try:
        payload = json.loads(body)
    except ValueError:
        return body.strip()[:200] or str(e.reason)
    if isinstance(payload, dict) and "error" in payload:
        return _error_message(payload["error"])
    return body.strip()[:200]


def _post_stream(url: str, body: dict, timeout: float):
    """Yields parsed SSE `data:` payloads of a streaming /generate call (raises HTTPError for non-2xx)."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                return
            yield json.loads(data)


@dataclass
class RequestResult:
    prompt_tokens: int
    output_tokens: int
    latency_s: float
    ttft_s: float
    itl_s: list[float] = field(default_factory=list)
    verify_ct: int = 0  # meta_info["spec_verify_ct"]: verify rounds of this request (0 without speculation)
    error: str | None = None  # set when the request failed: an error event, a non-2xx answer, no token at all


def run_one(base: str, prompt: str, max_tokens: int, temperature: float, timeout: float) -> RequestResult:
    body = {"text": prompt, "stream": True,
            "sampling_params": {"max_new_tokens": max_tokens, "temperature": temperature, "ignore_eos": True}}
    t0 = time.perf_counter()
    last, ttft, itl, meta, n_prev, error = t0, None, [], {}, 0, None
    try:
        for chunk in _post_stream(base + "/generate", body, timeout):
            if not isinstance(chunk, dict):
                error = f"unexpected stream event: {json.dumps(chunk)[:120]}"
                break
            if "error" in chunk:  # both servers end a failed stream with data: {"error": {...}} then [DONE]
                error = f"error event: {_error_message(chunk['error'])}"
                break
            now = time.perf_counter()
            meta = chunk.get("meta_info", meta)
            n = meta.get("completion_tokens", n_prev)
            if n > n_prev:
                if ttft is None:
                    ttft = now - t0
                else:
                    # several tokens may arrive in one chunk (a verify round): spread the gap over them
                    itl += [(now - last) / (n - n_prev)] * (n - n_prev)
                last, n_prev = now, n
    except urllib.error.HTTPError as e:
        error = f"HTTP {e.code}: {_http_error_message(e)}"
    except (urllib.error.URLError, OSError, json.JSONDecodeError) as e:
        error = f"{type(e).__name__}: {e}"
    latency = time.perf_counter() - t0
    if error is None and not meta.get("completion_tokens"):
        error = "the stream ended without an output token"
    if error is not None:
        return RequestResult(meta.get("prompt_tokens", 0), n_prev, latency, ttft or 0.0, itl, error=error)
    return RequestResult(meta.get("prompt_tokens", 0), meta["completion_tokens"], latency, ttft, itl,
                         meta.get("spec_verify_ct", 0))


def server_kind(info: dict, url: str = "the server") -> str:
    """OURS or SGLANG by the keys of the /get_server_info answer; BenchError naming the missing keys else."""
    missing_ours = [k for k in _OUR_KEYS if k not in info]
    if not missing_ours and isinstance(info["args"], dict):
        return OURS
    missing_sglang = [k for k in _SGLANG_KEYS if k not in info]
    if not missing_sglang and isinstance(info["internal_states"], list):
        return SGLANG
    missing_ours = missing_ours or ["args (an object)"]
    missing_sglang = missing_sglang or ["internal_states (a list)"]
    raise BenchError(f"/get_server_info of {url} is neither sglang_eagle3's (missing {', '.join(missing_ours)}) "
                     f"nor SGLang's (missing {', '.join(missing_sglang)}); its keys: {', '.join(sorted(info)[:12])}")


def _sglang_args(info: dict) -> dict:
    return {k: info[k] for k in sorted(info) if k not in _SGLANG_NOT_ARGS and not k.startswith("sglang_eagle3")}


def _sglang_worker_env(info: dict) -> list[dict] | None:
    # Engine.get_server_info (Python API, overlay on) lists every worker; over HTTP only worker 0's handshake.
    workers = info.get("sglang_eagle3_workers") or [info.get("sglang_eagle3") or {}]
    envs = [w["worker_env"] for w in workers if isinstance(w, dict) and w.get("worker_env")]
    return envs or None


def _counters(kind: str, info: dict) -> dict:
    """Server-side counters read as deltas over the run; None where this server does not report one."""
    if kind == OURS:
        fc = info.get("forward_counts", {}).get("target_verify", {})
        return {"verify_forwards": info.get("verify_forwards"), "accepted_tokens": info.get("accepted_tokens"),
                "verify_graph": fc.get("graph", 0), "verify_eager": fc.get("eager", 0)}
    # The overlay's verify counters, one set per DP rank (each rank's scheduler process counts its own).
    verify = [s["sglang_eagle3"]["verify"] for s in info["internal_states"]
              if isinstance(s, dict) and isinstance(s.get("sglang_eagle3"), dict) and "verify" in s["sglang_eagle3"]]
    return {"verify_forwards": None, "accepted_tokens": None,
            "verify_graph": sum(v.get("graph", 0) + v.get("prefill_graph", 0) for v in verify) if verify else None,
            "verify_eager": sum(v.get("eager", 0) for v in verify) if verify else None}


def _delta(before: dict, after: dict | None, key: str) -> int | None:
    if after is None or before.get(key) is None or after.get(key) is None:
        return None
    return after[key] - before[key]


def _client_versions() -> dict:
    """This harness's package, torch and triton versions as installed (read without importing torch)."""
    out = {}
    for dist in ("sglang_eagle3", "torch", "triton"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = None
    from sglang_eagle3 import __version__

    out["sglang_eagle3"] = __version__  # the imported copy (a checkout may not be the installed one)
    return out


def _cpu_name() -> str | None:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _env_not_applied(requested: dict, reports: list[dict] | None) -> list[str] | None:
    """One line per requested variable (--worker-env, a sweep configuration's VAR=VALUE) that a worker report
    shows with another value or unset: the variable did not reach the process that ran the model. None when no
    worker reported its environment (nothing to check against)."""
    if not reports:
        return None
    lines = []
    for i, report in enumerate(reports):
        env_seen = report.get("env") or {}
        for key, want in requested.items():
            if not is_reported(key) or env_seen.get(key) == want:
                continue  # (a variable the reports leave out, e.g. a secret, cannot be checked)
            got = env_seen.get(key)
            lines.append(f"{key}={want} was requested but worker rank {report.get('rank', i)} ran with "
                         f"{key}={'<unset>' if got is None else got}")
    return lines


def provenance(base: str, info: dict, *, command: str | None = None, launch_env: dict | None = None) -> dict:
    """Everything a reader needs to know whether two numbers are comparable. ``worker_env`` is a list of
    env_report.collect_env_report() dicts (one per worker process), or None where the server reports none.
    ``client_git_commit`` is this harness's checkout; ``server_git_commit`` the one our server reports it runs
    (SGLang's reports none). ``worker_env_not_applied`` lists the requested variables (``launch_env``, our
    server's --worker-env) that a worker report contradicts."""
    kind = server_kind(info, base)
    requested = dict(launch_env or {})
    if kind == OURS:
        args = info["args"]
        for pair in args.get("worker_env") or ():
            if isinstance(pair, (list, tuple)) and len(pair) == 2:
                requested[str(pair[0])] = str(pair[1])
        prov = {
            "server_kind": OURS,
            "server_version": info.get("version"),
            "server_args": {k: args.get(k) for k in sorted(args)},
            "model": info.get("model"),
            "draft": info.get("draft"),
            "device": info.get("device"),
            "tp_size": info.get("tp_size"),
            "max_total_num_tokens": info.get("max_total_num_tokens"),
            "worker_env": info.get("worker_env") or None,
            "kernels": info.get("kernels"),
            "server_git_commit": info.get("git_commit"),
        }
    else:
        args = _sglang_args(info)
        overlay = (info.get("sglang_eagle3") or {}).get("overlay")
        states = [s for s in info["internal_states"] if isinstance(s, dict)]
        prov = {
            "server_kind": SGLANG,
            "server_version": info["version"],
            "server_args": args,
            "device": args.get("device"),
            "tp_size": args.get("tp_size"),
            "max_total_num_tokens": info.get("max_total_num_tokens"),
            "worker_env": _sglang_worker_env(info),
            # SGLang's own variables, when it runs with SGLANG_EXPOSE_OWN_ENV_VARS=1
            "sglang_env_vars": states[0].get("env_vars") if states else None,
            "overlay": {k: overlay.get(k) for k in _OVERLAY_FIXED} if isinstance(overlay, dict) else None,
            "server_launch_command": info.get("launch_command"),
        }
    prov.update({
        "launch_env": dict(launch_env) if launch_env else None,
        "worker_env_not_applied": _env_not_applied(requested, prov["worker_env"]) if requested else None,
        "server_url": base,
        "client_host": platform.node(),
        "client_platform": platform.platform(),
        "client_cpu": _cpu_name(),
        "client_cpu_count": os.cpu_count(),
        "client_python": platform.python_version(),
        "client_versions": _client_versions(),
        "client_git_commit": git_commit(),
        "command": command if command is not None else " ".join(shlex.quote(a) for a in sys.argv),
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    })
    return prov


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during the timed passes: ``result`` holds what the requests finished before it measured (its
    ``interrupted`` field says how far the run got), for the caller to save."""

    def __init__(self, result: dict):
        super().__init__(result["interrupted"])
        self.result = result


def _timed_pass(base: str, prompts: list[str], num_requests: int, concurrency: int, max_tokens: int,
                temperature: float, timeout: float, on_done) -> tuple[list[RequestResult], float, bool]:
    """One pass of the workload: (the finished requests, its wall time, whether Ctrl-C cut it short). The
    request threads are daemons and stop taking requests at an interrupt, so Ctrl-C returns at once."""
    results: list[RequestResult] = []
    lock = threading.Lock()
    stop = threading.Event()
    todo = collections.deque(range(num_requests))

    def worker():
        while not stop.is_set():
            with lock:
                if not todo:
                    return
                i = todo.popleft()
            r = run_one(base, prompts[i % len(prompts)], max_tokens, temperature, timeout)
            with lock:
                if stop.is_set():  # finished after the interrupt: outside the measured wall time
                    return
                results.append(r)
                on_done(results)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker, daemon=True) for _ in range(min(concurrency, num_requests))]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    except KeyboardInterrupt:
        stop.set()
        with lock:
            return list(results), time.perf_counter() - t0, True
    return results, time.perf_counter() - t0, False


@dataclass(frozen=True)
class Workload:
    """What a run sends: ``num_requests`` requests a timed pass (prompts used in turn), ``concurrency`` in
    flight, ``max_tokens`` output tokens each (EOS ignored), after ``warmup`` untimed requests; ``repeats``
    timed passes on one server; ``timeout`` seconds a request."""

    prompts: list[str]
    num_requests: int
    concurrency: int
    max_tokens: int
    temperature: float = 0.0
    warmup: int = 2
    timeout: float = 600.0
    repeats: int = 1

    def __post_init__(self):
        if (self.num_requests < 1 or self.concurrency < 1 or self.max_tokens < 1 or self.repeats < 1
                or self.warmup < 0):
            raise ValueError(f"num_requests={self.num_requests}, concurrency={self.concurrency}, "
                             f"max_tokens={self.max_tokens} and repeats={self.repeats} must be positive "
                             f"and warmup={self.warmup} not negative")

    def record(self, rounds: int) -> dict:
        """The result file's ``workload``: what compare checks before it puts two runs side by side."""
        return {"num_requests": self.num_requests, "concurrency": self.concurrency, "max_tokens": self.max_tokens,
                "temperature": self.temperature, "prompts": len(self.prompts), "ignore_eos": True,
                "repeats": self.repeats, "warmup_requests": self.warmup, "rounds": rounds}


@dataclass
class Round:
    """One server's timed passes, raw: every request kept, so that latencies over several rounds are computed over
    all their requests (never averaged from per-round summaries). ``number`` counts from 1."""

    number: int
    kind: str  # OURS or SGLANG
    requests: list[RequestResult]
    passes: list[dict]  # one entry a pass, as written to the result file
    before: dict  # _counters after the warm-up
    after: dict | None  # _counters after the passes; None when the server stopped answering
    info: dict  # /get_server_info after the passes (the first answer when the server stopped answering)
    provenance: dict
    after_error: str | None = None  # why the server could not be read after the passes
    interrupted: str | None = None  # Ctrl-C cut a pass: how far it got


def collect_round(base: str, workload: Workload, *, name: str, number: int = 1, rounds: int = 1, progress=None,
                  command: str | None = None, launch_env: dict | None = None) -> Round:
    """Round ``number`` of ``rounds`` on one server: ``workload.warmup`` untimed requests, then
    ``workload.repeats`` timed passes, the server's counters read before and after them. Raises BenchError
    before any request when the server cannot be reached or its /get_server_info is in neither known format.
    Ctrl-C in a pass ends the round (``interrupted`` set) with the requests finished before it; Ctrl-C in the
    warm-up propagates."""
    check_name(name)
    w = workload
    base = _check_url(base)
    first = server_info(base)  # probe first: a wrong URL fails here, not in the warm-up
    kind = server_kind(first, base)
    for i in range(w.warmup):  # compile/capture/autotune stay out of the numbers
        run_one(base, w.prompts[i % len(w.prompts)], min(w.max_tokens, 16), w.temperature, w.timeout)
    before = _counters(kind, server_info(base))
    where = f"round {number}/{rounds}, " if rounds > 1 else ""
    requests: list[RequestResult] = []
    passes: list[dict] = []
    interrupted = None
    for p in range(w.repeats):
        t_pass, last = time.perf_counter(), [0.0]

        def on_done(done: list[RequestResult], p=p, t_pass=t_pass, last=last):
            now = time.perf_counter()
            if progress is not None and (now - last[0] >= 1.0 or len(done) == w.num_requests):
                last[0] = now
                failed = sum(r.error is not None for r in done)
                progress(f"[{name}] {where}pass {p + 1}/{w.repeats}: {len(done)}/{w.num_requests} requests"
                         f"{f' ({failed} failed)' if failed else ''}, "
                         f"{sum(r.output_tokens for r in done if r.error is None)} tokens, {now - t_pass:.1f} s")

        got, wall, cut = _timed_pass(base, w.prompts, w.num_requests, w.concurrency, w.max_tokens, w.temperature,
                                     w.timeout, on_done)
        requests += got
        ok = [r for r in got if r.error is None]
        toks = sum(r.output_tokens for r in ok)
        passes.append({"wall_s": wall, "output_tokens": toks, "requests_ok": len(ok),
                       "requests_failed": len(got) - len(ok),
                       "end_to_end_output_tok_per_s": toks / wall if wall else 0.0, "round": number})
        if cut:
            where_cut = f"round {number} of {rounds}, " if rounds > 1 else ""
            interrupted = (f"interrupted (Ctrl-C) in {where_cut}pass {p + 1} of {w.repeats} after {len(got)} of "
                           f"{w.num_requests} requests: the numbers cover the requests finished before it "
                           "(in-flight ones dropped)")
            break
    after_error = None
    try:
        info = server_info(base, timeout=5.0 if interrupted else 30.0)  # (Ctrl-C may have stopped the server too)
        if server_kind(info, base) != kind:
            raise BenchError(f"{base} answered as a {kind} server before the run and as another kind after it")
        after = _counters(kind, info)
    except BenchError as e:  # the server died in the run: keep what the requests measured
        info, after, after_error = first, None, str(e)
    return Round(number, kind, requests, passes, before, after, info,
                 provenance(base, info, command=command, launch_env=launch_env), after_error, interrupted)


def _sum(values) -> int | None:
    """The sum of per-round counts; None when a round has none (a partial sum would read as the whole)."""
    values = list(values)
    return None if any(v is None for v in values) else sum(values)


def _accept_counts(r: Round) -> tuple[int | None, int | None]:
    """(verify forwards, accepted tokens) of a round: our server's counters, or SGLang's per-request counts."""
    if r.kind == OURS:
        return _delta(r.before, r.after, "verify_forwards"), _delta(r.before, r.after, "accepted_tokens")
    spec = [q for q in r.requests if q.error is None and q.verify_ct]
    return sum(q.verify_ct for q in spec), sum(q.output_tokens for q in spec)


def round_differences(first: Round, later: Round) -> list[str]:
    """provenance_diff's lines of a later round against the first (another commit, GPU, version, server args):
    one configuration then ran under two conditions, and its merged numbers mix them."""
    lines = provenance_diff([{"name": f"round {r.number}", "provenance": r.provenance} for r in (first, later)])
    if not first.provenance.get("worker_env") and not later.provenance.get("worker_env"):
        lines = [ln for ln in lines if not ln.startswith("worker_env: not reported")]  # alike: neither reports one
    return lines


def summarize(name: str, workload: Workload, rounds: list[Round], *, planned_rounds: int = 1) -> dict:
    """The result dict (see save) of one configuration's rounds taken together: end-to-end throughput a pass, its
    median and spread over every pass of every round; latencies over every request of every round; server
    counters summed over the rounds' before/after deltas. Provenance is round 1's, with each round's launch
    (``provenance["rounds"]``) and what changed between them (``rounds_differ``) when ``planned_rounds`` > 1;
    ``rounds_missing`` says how many planned rounds are not in it. Only the last round may be interrupted."""
    assert rounds and all(r.interrupted is None for r in rounds[:-1]), [r.interrupted for r in rounds]
    several = planned_rounds > 1
    interrupted = rounds[-1].interrupted
    results = [q for r in rounds for q in r.requests]
    passes = [q for r in rounds for q in r.passes]
    errors = sorted({q.error for q in results if q.error})
    errors[:0] = [f"after {f'round {r.number}' if several else 'the run'}: {r.after_error}"
                  for r in rounds if r.after_error]
    if interrupted:
        errors.insert(0, interrupted)
    ok = [q for q in results if q.error is None]
    out_tokens = sum(q.output_tokens for q in ok)
    itl = [x for q in ok for x in q.itl_s]
    # An interrupted pass's throughput is kept in its entry but not in the median: it stopped mid-run.
    full = [q["end_to_end_output_tok_per_s"] for q in (passes[:-1] if interrupted else passes)]
    rates = full or [passes[-1]["end_to_end_output_tok_per_s"]]
    median_rate = statistics.median(rates)
    counts = [_accept_counts(r) for r in rounds]
    verify_forwards, accepted = _sum(c[0] for c in counts), _sum(c[1] for c in counts)
    kind, last = rounds[0].kind, rounds[-1]
    accept_source = ("server counters: accepted_tokens / verify_forwards over the run" if kind == OURS else
                     "SGLang per request: completion_tokens / meta_info.spec_verify_ct, summed over the run")
    prov = dict(rounds[0].provenance)
    if several:
        prov["rounds"] = [{"round": r.number, "launch_command": r.provenance.get("launch_command"),
                           "server_url": r.provenance.get("server_url"), "time_utc": r.provenance.get("time_utc")}
                          for r in rounds]
        prov["rounds_differ"] = [line for r in rounds[1:] for line in round_differences(rounds[0], r)]
    res = {
        "name": name,
        "metrics": {
            # client side, all requests together: a pass's output tokens / its wall time (prefill, queueing and
            # HTTP included), the median over the passes; not a decode-only step metric
            "end_to_end_output_tok_per_s": median_rate,
            "end_to_end_output_tok_per_s_passes": [q["end_to_end_output_tok_per_s"] for q in passes],
            "end_to_end_output_tok_per_s_min": min(rates),
            "end_to_end_output_tok_per_s_max": max(rates),
            "end_to_end_spread_pct": 100 * (max(rates) - min(rates)) / median_rate if len(rates) > 1 and median_rate
            else None,
            "passes": passes,
            "wall_s": sum(q["wall_s"] for q in passes),
            "requests_ok": len(ok),
            "requests_failed": len(results) - len(ok),
            "output_tokens": out_tokens,
            # per request, client side, over every request of every pass (of every round)
            "mean_ttft_ms": 1e3 * statistics.mean(q.ttft_s for q in ok) if ok else None,
            "median_itl_ms": 1e3 * statistics.median(itl) if itl else None,
            "per_request_tok_per_s_median": statistics.median(
                q.output_tokens / q.latency_s for q in ok) if ok else None,
            "server_accept_length": accepted / verify_forwards if verify_forwards else None,
            "accept_length_source": accept_source,
            "server_verify_batches_graph": _sum(_delta(r.before, r.after, "verify_graph") for r in rounds),
            "server_verify_batches_eager": _sum(_delta(r.before, r.after, "verify_eager") for r in rounds),
            # ours: the draft length after the (last) run (with --speculative-adaptive, where its policy left it)
            # and the policy's state then (its timed round costs, acceptance per position, switches); None elsewhere
            "server_num_steps_after": last.info.get("speculative_num_steps") if last.kind == OURS else None,
            "server_adaptive_after": last.info.get("adaptive") if last.kind == OURS else None,
        },
        "workload": workload.record(planned_rounds),
        "errors": errors[:5],
        "provenance": prov,
    }
    if len(rounds) < planned_rounds:
        res["rounds_missing"] = (f"{planned_rounds - len(rounds)} of {planned_rounds} rounds did not run: the "
                                 f"numbers cover round{'s 1-' if len(rounds) > 1 else ' '}{len(rounds)}")
    if interrupted:
        res["interrupted"] = interrupted
    return res


def run_workload(base: str, *, name: str, prompts: list[str], num_requests: int, concurrency: int,
                 max_tokens: int, temperature: float = 0.0, warmup: int = 2, timeout: float = 600.0,
                 repeats: int = 1, progress=None, command: str | None = None, launch_env: dict | None = None) -> dict:
    """Runs the workload ``repeats`` times on the server (after ``warmup`` untimed requests) and returns the
    result dict (see save): end-to-end throughput a pass, its median and spread over the passes; latencies over
    every request of every pass. Raises BenchError before any request when the server cannot be reached or its
    /get_server_info is in neither known format. Failed requests (an error event, a non-2xx answer, no token)
    are counted in ``requests_failed`` and their first messages kept in ``errors``; they raise nothing.
    ``progress(line)``, when given, gets a line of progress at most every second and at each pass's end.
    Ctrl-C during the passes raises Interrupted carrying the result of the requests finished before it.
    ``command``: the command line to record (default: this process's); ``launch_env``: variables the server
    was started with (recorded, and checked against the workers' reports). (One round: collect_round, then
    summarize.)"""
    workload = Workload(prompts, num_requests, concurrency, max_tokens, temperature, warmup, timeout, repeats)
    res = summarize(name, workload, [collect_round(base, workload, name=name, progress=progress, command=command,
                                                   launch_env=launch_env)])
    if res.get("interrupted"):
        raise Interrupted(res)
    return res


def _flatten(d, prefix=""):
    out = {}
    for k, v in (d or {}).items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


# Expected to differ between runs and not a reason to distrust a comparison (launch commands carry the port;
# their flags are in server_args). worker_env is compared key by key on its own (_worker_env_diff).
# worker_env_not_applied, and rounds_differ (what changed between a sweep's rounds), are printed as warnings of their
# own (warnings); rounds lists each round's launch (ports and times).
_VOLATILE = ("time_utc", "command", "server_url", "worker_env", "server_args.port", "server_args.host",
             "launch_command", "server_launch_command", "rounds")
_UNSET = "<unset>"


def _env_by_rank(reports: list[dict]) -> dict[int, dict]:
    """{rank: flat report without the keys that differ by rank or by process (PER_RANK_KEYS: pid, RANK, ...)}."""
    out = {}
    for i, report in enumerate(reports):
        flat = _flatten(report)
        out[flat.pop("rank", i)] = {k: v for k, v in flat.items() if k not in PER_RANK_KEYS}
    return out


def _worker_env_diff(runs: list[dict]) -> list[str]:
    """One line per worker variable (or report field) whose value differs between runs, rank by rank."""
    envs = [r["provenance"].get("worker_env") or None for r in runs]
    lines = []
    missing = [r["name"] for r, e in zip(runs, envs, strict=True) if e is None]
    if missing:
        lines.append(f"worker_env: not reported by the server of {', '.join(missing)} (not compared)")
    have = [(r["name"], _env_by_rank(e)) for r, e in zip(runs, envs, strict=True) if e is not None]
    if len(have) < 2:
        return lines
    for rank in sorted(set().union(*(by_rank for _, by_rank in have))):
        per_run = [(name, by_rank.get(rank)) for name, by_rank in have]
        absent = [name for name, flat in per_run if flat is None]
        if absent:
            lines.append(f"worker_env rank {rank}: no worker of that rank in {', '.join(absent)}")
            per_run = [(name, flat) for name, flat in per_run if flat is not None]
            if len(per_run) < 2:
                continue
        for key in sorted(set().union(*(flat for _, flat in per_run))):
            vals = [json.dumps(flat[key], default=str) if key in flat else _UNSET for _, flat in per_run]
            if len(set(vals)) > 1:
                lines.append(f"worker_env rank {rank} {key}: "
                             + " | ".join(f"{name}={v}" for (name, _), v in zip(per_run, vals, strict=True)))
    return lines


def provenance_diff(runs: list[dict]) -> list[str]:
    """One line per provenance field (server args, model, device, versions, commits, hosts) or workload field
    (requests, concurrency, max tokens, repeats...) whose value differs between the runs, then the worker
    environment's differences rank by rank."""
    flat = [{**_flatten(r["provenance"]), **_flatten(r.get("workload"), "workload.")} for r in runs]
    keys = sorted(set().union(*flat))
    lines = []
    for k in keys:
        if k.startswith(_VOLATILE) or k == "worker_env_not_applied":
            continue
        vals = [json.dumps(f.get(k), sort_keys=True, default=str) for f in flat]
        if len(set(vals)) > 1:
            lines.append(f"{k}: " + " | ".join(f"{r['name']}={v}" for r, v in zip(runs, vals, strict=True)))
    return lines + _worker_env_diff(runs)


# Provenance fields that say which machine and software ran: a difference in one of them is not the configuration
# under test (a sweep changes server args on purpose), and a ratio across it mixes the two.
_ENVIRONMENT = ("client_host", "client_git_commit", "server_git_commit", "server_version", "device", "kernels.triton",
                "client_versions.", "client_cpu", "client_platform", "client_python", "server_kind")
_ENVIRONMENT_WORKER = (" device.", " torch:", " cuda:", " nccl:", " python:")


def environment_differences(diffs: list[str]) -> list[str]:
    """The fields among provenance_diff's lines that name the machine or software (host, commits, GPU, versions)
    rather than the configuration."""
    out = []
    for d in diffs:
        key = d.split(":", 1)[0]
        if key.startswith(_ENVIRONMENT) or (key.startswith("worker_env rank") and any(
                m in d[:len(key) + 1] for m in _ENVIRONMENT_WORKER)):
            out.append(key)
    return out


def _fmt(x, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def _spread(m: dict) -> str:
    lo, hi = m.get("end_to_end_output_tok_per_s_min"), m.get("end_to_end_output_tok_per_s_max")
    n = len([q for q in m.get("passes") or () if q.get("requests_ok") is not None])
    if lo is None or hi is None or n < 2:
        return "- (1 pass)"
    return f"{lo:.1f}-{hi:.1f} ({m['end_to_end_spread_pct']:.0f}%, {n} passes)" if m.get(
        "end_to_end_spread_pct") is not None else f"{lo:.1f}-{hi:.1f} ({n} passes)"


def compare_table(runs: list[dict]) -> str:
    base = runs[0]["metrics"]["end_to_end_output_tok_per_s"]
    rows = ["| run | failed requests | end-to-end tok/s, all requests (median of passes) | min-max over passes "
            "| vs first | per-request tok/s (median) | median ITL ms | mean TTFT ms | server accept length "
            "| verify graph/eager |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in runs:
        m = r["metrics"]
        failed = m.get("requests_failed")
        total = None if failed is None else failed + m.get("requests_ok", 0)
        verify = (f"{_fmt(m.get('server_verify_batches_graph'), 'd')}/"
                  f"{_fmt(m.get('server_verify_batches_eager'), 'd')}")
        rate = m["end_to_end_output_tok_per_s"]
        vs = f"{rate / base:.2f}x" if base else "-"  # no ratio against a run that produced no token
        rows.append(f"| {r['name']}{' (interrupted)' if r.get('interrupted') else ''} | "
                    f"{'-' if failed is None else f'{failed}/{total}'} | {rate:.1f} | {_spread(m)} | {vs} | "
                    f"{_fmt(m.get('per_request_tok_per_s_median'), '.1f')} | "
                    f"{_fmt(m.get('median_itl_ms'), '.2f')} | {_fmt(m.get('mean_ttft_ms'), '.1f')} | "
                    f"{_fmt(m.get('server_accept_length'), '.2f')} | {verify} |")
    return "\n".join(rows)


TABLE_NOTE = ("end-to-end tok/s, all requests = the output tokens of every request of a pass / the pass's wall "
              "time, client side\n  (prefill, queueing and HTTP included; not a decode-only step metric), the "
              "median over the passes (--repeats);\n  per-request tok/s = a request's output tokens / its own "
              "latency; ITL and TTFT: per request, from the stream; accept length\n  and verify counts: the "
              "server's own counters over the run")


def warnings(runs: list[dict]) -> list[str]:
    """What makes a run's numbers doubtful on their own: failed requests, an interrupt, no token, the server
    gone after the run, requested variables the workers did not have, a sweep's rounds that did not all run or
    whose servers differed (another commit, GPU or version in one round)."""
    out = [p for p in map(failures, runs) if p]
    for r in runs:
        for line in r["provenance"].get("worker_env_not_applied") or ():
            out.append(f"{r['name']}: {line}")
        for line in r["provenance"].get("rounds_differ") or ():
            out.append(f"{r['name']}: the server differed between rounds: {line}")
        if r.get("rounds_missing"):
            out.append(f"{r['name']}: {r['rounds_missing']}")
    return out


def failures(result: dict) -> str | None:
    """Why a run's numbers cannot be trusted (interrupted, failed requests, no output token), or None."""
    m = result["metrics"]
    if result.get("interrupted"):
        return f"{result['name']}: {result['interrupted']}"
    if m.get("requests_failed"):
        total = m["requests_failed"] + m.get("requests_ok", 0)
        first = f": {result['errors'][0]}" if result.get("errors") else ""
        return f"{result['name']}: {m['requests_failed']} of {total} requests failed{first}"
    if not m.get("output_tokens"):
        return f"{result['name']}: no output token came back"
    if result.get("errors"):  # e.g. the server stopped answering after the run
        return f"{result['name']}: {result['errors'][0]}"
    return None


def save(result: dict, out_dir: str) -> str:
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"{check_name(result['name'])}.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=1, default=str)
    return path


def load_result(path: str) -> dict:
    """A result file written by save(); BenchError naming the file when it cannot be read or is no result."""
    try:
        with open(path) as f:
            res = json.load(f)
    except OSError as e:
        raise BenchError(f"cannot read {path}: {e.strerror or e}") from None
    except ValueError as e:
        raise BenchError(f"{path} is not JSON: {e}") from None
    if not isinstance(res, dict):
        raise BenchError(f"{path} holds a JSON {type(res).__name__}, not a result of python -m sglang_eagle3.bench")
    missing = [k for k, t in (("name", str), ("metrics", dict), ("provenance", dict)) if not isinstance(res.get(k), t)]
    if not missing and "end_to_end_output_tok_per_s" not in res["metrics"]:
        missing = ["metrics.end_to_end_output_tok_per_s"]
    if missing:
        raise BenchError(f"{path} is not a result of python -m sglang_eagle3.bench (missing {', '.join(missing)})")
    prov = res["provenance"]
    if "git_commit" in prov and "client_git_commit" not in prov:  # files written before the field was renamed
        prov["client_git_commit"] = prov.pop("git_commit")
    if isinstance(res.get("workload"), dict):  # files written before sweep --rounds: one round
        res["workload"].setdefault("rounds", 1)
    return res


def as_dict(r: RequestResult) -> dict:
    return asdict(r)
