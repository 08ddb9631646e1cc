"""selfcheck argument validation and dry run (the real run needs GPUs and a model)."""

from __future__ import annotations

import json

import pytest
import torch

from sglang_eagle3 import selfcheck

from .conftest import needs_sglang


def test_sglang_args_become_engine_kwargs():
    args = selfcheck.build_parser().parse_args(
        ["--model-path", "org/model", "--draft-model-path", "org/draft", "--tp", "8",
         "--sglang-arg=--cuda-graph-max-bs-decode=64", "--sglang-arg=--disable-radix-cache",
         "--sglang-arg=--attention-backend=triton"])
    kw = selfcheck.sglang_kwargs(args)
    assert kw == {"model_path": "org/model", "tp_size": 8, "speculative_algorithm": "EAGLE3",
                  "speculative_draft_model_path": "org/draft", "cuda_graph_max_bs_decode": 64,
                  "disable_radix_cache": True, "attention_backend": "triton"}


def test_invalid_arguments_are_all_reported(tmp_path):
    empty = tmp_path / "prompts.txt"
    empty.write_text("\n")
    args = selfcheck.build_parser().parse_args(
        ["--model-path", str(tmp_path / "missing"), "--tp", "0", "--prompts-file", str(empty), "--sglang-arg", "foo",
         "--sglang-arg=--ok=1", "--sglang-arg=--=2"])
    with pytest.raises(selfcheck.SelfCheckError) as e:
        selfcheck.validate(args)
    msg = str(e.value)
    assert "--tp=0" in msg and "is not a directory" in msg and "holds no prompts" in msg
    assert "--sglang-arg 'foo'" in msg and "--sglang-arg '--=2'" in msg and "'--ok=1'" not in msg
    assert selfcheck.main(["--model-path", str(tmp_path / "missing"), "--dry-run"]) == 2


def test_dry_run_needs_sglang_but_no_gpu(tmp_path, monkeypatch, capsys):
    from sglang_eagle3.integration import sglang_overlay

    def no_sglang():
        raise ImportError("the SGLang overlay needs SGLang")

    monkeypatch.setattr(sglang_overlay, "installed_sglang_version", no_sglang)
    assert selfcheck.main(["--model-path", str(tmp_path), "--dry-run"]) == 2
    monkeypatch.setattr(sglang_overlay, "installed_sglang_version", lambda: sglang_overlay.SUPPORTED_SGLANG_VERSIONS[0])
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    assert selfcheck.main(["--model-path", str(tmp_path), "--dry-run"]) == 0
    assert json.loads(capsys.readouterr().out)["engine_kwargs"]["model_path"] == str(tmp_path)


def test_real_run_refuses_too_few_gpus_before_starting(tmp_path, monkeypatch, caplog):
    from sglang_eagle3.integration import sglang_overlay

    def never(*args, **kwargs):
        raise AssertionError("a configuration was started")

    monkeypatch.setattr(sglang_overlay, "installed_sglang_version", lambda: sglang_overlay.SUPPORTED_SGLANG_VERSIONS[0])
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(selfcheck.subprocess, "run", never)
    assert selfcheck.main(["--model-path", str(tmp_path), "--tp", "2"]) == 2
    assert "need 2 CUDA device(s) (--tp 2); 1 visible" in caplog.text


def test_compare_flags_mismatched_outputs():
    base = {"texts": ["a", "b"], "ms_per_token": 10.0, "verify": [{"graph": 1}]}
    over = {"texts": ["a", "c"], "ms_per_token": 8.0, "verify": [{"graph": 2}]}
    report = selfcheck.compare(base, over)
    assert report["greedy_outputs_equal"] is False and report["mismatched_prompts"] == [1]
    assert report["ms_per_token"] == {"baseline": 10.0, "overlay": 8.0}


@needs_sglang
@pytest.mark.sglang
def test_dry_run_prints_plan(tmp_path, capsys):
    assert selfcheck.main(["--model-path", str(tmp_path), "--dry-run", "--max-new-tokens", "8"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["sglang_version"] == "0.5.23" and plan["runs"] == ["baseline", "overlay"]
    assert plan["engine_kwargs"]["model_path"] == str(tmp_path)


@needs_sglang
@pytest.mark.sglang
def test_help_example_is_a_keyword_sglang_engine_accepts():
    import re

    from sglang.srt.server_args import ServerArgs

    parser = selfcheck.build_parser()
    action = next(a for a in parser._actions if "--sglang-arg" in a.option_strings)
    example = re.search(r"e\.g\. (--sglang-arg=\S+)\)", action.help).group(1)
    kw = selfcheck.sglang_kwargs(parser.parse_args(["--model-path", "/nonexistent/model", example]))
    assert len(kw) == 3  # model_path, tp_size and the example's
    ServerArgs(**kw)  # what sglang.Engine(**kw) builds first; an unknown keyword is a TypeError


@needs_sglang
@pytest.mark.sglang
def test_dry_run_names_sglang_args_the_engine_does_not_have(tmp_path, caplog):
    """A misspelt --sglang-arg failed the real run in its first child, after the model began to load."""
    args = ["--model-path", str(tmp_path), "--dry-run", "--sglang-arg=--cuda-graph-max-bs-decod=64",
            "--sglang-arg=--no-such-flag", "--sglang-arg=--disable-radix-cache"]
    assert selfcheck.main(args) == 2
    assert "--cuda-graph-max-bs-decod: SGLang's server arguments have no 'cuda_graph_max_bs_decod' (did you mean " \
           "--cuda-graph-max-bs-decode?)" in caplog.text
    assert "'no_such_flag'" in caplog.text and "disable_radix_cache" not in caplog.text
