"""python -m sglang_eagle3.bench as a demanding user runs it: repeated passes with their spread, a workload
difference named by compare, the command and versions recorded, Ctrl-C leaving a marked partial file at once,
a --worker-env the workers never got warned about, bad values refused by name, and a sweep whose
configurations carry their own environment (a fake launcher: a small HTTP server in a subprocess)."""

from __future__ import annotations

import json
import shlex
import signal
import statistics
import sys
import threading
import time

import pytest

from sglang_eagle3.bench.__main__ import main
from sglang_eagle3.bench.harness import compare_table, load_result, provenance_diff, run_workload
from tests.server.test_bench_cli import FakeServer, _report, ours_info


@pytest.fixture
def fake():
    srv = FakeServer()
    srv.info = lambda: {**ours_info([]), "version": "9.9.9"}
    srv.thread.start()
    yield srv
    srv.httpd.shutdown()
    srv.httpd.server_close()


def test_repeats_time_each_pass_and_show_the_spread(fake):
    res = run_workload(fake.url, name="r", prompts=["a", "b"], num_requests=3, concurrency=2, max_tokens=4,
                       warmup=1, timeout=10, repeats=3)
    m = res["metrics"]
    assert fake.posts == 1 + 3 * 3  # one warm-up request, then three passes of three
    assert len(m["passes"]) == 3 and all(p["output_tokens"] == 3 * 4 for p in m["passes"])
    assert m["output_tokens"] == 3 * 3 * 4 and (m["requests_ok"], m["requests_failed"]) == (9, 0)
    rates = [p["output_tokens"] / p["wall_s"] for p in m["passes"]]
    assert m["end_to_end_output_tok_per_s"] == pytest.approx(statistics.median(rates))
    assert (m["end_to_end_output_tok_per_s_min"], m["end_to_end_output_tok_per_s_max"]) == pytest.approx(
        (min(rates), max(rates)))
    assert res["workload"]["repeats"] == 3 and res["workload"]["warmup_requests"] == 1
    table = compare_table([res])
    assert f"{min(rates):.1f}-{max(rates):.1f}" in table and "3 passes" in table
    header = table.splitlines()[0]
    assert "end-to-end tok/s, all requests" in header and "per-request tok/s" in header


def test_compare_names_a_workload_difference(fake):
    a = run_workload(fake.url, name="short", prompts=["a"], num_requests=2, concurrency=1, max_tokens=2, warmup=0)
    b = run_workload(fake.url, name="long", prompts=["a"], num_requests=2, concurrency=1, max_tokens=6, warmup=0)
    assert "workload.max_tokens: short=2 | long=6" in provenance_diff([a, b])


def test_result_records_the_command_versions_and_machine(fake, tmp_path):
    import torch

    import sglang_eagle3

    argv = ["run", "--url", fake.url, "--name", "v", "--out", str(tmp_path), "--num-requests", "1",
            "--max-tokens", "2", "--warmup", "0"]
    assert main(argv) == 0
    prov = load_result(str(tmp_path / "v.json"))["provenance"]
    # the command that reruns it, not the path of __main__.py
    assert prov["command"] == shlex.join([sys.executable, "-m", "sglang_eagle3.bench", *argv])
    assert prov["server_version"] == "9.9.9"
    assert prov["client_versions"]["torch"] == torch.__version__
    assert prov["client_versions"]["sglang_eagle3"] == sglang_eagle3.__version__
    assert "triton" in prov["client_versions"] and prov["client_cpu_count"] >= 1 and prov["client_platform"]


def test_ctrl_c_writes_a_marked_partial_file_at_once(fake, tmp_path, capsys):
    fake.delay = 0.02  # 10 tokens: about 0.2 s a request, 60 requests about 6 s
    main_thread = threading.main_thread().ident
    timer = threading.Timer(0.7, signal.pthread_kill, (main_thread, signal.SIGINT))
    timer.start()
    t0 = time.monotonic()
    code = main(["run", "--url", fake.url, "--name", "cut", "--out", str(tmp_path), "--num-requests", "60",
                 "--max-tokens", "10", "--warmup", "0", "--repeats", "2"])
    took = time.monotonic() - t0
    timer.join()
    assert code == 130 and took < 3.0, took  # the remaining requests are not run first
    assert "interrupted" in capsys.readouterr().err
    res = load_result(str(tmp_path / "cut.json"))
    m = res["metrics"]
    assert res["interrupted"].startswith("interrupted (Ctrl-C) in pass 1 of 2")
    assert 0 < m["requests_ok"] < 60 and m["output_tokens"] == 10 * m["requests_ok"]
    assert main(["compare", str(tmp_path / "cut.json")]) == 0
    out = capsys.readouterr().out
    assert "| cut (interrupted) |" in out and "cut: interrupted (Ctrl-C)" in out


def test_a_worker_env_the_workers_did_not_get_is_warned_about(fake, capsys, tmp_path):
    def info(seen: dict):
        i = ours_info([_report(100, 0, **seen), _report(101, 1, **seen)])
        i["args"]["worker_env"] = [["NCCL_P2P_DISABLE", "1"]]
        return i

    fake.info = lambda: info({})
    assert main(["run", "--url", fake.url, "--name", "lost", "--out", str(tmp_path), "--num-requests", "1",
                 "--max-tokens", "2", "--warmup", "0"]) == 0
    out = capsys.readouterr().out
    assert "lost: NCCL_P2P_DISABLE=1 was requested but worker rank 0 ran with NCCL_P2P_DISABLE=<unset>" in out
    assert "worker rank 1 ran with NCCL_P2P_DISABLE=<unset>" in out
    fake.info = lambda: info({"NCCL_P2P_DISABLE": "1"})
    res = run_workload(fake.url, name="got", prompts=["a"], num_requests=1, concurrency=1, max_tokens=2, warmup=0)
    assert res["provenance"]["worker_env_not_applied"] == []


def test_no_ratio_against_a_first_run_without_tokens(fake):
    good = run_workload(fake.url, name="good", prompts=["a"], num_requests=1, concurrency=1, max_tokens=2, warmup=0)
    fake.gen = "empty"
    empty = run_workload(fake.url, name="empty", prompts=["a"], num_requests=1, concurrency=1, max_tokens=2,
                         warmup=0)
    row = [ln for ln in compare_table([empty, good]).splitlines() if ln.startswith("| good |")][0]
    assert row.split("|")[5].strip() == "-", row  # "vs first": no ratio against 0 tok/s


@pytest.mark.parametrize("args, said", [
    (["--repeats", "0"], "argument --repeats: 0 must be >= 1"),
    (["--temperature", "-1"], "argument --temperature: -1.0 must be a finite number >= 0"),
    (["--temperature", "nan"], "argument --temperature: nan must be a finite number >= 0"),
    (["--warmup", "-1"], "argument --warmup: -1 must be >= 0"),
])
def test_bad_values_are_named(fake, tmp_path, capsys, args, said):
    with pytest.raises(SystemExit) as e:
        main(["run", "--url", fake.url, "--name", "x", "--out", str(tmp_path), *args])
    assert e.value.code == 2 and said in capsys.readouterr().err and fake.posts == 0


_FAKE_LAUNCHER = r'''
import json, os, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
port = int(sys.argv[sys.argv.index("--port") + 1])
print("fake server starting", flush=True)
env = {k: v for k, v in os.environ.items() if k.startswith(("NCCL_", "SGLANG_"))}
info = {"args": {"model_path": "/m", "worker_env": []}, "model": {}, "draft": None, "device": "cpu",
        "tp_size": 1, "worker_env": [{"env": env, "pid": os.getpid(), "rank": 0}], "version": "0"}

class H(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(json.dumps(info).encode())
    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.end_headers()
        meta = {"prompt_tokens": 1, "completion_tokens": 1}
        self.wfile.write(b"data: " + json.dumps({"meta_info": meta}).encode() + b"\n\ndata: [DONE]\n\n")

HTTPServer(("127.0.0.1", port), H).serve_forever()
'''


def test_sweep_configurations_carry_their_environment(tmp_path, capsys):
    script = tmp_path / "fake_launcher.py"
    script.write_text(_FAKE_LAUNCHER)
    out = tmp_path / "out"
    launcher = f"{shlex.quote(sys.executable)} {shlex.quote(str(script))}"
    code = main(["sweep", "--launcher", launcher, "--out", str(out), "--num-requests", "1", "--max-tokens", "1",
                 "--warmup", "0", "--config", "plain=", "--config", "p2p=NCCL_P2P_DISABLE=1 --flag"])
    assert code == 0
    p2p = load_result(str(out / "p2p.json"))["provenance"]
    assert p2p["worker_env"][0]["env"]["NCCL_P2P_DISABLE"] == "1"  # reached the server process
    assert p2p["launch_env"] == {"NCCL_P2P_DISABLE": "1"} and p2p["launch_command"][-3:] == ["127.0.0.1", "--port",
                                                                                              p2p["launch_command"][-1]]
    assert "NCCL_P2P_DISABLE=1" not in p2p["launch_command"] and "--flag" in p2p["launch_command"]
    assert "fake server starting" in (out / "p2p.server.log").read_text()
    assert 'worker_env rank 0 env.NCCL_P2P_DISABLE: plain=<unset> | p2p="1"' in capsys.readouterr().out
    # two configurations of one name would write one file
    with pytest.raises(SystemExit) as e:
        main(["sweep", "--launcher", launcher, "--out", str(out), "--config", "a=", "--config", "a=--x"])
    assert e.value.code == 2 and "'a' given twice" in capsys.readouterr().err


def test_sweep_shows_the_log_of_a_server_that_died(tmp_path):
    script = tmp_path / "dies.py"
    script.write_text("import sys\nprint('cannot load the checkpoint: boom', flush=True)\nsys.exit(3)\n")
    with pytest.raises(SystemExit) as e:
        main(["sweep", "--launcher", f"{shlex.quote(sys.executable)} {shlex.quote(str(script))}",
              "--out", str(tmp_path / "out"), "--config", "a=--x"])
    msg = str(e.value.code)
    assert "exited with code 3" in msg and "boom" in msg and "a.server.log" in msg


def test_compare_warns_when_runs_come_from_another_machine(fake, tmp_path, capsys):
    fake.info = lambda: {**ours_info([_report(100, 0)]), "version": "9.9.9"}
    here = run_workload(fake.url, name="here", prompts=["a"], num_requests=1, concurrency=1, max_tokens=2, warmup=0)
    spec = run_workload(fake.url, name="spec", prompts=["a"], num_requests=1, concurrency=1, max_tokens=2, warmup=0)
    spec["provenance"]["server_args"]["speculative_algorithm"] = "EAGLE3"  # the configuration under test
    spec["provenance"]["client_git_commit"] = here["provenance"]["client_git_commit"]  # (others may commit meanwhile)
    files = [save_as(r, tmp_path) for r in (here, spec)]
    assert main(["compare", *files]) == 0
    assert "WARNING" not in capsys.readouterr().out  # one machine, one commit: only the configuration differs
    there = json.loads(json.dumps(here))
    there["name"] = "there"
    there["provenance"]["client_host"] = "gpu-box-7"
    there["provenance"]["worker_env"][0]["device"] = {"type": "cuda", "name": "NVIDIA H100"}
    assert main(["compare", files[0], save_as(there, tmp_path)]) == 0
    warning = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("WARNING")]
    assert len(warning) == 1 and "client_host" in warning[0] and "device.name" in warning[0], warning


def save_as(result: dict, folder) -> str:
    from sglang_eagle3.bench.harness import save

    return save(result, str(folder))
