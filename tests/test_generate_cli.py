"""``python -m sglang_eagle3.generate``: speculation flags reach the engine, user errors stop before the model
loads with one line and exit code 2, and the output is each prompt followed by its continuation."""

from __future__ import annotations

import pytest

import sglang_eagle3.engine
from sglang_eagle3 import generate
from sglang_eagle3.engine import EMBEDDED_DIR, RequestError

pytestmark = pytest.mark.usefixtures("torch_one_thread")


class FakeEngine:
    """Records its kwargs; generate answers every prompt with ' TEXT' (or raises ``fail``)."""

    made: list[dict] = []
    fail: Exception | None = None

    def __init__(self, **kwargs):
        FakeEngine.made.append(kwargs)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def generate(self, prompts, params):
        if FakeEngine.fail is not None:
            raise FakeEngine.fail
        return [{"text": " TEXT", "output_ids": [1, 2], "meta_info": {"completion_tokens": 2, "spec_verify_ct": 1}}
                for _ in prompts]


@pytest.fixture
def fake_engine(monkeypatch):
    FakeEngine.made, FakeEngine.fail = [], None
    monkeypatch.setattr(sglang_eagle3.engine, "Engine", FakeEngine)
    return FakeEngine


@pytest.mark.parametrize("argv, expect", [
    # No --model-path: passed on as launch_server passes them; the engine runs the embedded target with EAGLE-3
    # and the given draft / step count in place of its own.
    (["--speculative-draft-model-path", "/nonexistent/draft"],
     {"model_path": None, "speculative_draft_model_path": "/nonexistent/draft"}),
    (["--speculative-num-steps", "5"], {"model_path": None, "speculative_num_steps": 5}),
    (["--model-path", "T", "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "D",
      "--speculative-num-steps", "2"],
     {"model_path": "T", "speculative_algorithm": "EAGLE3", "speculative_draft_model_path": "D",
      "speculative_num_steps": 2}),
    (["--model-path", "T"], {"model_path": "T", "speculative_algorithm": None}),
    (["--no-speculation"], {"model_path": f"{EMBEDDED_DIR}/target", "speculative_algorithm": None}),
])
def test_speculation_flags_reach_the_engine(fake_engine, argv, expect):
    assert generate.main(argv) == 0
    (kwargs,) = fake_engine.made
    for key, value in expect.items():
        assert kwargs.get(key) == value, (key, kwargs)


@pytest.mark.parametrize("argv, flag", [
    (["--temperature", "nan"], "--temperature=nan"),
    (["--top-p", "0"], "--top-p=0.0"),
    (["--max-new-tokens", "-1"], "--max-new-tokens=-1"),
    (["--top-k", "0"], "--top-k=0"),
    (["--min-p", "2"], "--min-p=2.0"),
    (["--prompt", "ok", "--prompt", ""], "--prompt ''"),
    (["--no-speculation", "--speculative-draft-model-path", "D"], "--speculative-draft-model-path"),
    # With --model-path a draft path or step count without the algorithm would be ignored: refused instead.
    (["--model-path", "T", "--speculative-draft-model-path", "D"],
     "--speculative-draft-model-path given without --speculative-algorithm"),
    (["--model-path", "T", "--speculative-num-steps", "3"], "--speculative-num-steps given without"),
    (["--model-path", "T", "--speculative-algorithm", "EAGLE3"], "needs --speculative-draft-model-path"),
])
def test_user_errors_stop_before_the_engine(fake_engine, capsys, argv, flag):
    with pytest.raises(SystemExit) as e:
        generate.main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert flag in err and "Traceback" not in err, err
    assert fake_engine.made == []


def test_prints_prompt_then_text_and_stats(fake_engine, capsys):
    assert generate.main(["--prompt", "A", "--prompt", "B", "--stop", "x", "--top-k", "5", "--seed", "7"]) == 0
    out = capsys.readouterr()
    assert out.out.splitlines() == ["A TEXT", "B TEXT"]
    assert "[4 tokens in" in out.err and "accept length 2.00" in out.err


def test_request_error_is_one_line(fake_engine, capsys):
    fake_engine.fail = RequestError("prompt of 9999 tokens is longer than the context allows")
    assert generate.main(["--prompt", "A"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "longer than the context" in err


def test_missing_draft_is_one_line_error(capsys):
    # The real engine: the draft is checked from its config before any weights load.
    assert generate.main(["--speculative-draft-model-path", "/nonexistent/draft", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "cannot start the engine" in err and "/nonexistent/draft" in err and "Traceback" not in err, err


def test_draft_path_speculates_with_the_embedded_target(capsys):
    # The real engine on CPU: a draft path alone runs EAGLE-3 (the stats line has an accept length).
    argv = ["--speculative-draft-model-path", f"{EMBEDDED_DIR}/draft", "--speculative-num-steps", "2",
            "--device", "cpu", "--max-new-tokens", "8", "--prompt", "And God said,"]
    assert generate.main(argv) == 0
    out = capsys.readouterr()
    assert out.out.startswith("And God said,") and "accept length" in out.err, out.err


# -- the audit's findings: each test failed before its fix ------------------------------------------------------
def test_ctrl_c_is_one_line_and_exit_130(fake_engine, capsys):
    fake_engine.fail = KeyboardInterrupt()  # what Ctrl-C raises inside engine.generate
    assert generate.main(["--prompt", "A"]) == 130
    out = capsys.readouterr()
    assert out.err.count("\n") == 1 and "interrupted" in out.err and "Traceback" not in out.err, out.err
    assert out.out == ""


@pytest.mark.parametrize("argv, expect", [
    # The engine's checks named its keyword (speculative_num_steps=0, tp_size=0, ...), not the flag.
    (["--speculative-num-steps", "0"], "--speculative-num-steps=0 must"),
    (["--speculative-num-steps", "99"], "--speculative-num-steps=99 must"),
    (["--tp-size", "0"], "--tp-size=0 must"),
    (["--dtype", "float8"], "--dtype='float8' must"),
    (["--device", "tpu"], "--device='tpu' must"),
    # A bad stop string was reported as stop[0]=''.
    (["--stop", "ok", "--stop", ""], "--stop[1]=''"),
])
def test_engine_errors_name_the_flag(capsys, argv, expect):
    # The real engine: its argument checks run before any weights load.
    argv = [*argv, "--max-new-tokens", "4"] + ([] if "--device" in argv else ["--device", "cpu"])
    try:
        code = generate.main(argv)
    except SystemExit as e:  # refused by the parser
        code = e.code
    assert code == 2
    err = capsys.readouterr().err
    assert expect in err and "Traceback" not in err, err
