"""``python -m sglang_eagle3.bench``: end-to-end benchmarks with provenance, side by side.

  run       against a running server (ours or SGLang's):
            python -m sglang_eagle3.bench run --url http://127.0.0.1:30000 --name eagle3 --out bench_out/
  sweep     starts a server per configuration in turn (same workload), then prints the comparison:
            python -m sglang_eagle3.bench sweep --out bench_out/ \\
                --config "baseline=--model-path M" \\
                --config "eagle3=--model-path M --speculative-algorithm EAGLE3 --speculative-draft-model-path D"
            (each configuration's flags go to `python -m sglang_eagle3.launch_server`, or to any command given
            with --launcher, e.g. --launcher "python -m sglang.launch_server")
  compare   prints runs side by side, after every provenance field in which they differ:
            python -m sglang_eagle3.bench compare bench_out/baseline.json bench_out/eagle3.json

run and sweep write NAME.json into --out (NAME: a plain file name), then exit with status 1 if any request
failed (an error event, a non-2xx answer or no token; the table's "failed requests" column), no output token
came back, or /get_server_info stopped answering after the run. A server that cannot be reached, or whose
/get_server_info is in neither known format (ours, SGLang's), stops the run before any request.

Provenance records the server's args, model, device and worker environment (one report per worker process:
our server's TP workers, or its own process as rank 0 at TP=1; SGLang with the overlay, worker 0 only over
HTTP; none otherwise, and compare says so), server_git_commit (ours reports the checkout it runs; SGLang's
reports none) and client_git_commit: the commit of the checkout running this harness. compare names each
worker variable that differs, rank by rank, with both values.
"""

from __future__ import annotations

import argparse
import os
import shlex
import socket
import subprocess
import sys
import time
import urllib.request

from sglang_eagle3.bench.harness import (
    DEFAULT_PROMPTS,
    BenchError,
    check_name,
    compare_table,
    failures,
    load_result,
    provenance_diff,
    run_workload,
    save,
)

PROG = "python -m sglang_eagle3.bench"


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be a positive integer")
    return value


def _run_name(text: str) -> str:
    try:
        return check_name(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _workload_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--num-requests", type=_positive_int, default=16)
    ap.add_argument("--concurrency", type=_positive_int, default=1, help="1 = the single-stream latency case")
    ap.add_argument("--max-tokens", type=_positive_int, default=128)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--prompts-file", help="one prompt per line (default: a few built-in ones)")
    ap.add_argument("--out", default="bench_out")


def _prompts(a) -> list[str]:
    if not a.prompts_file:
        return DEFAULT_PROMPTS
    try:
        with open(a.prompts_file) as f:
            lines = [ln.strip() for ln in f if ln.strip()]
    except OSError as e:
        raise SystemExit(f"{PROG}: error: cannot read --prompts-file {a.prompts_file}: {e.strerror or e}") from None
    if not lines:
        raise SystemExit(f"{PROG}: error: --prompts-file {a.prompts_file} holds no prompts")
    return lines


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_healthy(url: str, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{PROG}: error: server exited with code {proc.returncode} before becoming healthy")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(1)
    raise SystemExit(f"{PROG}: error: server at {url} not healthy after {timeout:.0f} s")


def _workload(a) -> dict:
    return dict(prompts=_prompts(a), num_requests=a.num_requests, concurrency=a.concurrency,
                max_tokens=a.max_tokens, temperature=a.temperature)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="benchmark a running server")
    r.add_argument("--url", required=True, help="http://HOST:PORT of our server or SGLang's")
    r.add_argument("--name", required=True, type=_run_name, help="the result's file name in --out (no '/', '..')")
    _workload_args(r)
    s = sub.add_parser("sweep", help="start a server per configuration and benchmark each")
    s.add_argument("--config", action="append", required=True, metavar="NAME=FLAGS")
    s.add_argument("--launcher", default=f"{sys.executable} -m sglang_eagle3.launch_server")
    s.add_argument("--startup-timeout", type=float, default=1800)
    _workload_args(s)
    c = sub.add_parser("compare", help="side-by-side table of result files")
    c.add_argument("files", nargs="+")
    a = ap.parse_args(argv)

    try:
        if a.cmd == "run":
            res = run_workload(a.url, name=a.name, **_workload(a))
            print(f"wrote {save(res, a.out)}")
            print(compare_table([res]))
            return _exit_status([res])
        if a.cmd == "compare":
            return _print_comparison([load_result(p) for p in a.files])
        return _sweep(s, a)
    except BenchError as e:
        raise SystemExit(f"{PROG}: error: {e}") from None


def _sweep(ap: argparse.ArgumentParser, a) -> int:
    configs = []
    for spec in a.config:
        name, sep, flags = spec.partition("=")
        if not sep:
            ap.error(f"--config {spec!r} must look like NAME=FLAGS")
        try:
            configs.append((check_name(name), flags))
        except ValueError as e:
            ap.error(f"--config {spec!r}: {e}")
    launcher = shlex.split(a.launcher)
    if not launcher:
        ap.error("--launcher is empty")
    runs = []
    for name, flags in configs:
        port = _free_port()
        cmd = launcher + shlex.split(flags) + ["--host", "127.0.0.1", "--port", str(port)]
        print(f"[{name}] {' '.join(cmd)}", flush=True)
        try:
            proc = subprocess.Popen(cmd, env=os.environ.copy())
        except OSError as e:
            raise SystemExit(f"{PROG}: error: --launcher {a.launcher!r} cannot start {cmd[0]!r}: "
                             f"{e.strerror or e}") from None
        try:
            url = f"http://127.0.0.1:{port}"
            _wait_healthy(url, proc, a.startup_timeout)
            res = run_workload(url, name=name, **_workload(a))
            res["provenance"]["launch_command"] = cmd
            runs.append(res)
            print(f"[{name}] wrote {save(res, a.out)}", flush=True)
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
    _print_comparison(runs)
    return _exit_status(runs)


def _exit_status(runs: list[dict]) -> int:
    """1 (after the files are written and the table printed) if any run had a failed request or no token."""
    problems = [p for p in map(failures, runs) if p]
    for p in problems:
        print(f"{PROG}: error: {p}", file=sys.stderr)
    return 1 if problems else 0


def _print_comparison(runs: list[dict]) -> int:
    diffs = provenance_diff(runs)
    if diffs:
        print("Runs differ in (check these before reading the ratios):")
        for d in diffs:
            print("  - " + d)
    print(compare_table(runs))
    print("end-to-end tok/s = all output tokens / wall time of the run (not a decode-only step metric)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
