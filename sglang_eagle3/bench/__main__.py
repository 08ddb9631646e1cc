"""``python -m sglang_eagle3.bench``: end-to-end benchmarks with provenance, side by side.

  run       against a running server:
            python -m sglang_eagle3.bench run --url http://127.0.0.1:30000 --name eagle3 --out bench_out/
  sweep     starts a server per configuration in turn (same workload), then prints the comparison:
            python -m sglang_eagle3.bench sweep --out bench_out/ \\
                --config "baseline=--model-path M" \\
                --config "eagle3=--model-path M --speculative-algorithm EAGLE3 --speculative-draft-model-path D"
            (each configuration's flags go to `python -m sglang_eagle3.launch_server`, or to any command given
            with --launcher, e.g. --launcher "python -m sglang.launch_server")
  compare   prints runs side by side, after every provenance field in which they differ:
            python -m sglang_eagle3.bench compare bench_out/baseline.json bench_out/eagle3.json
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import socket
import subprocess
import sys
import time
import urllib.request

from sglang_eagle3.bench.harness import DEFAULT_PROMPTS, compare_table, provenance_diff, run_workload, save


def _workload_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--num-requests", type=int, default=16)
    ap.add_argument("--concurrency", type=int, default=1, help="1 = the single-stream latency case")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--prompts-file", help="one prompt per line (default: a few built-in ones)")
    ap.add_argument("--out", default="bench_out")


def _prompts(a) -> list[str]:
    if not a.prompts_file:
        return DEFAULT_PROMPTS
    with open(a.prompts_file) as f:
        lines = [ln.strip() for ln in f if ln.strip()]
    if not lines:
        raise SystemExit(f"{a.prompts_file} holds no prompts")
    return lines


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_healthy(url: str, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited with code {proc.returncode} before becoming healthy")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(1)
    raise SystemExit(f"server at {url} not healthy after {timeout:.0f} s")


def _workload(a) -> dict:
    return dict(prompts=_prompts(a), num_requests=a.num_requests, concurrency=a.concurrency,
                max_tokens=a.max_tokens, temperature=a.temperature)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sglang_eagle3.bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="benchmark a running server")
    r.add_argument("--url", required=True)
    r.add_argument("--name", required=True)
    _workload_args(r)
    s = sub.add_parser("sweep", help="start a server per configuration and benchmark each")
    s.add_argument("--config", action="append", required=True, metavar="NAME=FLAGS")
    s.add_argument("--launcher", default=f"{sys.executable} -m sglang_eagle3.launch_server")
    s.add_argument("--startup-timeout", type=float, default=1800)
    _workload_args(s)
    c = sub.add_parser("compare", help="side-by-side table of result files")
    c.add_argument("files", nargs="+")
    a = ap.parse_args(argv)

    if a.cmd == "run":
        res = run_workload(a.url, name=a.name, **_workload(a))
        print(f"wrote {save(res, a.out)}")
        print(compare_table([res]))
        return 0
    if a.cmd == "compare":
        runs = []
        for p in a.files:
            with open(p) as f:
                runs.append(json.load(f))
        return _print_comparison(runs)
    runs = []
    for spec in a.config:
        if "=" not in spec:
            raise SystemExit(f"--config {spec!r} must look like NAME=FLAGS")
        name, flags = spec.split("=", 1)
        port = _free_port()
        cmd = shlex.split(a.launcher) + shlex.split(flags) + ["--host", "127.0.0.1", "--port", str(port)]
        print(f"[{name}] {' '.join(cmd)}", flush=True)
        proc = subprocess.Popen(cmd, env=os.environ.copy())
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
    return _print_comparison(runs)


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
