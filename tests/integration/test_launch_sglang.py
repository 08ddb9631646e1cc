"""`launch_server --backend sglang` applies the overlay, then runs SGLang's own launcher with the rest."""

from __future__ import annotations

import os
import re

import pytest

from tests.integration.conftest import needs_sglang


@needs_sglang
def test_launch_sglang_applies_overlay_and_hands_flags_to_sglang(overlay, capsys):
    from sglang_eagle3.integration.launch import launch_sglang

    rc = launch_sglang(["--help"])  # SGLang's argparse prints its help and exits 0
    assert rc == 0
    assert overlay.is_applied()
    assert "--speculative-num-draft-tokens" in capsys.readouterr().out


@needs_sglang
def test_launch_refuses_when_sglang_would_not_run_the_plugin(overlay, monkeypatch, caplog):
    from sglang_eagle3.integration.launch import launch_sglang

    monkeypatch.setenv("SGLANG_PLUGINS", "some_other_plugin")
    assert launch_sglang(["--help"]) == 2
    assert not overlay.is_applied()
    assert "SGLANG_PLUGINS='some_other_plugin' does not name 'sglang_eagle3'" in caplog.text


def test_graph_buckets_cover_max_running_requests(monkeypatch):
    from sglang_eagle3.integration.launch import close_common_fallbacks

    monkeypatch.delenv("SGLANG_EAGLE3_KEEP_GRAPH_BS", raising=False)
    assert close_common_fallbacks(["--model-path", "m", "--max-running-requests", "48"])[-2:] == \
        ["--cuda-graph-max-bs-decode", "48"]
    assert close_common_fallbacks(["--max-running-requests=48"]) == \
        ["--max-running-requests=48", "--cuda-graph-max-bs-decode", "48"]
    for user in (["--cuda-graph-max-bs-decode", "8"], ["--cuda-graph-max-bs-decode=8"],
                 ["--cuda-graph-bs-decode", "1", "2", "4"], ["--cuda-graph-bs-decode=4"]):
        argv = ["--max-running-requests=48", *user]
        assert close_common_fallbacks(argv) == argv, user  # the user's choice wins
    assert close_common_fallbacks(["--model-path", "m"]) == ["--model-path", "m"]
    monkeypatch.setenv("SGLANG_EAGLE3_KEEP_GRAPH_BS", "1")
    assert close_common_fallbacks(["--max-running-requests", "48"]) == ["--max-running-requests", "48"]


@needs_sglang
@pytest.mark.sglang
@pytest.mark.parametrize("argv, decode_max_bs", [
    (["--max-running-requests", "48"], 48),
    (["--max-running-requests=48", "--cuda-graph-max-bs-decode=8"], 8),
    (["--max-running-requests", "48", "--cuda-graph-bs-decode", "1", "2", "4"], None),
    (["--tp-size", "2"], None),
])
def test_final_argv_parses_with_sglangs_own_parser(argv, decode_max_bs, monkeypatch):
    from sglang.srt.server_args import prepare_server_args

    from sglang_eagle3.integration.launch import close_common_fallbacks

    monkeypatch.delenv("SGLANG_EAGLE3_KEEP_GRAPH_BS", raising=False)
    server_args = prepare_server_args(close_common_fallbacks(["--model-path", "/nonexistent/model", *argv]))
    assert server_args.cuda_graph_max_bs_decode == decode_max_bs


@needs_sglang
@pytest.mark.sglang
def test_config_file_values_count_as_given(tmp_path, monkeypatch):
    from sglang.srt.server_args import prepare_server_args

    from sglang_eagle3.integration.launch import close_common_fallbacks

    monkeypatch.delenv("SGLANG_EAGLE3_KEEP_GRAPH_BS", raising=False)
    pinned = tmp_path / "pinned.yaml"
    pinned.write_text("max-running-requests: 48\ncuda-graph-max-bs-decode: 8\n")
    argv = ["--model-path", "/nonexistent/model", "--config", str(pinned)]
    assert close_common_fallbacks(argv) == argv
    assert prepare_server_args(argv).cuda_graph_max_bs_decode == 8
    running_only = tmp_path / "running.yaml"
    running_only.write_text("max-running-requests: 48\n")
    argv = ["--model-path", "/nonexistent/model", "--config", str(running_only)]
    assert prepare_server_args(close_common_fallbacks(argv)).cuda_graph_max_bs_decode == 48


@needs_sglang
@pytest.mark.sglang
def test_flags_the_overlay_names_exist_in_sglang():
    import argparse

    from sglang.srt.server_args import ServerArgs

    import sglang_eagle3.integration.launch as launch
    import sglang_eagle3.integration.verify_guard as verify_guard

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    known = set(parser._option_string_actions)
    with open(verify_guard.__file__) as f:
        named = set(re.findall(r"--[a-z][a-z0-9-]+", f.read()))
    named |= set(launch.DECODE_GRAPH_BS_FLAGS) | {"--max-running-requests"}
    assert named and named <= known, sorted(named - known)


@needs_sglang
@pytest.mark.sglang
def test_worker_env_goes_to_the_environment_not_to_sglang(monkeypatch):
    import os

    import sglang_eagle3.integration.launch as launch
    from sglang_eagle3 import launch_server

    handed = {}

    def fake_launch(argv):
        handed.update(argv=argv, env=os.environ.get("NCCL_P2P_LEVEL"), other=os.environ.get("SGLANG_EAGLE3_X"))
        return 0

    monkeypatch.setenv("NCCL_P2P_LEVEL", "LOC")  # restored after the test, as is SGLANG_EAGLE3_X
    monkeypatch.setenv("SGLANG_EAGLE3_X", "")
    monkeypatch.setattr(launch, "launch_sglang", fake_launch)
    argv = ["--backend", "sglang", "--model-path", "/m", "--worker-env", "NCCL_P2P_LEVEL=SYS",
            "--worker-env=SGLANG_EAGLE3_X=a=b", "--tp-size", "2"]
    assert launch_server.main(argv) == 0
    assert handed == {"argv": ["--model-path", "/m", "--tp-size", "2"], "env": "SYS", "other": "a=b"}
    from sglang.srt.server_args import prepare_server_args

    assert prepare_server_args(handed["argv"]).tp_size == 2  # what SGLang gets, it parses


@needs_sglang
def test_native_only_flags_are_ours_minus_sglangs():
    """launch_server's NATIVE_ONLY_FLAGS (refused with --backend sglang) are exactly our flags SGLang lacks, apart
    from the two it strips (--backend, --worker-env) and the alias it renames (--tp)."""
    import argparse

    from sglang.srt.server_args import ServerArgs, prepare_server_args

    from sglang_eagle3.launch_server import NATIVE_ONLY_FLAGS, build_parser, sglang_argv

    theirs = argparse.ArgumentParser()
    ServerArgs.add_cli_args(theirs)
    sglang_flags = {s for a in theirs._actions for s in a.option_strings}
    ours = {s for a in build_parser()._actions for s in a.option_strings}
    assert set(NATIVE_ONLY_FLAGS) | {"--backend", "--worker-env", "--tp"} == ours - sglang_flags
    assert prepare_server_args(sglang_argv(["--model-path", "/nonexistent/model", "--tp", "2"])).tp_size == 2


@needs_sglang
@pytest.mark.sglang
@pytest.mark.parametrize("argv, yaml", [
    (["--max-running-requests", "32", "--max-running-requests", "64"], None),  # argparse keeps the last
    (["--max-running", "64"], None),  # an abbreviation SGLang's parser expands
    (["--max-running-requests", "64"], "max-running-requests: 32\n"),  # the command line above the --config file
])
def test_added_graph_size_is_the_max_running_requests_sglang_reads(argv, yaml, tmp_path, monkeypatch):
    from sglang.srt.server_args import prepare_server_args

    from sglang_eagle3.integration.launch import close_common_fallbacks

    monkeypatch.delenv("SGLANG_EAGLE3_KEEP_GRAPH_BS", raising=False)
    argv = ["--model-path", "/nonexistent/model", *argv]
    if yaml is not None:
        (tmp_path / "c.yaml").write_text(yaml)
        argv += ["--config", str(tmp_path / "c.yaml")]
    parsed = prepare_server_args(close_common_fallbacks(argv))
    assert parsed.max_running_requests == 64
    assert parsed.cuda_graph_max_bs_decode == parsed.max_running_requests


@needs_sglang
@pytest.mark.sglang
def test_users_abbreviated_graph_size_is_kept(monkeypatch):
    from sglang.srt.server_args import prepare_server_args

    from sglang_eagle3.integration.launch import close_common_fallbacks

    monkeypatch.delenv("SGLANG_EAGLE3_KEEP_GRAPH_BS", raising=False)
    argv = ["--model-path", "/nonexistent/model", "--max-running-requests", "64", "--cuda-graph-max-bs-dec", "8"]
    assert prepare_server_args(argv).cuda_graph_max_bs_decode == 8  # SGLang reads the user's 8
    assert prepare_server_args(close_common_fallbacks(argv)).cuda_graph_max_bs_decode == 8


@needs_sglang
@pytest.mark.parametrize("var", ["SGLANG_EAGLE3_STRICT_VERIFY", "SGLANG_EAGLE3_NO_MOE_ROUTING",
                                 "SGLANG_EAGLE3_KEEP_GRAPH_BS", "SGLANG_EAGLE3_FORCE"])
def test_launch_refuses_a_switch_that_is_not_0_or_1(var, overlay, monkeypatch, caplog):
    """SGLANG_EAGLE3_STRICT_VERIFY=true used to start a server that was silently not strict."""
    from sglang_eagle3.integration.launch import launch_sglang

    monkeypatch.setenv(var, "true")
    assert launch_sglang(["--help"]) == 2
    assert not overlay.is_applied()
    assert f"{var}='true'" in caplog.text


@needs_sglang
@pytest.mark.sglang
@pytest.mark.parametrize("flag", [["--context-length", "128k"], ["--max-total-tokens", "1M"],
                                  ["--grammar-backend", "llguidance"]])
def test_values_sglang_accepts_reach_sglang(flag, monkeypatch):
    import sglang_eagle3.integration.launch as launch
    from sglang_eagle3 import launch_server

    handed = []
    monkeypatch.setattr(launch, "launch_sglang", lambda argv: handed.append(argv) or 0)
    argv = ["--model-path", "/nonexistent/model", *flag]
    from sglang.srt.server_args import prepare_server_args

    prepare_server_args(argv)  # SGLang's own parser takes it
    try:
        rc = launch_server.main(["--backend", "sglang", *argv])
    except SystemExit as e:  # our argparse refusing the value
        rc = e.code
    assert rc == 0 and handed == [argv]


@needs_sglang
@pytest.mark.sglang
@pytest.mark.parametrize("backend,workers", [
    (["--backend", "sglang"], ["--worker-env", "A_1=x y", "--worker-env=A_2=k=v"]),
    (["--backend=sglang"], ["--worker-e", "A_1=x y", "--worker-env=A_2=k=v"]),
    (["--back", "sglang"], ["--work=A_1=x y", "--wor", "A_2=k=v"]),
])
def test_own_flags_never_reach_sglang(backend, workers, monkeypatch, caplog):
    """--backend and --worker-env, written whole, with = or abbreviated as argparse reads them, are taken out of
    what SGLang's launcher gets (abbreviated, they used to reach it and stop it); what remains is SGLang's own argv,
    which its parser takes, its --help included; no "embedded model" warning (that is the native server's)."""
    import sglang_eagle3.integration.launch as launch
    from sglang_eagle3 import launch_server

    handed = []
    monkeypatch.setattr(launch, "launch_sglang", lambda argv: handed.append(argv) or 0)
    for key in ("A_1", "A_2"):
        monkeypatch.delenv(key, raising=False)
    sglang_own = ["--model-path", "/nonexistent/model", "--tp-size", "2", "--log-level", "info"]
    assert launch_server.main([*backend, *sglang_own[:2], *workers, *sglang_own[2:]]) == 0
    assert handed == [sglang_own]
    assert os.environ["A_1"] == "x y" and os.environ["A_2"] == "k=v"
    assert "embedded" not in caplog.text
    from sglang.srt.server_args import prepare_server_args

    prepare_server_args(handed[0])
    assert launch_server.main(["--backend", "sglang", "--help"]) == 0 and handed[-1] == ["--help"]


@needs_sglang
def test_no_sglang_flag_is_taken_for_an_abbreviation_of_ours():
    """_strip_own_flags drops a flag that is a prefix of --backend or --worker-env: no flag of SGLang's may be one,
    or it would be dropped too."""
    import argparse

    from sglang.srt.server_args import ServerArgs

    from sglang_eagle3.launch_server import _OWN_FLAGS

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    theirs = [o for action in parser._actions for o in action.option_strings if o.startswith("--")]
    assert len(theirs) > 100
    assert not [o for o in theirs if any(flag.startswith(o) for flag in _OWN_FLAGS)]


@needs_sglang
def test_a_message_sglang_exits_with_is_not_lost(overlay, monkeypatch, caplog):
    """sys.exit("...") in SGLang's launcher (or our plugin's SystemExit there): Python prints the message when it
    ends the process; launch_sglang catches it to return the exit status, so it must print it too."""
    import runpy

    from sglang_eagle3.integration.launch import launch_sglang

    def fake_run_module(name, **kw):
        raise SystemExit("the launcher gave up: reason X")

    monkeypatch.setattr(runpy, "run_module", fake_run_module)
    assert launch_sglang(["--model-path", "/nonexistent/model"]) == 1
    assert "the launcher gave up: reason X" in caplog.text
