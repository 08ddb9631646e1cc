"""launch_server's command line: SGLang flag names map onto EngineArgs, the backend choice, and the first
log line when no --model-path is given."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import subprocess
import sys
import time

import pytest

from sglang_eagle3.engine import EngineArgs
from sglang_eagle3.launch_server import build_parser, choose_backend, engine_kwargs

from .conftest import free_port

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


@pytest.mark.skipif(importlib.util.find_spec("sglang_eagle3.integration.launch") is not None,
                    reason="the SGLang launcher is installed here")
def test_sglang_backend_without_launcher_is_a_clear_error():
    r = _run(["--backend", "sglang", "--model-path", "/nowhere"])
    assert r.returncode == 2
    assert "--backend sglang" in r.stderr and "--backend native" in r.stderr


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
