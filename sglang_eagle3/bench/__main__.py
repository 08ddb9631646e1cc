"""python -m sglang_eagle3.bench: end-to-end benchmarks with provenance, side by side.

  run       against a running server (ours or SGLang's):
            python -m sglang_eagle3.bench run --url http://127.0.0.1:30000 --name eagle3 --out bench_out/
  sweep     starts a server per configuration in turn (same workload), then prints the comparison:
            python -m sglang_eagle3.bench sweep --out bench_out/ --rounds 3 \\
                --config "baseline=--model-path M" \\
                --config "eagle3=--model-path M --speculative-algorithm EAGLE3 --speculative-draft-model-path D"
            (each configuration's flags go to `python -m sglang_eagle3.launch_server`, or to any command given
            with --launcher, e.g. --launcher "python -m sglang.launch_server")
  compare   prints runs side by side, after every provenance and workload field in which they differ (and a
            warning when the machine or software differs: host, server hosts, commit, GPU, versions):
            python -m sglang_eagle3.bench compare bench_out/baseline.json bench_out/eagle3.json
            (runs of one name, e.g. before/eagle3.json and after/eagle3.json, are labelled with their file)

Each configuration gets --warmup untimed requests, then --repeats timed passes of the workload on the same
server; the table's end-to-end tok/s is the successful requests' output tokens over a pass's wall time (client
side, not a decode-only metric; failed requests are counted apart, their time stays in the wall time), the
median over the passes, with their min-max beside it. Under it, a line a run gives the latencies per request as
SGLang's bench_serving defines them (TTFT, TPOT, ITL, end-to-end latency: mean / median / p99, and how many samples each
is over); a p99 over fewer than 100 samples (a p90 over fewer than 10) would be the maximum, nearly, and reads
"n<100". The provenance records the prompt set's sha256 (compare names a different prompt set of as many
prompts), and NAME.json keeps every request as measured under metrics.requests (TTFT, latency, inter-token gaps,
error), one a line.
In a sweep a configuration's FLAGS may start with VAR=VALUE words, set in its server's environment (recorded; a
worker that did not get one is warned about), and each server's log goes to --out/NAME.server.log. Progress
goes to stderr: a line every 30 s while a sweep's server starts, each warm-up request, then a line a second as
requests finish (every 10 s while none does). compare (and run and sweep) also warns about requests the server
cut before --max-tokens, a --concurrency above --num-requests, and a file written by an older harness; a damaged
result file is refused naming the field.

sweep --rounds N interleaves the configurations, A B C, A B C, ... N times, each round starting each server
afresh (warm-up and --repeats passes again), so that a machine drifting during the sweep (clocks, heat, other
tenants) spreads over every configuration instead of landing on the one that ran last. NAME.json then holds
every pass of every round (each pass records its round): the median and min-max over all of them, latencies
over every request of every round, server counters summed over the rounds; its provenance is round 1's, with
each round's launch under "rounds" and, under "rounds_differ", any field in which a later round's server
differed (another commit, GPU or version: warned about). NAME.json is rewritten after each of its rounds,
naming under "rounds_missing" the rounds not in it yet.

run and sweep write NAME.json into --out (NAME: a plain file name), then exit with status 1 if any request
failed (an error event, a non-2xx answer or no token; the table's "failed requests" column), no output token
came back, or /get_server_info stopped answering after the run. A server that cannot be reached, or whose
/get_server_info is in neither known format (ours, SGLang's), or an --out that cannot hold files, stops the run
before any request. Ctrl-C in the
timed passes writes NAME.json with what had finished, marked "interrupted", and exits with status 130 (a sweep
says which rounds and configurations did not run; each configuration's file keeps its finished rounds).

Provenance records the command that reruns the run, the server's args, model, device, version and worker
environment (one report per worker process, with its torch/CUDA/NCCL versions and device:
our server's TP workers, or its own process as rank 0 at TP=1; SGLang with the overlay, worker 0 only over
HTTP; none otherwise, and compare says so), server_git_commit (ours reports the checkout it runs; SGLang's
reports none), client_git_commit: the commit of the checkout running this harness ("-dirty" with uncommitted
changes), and the client's host, CPU, platform and torch/triton/sglang_eagle3 versions. compare names each
worker variable that differs, rank by rank, with both values.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import socket
import subprocess
import sys
import time
import urllib.request

from sglang_eagle3.argtypes import finite_float, int_at_least
from sglang_eagle3.bench.harness import (
    DEFAULT_PROMPTS,
    LATENCY_NOTE,
    TABLE_NOTE,
    BenchError,
    Round,
    Workload,
    check_name,
    collect_round,
    compare_table,
    environment_differences,
    failures,
    latency_table,
    load_result,
    prepare_out_dir,
    provenance_diff,
    round_differences,
    save,
    summarize,
    warnings,
)

PROG = "python -m sglang_eagle3.bench"
_positive_int, _non_negative_int = int_at_least(1), int_at_least(0)


def _run_name(text: str) -> str:
    try:
        return check_name(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _workload_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--num-requests", type=_positive_int, default=16, help="requests a timed pass (default 16)")
    ap.add_argument("--concurrency", type=_positive_int, default=1,
                    help="requests in flight at once (default 1: the single-stream latency case)")
    ap.add_argument("--max-tokens", type=_positive_int, default=128,
                    help="output tokens a request, EOS ignored (default 128)")
    ap.add_argument("--temperature", type=finite_float(0.0, strict=False), default=0.0,
                    help="sampling temperature (default 0: greedy)")
    ap.add_argument("--repeats", type=_positive_int, default=1,
                    help="timed passes of the workload on the same server: the table shows their median and "
                    "min-max (default 1; 3 or more to see the noise)")
    ap.add_argument("--warmup", type=_non_negative_int, default=2,
                    help="untimed requests before the first pass (compilation, graph capture; default 2)")
    ap.add_argument("--prompts-file", help="one prompt per line, used in turn (default: 8 built-in ones)")
    ap.add_argument("--out", default="bench_out", help="folder for the NAME.json results (default bench_out)")


def _prompts(a) -> list[str]:
    if not a.prompts_file:
        return DEFAULT_PROMPTS
    try:
        with open(a.prompts_file, encoding="utf-8") as f:
            lines = [ln.strip() for ln in f if ln.strip()]
    except OSError as e:
        raise SystemExit(f"{PROG}: error: cannot read --prompts-file {a.prompts_file}: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise SystemExit(f"{PROG}: error: --prompts-file {a.prompts_file} is not UTF-8 text (byte {e.start}: "
                         f"{e.object[e.start:e.start + 1]!r}); one prompt per line, as text") from None
    if not lines:
        raise SystemExit(f"{PROG}: error: --prompts-file {a.prompts_file} holds no prompts")
    return lines


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _log_tail(path: str, lines: int = 15) -> str:
    try:
        with open(path, errors="replace") as f:
            tail = f.readlines()[-lines:]
    except OSError:
        return ""
    return "".join("    " + ln for ln in tail)


# Seconds between the progress lines while a server starts (loading a large checkpoint takes many minutes).
STARTUP_PROGRESS_S = 30.0


def _wait_healthy(url: str, proc: subprocess.Popen, timeout: float, log_path: str, name: str = "") -> None:
    t0 = time.monotonic()
    deadline, shown = t0 + timeout, t0
    while time.monotonic() < deadline:
        if time.monotonic() - shown >= STARTUP_PROGRESS_S:
            shown = time.monotonic()
            tail = _log_tail(log_path, 1).strip()
            _progress(f"[{name}] waiting for the server to answer /health: {shown - t0:.0f} s of at most {timeout:g}"
                      f"{f'; its log ends: {tail[:160]}' if tail else ''}")
        if proc.poll() is not None:
            raise SystemExit(f"{PROG}: error: server exited with code {proc.returncode} before becoming healthy; "
                             f"the end of {log_path}:\n{_log_tail(log_path)}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1)  # (also after a 2xx other than 200: not ready, and no busy loop)
    raise SystemExit(f"{PROG}: error: server at {url} not healthy after {timeout:g} s (--startup-timeout); the end "
                     f"of {log_path}:\n{_log_tail(log_path)}")


def _workload(a) -> Workload:
    return Workload(prompts=_prompts(a), num_requests=a.num_requests, concurrency=a.concurrency,
                    max_tokens=a.max_tokens, temperature=a.temperature, warmup=a.warmup, repeats=a.repeats,
                    prompts_source=os.path.abspath(a.prompts_file) if a.prompts_file else None)


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _interrupted(result: dict, out: str) -> int:
    """Ctrl-C in a timed pass: the finished requests' result is written, marked interrupted; status 130."""
    path = save(result, out)
    print(f"{PROG}: {result['interrupted']}; wrote {path} (marked interrupted)", file=sys.stderr)
    return 130


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="benchmark a running server")
    r.add_argument("--url", required=True, help="http://HOST:PORT of our server or SGLang's")
    r.add_argument("--name", required=True, type=_run_name, help="the result's file name in --out (no '/', '..')")
    _workload_args(r)
    s = sub.add_parser("sweep", help="start a server per configuration and benchmark each")
    s.add_argument("--config", action="append", required=True, metavar="NAME=FLAGS",
                   help="a configuration: its name (the result's file name) and the server's flags, which may "
                   "start with VAR=VALUE words for its environment, e.g. 'p2p_off=NCCL_P2P_DISABLE=1 --tp-size 8'; "
                   "repeatable, run in the order given")
    s.add_argument("--launcher", default=f"{sys.executable} -m sglang_eagle3.launch_server",
                   help="the server command the flags are appended to, then --host 127.0.0.1 --port P "
                   "(default: this Python's -m sglang_eagle3.launch_server)")
    s.add_argument("--startup-timeout", type=finite_float(0.0, strict=True), default=1800,
                   help="seconds a server may take to answer /health (default 1800)")
    s.add_argument("--rounds", type=_positive_int, default=1,
                   help="run the configurations in turn this many times (A B, A B, ...), each round a fresh "
                   "server with its warm-up and --repeats passes; a configuration's NAME.json holds the passes "
                   "of all its rounds (default 1; more spreads a drifting machine over every configuration)")
    _workload_args(s)
    c = sub.add_parser("compare", help="side-by-side table of result files")
    c.add_argument("files", nargs="+", help="NAME.json files written by run or sweep; the first is the reference")
    argv = sys.argv[1:] if argv is None else list(argv)
    a = ap.parse_args(argv)
    a.command = shlex.join([sys.executable, "-m", "sglang_eagle3.bench", *argv])

    try:
        if a.cmd == "run":
            try:
                w = _workload(a)
                prepare_out_dir(a.out)
                res = summarize(a.name, w, [collect_round(a.url, w, name=a.name, progress=_progress,
                                                          command=a.command)])
            except KeyboardInterrupt:
                print(f"{PROG}: interrupted (outside the timed passes): nothing written", file=sys.stderr)
                return 130
            if res.get("interrupted"):
                return _interrupted(res, a.out)
            print(f"wrote {save(res, a.out)}")
            _print_comparison([res])
            return _exit_status([res])
        if a.cmd == "compare":
            return _print_comparison(_label_duplicates([load_result(p) for p in a.files], a.files))
        return _sweep(s, a)
    except BenchError as e:
        raise SystemExit(f"{PROG}: error: {e}") from None


_ENV_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")


def _parse_config(ap: argparse.ArgumentParser, spec: str) -> tuple[str, dict, list[str]]:
    """NAME=FLAGS -> (name, the leading VAR=VALUE words as an environment, the remaining flags)."""
    name, sep, flags = spec.partition("=")
    if not sep:
        ap.error(f"--config {spec!r} must look like NAME=FLAGS")
    try:
        check_name(name)
    except ValueError as e:
        ap.error(f"--config {spec!r}: {e}")
    try:
        words = shlex.split(flags)
    except ValueError as e:
        ap.error(f"--config {spec!r}: cannot split its flags: {e}")
    env = {}
    while words and _ENV_WORD.match(words[0]):
        key, _, value = words.pop(0).partition("=")
        env[key] = value
    return name, env, words


def _sweep(ap: argparse.ArgumentParser, a) -> int:
    configs = [_parse_config(ap, spec) for spec in a.config]
    names = [name for name, _, _ in configs]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        ap.error(f"--config names must differ (each is a result file): {', '.join(map(repr, dup))} given twice")
    try:
        launcher = shlex.split(a.launcher)
    except ValueError as e:
        ap.error(f"--launcher {a.launcher!r}: {e}")
    if not launcher:
        ap.error("--launcher is empty")
    prepare_out_dir(a.out)
    workload, n_rounds = _workload(a), a.rounds
    done: dict[str, list[Round]] = {name: [] for name in names}  # each configuration's finished rounds, raw

    def merged() -> list[dict]:  # the result of each configuration that ran, its rounds together
        return [summarize(n, workload, done[n], planned_rounds=n_rounds) for n in names if done[n]]

    # Round by round (A B C, A B C, ...): drift of the machine over the sweep then reaches every configuration.
    for rnd in range(1, n_rounds + 1):
        where = f"round {rnd}/{n_rounds}, " if n_rounds > 1 else ""
        for i, (name, env, flags) in enumerate(configs):
            port = _free_port()
            cmd = launcher + flags + ["--host", "127.0.0.1", "--port", str(port)]
            log_path = os.path.join(a.out, f"{name}.server.log")
            shown = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
            print(f"[{name}] ({where}{i + 1}/{len(configs)}) {shown + ' ' if shown else ''}{shlex.join(cmd)}  "
                  f"(log: {log_path})", flush=True)
            try:
                log = open(log_path, "w" if rnd == 1 else "a")  # one log a configuration, its rounds in turn
                if rnd > 1:
                    log.write(f"\n===== {PROG} sweep: round {rnd}/{n_rounds} =====\n")
                    log.flush()
                proc = subprocess.Popen(cmd, env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT)
            except OSError as e:
                raise SystemExit(f"{PROG}: error: --launcher {a.launcher!r} cannot start {cmd[0]!r}: "
                                 f"{e.strerror or e}") from None
            try:
                url = f"http://127.0.0.1:{port}"
                t_start = time.monotonic()
                _wait_healthy(url, proc, a.startup_timeout, log_path, name)
                _progress(f"[{name}] {where}server up after {time.monotonic() - t_start:.0f} s; then {a.warmup} "
                          f"warm-up request(s) and {a.repeats} pass(es) of {a.num_requests} requests")
                got = collect_round(url, workload, name=name, number=rnd, rounds=n_rounds, progress=_progress,
                                    command=a.command, launch_env=env)
                got.provenance["launch_command"] = cmd
                done[name].append(got)
                for line in round_differences(done[name][0], got):
                    _progress(f"WARNING: [{name}] the server of round {rnd} differs from round 1's (its numbers "
                              f"mix the two): {line}")
                res = summarize(name, workload, done[name], planned_rounds=n_rounds)
                if got.interrupted:
                    code = _interrupted(res, a.out)
                    _stop(proc, log)
                    _print_comparison(merged())
                    left = _not_run(names, i + 1, rnd, n_rounds)
                    if left:
                        print(f"{PROG}: not run: {left}", file=sys.stderr)
                    return code
                print(f"[{name}] wrote {save(res, a.out)}"
                      f"{f' (rounds 1-{rnd} of {n_rounds})' if n_rounds > 1 else ''}", flush=True)
            except KeyboardInterrupt:
                _stop(proc, log)
                written = [n for n in names if done[n]]
                print(f"{PROG}: interrupted while starting or warming up {name}"
                      f"{f' in round {rnd} of {n_rounds}' if n_rounds > 1 else ''}: nothing written for it"
                      f"{' in that round' if done[name] else ''}"
                      f"{'; written: ' + ', '.join(written) if written else ''}", file=sys.stderr)
                left = _not_run(names, i + 1 if n_rounds == 1 else i, rnd, n_rounds)
                if left:
                    print(f"{PROG}: not run: {left}", file=sys.stderr)
                if written:
                    _print_comparison(merged())
                return 130
            finally:
                _stop(proc, log)
    runs = merged()
    _print_comparison(runs)
    return _exit_status(runs)


def _label_duplicates(runs: list[dict], paths: list[str]) -> list[dict]:
    """Runs of one name (bench_before/eagle3.json and bench_after/eagle3.json) are told apart by their file in
    the table and in every difference line; otherwise each line would read eagle3=... | eagle3=..."""
    names = [r["name"] for r in runs]
    for r, path in zip(runs, paths, strict=True):
        if names.count(r["name"]) > 1:
            r["name"] = f"{r['name']} ({path})"
    labels = [r["name"] for r in runs]
    for i, r in enumerate(runs):
        if labels.count(labels[i]) > 1:  # the same file given twice
            r["name"] = f"{labels[i]} #{i + 1}"
    return runs


def _not_run(names: list[str], first: int, rnd: int, n_rounds: int) -> str:
    """The configurations from ``names[first]`` on in round ``rnd``, then every later round; '' when none."""
    left = ", ".join(names[first:])
    if n_rounds == 1:
        return left
    parts = [f"round {rnd} of {n_rounds}: {left}"] if left else []
    if rnd < n_rounds:
        later = f"round {n_rounds}" if rnd + 1 == n_rounds else f"rounds {rnd + 1}-{n_rounds}"
        parts.append(f"{later} of {n_rounds}: every configuration")
    return "; ".join(parts)


def _stop(proc: subprocess.Popen, log) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    log.close()


def _exit_status(runs: list[dict]) -> int:
    """1 (after the files are written and the table printed) if any run had a failed request or no token."""
    problems = [p for p in map(failures, runs) if p]
    for p in problems:
        print(f"{PROG}: error: {p}", file=sys.stderr)
    return 1 if problems else 0


def _print_comparison(runs: list[dict]) -> int:
    diffs = provenance_diff(runs) if len(runs) > 1 else []
    env = environment_differences(diffs)
    if env:
        print(f"WARNING: these runs come from different machines or software ({', '.join(env)}): a ratio between "
              "them mixes the configuration with the environment; rerun them side by side in one sweep")
    if diffs:
        print("Runs differ in (check these before reading the ratios):")
        for d in diffs:
            print("  - " + d)
    doubts = warnings(runs)
    if doubts:
        print("Warnings (numbers to distrust):")
        for w in doubts:
            print("  - " + w)
    print(compare_table(runs))
    print(TABLE_NOTE)
    print(latency_table(runs))
    print(LATENCY_NOTE)
    return 0


if __name__ == "__main__":
    sys.exit(main())
