"""Second audit of the SGLang overlay as a user meets it: code paths the patches claim (pinned against SGLang
0.5.23's own code, refused by name when they moved), the verify counters of selfcheck's baseline, the draft wiring
check that could not run, and the `launch_server --backend sglang` hand-off (native flags abbreviated, --use-ray,
--worker-env pairs, secrets in the log, --help, an unsupported SGLang)."""

from __future__ import annotations

import logging
import os
import re
from types import SimpleNamespace as NS

import pytest

from sglang_eagle3 import launch_server
from sglang_eagle3.integration.draft_wiring import wrap_init_attention_backends

from .conftest import HAVE_SGLANG, needs_sglang


@pytest.fixture
def handed(monkeypatch):
    """launch_server --backend sglang with SGLang's launcher replaced: the argv it would get, one list a call."""
    import sglang_eagle3.integration.launch as launch

    calls = []
    monkeypatch.setattr(launch, "launch_sglang", lambda argv: calls.append(argv) or 0)
    return calls


# -- code paths: a patch SGLang's code no longer reaches is an error naming what moved ------------------------------

@pytest.mark.parametrize("module, name, body, named", [
    # select_experts holding its own router: the overlay's biased_grouped_topk would never be called.
    ("sglang.srt.layers.moe.topk", "select_experts", lambda *a, **k: None,
     "sglang.srt.layers.moe.topk.select_experts no longer calls biased_grouped_topk"),
    # the engine no longer writing the environment through _set_envs_and_config: no override would be reported.
    ("sglang.srt.entrypoints.engine", "Engine._launch_subprocesses", classmethod(lambda cls, *a, **k: None),
     "Engine._launch_subprocesses no longer calls _set_envs_and_config"),
])
@needs_sglang
@pytest.mark.sglang
def test_a_patch_whose_caller_moved_on_is_refused_by_name(overlay, monkeypatch, module, name, body, named):
    """apply() checked signatures only: a patch SGLang's code no longer called was installed and reported as
    applied, and did nothing (MoE routing, worker reports); now an error naming the symbol, the caller and the
    installed version, and under force a skipped target."""
    import importlib

    mod = importlib.import_module(module)
    owner, _, attr = name.rpartition(".")
    monkeypatch.setattr(getattr(mod, owner) if owner else mod, attr, body)
    with pytest.raises(overlay.PatchTargetError, match=re.escape(named)) as e:
        overlay.apply()
    assert "sglang 0.5.23" in str(e.value)
    assert not overlay.is_applied()
    status = overlay.apply(force=True)
    assert any(named in why for why in status["skipped"].values()), status["skipped"]


@needs_sglang
@pytest.mark.sglang
def test_a_verify_path_whose_conditions_moved_is_refused(overlay, monkeypatch):
    """The guard's reasons name DecodeCudaGraphRunner.can_run_graph's conditions; one it no longer checks (here the
    draft width) would make the reason given for a fallback wrong, so it is refused, naming the attribute."""
    from sglang.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner

    def can_run_graph(self, forward_batch):  # a rewrite that checks only the batch size
        return forward_batch.batch_size <= self.max_bs

    monkeypatch.setattr(DecodeCudaGraphRunner, "can_run_graph", can_run_graph)
    with pytest.raises(overlay.PatchTargetError, match=r"can_run_graph: the code path .* no longer refers to "
                                                       r"replace_embeds, ragged_verify_mode, num_tokens_per_req"):
        overlay.apply()


@needs_sglang
@pytest.mark.sglang
def test_every_pinned_code_path_holds_on_sglang_0_5_23(overlay):
    for spec in overlay.PATCHES:
        _, raw = overlay.resolve_target(spec)
        assert overlay.code_path_problems(spec, raw) == [], spec.key
    assert overlay.worker_plugin_problem() is None


@needs_sglang
@pytest.mark.sglang
def test_a_scheduler_entry_that_no_longer_loads_plugins_stops_the_launcher(overlay, monkeypatch, caplog):
    """The HTTP launcher's workers get the overlay only through load_plugins() in SGLang's run_scheduler_process;
    without it they silently served without the overlay. apply() now names it, and --backend sglang refuses."""
    import sglang.srt.managers.scheduler as scheduler_mod

    from sglang_eagle3.integration.launch import launch_sglang

    def run_scheduler_process(scheduler, pipe_writer):  # an entry point that forgot load_plugins()
        pipe_writer.send(scheduler.get_init_info())

    monkeypatch.setattr(scheduler_mod, "run_scheduler_process", run_scheduler_process)
    assert launch_sglang(["--help"]) == 2
    assert "run_scheduler_process no longer calls load_plugins()" in caplog.text
    assert not overlay.is_applied()
    assert "no longer calls load_plugins" in overlay.apply()["worker_plugin_problem"]


# -- verify counters where the docs say they are ---------------------------------------------------------------------

def _internal_state(overlay):
    from sglang.srt.managers.io_struct import GetInternalStateReqOutput
    from sglang.srt.managers.scheduler import Scheduler

    sched = object.__new__(Scheduler)
    sched.internal_state = NS(get_internal_state=lambda req: GetInternalStateReqOutput(internal_state={"x": 1}))
    return Scheduler.get_internal_state(sched, None).internal_state


@needs_sglang
@pytest.mark.sglang
def test_selfcheck_baseline_reports_its_verify_counts(overlay):
    """selfcheck's baseline applied the verify counter with worker_env=False, which left the internal-state patch
    out: its column of verify counts was always null. Its configuration now carries them to get_server_info."""
    from sglang_eagle3 import selfcheck

    status = overlay.apply(**selfcheck.BASELINE_OVERLAY)
    assert status["config"]["moe_routing"] is False and status["config"]["draft_wiring"] is False
    assert _internal_state(overlay)["sglang_eagle3"]["verify"]["total"] == 0


@needs_sglang
@pytest.mark.sglang
def test_worker_env_off_says_the_worker_counters_are_not_reported(overlay, caplog):
    with caplog.at_level(logging.WARNING, logger="sglang_eagle3"):
        overlay.apply(worker_env=False)
    assert "verify counters of SGLang's workers will not be in get_server_info()" in caplog.text
    assert "sglang_eagle3" not in _internal_state(overlay)


# -- draft wiring --------------------------------------------------------------------------------------------------

def test_draft_wiring_that_cannot_be_read_is_recorded_and_logged(caplog):
    """A target whose model keeps no model.layers_to_capture: the check returned without a word, and status() showed
    an empty draft_wiring entry, as if no EAGLE-3 draft were configured."""
    record = {}
    wrapped = wrap_init_attention_backends(lambda self: "ok", record)

    class OtherTarget:
        model = NS()  # no layers_to_capture

    runner = NS(is_draft_worker=False, spec_algorithm=NS(name="EAGLE3", is_eagle3=lambda: True),
                pp_group=NS(is_last_rank=True), model=OtherTarget(),
                spec_aux_config=NS(eagle_use_aux_hidden_state=True, eagle_aux_hidden_state_layer_ids=None))
    with caplog.at_level(logging.WARNING, logger="sglang_eagle3"):
        assert wrapped(runner) == "ok"
    assert "OtherTarget keeps no model.layers_to_capture" in record["skipped"]
    assert "EAGLE-3 wiring check skipped: OtherTarget" in caplog.text


# -- launch_server --backend sglang: what SGLang gets ---------------------------------------------------------------

@pytest.mark.parametrize("argv, named", [
    (["--worker-start", "900"], "--worker-start (our --worker-start-timeout, abbreviated) belongs to the native"),
    (["--use", "--max-request=9"], "--max-request (our --max-request-bytes, abbreviated), --use (our "
                                   "--use-worker-processes, abbreviated) belong to the native server"),
    (["--worker-start-timeout", "900"], "--worker-start-timeout belongs to the native server"),
])
def test_native_only_flags_are_refused_abbreviated_too(argv, named, handed, capsys):
    """Abbreviated (as our own parser reads them), native-only flags reached SGLang: "unrecognized arguments", or
    another of SGLang's flags (--use is its --use-ray, --cuda-graph-prefill its --cuda-graph-prefill-max-context)."""
    assert launch_server.main(["--backend", "sglang", "--model-path", "/m", *argv]) == 2
    assert named in capsys.readouterr().err and handed == []


def test_flags_of_both_parsers_still_reach_sglang(handed):
    argv = ["--model-path", "/m", "--sampling-defaults", "openai", "--max-running", "8", "--speculative-draft-model",
            "/d", "--", "--use"]
    rc = launch_server.main(["--backend", "sglang", *argv])
    assert (rc, handed) == ((0, [argv]) if HAVE_SGLANG else (2, []))  # 2: "SGLang is not installed"


@needs_sglang
@pytest.mark.sglang
def test_no_abbreviation_refused_as_native_is_a_whole_sglang_flag():
    """What _native_only_given refuses is never one of SGLang's own flags written whole; and the abbreviation that
    motivated it is indeed read by SGLang as another flag."""
    import argparse

    from sglang.srt.server_args import ServerArgs, prepare_server_args

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    theirs = {o for a in parser._actions for o in a.option_strings}
    ours = {o for a in launch_server.build_parser()._actions for o in a.option_strings if o.startswith("--")}
    prefixes = {f[:n] for f in ours for n in range(3, len(f) + 1)}
    refused = launch_server._native_only_given(sorted(prefixes))
    assert refused and not set(refused) & theirs, sorted(set(refused) & theirs)
    assert prepare_server_args(["--model-path", "/m", "--use"]).use_ray is True


@pytest.mark.parametrize("pair, named", [
    ("NCCL_ALGO =Ring", "'NCCL_ALGO =Ring': 'NCCL_ALGO ' is not an environment variable name"),
    ("1NCCL=x", "'1NCCL=x': '1NCCL' is not an environment variable name"),
    ("SGLANG_EAGLE3_OVERLAY={}", "the overlay writes SGLANG_EAGLE3_OVERLAY itself"),
])
def test_bad_worker_env_pairs_are_refused_naming_them(pair, named, handed, capsys, monkeypatch):
    """A name with a stray space went into the environment as "NCCL_ALGO " (NCCL read nothing); the overlay's own
    variable was silently overwritten by apply()."""
    monkeypatch.delenv("NCCL_ALGO ", raising=False)
    assert launch_server.main(["--backend", "sglang", "--model-path", "/m", "--worker-env", pair]) == 2
    assert named in capsys.readouterr().err and handed == []
    assert "NCCL_ALGO " not in os.environ


def test_a_nul_byte_in_a_worker_env_value_is_named_not_a_traceback(handed, caplog):
    assert launch_server.launch_sglang(["--model-path", "/m"], [("NCCL_ALGO", "Ring\0")]) == 2
    assert "'NCCL_ALGO=Ring\\x00': a NUL byte in the value" in caplog.text


@needs_sglang
@pytest.mark.sglang
def test_a_secret_worker_env_value_stays_out_of_the_log(handed, capsys, monkeypatch):
    """The hand-off logged every --worker-env pair with its value: a hub token went into the server's log."""
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("NCCL_ALGO", "x")  # restored after the test
    assert launch_server.main(["--backend", "sglang", "--model-path", "/m", "--worker-env", "HF_TOKEN=hf_s3cret",
                               "--worker-env", "NCCL_ALGO=Ring"]) == 0
    assert os.environ.pop("HF_TOKEN") == "hf_s3cret"
    log = capsys.readouterr().err
    assert "hf_s3cret" not in log and "HF_TOKEN=<hidden>" in log
    assert "NCCL_ALGO='Ring'" in log


@needs_sglang
@pytest.mark.sglang
@pytest.mark.parametrize("how", ["flag", "abbreviated", "config"])
def test_use_ray_is_refused(how, overlay, tmp_path, caplog):
    """SGLang's Ray actors build their Scheduler without load_plugins(): the workers served without the overlay
    while the launcher reported it applied."""
    from sglang_eagle3.integration.launch import launch_sglang

    argv = ["--model-path", "/nonexistent/model"]
    if how == "config":
        (tmp_path / "c.yaml").write_text("use-ray: true\n")
        argv += ["--config", str(tmp_path / "c.yaml")]
    else:
        argv.append("--use-ray" if how == "flag" else "--use-r")
    assert launch_sglang(argv) == 2
    assert "--use-ray (as SGLang reads the arguments)" in caplog.text and not overlay.is_applied()


@needs_sglang
@pytest.mark.sglang
def test_an_unsupported_sglang_stops_the_launcher_with_its_version(overlay, monkeypatch, caplog):
    from sglang_eagle3.integration.launch import launch_sglang

    monkeypatch.setattr(overlay, "installed_sglang_version", lambda: "0.5.24")
    assert launch_sglang(["--help"]) == 2
    assert "found sglang 0.5.24" in caplog.text and "not starting" in caplog.text


@needs_sglang
@pytest.mark.sglang
def test_help_names_what_the_hand_off_adds(handed, capsys):
    """--backend sglang --help printed SGLang's help alone: nothing said --worker-env exists there, or which
    environment switches the overlay reads. Every flag and variable the preamble names is real."""
    import argparse

    from sglang.srt.server_args import ServerArgs

    from sglang_eagle3 import env

    assert launch_server.main(["--backend", "sglang", "--help"]) == 0 and handed == [["--help"]]
    out = capsys.readouterr().out
    assert "--worker-env KEY=VALUE" in out and "SGLANG_EAGLE3_STRICT_VERIFY=1" in out
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    known = {o for a in parser._actions for o in a.option_strings}
    known |= {o for a in launch_server.build_parser()._actions for o in a.option_strings}
    assert set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", out)) <= known
    registered = {k.name for k in env.ALL}
    assert set(re.findall(r"\bSGLANG_EAGLE3_[A-Z_]*[A-Z]\b", out)) <= registered


# -- selfcheck --help -----------------------------------------------------------------------------------------------

def test_selfcheck_help_describes_the_runs_with_flags_that_exist():
    """Its --help showed one line; the module docstring (the runs, --dry-run, the exit codes) named a
    --count-baseline flag that does not exist and printed the example's continuation as one line."""
    from sglang_eagle3 import selfcheck

    parser = selfcheck.build_parser()
    text = parser.format_help()
    assert "Exit codes: 0 the greedy outputs are equal" in text and "``" not in text
    flags = {o for a in parser._actions for o in a.option_strings}
    described = text.split("options:", 1)[0]
    assert set(re.findall(r"(?<![\w=-])--[a-z][a-z0-9-]*", described)) <= flags  # (not a --sglang-arg=--flag)
    example = described.split("Example:", 1)[1]
    assert "kimi-eagle3 \\\n      --tp 8" in example
