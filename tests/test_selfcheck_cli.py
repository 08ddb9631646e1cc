"""``python -m sglang_eagle3.selfcheck`` as a user meets it without GPUs: paths and outputs checked before the
(long) runs, a failed run or Ctrl-C as one line, the report printed even when it cannot be written. SGLang
itself is faked (its version check and the child runs); tests/integration/test_selfcheck.py has the rest."""

from __future__ import annotations

import json
import os
import random
import subprocess

import pytest
import torch

from sglang_eagle3 import selfcheck
from sglang_eagle3.integration import sglang_overlay


@pytest.fixture
def sglang_ok(monkeypatch):
    monkeypatch.setattr(sglang_overlay, "installed_sglang_version", lambda: sglang_overlay.SUPPORTED_SGLANG_VERSIONS[0])
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)


def _problems(argv) -> str:
    with pytest.raises(selfcheck.SelfCheckError) as e:
        selfcheck.validate(selfcheck.build_parser().parse_args(argv))
    return str(e.value)


def test_output_is_checked_before_the_runs(sglang_ok, tmp_path):
    # Was written only after both runs: a directory or a missing folder lost the whole report to a traceback.
    model = str(tmp_path)
    msg = _problems(["--model-path", model, "--output", str(tmp_path)])
    assert f"--output {str(tmp_path)!r} is a directory" in msg
    missing = str(tmp_path / "no" / "report.json")
    assert f"--output {missing!r}: directory" in _problems(["--model-path", model, "--output", missing])
    selfcheck.validate(selfcheck.build_parser().parse_args(["--model-path", model, "--output",
                                                            str(tmp_path / "report.json")]))


def test_prompts_file_problems_are_named(sglang_ok, tmp_path):
    model = str(tmp_path)
    # A directory was reported as "does not exist".
    assert f"--prompts-file {str(tmp_path)!r} is a directory" in _problems(["--model-path", model, "--prompts-file",
                                                                          str(tmp_path)])
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes(b"caf\xe9\n")  # was a UnicodeDecodeError traceback
    assert "--prompts-file" in _problems(["--model-path", model, "--prompts-file", str(latin1)])


def test_crlf_prompts_lose_their_carriage_return(tmp_path):
    rng = random.Random(os.urandom(4))
    prompts = ["".join(rng.choice("abc xyz,.") for _ in range(rng.randint(1, 30))).strip() or "p" for _ in range(5)]
    path = tmp_path / "prompts.txt"
    path.write_bytes("\r\n".join(prompts).encode() + b"\r\n")
    assert selfcheck.load_prompts(str(path)) == prompts


def test_sglang_arg_may_not_contradict_our_flags(sglang_ok, tmp_path):
    # --sglang-arg=--tp-size=2 silently replaced --tp (and the GPU count check used --tp).
    msg = _problems(["--model-path", str(tmp_path), "--tp", "1", "--sglang-arg=--tp-size=2"])
    assert "--sglang-arg '--tp-size=2' sets tp_size: use --tp" in msg


def _fake_runs(monkeypatch, fail_run=None, texts=("a", "b")):
    def fake_run(cmd, check, env):
        run = next(c.split("=", 1)[1] for c in cmd if c.startswith("--_child="))
        if run == fail_run:
            raise subprocess.CalledProcessError(1, cmd)
        out = next(c.split("=", 1)[1] for c in cmd if c.startswith("--_child-out="))
        with open(out, "w") as f:
            json.dump({"run": run, "texts": list(texts), "elapsed_s": 1.0, "completion_tokens": 10,
                       "ms_per_token": 100.0, "verify": [None]}, f)

    monkeypatch.setattr(selfcheck.subprocess, "run", fake_run)


def test_a_failed_run_is_one_line(sglang_ok, monkeypatch, tmp_path, caplog, capsys):
    # Was a CalledProcessError traceback on top of the child's own.
    run = random.choice(["baseline", "overlay"])
    _fake_runs(monkeypatch, fail_run=run)
    assert selfcheck.main(["--model-path", str(tmp_path)]) == 3
    assert f"the {run} run failed (exit code 1)" in caplog.text
    assert "Traceback" not in capsys.readouterr().err


def test_report_written_and_printed(sglang_ok, monkeypatch, tmp_path, capsys):
    _fake_runs(monkeypatch)
    out = tmp_path / "report.json"
    assert selfcheck.main(["--model-path", str(tmp_path), "--output", str(out)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert json.loads(out.read_text()) == printed and printed["greedy_outputs_equal"]


def test_ctrl_c_is_one_line(sglang_ok, monkeypatch, tmp_path, caplog):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(selfcheck.subprocess, "run", interrupted)
    assert selfcheck.main(["--model-path", str(tmp_path)]) == 130
    assert "interrupted" in caplog.text
