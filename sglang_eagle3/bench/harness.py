"""End-to-end benchmark harness with provenance. Talks HTTP only (our server or SGLang's); imports no runtime.

Why it exists: a remembered "89 tok/s" baseline from another session and environment cost hours of chasing a
regression that never was, and a decode-only internal metric was compared with an end-to-end one. So every
result here carries where it came from (server args, model, GPU, worker environment, git commit, command,
time), names what it measures (end-to-end output tokens/s over wall time; time to first token; inter-token
latency; server-side accept length and verify graph/eager counts as deltas over the run), and `compare` puts
runs side by side only after printing every provenance field in which they differ.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field

from sglang_eagle3 import env

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


def _get(url: str, timeout: float = 30.0) -> dict:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())


def _post_stream(url: str, body: dict, timeout: float):
    """Yields parsed SSE `data:` payloads (dicts) of a streaming /generate call."""
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
    verify_ct: int = 0
    error: str | None = None


def run_one(base: str, prompt: str, max_tokens: int, temperature: float, timeout: float) -> RequestResult:
    body = {"text": prompt, "stream": True,
            "sampling_params": {"max_new_tokens": max_tokens, "temperature": temperature, "ignore_eos": True}}
    t0 = time.perf_counter()
    last, ttft, itl, meta, n_prev = t0, None, [], {}, 0
    try:
        for chunk in _post_stream(base + "/generate", body, timeout):
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
    except (urllib.error.URLError, OSError, json.JSONDecodeError) as e:
        return RequestResult(0, 0, time.perf_counter() - t0, 0.0, error=f"{type(e).__name__}: {e}")
    return RequestResult(meta.get("prompt_tokens", 0), meta.get("completion_tokens", 0), time.perf_counter() - t0,
                         ttft or 0.0, itl, meta.get("spec_verify_ct", 0))


def _verify_counts(info: dict) -> dict:
    fc = info.get("forward_counts", {}).get("target_verify", {})
    return {"graph": fc.get("graph", 0), "eager": fc.get("eager", 0)}


REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def git_commit(repo: str = REPO) -> str:
    """GIT_COMMIT when set (a run on another machine names the commit it was sent from: the copy there may
    carry stale git metadata, as the GPU machines' copies did, recording the session's first commit + "-dirty"
    for every run), else HEAD of the checkout (+ "-dirty" with uncommitted changes to tracked files), else
    "unknown"."""
    if env.GIT_COMMIT.raw():
        return env.GIT_COMMIT.raw()
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo,
                               capture_output=True, text=True).stdout.strip()
    except OSError:
        commit, dirty = "", ""
    if len(commit) != 40:
        return "unknown"
    return commit + ("-dirty" if dirty else "")


def provenance(base: str, info: dict) -> dict:
    """Everything a reader needs to know whether two numbers are comparable."""
    args = info.get("args", {})
    return {
        "server_url": base,
        "server_args": {k: args.get(k) for k in sorted(args)},
        "model": info.get("model"),
        "draft": info.get("draft"),
        "device": info.get("device"),
        "tp_size": info.get("tp_size"),
        "worker_env": info.get("worker_env"),
        "kernels": info.get("kernels"),
        "client_host": platform.node(),
        "client_python": platform.python_version(),
        "git_commit": git_commit(),
        "command": " ".join(shlex.quote(a) for a in sys.argv),
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def run_workload(base: str, *, name: str, prompts: list[str], num_requests: int, concurrency: int,
                 max_tokens: int, temperature: float = 0.0, warmup: int = 2, timeout: float = 600.0) -> dict:
    base = base.rstrip("/")
    for i in range(warmup):  # compile/capture/autotune stay out of the numbers
        run_one(base, prompts[i % len(prompts)], min(max_tokens, 16), temperature, timeout)
    before = _get(base + "/get_server_info")
    results: list[RequestResult] = []
    lock = threading.Lock()
    todo = list(range(num_requests))

    def worker():
        while True:
            with lock:
                if not todo:
                    return
                i = todo.pop()
            r = run_one(base, prompts[i % len(prompts)], max_tokens, temperature, timeout)
            with lock:
                results.append(r)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    after = _get(base + "/get_server_info")
    ok = [r for r in results if r.error is None]
    out_tokens = sum(r.output_tokens for r in ok)
    vb, va = _verify_counts(before), _verify_counts(after)
    verify_forwards = after.get("verify_forwards", 0) - before.get("verify_forwards", 0)
    accepted = after.get("accepted_tokens", 0) - before.get("accepted_tokens", 0)
    itl = [x for r in ok for x in r.itl_s]
    return {
        "name": name,
        "metrics": {
            "end_to_end_output_tok_per_s": out_tokens / wall if wall else 0.0,
            "wall_s": wall,
            "requests_ok": len(ok),
            "requests_failed": len(results) - len(ok),
            "output_tokens": out_tokens,
            "mean_ttft_ms": 1e3 * statistics.mean(r.ttft_s for r in ok) if ok else None,
            "median_itl_ms": 1e3 * statistics.median(itl) if itl else None,
            "per_request_tok_per_s_median": statistics.median(
                r.output_tokens / r.latency_s for r in ok) if ok else None,
            "server_accept_length": accepted / verify_forwards if verify_forwards else None,
            "server_verify_batches_graph": va["graph"] - vb["graph"],
            "server_verify_batches_eager": va["eager"] - vb["eager"],
        },
        "workload": {"num_requests": num_requests, "concurrency": concurrency, "max_tokens": max_tokens,
                     "temperature": temperature, "prompts": len(prompts), "ignore_eos": True},
        "errors": sorted({r.error for r in results if r.error})[:5],
        "provenance": provenance(base, after),
    }


def _flatten(d, prefix=""):
    out = {}
    for k, v in (d or {}).items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


# Expected to differ between runs and not a reason to distrust a comparison.
_VOLATILE = ("time_utc", "command", "server_url", "worker_env", "server_args.port", "server_args.host")


def provenance_diff(runs: list[dict]) -> list[str]:
    flat = [_flatten(r["provenance"]) for r in runs]
    keys = sorted(set().union(*flat))
    lines = []
    for k in keys:
        if k.startswith(_VOLATILE):
            continue
        vals = [json.dumps(f.get(k), sort_keys=True, default=str) for f in flat]
        if len(set(vals)) > 1:
            lines.append(f"{k}: " + " | ".join(f"{r['name']}={v}" for r, v in zip(runs, vals, strict=True)))
    env = [json.dumps(r["provenance"].get("worker_env"), sort_keys=True, default=str) for r in runs]
    if len(set(env)) > 1:
        lines.append("worker_env differs between runs (see the JSON files)")
    return lines


def compare_table(runs: list[dict]) -> str:
    base = runs[0]["metrics"]["end_to_end_output_tok_per_s"] or 1.0
    rows = ["| run | end-to-end tok/s | vs first | median ITL ms | mean TTFT ms | accept length | verify graph/eager |",
            "|---|---:|---:|---:|---:|---:|---:|"]
    for r in runs:
        m = r["metrics"]
        acc = f"{m['server_accept_length']:.2f}" if m["server_accept_length"] else "-"
        itl = f"{m['median_itl_ms']:.2f}" if m["median_itl_ms"] is not None else "-"
        ttft = f"{m['mean_ttft_ms']:.1f}" if m["mean_ttft_ms"] is not None else "-"
        rows.append(f"| {r['name']} | {m['end_to_end_output_tok_per_s']:.1f} | "
                    f"{m['end_to_end_output_tok_per_s'] / base:.2f}x | {itl} | {ttft} | {acc} | "
                    f"{m['server_verify_batches_graph']}/{m['server_verify_batches_eager']} |")
    return "\n".join(rows)


def save(result: dict, out_dir: str) -> str:
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"{result['name']}.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=1, default=str)
    return path


def as_dict(r: RequestResult) -> dict:
    return asdict(r)
