"""launch_server's command line as an SGLang 0.5.23 user writes it for Kimi-K2.5 + EAGLE-3: SGLang's aliases, value
spellings and --config file reach the engine; the flags the native server does not implement are refused naming
each, with why; a switch given a value is refused rather than reported as a stray argument. No model is loaded:
serve_native is replaced by a recorder."""

from __future__ import annotations

import argparse

import pytest

from sglang_eagle3 import launch_server
from sglang_eagle3.launch_server import engine_kwargs, server_config, sglang_argv


@pytest.fixture
def served(monkeypatch):
    """main() up to the engine: the parsed arguments serve_native would get, one Namespace a call."""
    calls: list[argparse.Namespace] = []
    monkeypatch.setattr(launch_server, "serve_native", lambda args: calls.append(args) or 0)
    return calls


def _main(argv, capsys) -> tuple[int, str]:
    rc = launch_server.main(["--backend", "native", *argv])
    return rc, capsys.readouterr().err


KIMI = ["--model-path", "/models/Kimi-K2.5", "--tp", "8", "--trust-remote-code", "--speculative-algorithm", "EAGLE3",
        "--speculative-draft-model-path", "/models/eagle3", "--speculative-num-steps", "3",
        "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4", "--mem-fraction-static", "0.85",
        "--cuda-graph-max-bs", "32", "--context-length", "32768", "--host", "0.0.0.0", "--port", "30000",
        "--served-model-name", "kimi", "--tool-call-parser", "kimi_k2", "--reasoning-parser", "kimi_k2",
        "--enable-metrics", "--log-requests", "--api-key", "sk-test", "--attention-backend", "triton",
        "--moe-runner-backend", "triton", "--dtype", "bfloat16", "--random-seed", "0"]


def test_sglang_spellings_reach_the_engine(served, capsys):
    """SGLang 0.5.23's aliases (--model, --tensor-parallel-size, --cuda-graph-max-bs-decode), its value spellings
    (32k, half, torch_native) and its neutral flags (--kv-cache-dtype auto, --disable-radix-cache) were all
    "unrecognised" before."""
    rc, err = _main(["--model", "/m", "--tensor-parallel-size", "4", "--cuda-graph-max-bs-decode", "8",
                     "--context-length", "32k", "--max-total-tokens", "1Mi", "--dtype", "half",
                     "--attention-backend", "torch_native", "--kv-cache-dtype", "auto", "--disable-radix-cache"],
                    capsys)
    assert rc == 0, err
    kw = engine_kwargs(served[-1])
    assert kw["model_path"] == "/m" and kw["tp_size"] == 4 and kw["cuda_graph_max_bs"] == 8
    assert kw["context_length"] == 32000 and kw["max_total_tokens"] == 1 << 20
    assert kw["dtype"] == "float16" and kw["attention_backend"] == "torch"
    assert "kv_cache_dtype" not in kw and "disable_radix_cache" not in kw  # no-ops, documented as such
    rc, _ = _main(["--model-path", "/m", "--dtype", "float", "--kv-cache-dtype", "bf16", "--dtype", "bfloat16"],
                  capsys)
    assert rc == 0 and engine_kwargs(served[-1])["dtype"] == "bfloat16"


def test_kimi_command_line_with_a_config_file(served, capsys, tmp_path):
    cfg = tmp_path / "kimi.yaml"
    cfg.write_text("tp_size: 2\nmax-running-requests: 48\ndisable-cuda-graph: true\ndisable_overlap_schedule: false\n"
                   "speculative-aux-layer-ids: [2, 3, 5]\nworker-env: {NCCL_ALGO: Ring, FOO: '1'}\n"
                   "enable-torch-compile: false\napi-key: from-file\n")
    rc, err = _main([*KIMI, "--config", str(cfg)], capsys)
    assert rc == 0, err
    args = served[-1]
    kw = engine_kwargs(args)
    assert kw["tp_size"] == 8  # the command line wins over the file
    assert kw["max_running_requests"] == 48 and kw["disable_cuda_graph"] is True
    assert "disable_overlap_schedule" not in kw  # false: left off
    assert kw["speculative_aux_layer_ids"] == (2, 3, 5)
    assert kw["worker_env"] == (("NCCL_ALGO", "Ring"), ("FOO", "1"))
    assert kw["speculative_num_steps"] == 3 and kw["cuda_graph_max_bs"] == 32 and kw["context_length"] == 32768
    config = server_config(args)
    assert config.api_key == "sk-test" and config.served_model_name == "kimi" and config.tool_call_parser == "kimi_k2"
    assert f"--config {cfg}" in err and "--api-key" in err and "from-file" not in err  # names, never values
    # --config=FILE and an abbreviation read the file too; the file alone supplies the model path
    cfg2 = tmp_path / "m.yml"
    cfg2.write_text("model: /from-file\n")
    for argv in (["--config=" + str(cfg2)], ["--conf", str(cfg2)]):
        assert _main(argv, capsys)[0] == 0 and served[-1].model_path == "/from-file"


@pytest.mark.parametrize("text, message", [
    ("- a\n- b\n", "must hold a mapping of flag names to values, not a list"),
    ("context-length:\n", "'context-length' has no value"),
    ("disable-cuda-graph: 'yes'\n", "'disable-cuda-graph' is a switch: true or false"),
    ("a: [\n", "not valid YAML"),
])
def test_bad_config_files_are_one_clear_error(text, message, served, capsys, tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(text)
    rc, err = _main(["--config", str(cfg)], capsys)
    assert rc == 2 and message in err and not served, err


def test_config_file_name_problems(served, capsys, tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("tp: 1\n")
    for argv, message in ((["--config", str(cfg), "--config", str(cfg)], "--config given 2 times"),
                          (["--config", str(tmp_path / "c.json")], "must be a YAML file"),
                          (["--config", str(tmp_path / "none.yaml")], "No such file"),
                          (["--config"], "--config needs a YAML file")):
        rc, err = _main(argv, capsys)
        assert rc == 2 and message in err and not served, (argv, err)


def test_flags_the_native_server_lacks_are_named_with_why(served, capsys, tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("enable-torch-compile: true\n")
    rc, err = _main([*KIMI, "--chunked-prefill-size", "-1", "--watchdog-timeout", "600", "--quantization", "fp8",
                     "--ep", "8", "--no-such-flag", "1", "2", "--config", str(cfg)], capsys)
    assert rc == 2 and not served
    line = next(x for x in err.splitlines() if "ERROR" in x)
    assert "refuses 6 flag(s)" in line, line
    assert "--enable-torch-compile (in the --config file): nothing is torch.compile'd" in line
    assert "--chunked-prefill-size: a prompt longer than the largest --cuda-graph-prefill-tokens bucket" in line
    assert "--watchdog-timeout: the native server's counterpart is --worker-timeout" in line
    assert "--quantization: the checkpoint's quantization_config decides" in line
    assert "--ep: only tensor parallelism" in line
    assert "--no-such-flag: the native backend does not implement it" in line and "--backend sglang" in line
    assert "'600'" not in line and "'-1'" not in line  # values are not reported as arguments


def test_a_switch_given_a_value_is_refused_as_such(served, capsys):
    """SGLang's switches take no value either; before, "--enable-metrics true" ended in "unrecognised argument(s)
    ['true']" and "--disable-cuda-graph=false" in argparse's "ignored explicit argument"."""
    rc, err = _main(["--model-path", "/m", "--enable-metrics", "true", "--disable-cuda-graph=false"], capsys)
    assert rc == 2 and not served
    assert "--enable-metrics is a switch and takes no value (got 'true')" in err, err
    assert "--disable-cuda-graph is a switch and takes no value (got 'false')" in err


def test_kv_cache_dtype_other_than_the_models_is_refused(served, capsys):
    with pytest.raises(SystemExit) as e:
        launch_server.main(["--backend", "native", "--model-path", "/m", "--kv-cache-dtype", "fp8_e4m3"])
    assert e.value.code == 2 and "SGLang's FP8 / FP4 KV caches need --backend sglang" in capsys.readouterr().err
    rc, err = _main(["--model-path", "/m", "--kv-cache-dtype", "bf16"], capsys)  # --dtype auto: fp32 on CPU
    assert rc == 2 and "give --dtype bfloat16 with it" in err and not served


def test_human_readable_sizes():
    from sglang_eagle3.argtypes import human_int

    parse = human_int(1)
    assert [parse(t) for t in ("32768", "32k", "25.6k", "128Ki", "2M")] == [32768, 32000, 25600, 131072, 2_000_000]
    for text, message in (("0", "must be >= 1"), ("1.5Ki", "decimals are not allowed"), ("0.0001k", "not a whole"),
                          ("32K", "is not an integer")):
        with pytest.raises(argparse.ArgumentTypeError, match=message):
            parse(text)


def test_config_is_handed_to_sglang_in_the_form_it_reads():
    """SGLang's launcher looks for the word "--config" itself: given as --config=FILE (or abbreviated) its argparse
    kept the path and no one read the file."""
    assert sglang_argv(["--config=/c.yaml", "--tp", "8"]) == ["--config", "/c.yaml", "--tp-size", "8"]
    assert sglang_argv(["--conf", "/c.yaml"]) == ["--config", "/c.yaml"]


def test_config_for_sglang_naming_native_flags_is_refused(capsys, tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("max-request-bytes: 9\nworker-env: {A: b}\ntp-size: 2\n")
    rc = launch_server.main(["--backend", "sglang", "--model-path", "/m", "--config", str(cfg)])
    err = capsys.readouterr().err
    assert rc == 2 and "--config" in err and "--max-request-bytes" in err and "--worker-env" in err, err
    assert "--tp-size" not in err.split("names", 1)[1]


def test_help_lists_the_sglang_flags_and_logs_nothing(capsys):
    with pytest.raises(SystemExit) as e:
        launch_server.main(["--backend", "native", "--help"])
    out = capsys.readouterr()
    assert e.value.code == 0 and "embedded" not in out.err
    for flag in ("--config", "--kv-cache-dtype", "--disable-radix-cache", "--tensor-parallel-size", "--model ",
                 "--cuda-graph-max-bs-decode"):
        assert flag in out.out, flag


def test_a_bad_log_level_is_an_argparse_style_error(served, capsys):
    """It exited 1 with a bare message, unlike every other bad flag (2, 'prog: error: ...')."""
    with pytest.raises(SystemExit) as e:
        launch_server.main(["--backend", "native", "--log-level", "loud"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "launch_server: error: --log-level 'loud' is not one of" in err and not served
    assert _main(["--log-level", "critical"], capsys)[0] == 0


def test_an_engine_refusal_names_the_flag(tiny_model, capsys):
    """The engine's ConfigError names its field (dtype='fp8'); the user typed a flag, so the log names the flag."""
    for argv, want in ((["--dtype", "fp8"], "--dtype='fp8' must be one of"),
                       (["--attention-backend", "fa3"], "--attention-backend='fa3'"),
                       (["--constrained-json-max-whitespace-cnt", "0"], "--constrained-json-max-whitespace-cnt=0")):
        rc = launch_server.main(["--backend", "native", "--model-path", tiny_model.target, "--device", "cpu", *argv])
        err = capsys.readouterr().err
        assert rc == 2 and "cannot start the engine: ConfigError: " + want in err, err
