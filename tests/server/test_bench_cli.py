"""The benchmark harness and its CLI against an in-process fake server (threads, localhost): both servers'
/get_server_info formats, failed requests, the worker-environment diff and the one-line errors of bad inputs.

The fake speaks the two formats as read from the code: ours (Engine.get_server_info: "args", "model",
"worker_env", counters) and SGLang 0.5.23's (http_server.server_info: the resolved server args flat at the top
level, worker 0's scheduler handshake merged in, "internal_states", "version"; with our overlay the handshake's
"sglang_eagle3" = {"worker_env", "overlay"} and each internal state's "sglang_eagle3" = the overlay status).
"""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from sglang_eagle3.bench.__main__ import main
from sglang_eagle3.bench.harness import (
    BenchError,
    compare_table,
    load_result,
    provenance_diff,
    run_workload,
    save,
)


class FakeServer:
    """info(): the /get_server_info answer (None: HTTP 500). gen: "ok" (one token a chunk, with spec_verify_ct
    when verify_ct is set), "error_event" (SGLang's and ours: data: {"error": {...}} then [DONE]), "http_400",
    "empty" (only [DONE])."""

    def __init__(self):
        self.info = lambda: {}
        self.gen = "ok"
        self.verify_ct = None
        self.delay = 0.0  # seconds before each token ("ok")
        self.posts = 0
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                info = fake.info() if self.path == "/get_server_info" else {}
                if info is None:  # the server is gone
                    self.send_response(500)
                    self.end_headers()
                    self.wfile.write(b"engine died")
                    return
                body = json.dumps(info).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self):
                req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                fake.posts += 1
                if fake.gen == "http_400":
                    self.send_response(400)
                    self.send_header("Content-Type", "application/json")
                    self.end_headers()
                    self.wfile.write(json.dumps({"error": {"message": "max_new_tokens too large"}}).encode())
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                if fake.gen == "error_event":
                    self.wfile.write(b'data: {"error": {"message": "The input is longer than the context"}}\n\n')
                elif fake.gen == "ok":
                    m = req["sampling_params"]["max_new_tokens"]
                    for i in range(1, m + 1):
                        time.sleep(fake.delay)
                        meta = {"prompt_tokens": 3, "completion_tokens": i}
                        if fake.verify_ct is not None:
                            meta["spec_verify_ct"] = fake.verify_ct
                        self.wfile.write(b"data: " + json.dumps({"text": "x", "meta_info": meta}).encode() + b"\n\n")
                self.wfile.write(b"data: [DONE]\n\n")

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.02,), daemon=True)


@pytest.fixture(name="fake")
def fake_server():  # (named so: tests/test_bench_rounds.py imports it beside its own parameter name)
    srv = FakeServer()
    srv.thread.start()
    yield srv
    srv.httpd.shutdown()
    srv.httpd.server_close()


def _report(pid: int, rank: int | None = None, **env) -> dict:
    r = {"env": {"CUDA_VISIBLE_DEVICES": "0,1", **env}, "pid": pid, "hostname": "h", "nccl": "2.21.5"}
    if rank is not None:
        r["rank"] = rank
    return r


def ours_info(worker_env: list[dict], verify_forwards: int = 0, accepted: int = 0, graph: int = 0) -> dict:
    return {"args": {"model_path": "/m", "tp_size": len(worker_env) or 1, "port": 1, "host": "h"},
            "model": {"path": "/m", "layers": 2}, "draft": None, "device": "cuda", "tp_size": len(worker_env) or 1,
            "worker_env": worker_env, "kernels": {"gpu": "H200"}, "verify_forwards": verify_forwards,
            "accepted_tokens": accepted, "forward_counts": {"target_verify": {"graph": graph, "eager": 0}}}


def sglang_info(spec: str | None, nccl: str, verify_graph: int = 0) -> dict:
    return {"model_path": "/m", "tp_size": 8, "device": "cuda", "speculative_algorithm": spec, "port": 30000,
            "host": "127.0.0.1", "launch_command": "python -m sglang.launch_server --port 30000",
            "status": "ready", "max_total_num_tokens": 1000, "startup_time": 12.5, "frontend": "python",
            "sglang_eagle3": {"worker_env": _report(4321, NCCL_P2P_DISABLE=nccl),
                              "overlay": {"applied": True, "sglang_version": "0.5.23", "pid": 4321,
                                          "verify": {"graph": 0, "prefill_graph": 0, "eager": 0}}},
            "internal_states": [{"avg_spec_accept_length": 2.9, "sglang_eagle3": {
                "verify": {"graph": verify_graph, "prefill_graph": 1, "eager": 2}}}],
            "version": "0.5.23"}


def _run(url: str, name: str, **kw) -> dict:
    return run_workload(url, name=name, prompts=["a"], num_requests=2, concurrency=1, max_tokens=4, warmup=0,
                        timeout=10, **kw)


def test_sglang_server_info_gives_args_env_and_accept_length(fake):
    fake.info = lambda: sglang_info(None, "0")
    base = _run(fake.url, "baseline")
    counter = iter([0, 0, 10])  # before the warm-up probe, before the run, after it: 10 graph verifies
    fake.info = lambda: sglang_info("EAGLE3", "1", verify_graph=next(counter))
    fake.verify_ct = 2  # 4 tokens in 2 verify rounds a request
    eagle = _run(fake.url, "eagle3")
    prov = eagle["provenance"]
    assert prov["server_kind"] == "sglang" and prov["server_version"] == "0.5.23"
    assert prov["server_args"]["speculative_algorithm"] == "EAGLE3" and prov["server_args"]["tp_size"] == 8
    assert "internal_states" not in prov["server_args"] and "startup_time" not in prov["server_args"]
    assert prov["worker_env"][0]["env"]["NCCL_P2P_DISABLE"] == "1"
    assert prov["overlay"]["applied"] is True and "pid" not in prov["overlay"]
    m = eagle["metrics"]
    assert m["server_accept_length"] == pytest.approx(2.0)
    assert (m["server_verify_batches_graph"], m["server_verify_batches_eager"]) == (10, 0)
    assert base["metrics"]["server_accept_length"] is None
    diffs = provenance_diff([base, eagle])
    assert any(d.startswith("server_args.speculative_algorithm:") and "eagle3=\"EAGLE3\"" in d for d in diffs)
    assert 'worker_env rank 0 env.NCCL_P2P_DISABLE: baseline="0" | eagle3="1"' in diffs
    assert not any("startup_time" in d or "launch_command" in d or "port" in d for d in diffs), diffs


def test_unrecognised_server_info_fails_before_any_request(fake):
    fake.info = lambda: {"benchmarks": []}
    with pytest.raises(BenchError) as e:
        run_workload(fake.url, name="x", prompts=["a"], num_requests=1, concurrency=1, max_tokens=2, warmup=2)
    msg = str(e.value)
    assert fake.url in msg and "args" in msg and "internal_states" in msg and "version" in msg
    assert fake.posts == 0  # the probe comes before the warm-up


@pytest.mark.parametrize("gen, message", [
    ("error_event", "error event: The input is longer than the context"),
    ("http_400", "HTTP 400: max_new_tokens too large"),
    ("empty", "the stream ended without an output token"),
])
def test_failed_requests_are_counted_with_their_message(fake, gen, message):
    fake.info = lambda: ours_info([])
    fake.gen = gen
    res = _run(fake.url, "failing")
    m = res["metrics"]
    assert (m["requests_ok"], m["requests_failed"], m["output_tokens"]) == (0, 2, 0)
    assert res["errors"] == [message]
    assert "| failing | 2/2 |" in compare_table([res])


def test_cli_run_exits_1_after_writing_the_file_when_requests_fail(fake, tmp_path, capsys):
    fake.info = lambda: ours_info([])
    args = ["run", "--url", fake.url, "--out", str(tmp_path), "--num-requests", "2", "--max-tokens", "3"]
    assert main([*args, "--name", "good"]) == 0
    fake.gen = "error_event"
    assert main([*args, "--name", "bad"]) == 1
    assert "bad: 2 of 2 requests failed: error event: The input is longer" in capsys.readouterr().err
    assert load_result(str(tmp_path / "bad.json"))["metrics"]["requests_failed"] == 2
    assert main(["compare", str(tmp_path / "good.json"), str(tmp_path / "bad.json")]) == 0
    out = capsys.readouterr().out
    assert "| good | 0/2 |" in out and "| bad | 2/2 |" in out


def _env_lines(runs: list[dict]) -> list[str]:
    # (client_git_commit may differ too: others commit to this checkout while the test runs)
    return [d for d in provenance_diff(runs) if not d.startswith("client_git_commit")]


def test_worker_env_is_compared_key_by_key_per_rank(fake):
    pids = iter(range(1000, 2000, 2))

    def info(nccl: str):
        def f():
            p = next(pids)
            return ours_info([_report(p, 0, NCCL_P2P_DISABLE=nccl, RANK="0"),
                              _report(p + 1, 1, NCCL_P2P_DISABLE=nccl, RANK="1")])
        return f

    fake.info = info("0")
    a1, a2 = _run(fake.url, "a1"), _run(fake.url, "a2")
    assert a1["provenance"]["worker_env"][0]["pid"] != a2["provenance"]["worker_env"][0]["pid"]
    assert _env_lines([a1, a2]) == []  # pids differ, nothing else
    fake.info = info("1")
    b1 = _run(fake.url, "b1")
    assert _env_lines([a1, b1]) == ['worker_env rank 0 env.NCCL_P2P_DISABLE: a1="0" | b1="1"',
                                         'worker_env rank 1 env.NCCL_P2P_DISABLE: a1="0" | b1="1"']
    fake.info = lambda: ours_info([])  # TP=1: the model runs in the server process, no worker reports
    single = _run(fake.url, "tp1")
    assert single["provenance"]["worker_env"] is None
    assert "worker_env: not reported by the server of tp1 (not compared)" in provenance_diff([a1, single])


def test_bad_files_and_urls_are_one_line_errors(fake, tmp_path):
    not_json, other, listed = tmp_path / "bad.json", tmp_path / "other.json", tmp_path / "list.json"
    not_json.write_text("{not json")
    other.write_text(json.dumps({"benchmarks": [{"name": "x"}]}))
    listed.write_text("[1, 2]")
    missing = tmp_path / "missing.json"
    for path, problem in ((missing, "cannot read"), (not_json, "is not JSON"),
                          (other, "is not a result of python -m sglang_eagle3.bench (missing name, metrics"),
                          (listed, "holds a JSON list")):
        with pytest.raises(SystemExit) as e:
            main(["compare", str(path)])
        assert str(path) in str(e.value.code) and problem in str(e.value.code)
        assert "\n" not in str(e.value.code)
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    for url, problem in ((dead, "cannot reach"), ("127.0.0.1:30000", "must look like http://HOST:PORT")):
        with pytest.raises(SystemExit) as e:
            main(["run", "--url", url, "--name", "x", "--out", str(tmp_path)])
        assert url in str(e.value.code) and problem in str(e.value.code)
    with pytest.raises(SystemExit) as e:
        main(["sweep", "--launcher", "/nonexistent/launcher", "--config", "a=--x", "--out", str(tmp_path)])
    assert "/nonexistent/launcher" in str(e.value.code) and "No such file" in str(e.value.code)
    with pytest.raises(SystemExit) as e:  # a configuration's name is a file name too
        main(["sweep", "--launcher", "/nonexistent/launcher", "--config", "../a=--x", "--out", str(tmp_path)])
    assert e.value.code == 2


def test_server_gone_after_the_run_keeps_the_measurements(fake, tmp_path):
    answers = iter([ours_info([]), ours_info([], verify_forwards=5, accepted=10)])
    fake.info = lambda: next(answers, None)  # the probe, before the run; then HTTP 500
    res = _run(fake.url, "gone")
    assert res["metrics"]["requests_ok"] == 2 and res["metrics"]["server_accept_length"] is None
    assert res["errors"] == [f"after the run: GET {fake.url}/get_server_info answered HTTP 500: engine died"]
    assert res["provenance"]["server_kind"] == "sglang_eagle3"
    answers = iter([ours_info([]), ours_info([])])
    assert main(["run", "--url", fake.url, "--name", "gone", "--out", str(tmp_path), "--max-tokens", "2"]) == 1
    assert (tmp_path / "gone.json").exists()


@pytest.mark.parametrize("flag, value", [("--concurrency", "0"), ("--num-requests", "0"), ("--max-tokens", "-1"),
                                         ("--name", "../escaped"), ("--name", "sub/x")])
def test_cli_rejects_bad_numbers_and_names(fake, tmp_path, capsys, flag, value):
    fake.info = lambda: ours_info([])
    args = {"--url": fake.url, "--name": "ok", "--out": str(tmp_path / "out"), "--max-tokens": "2", flag: value}
    with pytest.raises(SystemExit) as e:
        main(["run", *(x for kv in args.items() for x in kv)])
    assert e.value.code == 2 and f"argument {flag}" in capsys.readouterr().err
    assert fake.posts == 0 and not list(tmp_path.rglob("*.json"))


def test_table_shows_a_zero_accept_length_and_the_client_commit_is_labelled(fake, tmp_path):
    fake.info = lambda: ours_info([])
    res = _run(fake.url, "r")
    prov = res["provenance"]
    assert prov["client_git_commit"] and "git_commit" not in prov
    res["metrics"]["server_accept_length"] = 0.0
    assert "| 0.00 |" in compare_table([res])
    old = dict(res, provenance={**{k: v for k, v in prov.items() if k != "client_git_commit"}, "git_commit": "abc"})
    loaded = load_result(save(old, str(tmp_path)))  # a file written before the rename reads the same
    assert loaded["provenance"]["client_git_commit"] == "abc" and "git_commit" not in loaded["provenance"]
