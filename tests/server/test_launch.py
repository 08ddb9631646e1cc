"""launch_server's command line: SGLang flag names map onto EngineArgs, the backend choice, and the first
log line when no --model-path is given."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest

from sglang_eagle3.engine import EngineArgs
from sglang_eagle3.launch_server import build_parser, choose_backend, engine_kwargs, server_config
from sglang_eagle3.server.config import ServerConfigError

from .conftest import ServerProcess, free_port, model_args

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def test_sglang_flags_map_onto_engine_args():
    argv = ["--model-path", "/m", "--tokenizer-path", "/t", "--speculative-algorithm", "EAGLE3",
            "--speculative-draft-model-path", "/d", "--speculative-num-steps", "4", "--speculative-eagle-topk", "1",
            "--speculative-num-draft-tokens", "5", "--tp-size", "2", "--device", "cpu", "--dtype", "float32",
            "--disable-cuda-graph", "--disable-overlap-schedule", "--cuda-graph-max-bs", "8",
            "--max-running-requests", "7", "--context-length", "128", "--attention-backend", "torch",
            "--moe-runner-backend", "torch", "--random-seed", "3",
            "--page-size", "32", "--max-total-tokens", "4096", "--log-level", "debug",
            "--speculative-aux-layer-ids", "2,3,5", "--skip-tokenizer-init"]
    args = build_parser().parse_args(argv)
    kw = engine_kwargs(args)
    fields = {f.name for f in dataclasses.fields(EngineArgs)}
    assert set(kw) <= fields, set(kw) - fields
    assert kw["speculative_num_steps"] == 4 and kw["tp_size"] == 2 and kw["disable_cuda_graph"] is True
    assert kw["disable_overlap_schedule"] is True
    assert kw["speculative_aux_layer_ids"] == (2, 3, 5) and kw["max_total_tokens"] == 4096
    assert build_parser().parse_args(["--tp", "4"]).tp_size == 4  # SGLang's short alias
    assert engine_kwargs(build_parser().parse_args([])) == {"log_level": "info"}  # nothing else forced


def test_auto_backend_is_native_without_model_or_sglang():
    backend, why = choose_backend(build_parser().parse_args([]))
    assert backend == "native", why
    assert choose_backend(build_parser().parse_args(["--backend", "sglang"]))[0] == "sglang"


def _run(argv: list[str], timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sglang_eagle3.launch_server", *argv], capture_output=True,
                          text=True, timeout=timeout, env=ENV)


@pytest.mark.skipif(importlib.util.find_spec("sglang") is not None, reason="SGLang is installed here")
def test_sglang_backend_without_launcher_is_a_clear_error():
    # (It was skipped wherever our own integration.launch module exists, i.e. always.)
    r = _run(["--backend", "sglang", "--model-path", "/nowhere"])
    assert r.returncode == 2
    assert "--backend sglang" in r.stderr and "--backend native" in r.stderr


def test_native_only_flags_are_refused_for_sglang():
    """SGLang's launcher has none of them: it would stop at them (or, --cuda-graph-max-bs, call it ambiguous)."""
    r = _run(["--backend", "sglang", "--model-path", "/nowhere", "--max-request-bytes", "9",
              "--cuda-graph-max-bs=8", "--tp", "2"])
    assert r.returncode == 2
    assert "--cuda-graph-max-bs, --max-request-bytes belong to the native server" in r.stderr, r.stderr
    assert "--cuda-graph-max-bs-decode" in r.stderr


def test_sglang_argv_renames_our_aliases():
    from sglang_eagle3.launch_server import sglang_argv

    assert sglang_argv(["--tp", "8", "--tp=4", "--model-path", "m"]) == ["--tp-size", "8", "--tp-size=4",
                                                                          "--model-path", "m"]


def test_unknown_flag_on_native_backend_is_a_clear_error(tiny_model):
    r = _run(["--backend", "native", "--model-path", tiny_model.target, "--chunked-prefill-size", "4096"])
    assert r.returncode == 2
    assert "--chunked-prefill-size" in r.stderr and "--backend sglang" in r.stderr


def test_first_log_line_names_the_embedded_default():
    """With no --model-path the first line says the embedded default is served (whether or not it is
    installed yet: without it the server then exits with a clear error)."""
    proc = subprocess.Popen([sys.executable, "-m", "sglang_eagle3.launch_server", "--device", "cpu", "--port",
                             str(free_port())], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=ENV)
    try:
        first = proc.stderr.readline()
        assert "embedded default" in first, first
        assert "--model-path" in first
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        proc.stderr.close()


def test_missing_embedded_model_exits_with_a_message():
    from sglang_eagle3.engine import EMBEDDED_DIR

    if os.path.exists(os.path.join(EMBEDDED_DIR, "target", "config.json")):
        pytest.skip("the embedded model is installed")
    t0 = time.monotonic()
    r = _run(["--device", "cpu", "--port", str(free_port())])
    assert r.returncode == 2 and "embedded default model is not installed" in r.stderr
    assert time.monotonic() - t0 < 60


def test_server_flags_are_checked_before_the_engine_loads(tiny_model):
    def config(*argv):
        return server_config(build_parser().parse_args(list(argv)))

    assert config("--max-queued-requests", "-1").max_queued_requests is None  # documented: unbounded
    assert config("--max-queued-requests", "0").max_queued_requests == 0
    assert config().max_request_bytes == 16 * 1024 * 1024 and config().shutdown_grace_s == 5.0
    assert config("--max-request-bytes", "1000", "--shutdown-grace-s", "0").max_request_bytes == 1000
    with pytest.raises(ServerConfigError, match="--max-queued-requests -5: must be >= 0, or -1"):
        config("--max-queued-requests", "-5")
    for flag, value, message in (("--max-queued-requests", "-5", "--max-queued-requests -5"),
                                 ("--max-request-bytes", "0", "max_request_bytes=0"),
                                 ("--shutdown-grace-s", "-1", "shutdown_grace_s=-1.0")):
        r = _run(["--backend", "native", "--model-path", tiny_model.target, "--device", "cpu", flag, value])
        assert r.returncode == 2 and message in r.stderr, r.stderr
        assert "serving" not in r.stderr  # refused before the engine was built


def test_sigterm_ends_streams_with_an_error_event_then_stops_the_engine(tiny_model, tmp_path):
    """SIGTERM: requests in flight get --shutdown-grace-s to finish; then a stream still running ends with an
    error event and [DONE] (not a connection that just stops), one still queued gets a 503, and the engine
    thread is stopped before the process exits (as killed by SIGTERM)."""
    srv = ServerProcess([*model_args(tiny_model), "--max-running-requests", "1", "--shutdown-grace-s", "0.1"],
                        str(tmp_path / "server.log"))
    results: dict[int, tuple[int, list]] = {}
    first_event = threading.Event()

    def stream(i: int) -> None:
        body = {"model": "default", "prompt": f"fox {i}", "max_tokens": 200, "temperature": 0, "stream": True}
        events = []
        with httpx.stream("POST", srv.url + "/v1/completions", json=body, timeout=60) as r:
            if r.status_code != 200:
                events = [json.loads(r.read())]
            for line in r.iter_lines() if r.status_code == 200 else ():
                if line.startswith("data: "):
                    first_event.set()
                    data = line[len("data: "):]
                    events.append(data if data == "[DONE]" else json.loads(data))
        results[i] = (r.status_code, events)

    try:
        srv.wait_healthy()
        threads = [threading.Thread(target=stream, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        assert first_event.wait(30)
        deadline = time.monotonic() + 30
        while httpx.get(srv.url + "/get_server_info", timeout=30).json()["server_stats"]["inflight_requests"] < 3:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        srv.proc.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(60)
        assert srv.proc.wait(30) == -signal.SIGTERM
    finally:
        srv.stop()
    assert len(results) == 3, results  # no client thread died
    cut = [events for status, events in results.values() if status == 200 and "error" in events[-2]]
    assert cut, results  # the running stream did not finish 200 tokens within the 0.1 s grace
    for events in cut:
        assert events[-1] == "[DONE]" and events[-2]["error"]["code"] == "server_shutting_down"
        assert any(e["choices"][0]["text"] for e in events[:-2])
    for status, events in results.values():
        assert status in (200, 503), results
        if status == 503:
            assert events[0]["error"]["code"] == "server_shutting_down"
        else:
            assert events[-1] == "[DONE]"
    assert "engine thread stopped" in srv.log()
