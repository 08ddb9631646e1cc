"""End-to-end benchmark harness with provenance. Talks HTTP only (our server or SGLang's); imports no runtime.

Why it exists: a remembered "89 tok/s" baseline from another session and environment cost hours of chasing a
regression that never was, and a decode-only internal metric was compared with an end-to-end one. So every
result here carries where it came from (server args, model, GPU, worker environment, the client's git commit,
command, time, the prompt set's hash), names what it measures (end-to-end output tokens/s over wall time; TTFT,
TPOT and inter-token latency as SGLang's bench_serving defines them, with a percentile only over enough samples;
accept length and verify graph/eager counts), keeps every request as measured, counts failed requests apart, and
`compare` puts runs side by side only after printing every provenance field in which they differ.

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
import hashlib
import importlib.metadata
import json
import math
import os
import platform
import shlex
import shutil
import statistics
import subprocess
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
    try:
        parts = urllib.parse.urlsplit(base)
        parts.port  # noqa: B018 - raises ValueError for a port that is no number or out of 0-65535
    except ValueError as e:
        raise BenchError(f"server URL {base!r} is not a valid URL ({e}); it must look like http://HOST:PORT") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
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
    round: int = 0  # the round and timed pass (from 1) it ran in; set by collect_round
    pass_number: int = 0

    def record(self) -> dict:
        """The request as the result file's ``requests`` keeps it (times in seconds, to the microsecond)."""
        return {"round": self.round, "pass": self.pass_number, "prompt_tokens": self.prompt_tokens,
                "output_tokens": self.output_tokens, "latency_s": round(self.latency_s, 6),
                "ttft_s": round(self.ttft_s, 6), "verify_ct": self.verify_ct, "error": self.error,
                "itl_s": [round(x, 6) for x in self.itl_s]}


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


def _client_gpus() -> list[str] | None:
    """The GPUs of the machine running the harness (nvidia-smi: name, memory, driver), the server's own where it
    runs here (a sweep always does); the only GPU record of a server that reports none (SGLang without the
    overlay). None without nvidia-smi."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run([smi, "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return [ln.strip() for ln in out.stdout.splitlines() if ln.strip()] if out.returncode == 0 else None


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
        # the machines the workers ran on (from their reports; None when none reports): a baseline measured on
        # another machine of the same GPU differs here and nowhere else
        "server_hosts": sorted({str(w["hostname"]) for w in prov["worker_env"] or ()
                                if isinstance(w, dict) and w.get("hostname")}) or None,
        "launch_env": dict(launch_env) if launch_env else None,
        "worker_env_not_applied": _env_not_applied(requested, prov["worker_env"]) if requested else None,
        "server_url": base,
        "client_host": platform.node(),
        "client_platform": platform.platform(),
        "client_cpu": _cpu_name(),
        "client_cpu_count": os.cpu_count(),
        "client_python": platform.python_version(),
        "client_versions": _client_versions(),
        "client_gpus": _client_gpus(),
        "client_git_commit": git_commit(),
        "command": command if command is not None else " ".join(shlex.quote(a) for a in sys.argv),
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    })
    return prov


# Seconds without a finished request after which a pass prints a progress line anyway (a request of thousands of
# tokens on a slow machine finishes nothing for minutes).
HEARTBEAT_S = 10.0


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during the timed passes: ``result`` holds what the requests finished before it measured (its
    ``interrupted`` field says how far the run got), for the caller to save."""

    def __init__(self, result: dict):
        super().__init__(result["interrupted"])
        self.result = result


def _timed_pass(base: str, prompts: list[str], num_requests: int, concurrency: int, max_tokens: int,
                temperature: float, timeout: float, on_done, on_tick=None,
                tick_s: float = 5.0) -> tuple[list[RequestResult], float, bool]:
    """One pass of the workload: (the finished requests, its wall time, whether Ctrl-C cut it short). The
    request threads are daemons and stop taking requests at an interrupt, so Ctrl-C returns at once.
    ``on_done(finished)`` after each request; ``on_tick(finished)`` every ``tick_s`` seconds meanwhile (a long
    request finishes nothing for minutes)."""
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
            while t.is_alive():
                t.join(tick_s)
                if on_tick is not None and t.is_alive():
                    with lock:
                        on_tick(results)
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
    prompts_source: str | None = None  # where the prompts came from (a --prompts-file path), recorded only

    def __post_init__(self):
        if (self.num_requests < 1 or self.concurrency < 1 or self.max_tokens < 1 or self.repeats < 1
                or self.warmup < 0):
            raise ValueError(f"num_requests={self.num_requests}, concurrency={self.concurrency}, "
                             f"max_tokens={self.max_tokens} and repeats={self.repeats} must be positive "
                             f"and warmup={self.warmup} not negative")

    @property
    def prompt_set_sha256(self) -> str:
        """The identity of the prompt set as a pass sends it (prompts in turn, ``num_requests`` of them): two
        files of as many prompts, or one file edited, differ here where the count alone would not."""
        sent = [self.prompts[i % len(self.prompts)] for i in range(self.num_requests)]
        return hashlib.sha256(json.dumps(sent, ensure_ascii=False).encode()).hexdigest()

    def record(self, rounds: int) -> dict:
        """The result file's ``workload``: what compare checks before it puts two runs side by side (with the
        prompt set's hash, kept in the provenance)."""
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
    where = f"round {number}/{rounds}, " if rounds > 1 else ""
    if w.warmup and progress is not None:
        progress(f"[{name}] {where}warm-up: {w.warmup} untimed request(s) of {min(w.max_tokens, 16)} tokens "
                 "(the first may compile or capture for minutes)")
    t_warm = time.perf_counter()
    for i in range(w.warmup):  # compile/capture/autotune stay out of the numbers
        r = run_one(base, w.prompts[i % len(w.prompts)], min(w.max_tokens, 16), w.temperature, w.timeout)
        if progress is not None:
            progress(f"[{name}] {where}warm-up {i + 1}/{w.warmup} "
                     f"{'FAILED: ' + r.error if r.error else 'done'} ({time.perf_counter() - t_warm:.1f} s)")
    before = _counters(kind, server_info(base))
    requests: list[RequestResult] = []
    passes: list[dict] = []
    interrupted = None
    for p in range(w.repeats):
        t_pass, last = time.perf_counter(), [0.0]

        def on_done(done: list[RequestResult], p=p, t_pass=t_pass, last=last, every: float = 1.0):
            now = time.perf_counter()
            if progress is not None and (now - last[0] >= every or len(done) == w.num_requests):
                last[0] = now
                failed = sum(r.error is not None for r in done)
                running = min(w.concurrency, w.num_requests - len(done))
                progress(f"[{name}] {where}pass {p + 1}/{w.repeats}: {len(done)}/{w.num_requests} requests done"
                         f"{f' ({failed} failed)' if failed else ''}, "
                         f"{sum(r.output_tokens for r in done if r.error is None)} tokens, {now - t_pass:.1f} s"
                         f"{f', {running} in flight' if running else ''}")

        got, wall, cut = _timed_pass(base, w.prompts, w.num_requests, w.concurrency, w.max_tokens, w.temperature,
                                     w.timeout, on_done, on_tick=lambda done, f=on_done: f(done, every=HEARTBEAT_S),
                                     tick_s=HEARTBEAT_S / 2)
        for r in got:
            r.round, r.pass_number = number, p + 1
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


# The result file's layout. 1: files without the field (before per-request records, the prompt set's hash and the
# latency distributions); 2: those added.
RESULT_FORMAT = 2
PERCENTILES = (90, 99)


def min_samples(q: float) -> int:
    """The fewest samples for a q-th percentile to be reported: with fewer, no sample lies beyond it and it is the
    maximum, nearly (a p99 of 16 requests is their slowest one)."""
    return math.ceil(100 / (100 - q))


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile with linear interpolation between the closest ranks (numpy's default method)."""
    v = sorted(values)
    pos = (len(v) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def _distribution(values: list[float]) -> dict:
    """{"n", "mean", "median", "p90", "p99", "max"}: None where there is no sample, and a percentile None below
    min_samples (the table then says "n<N")."""
    n = len(values)
    out = {"n": n, "mean": statistics.fmean(values) if n else None,
           "median": statistics.median(values) if n else None}
    for q in PERCENTILES:
        out[f"p{q}"] = percentile(values, q) if n >= min_samples(q) else None
    out["max"] = max(values) if n else None
    return out


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
    spec = [q for q in ok if q.verify_ct]
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
    prov["prompt_set_sha256"] = workload.prompt_set_sha256
    prov["prompts_source"] = workload.prompts_source or (
        "built-in" if workload.prompts == DEFAULT_PROMPTS else "given by the caller")
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
            # one definition for both servers, from each request's stream: the tokens its verify rounds emitted (all
            # but the first, which prefill emits) over those rounds (meta_info.spec_verify_ct); "server_accept_length"
            # is our server's counters but SGLang's per-request ratio, which counts the first token too
            "accept_length_per_verify": sum(q.output_tokens - 1 for q in spec) / sum(q.verify_ct for q in spec)
            if spec else None,
            "prompt_tokens": sum(q.prompt_tokens for q in ok),
            "prompt_tokens_per_request_mean": statistics.fmean(q.prompt_tokens for q in ok) if ok else None,
            # ignore_eos asks for max_tokens each: fewer means the server stopped it (context length, a limit)
            "requests_short": sum(q.output_tokens < workload.max_tokens for q in ok),
            # every request as measured (failed ones with their error), one record each (RequestResult.record)
            "requests": [q.record() for q in results],
            # client side, over every successful request (gap) of every pass, as SGLang's bench_serving defines them:
            # TTFT = request sent -> first token; ITL = a chunk's gap spread over the tokens it brought; TPOT =
            # (latency - TTFT) / (output tokens - 1); a percentile only over enough samples (see _distribution)
            "latency": {
                "ttft_ms": _distribution([1e3 * q.ttft_s for q in ok]),
                "tpot_ms": _distribution([1e3 * (q.latency_s - q.ttft_s) / (q.output_tokens - 1)
                                          for q in ok if q.output_tokens > 1]),
                "itl_ms": _distribution([1e3 * x for x in itl]),
                "e2e_latency_ms": _distribution([1e3 * q.latency_s for q in ok]),
            },
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
# prompts_source is where the prompts were read (a path); their identity is prompt_set_sha256.
_VOLATILE = ("time_utc", "command", "server_url", "worker_env", "server_args.port", "server_args.host",
             "launch_command", "server_launch_command", "rounds", "prompts_source")
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
    return lines + _measured_differences(runs) + _worker_env_diff(runs)


def _measured_differences(runs: list[dict]) -> list[str]:
    """What the runs measured that says their workloads or definitions differ although no recorded field does:
    another tokenizer (or prompt set, in files without its hash) gives other prompt token counts; an accept length
    taken from another source is another quantity."""
    metrics = [r.get("metrics") for r in runs]
    if not all(isinstance(m, dict) for m in metrics):
        return []  # (round_differences compares provenance only)
    lines = []
    sources = [m.get("accept_length_source") for m in metrics]
    if len({json.dumps(x) for x in sources}) > 1:
        lines.append("metrics.accept_length_source (the \"server accept length\" column is another quantity in each; "
                     "\"accept length / verify round\" is one definition for all): "
                     + " | ".join(f"{r['name']}={json.dumps(x)}" for r, x in zip(runs, sources, strict=True)))
    prompt = [m.get("prompt_tokens_per_request_mean") for m in metrics]
    if all(isinstance(x, (int, float)) for x in prompt) and len({round(x, 6) for x in prompt}) > 1:
        lines.append("measured prompt tokens a request (another prompt set or tokenizer): "
                     + " | ".join(f"{r['name']}={x:.1f}" for r, x in zip(runs, prompt, strict=True)))
    return lines


# Provenance fields that say which machine and software ran: a difference in one of them is not the configuration
# under test (a sweep changes server args on purpose), and a ratio across it mixes the two.
_ENVIRONMENT = ("client_host", "client_git_commit", "server_git_commit", "server_version", "device", "kernels.triton",
                "client_versions.", "client_cpu", "client_platform", "client_python", "server_kind", "server_hosts",
                "client_gpus")
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
    if x is None:
        return "-"
    try:
        return format(x, spec)
    except (TypeError, ValueError):  # (a hand-edited file: shown as written rather than a traceback)
        return str(x)


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
            "| accept length / verify round | verify graph/eager |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
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
                    f"{_fmt(m.get('server_accept_length'), '.2f')} | "
                    f"{_fmt(m.get('accept_length_per_verify'), '.2f')} | {verify} |")
    return "\n".join(rows)


TABLE_NOTE = ("end-to-end tok/s, all requests = the output tokens of a pass's successful requests / the pass's wall "
              "time (failed requests'\n  time in it, their tokens not), client side (prefill, queueing and HTTP "
              "included; not a decode-only step metric),\n  the median over the passes (--repeats); per-request "
              "tok/s = a request's output tokens / its own latency; ITL and TTFT:\n  per request, from the stream "
              "(definitions below); server accept length and verify counts: the server's own\n  counters over the "
              "run (SGLang: completion tokens / spec_verify_ct per request, the first token counted too);\n  accept "
              "length / verify round = every request's tokens after its first / its verify rounds, from the "
              "stream,\n  one definition for both servers")


def _cell(d: dict | None, keys: tuple[str, ...], spec: str) -> str:
    """"mean / median / p99" of a _distribution; a withheld percentile reads n<N (too few samples for it)."""
    if not isinstance(d, dict) or not d.get("n"):
        return "-"
    out = []
    for k in keys:
        v = d.get(k)
        q = k[1:] if k.startswith("p") and k[1:].isdigit() else None
        out.append(f"n<{min_samples(float(q))}" if v is None and q else _fmt(v, spec))
    return " / ".join(out)


# (metrics.latency key, label, unit shown, scale from the stored ms, format)
_LATENCY_LINE = (("ttft_ms", "TTFT", "ms", 1.0, ".1f"), ("tpot_ms", "TPOT", "ms", 1.0, ".2f"),
                 ("itl_ms", "ITL", "ms", 1.0, ".2f"), ("e2e_latency_ms", "latency", "s", 1e-3, ".3f"))


def latency_table(runs: list[dict]) -> str:
    """Per-request latency distributions, a line a run: mean / median / p99 and the number of samples each is
    over (a p99 over too few reads n<100)."""
    lines = ["Latency per successful request, client side: mean / median / p99 [samples]"]
    for r in runs:
        lat = r["metrics"].get("latency")
        if not isinstance(lat, dict):
            lines.append(f"  {r['name']}: - (not recorded: a file from before the latency distributions)")
            continue
        parts = []
        for key, label, unit, scale, spec in _LATENCY_LINE:
            d = lat.get(key)
            if isinstance(d, dict) and scale != 1.0:
                d = {k: (v * scale if k != "n" and isinstance(v, (int, float)) else v) for k, v in d.items()}
            n = d.get("n") if isinstance(d, dict) else None
            samples = f"{_fmt(n, 'd')}{' gaps' if key == 'itl_ms' else ''}"
            parts.append(f"{label} {_cell(d, ('mean', 'median', 'p99'), spec)} {unit} [{samples}]")
        lines.append(f"  {r['name']}: " + "; ".join(parts))
    return "\n".join(lines)


LATENCY_NOTE = (f"  as SGLang's bench_serving defines them: TTFT = request sent -> first token; TPOT = (latency - "
                f"TTFT) / (output tokens - 1);\n  ITL = the gap before a chunk spread over the tokens it brought (a "
                f"verify round brings several); latency = the whole request;\n  a p99 needs {min_samples(99)} "
                f"samples, a p90 {min_samples(90)} (\"n<N\": fewer, so none lies beyond it: the maximum, nearly)")


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
        m, w = r["metrics"], r.get("workload") or {}
        if m.get("requests_short"):
            out.append(f"{r['name']}: {m['requests_short']} request(s) ended before --max-tokens "
                       f"{w.get('max_tokens')} (EOS is ignored: the server cut them, e.g. at its context length); "
                       "runs with other cuts did other work")
        if isinstance(w.get("concurrency"), int) and isinstance(w.get("num_requests"), int) \
                and w["concurrency"] > w["num_requests"]:
            out.append(f"{r['name']}: --concurrency {w['concurrency']} > --num-requests {w['num_requests']}: at most "
                       f"{w['num_requests']} requests were in flight")
        fmt = r.get("format", RESULT_FORMAT)  # (a file's, from load_result; a result in memory is this version's)
        if fmt < RESULT_FORMAT:
            out.append(f"{r['name']}: written by an older harness (result format {fmt}, this one writes "
                       f"{RESULT_FORMAT}): fields added since (the prompt set's hash, latency percentiles, "
                       "per-request records, the client's GPUs, the server's hosts) read as null or -")
        elif fmt > RESULT_FORMAT:
            out.append(f"{r['name']}: written by a newer harness (result format {fmt}, this one reads "
                       f"{RESULT_FORMAT}): fields this one does not know are compared as written, not explained")
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


_RECORDS = "<per-request records, written one a line>"  # save()'s placeholder


def prepare_out_dir(out_dir: str) -> str:
    """Creates the results folder, or BenchError naming it when it cannot hold files: checked before a run,
    which would otherwise end, maybe hours later, without writing its result."""
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise BenchError(f"--out {out_dir!r} is a file, not a folder")
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as e:
        raise BenchError(f"--out {out_dir!r} cannot be made a folder: {e.strerror or e}") from None
    if not os.access(out_dir, os.W_OK | os.X_OK):
        raise BenchError(f"--out {out_dir!r} is a folder this user cannot write to")
    return out_dir


def save(result: dict, out_dir: str) -> str:
    """Writes OUT/NAME.json: indented, one line per request record. BenchError naming the path when it cannot."""
    path = os.path.join(out_dir, f"{check_name(result['name'])}.json")
    body = {"format": RESULT_FORMAT, **result}
    records = result["metrics"].get("requests")
    if isinstance(records, list):  # thousands of records: one line each, not one line per number
        body["metrics"] = {**result["metrics"], "requests": _RECORDS}
    text = json.dumps(body, indent=1, default=str)
    if isinstance(records, list):
        lines = ",\n".join("   " + json.dumps(q, default=str) for q in records)
        text = text.replace(json.dumps(_RECORDS), f"[\n{lines}\n  ]" if records else "[]", 1)
    try:
        os.makedirs(out_dir, exist_ok=True)
        with open(path, "w") as f:
            f.write(text + "\n")
    except OSError as e:
        raise BenchError(f"cannot write {path}: {e.strerror or e}") from None
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
    for where, key, kinds in _RESULT_FIELDS:
        holder = res if where is None else res.get(where)
        if not isinstance(holder, dict) or key not in holder:
            continue
        value = holder[key]
        if not (value is None and key != "end_to_end_output_tok_per_s" or _is(value, kinds)):
            field_name = key if where is None else f"{where}.{key}"
            raise BenchError(f"{path}: {field_name} is {json.dumps(value, default=str)[:60]}, not "
                             f"{' or '.join(_KIND_WORDS[k] for k in kinds)}: a damaged or hand-edited result file")
    fmt = res.setdefault("format", 1)  # (files written before the field: format 1)
    if not _is(fmt, ("int",)) or fmt < 1:
        raise BenchError(f"{path}: format is {json.dumps(fmt)[:60]}, not a positive integer")
    if not all(isinstance(w, dict) for w in res["provenance"].get("worker_env") or ()):
        raise BenchError(f"{path}: provenance.worker_env holds a non-object: a damaged or hand-edited result file")
    prov = res["provenance"]
    if "git_commit" in prov and "client_git_commit" not in prov:  # files written before the field was renamed
        prov["client_git_commit"] = prov.pop("git_commit")
    if isinstance(res.get("workload"), dict):  # files written before sweep --rounds: one round
        res["workload"].setdefault("rounds", 1)
    return res


# The fields compare and the warnings read, with the JSON types they must have (None allowed unless said): a file
# damaged or edited by hand is refused by name instead of failing with a traceback inside the table.
_NUMBER = ("number",)
_RESULT_FIELDS = (
    (None, "workload", ("object",)), (None, "errors", ("list",)), (None, "interrupted", ("string",)),
    (None, "rounds_missing", ("string",)),
    ("metrics", "end_to_end_output_tok_per_s", _NUMBER),
    *(("metrics", k, _NUMBER) for k in (
        "end_to_end_output_tok_per_s_min", "end_to_end_output_tok_per_s_max", "end_to_end_spread_pct",
        "per_request_tok_per_s_median", "median_itl_ms", "mean_ttft_ms", "server_accept_length",
        "accept_length_per_verify", "prompt_tokens_per_request_mean")),
    *(("metrics", k, ("int",)) for k in (
        "requests_ok", "requests_failed", "output_tokens", "requests_short", "server_verify_batches_graph",
        "server_verify_batches_eager")),
    ("metrics", "passes", ("list",)), ("metrics", "latency", ("object",)), ("metrics", "requests", ("list",)),
    ("provenance", "worker_env", ("list",)), ("provenance", "worker_env_not_applied", ("list",)),
    ("provenance", "rounds_differ", ("list",)),
    *(("workload", k, ("int",)) for k in ("num_requests", "concurrency", "max_tokens")),
)


_KIND_WORDS = {"number": "a number", "int": "an integer", "string": "a string", "list": "a list",
               "object": "an object"}


def _is(value, kinds: tuple[str, ...]) -> bool:
    checks = {"number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
              "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
              "string": lambda v: isinstance(v, str), "list": lambda v: isinstance(v, list),
              "object": lambda v: isinstance(v, dict)}
    return any(checks[k](value) for k in kinds)


def as_dict(r: RequestResult) -> dict:
    return asdict(r)
