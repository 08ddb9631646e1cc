"""python -m sglang_eagle3.bench sweep --rounds N: configurations interleaved A B, A B (each round a fresh server), a
configuration's file the union of its rounds (passes, requests, counter deltas), one round's metrics those of its
requests, Ctrl-C in a later round keeping every finished round and naming
what did not run, and a server that changed between rounds warned about.

In-process checks run the harness with a scripted run_one and a fake clock (numbers known exactly); the sweep
checks start a small HTTP server per configuration and round in a subprocess (about 1 s each)."""

from __future__ import annotations

import shlex
import signal
import statistics
import sys
import threading
import time
import types

import pytest

from sglang_eagle3.bench import harness
from sglang_eagle3.bench.__main__ import main
from sglang_eagle3.bench.harness import (
    RequestResult,
    Workload,
    collect_round,
    load_result,
    run_workload,
    save,
    summarize,
    warnings,
)
from tests.server.test_bench_cli import fake_server, ours_info, sglang_info  # noqa: F401 (fake_server: the fixture)


class Script:
    """run_one without HTTP: request i (counted over the whole test) takes a known latency on a fake clock, with a
    known TTFT and inter-token gaps (all times ``scale``), or fails when i is in ``fail_at``."""

    def __init__(self, fail_at=(), scale: float = 1.0):
        self.now, self.calls, self.fail_at, self.scale = 100.0, 0, set(fail_at), scale

    def perf_counter(self) -> float:
        return self.now

    def run_one(self, base, prompt, max_tokens, temperature, timeout) -> RequestResult:
        i, s = self.calls, self.scale
        self.calls += 1
        latency = (0.1 + 0.013 * ((i * 7) % 5)) * s
        self.now += latency
        if i in self.fail_at:
            return RequestResult(3, 0, latency, 0.0, [], error=f"HTTP 400: bad request {i % 2}")
        itl = [(0.004 + 0.001 * ((i + j) % 3)) * s for j in range(max_tokens - 1)]
        return RequestResult(3, max_tokens, latency, (0.02 + 0.003 * (i % 4)) * s, itl, verify_ct=(i % 3))


@pytest.fixture
def scripted(monkeypatch):
    """Installs a Script (replace it with install(Script(...))) in the harness, clock included."""

    def install(script: Script) -> Script:
        monkeypatch.setattr(harness, "run_one", script.run_one)
        monkeypatch.setattr(harness, "time", types.SimpleNamespace(
            perf_counter=script.perf_counter, strftime=time.strftime, gmtime=time.gmtime))
        return script

    return install


def expected_one_round(script: Script, *, warmup: int, num_requests: int, repeats: int, max_tokens: int) -> dict:
    """The metrics of one round at concurrency 1, from the Script's definition of each request (not from the
    harness): request i of the test is the warm-ups' and then each pass's in turn, a pass's wall time the sum of its
    requests' latencies on the fake clock."""
    i, passes, ok = warmup, [], []
    for _ in range(repeats):
        wall = toks = good = 0
        for _ in range(num_requests):
            latency = 0.1 + 0.013 * ((i * 7) % 5)
            wall += latency
            if i not in script.fail_at:
                itl = [0.004 + 0.001 * ((i + j) % 3) for j in range(max_tokens - 1)]
                ok.append((latency, 0.02 + 0.003 * (i % 4), itl, i % 3))
                toks, good = toks + max_tokens, good + 1
            i += 1
        passes.append({"wall_s": wall, "output_tokens": toks, "requests_ok": good,
                       "requests_failed": num_requests - good, "end_to_end_output_tok_per_s": toks / wall})
    rates = [q["end_to_end_output_tok_per_s"] for q in passes]
    spec = [r for r in ok if r[3]]
    return {"passes": passes, "end_to_end_output_tok_per_s": statistics.median(rates),
            "end_to_end_output_tok_per_s_min": min(rates), "end_to_end_output_tok_per_s_max": max(rates),
            "end_to_end_spread_pct": 100 * (max(rates) - min(rates)) / statistics.median(rates),
            "requests_ok": len(ok), "requests_failed": repeats * num_requests - len(ok),
            "output_tokens": max_tokens * len(ok), "mean_ttft_ms": 1e3 * statistics.mean(r[1] for r in ok),
            "median_itl_ms": 1e3 * statistics.median([x for r in ok for x in r[2]]),
            "per_request_tok_per_s_median": statistics.median(max_tokens / r[0] for r in ok),
            "sglang_accept_length": max_tokens * len(spec) / sum(r[3] for r in spec)}


def assert_metrics(m: dict, want: dict) -> None:
    for p, q in zip(m["passes"], want["passes"], strict=True):
        assert p.pop("round") == 1
        assert p == pytest.approx(q, rel=1e-9)
    for key, value in want.items():
        if key not in ("passes", "sglang_accept_length"):
            assert m[key] == pytest.approx(value, rel=1e-9), key


def test_one_round_metrics_follow_the_requests(fake, scripted):
    """--rounds 1 (and run) against the Script's own definition of every request, in two cases: our server's
    counters with failed requests, and SGLang's per-request accept length with the server gone after the run; the
    file's sections in their order and no round fields beyond a pass's round and the workload's rounds = 1."""
    script = scripted(Script(fail_at=[5, 9]))
    gets = iter(range(1000))  # the counters of GET k: 10k verify forwards, 27k accepted tokens, 3k graph verifies

    def info():
        k = next(gets)
        return ours_info([], verify_forwards=10 * k, accepted=27 * k, graph=3 * k)

    fake.info = info
    res = run_workload(fake.url, name="g", prompts=["a", "b", "c"], timeout=10, num_requests=4, concurrency=1,
                       max_tokens=5, warmup=1, repeats=3)
    assert list(res) == ["name", "metrics", "workload", "errors", "provenance"]
    m = res["metrics"]
    assert_metrics(m, expected_one_round(script, warmup=1, num_requests=4, repeats=3, max_tokens=5))
    assert m["server_accept_length"] == pytest.approx(2.7)  # the counters' deltas, whatever GETs came between
    assert m["server_verify_batches_graph"] == 3 and m["server_verify_batches_eager"] == 0  # before, after: GETs 1, 2
    assert res["workload"] == {"num_requests": 4, "concurrency": 1, "max_tokens": 5, "temperature": 0.0,
                               "prompts": 3, "ignore_eos": True, "repeats": 3, "warmup_requests": 1, "rounds": 1}
    assert res["errors"] == ["HTTP 400: bad request 1"]  # requests 5 and 9: one message
    assert "rounds" not in res["provenance"] and "rounds_missing" not in res

    script = scripted(Script(fail_at=[2]))
    answers = iter([sglang_info("EAGLE3", "1", 0), sglang_info("EAGLE3", "1", 4)])
    fake.info = lambda: next(answers, None)  # then HTTP 500: the server died during the run
    res = run_workload(fake.url, name="g", prompts=["a", "b", "c"], timeout=10, num_requests=3, concurrency=1,
                       max_tokens=4, warmup=0, repeats=2)
    m = res["metrics"]
    want = expected_one_round(script, warmup=0, num_requests=3, repeats=2, max_tokens=4)
    assert_metrics(m, want)
    assert m["server_accept_length"] == pytest.approx(want["sglang_accept_length"])
    assert m["server_verify_batches_graph"] is None and m["server_verify_batches_eager"] is None
    assert res["errors"][0].startswith("after the run: ") and "engine died" in res["errors"][0]
    assert res["errors"][1:] == ["HTTP 400: bad request 0"]


def _round(fake, number: int, base: int, w: Workload, rounds: int = 2, commit: str = "c1"):
    """One round against the fake as a fresh server whose counters start at ``base``: each GET after the probe
    reads 5 more verify forwards, 13 more accepted tokens, 2 more graph verifies."""
    gets = iter(range(1000))

    def info():
        k = next(gets)
        return {**ours_info([], verify_forwards=base + 5 * k, accepted=7 * base + 13 * k, graph=base // 2 + 2 * k),
                "git_commit": commit}

    fake.info = info
    return collect_round(fake.url, w, name="x", number=number, rounds=rounds, command="cmd")


def test_rounds_merge_every_request_and_sum_the_counter_deltas(fake, scripted):
    """Two rounds, the second three times slower: the merged passes are round 1's then round 2's (each marked), the
    median and min-max are over all of them, TTFT / ITL / per-request tok/s over every request of both rounds (not
    an average of the rounds' own figures), counters the sum of each round's before/after delta (not the last
    round's end minus the first round's start: each round is a fresh server)."""
    w = Workload(prompts=["a", "b"], num_requests=3, concurrency=1, max_tokens=4, warmup=1, repeats=2)
    scripted(Script(fail_at=[2]))
    r1 = _round(fake, 1, 0, w)
    r2_script = scripted(Script(scale=3.0))
    r2_script.calls = 100  # other request numbers: other latencies
    r2 = _round(fake, 2, 5000, w)
    res = summarize("x", w, [r1, r2], planned_rounds=2)
    m = res["metrics"]

    assert m["passes"] == r1.passes + r2.passes and [p["round"] for p in m["passes"]] == [1, 1, 2, 2]
    rates = [p["end_to_end_output_tok_per_s"] for p in m["passes"]]
    assert m["end_to_end_output_tok_per_s"] == statistics.median(rates)
    assert (m["end_to_end_output_tok_per_s_min"], m["end_to_end_output_tok_per_s_max"]) == (min(rates), max(rates))
    assert m["end_to_end_output_tok_per_s_passes"] == rates and m["wall_s"] == pytest.approx(
        sum(p["wall_s"] for p in m["passes"]))

    ok = [q for q in r1.requests + r2.requests if q.error is None]
    assert (m["requests_ok"], m["requests_failed"]) == (len(ok), 1) == (11, 1)
    assert m["output_tokens"] == sum(q.output_tokens for q in ok)
    want = {"mean_ttft_ms": 1e3 * statistics.mean(q.ttft_s for q in ok),
            "median_itl_ms": 1e3 * statistics.median([x for q in ok for x in q.itl_s]),
            "per_request_tok_per_s_median": statistics.median(q.output_tokens / q.latency_s for q in ok)}
    per_round = [summarize("x", w, [r])["metrics"] for r in (r1, r2)]
    for key, value in want.items():
        assert m[key] == pytest.approx(value, rel=1e-12), key
        # the data tells the two ways apart: an average of the rounds' figures would fail the line above
        assert value != pytest.approx(statistics.mean(p[key] for p in per_round), rel=1e-6), key

    # each round: 6 timed requests between its before (GET 1) and after (GET 2): 5 / 13 / 2 a GET
    assert m["server_accept_length"] == (13 + 13) / (5 + 5)
    assert m["server_verify_batches_graph"] == 2 + 2 and m["server_verify_batches_eager"] == 0
    assert res["workload"]["rounds"] == 2 and "rounds_missing" not in res and "interrupted" not in res
    prov = res["provenance"]
    assert [r["round"] for r in prov["rounds"]] == [1, 2] and prov["rounds_differ"] == []
    assert prov["server_git_commit"] == "c1"

    # a third round planned but not run, and one whose server runs another commit
    scripted(Script())
    r3 = _round(fake, 2, 0, w, rounds=3, commit="c2")
    res = summarize("x", w, [r1, r3], planned_rounds=3)
    assert res["rounds_missing"] == "1 of 3 rounds did not run: the numbers cover rounds 1-2"
    assert res["provenance"]["rounds_differ"] == ['server_git_commit: round 1="c1" | round 2="c2"']
    said = warnings([res])
    assert 'x: the server differed between rounds: server_git_commit: round 1="c1" | round 2="c2"' in said
    assert "x: 1 of 3 rounds did not run: the numbers cover rounds 1-2" in said


@pytest.mark.parametrize("value, said", [("0", "argument --rounds: 0 must be >= 1"),
                                         ("two", "argument --rounds: 'two' is not an integer")])
def test_bad_rounds_are_named(tmp_path, capsys, value, said):
    with pytest.raises(SystemExit) as e:
        main(["sweep", "--out", str(tmp_path), "--rounds", value, "--config", "a=--x"])
    assert e.value.code == 2 and said in capsys.readouterr().err and not list(tmp_path.iterdir())


def test_a_file_from_before_rounds_reads_as_one_round(fake, tmp_path):
    fake.info = lambda: ours_info([])
    res = run_workload(fake.url, name="old", prompts=["a"], num_requests=1, concurrency=1, max_tokens=2, warmup=0)
    del res["workload"]["rounds"]
    assert load_result(save(res, str(tmp_path)))["workload"]["rounds"] == 1


# A server a sweep starts: records its launch (tag and order) in $BENCH_ROUNDS_DIR/order and each request in
# .../posts; its counters start at 1000 x its launch number (a fresh server's are its own); "b" reports another
# commit at each launch; launches from $BENCH_ROUNDS_SLOW_FROM on take 50 ms a token.
_LAUNCHER = r"""
import json, os, sys, threading, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
port = int(sys.argv[sys.argv.index("--port") + 1])
tag = sys.argv[sys.argv.index("--tag") + 1]
folder = os.environ["BENCH_ROUNDS_DIR"]
with open(os.path.join(folder, "order"), "a") as f:
    f.write(tag + "\n")
with open(os.path.join(folder, "order")) as f:
    launch = len(f.read().split())
slow = launch >= int(os.environ.get("BENCH_ROUNDS_SLOW_FROM", "1000000"))
print(f"fake server {tag}, launch {launch}", flush=True)
lock, posts = threading.Lock(), [0]

def info():
    n = 1000 * launch + posts[0]
    return {"args": {"model_path": "/m", "worker_env": []}, "model": {}, "draft": None, "device": "cpu",
            "tp_size": 1, "worker_env": [{"env": {}, "pid": os.getpid(), "rank": 0}], "version": "0",
            "git_commit": f"commit{launch}" if tag == "b" else "same", "verify_forwards": n,
            "accepted_tokens": 3 * n, "forward_counts": {"target_verify": {"graph": n, "eager": 0}}}

class H(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass
    def do_GET(self):
        with lock:
            body = json.dumps(info()).encode()
        self.send_response(200)
        self.end_headers()
        self.wfile.write(body)
    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with lock:
            posts[0] += 1
            with open(os.path.join(folder, "posts"), "a") as f:
                f.write(f"{launch}\n")
        self.send_response(200)
        self.end_headers()
        for i in range(1, req["sampling_params"]["max_new_tokens"] + 1):
            time.sleep(0.05 if slow else 0.0)
            meta = {"prompt_tokens": 1, "completion_tokens": i}
            self.wfile.write(b"data: " + json.dumps({"meta_info": meta}).encode() + b"\n\n")
        self.wfile.write(b"data: [DONE]\n\n")

ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()
"""


@pytest.fixture
def launcher(tmp_path, monkeypatch):
    script = tmp_path / "launcher.py"
    script.write_text(_LAUNCHER)
    monkeypatch.setenv("BENCH_ROUNDS_DIR", str(tmp_path))
    monkeypatch.setattr(harness, "git_commit", lambda: "client")  # (others may commit in this checkout meanwhile)
    return f"{shlex.quote(sys.executable)} {shlex.quote(str(script))}"


def _sweep_args(launcher: str, out, *extra: str) -> list[str]:
    return ["sweep", "--launcher", launcher, "--out", str(out), "--warmup", "0", "--config", "a=--tag a",
            "--config", "b=--tag b", *extra]


def test_sweep_rounds_interleave_and_merge(launcher, tmp_path, capsys):
    """--rounds 2 --repeats 2: servers start A B A B; each file holds both rounds' passes, its median over all four,
    the counters summed over the two servers; b's server reported another commit in round 2: warned, at once and
    under the table."""
    out = tmp_path / "out"
    assert main(_sweep_args(launcher, out, "--rounds", "2", "--repeats", "2", "--num-requests", "2",
                            "--max-tokens", "3")) == 0
    assert (tmp_path / "order").read_text().split() == ["a", "b", "a", "b"]
    a, b = (load_result(str(out / f"{n}.json")) for n in "ab")
    m = a["metrics"]
    assert [p["round"] for p in m["passes"]] == [1, 1, 2, 2] and m["requests_ok"] == 8 and m["output_tokens"] == 24
    assert m["end_to_end_output_tok_per_s"] == statistics.median(p["end_to_end_output_tok_per_s"] for p in m["passes"])
    assert m["server_verify_batches_graph"] == 8 and m["server_accept_length"] == 3.0  # 4 requests a server
    assert a["workload"]["rounds"] == 2 and "rounds_missing" not in a
    ports = [r["launch_command"][-1] for r in a["provenance"]["rounds"]]
    assert len(set(ports)) == 2 and a["provenance"]["launch_command"][-1] == ports[0]
    assert a["provenance"]["rounds_differ"] == []
    assert b["provenance"]["rounds_differ"] == ['server_git_commit: round 1="commit2" | round 2="commit4"']
    captured = capsys.readouterr()
    assert "[a] round 2/2, pass 2/2: 2/2 requests" in captured.err
    assert 'WARNING: [b] the server of round 2 differs from round 1\'s' in captured.err
    assert 'b: the server differed between rounds: server_git_commit: round 1="commit2"' in captured.out
    assert captured.out.count("| a |") == 1 and "| b |" in captured.out  # one table, one row each
    log = (out / "a.server.log").read_text()
    assert "launch 1" in log and "round 2/2" in log and "launch 3" in log


def test_sweep_ctrl_c_in_round_two_keeps_the_finished_rounds(launcher, tmp_path, monkeypatch, capsys):
    """Ctrl-C in a's second round: a.json has round 1 and round 2's finished requests, marked interrupted; b.json
    keeps its round 1 and says a round did not run; the sweep names b's round 2 as not run."""
    monkeypatch.setenv("BENCH_ROUNDS_SLOW_FROM", "3")  # a's round 2: 0.2 s a request, 40 requests
    out = tmp_path / "out"
    main_thread = threading.main_thread().ident

    def interrupt_in_round_two():
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            posts = tmp_path / "posts"
            if posts.exists() and "3" in posts.read_text().split():
                time.sleep(0.3)
                signal.pthread_kill(main_thread, signal.SIGINT)
                return
            time.sleep(0.05)

    watcher = threading.Thread(target=interrupt_in_round_two, daemon=True)
    watcher.start()
    code = main(_sweep_args(launcher, out, "--rounds", "2", "--num-requests", "40", "--max-tokens", "4"))
    watcher.join()
    assert code == 130
    assert (tmp_path / "order").read_text().split() == ["a", "b", "a"]
    a, b = (load_result(str(out / f"{n}.json")) for n in "ab")
    assert a["interrupted"].startswith("interrupted (Ctrl-C) in round 2 of 2, pass 1 of 1 after ")
    rounds = [p["round"] for p in a["metrics"]["passes"]]
    assert rounds == [1, 2] and a["metrics"]["passes"][0]["requests_ok"] == 40
    assert 40 < a["metrics"]["requests_ok"] < 80
    # the cut pass is kept but out of the median
    assert a["metrics"]["end_to_end_output_tok_per_s"] == a["metrics"]["passes"][0]["end_to_end_output_tok_per_s"]
    assert [p["round"] for p in b["metrics"]["passes"]] == [1] and "interrupted" not in b
    assert b["rounds_missing"] == "1 of 2 rounds did not run: the numbers cover round 1"
    err = capsys.readouterr().err
    assert "not run: round 2 of 2: b" in err and "wrote" in err and "(marked interrupted)" in err
