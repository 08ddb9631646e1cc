"""The overlay against the real SGLang 0.5.23: targets, signatures, idempotence, exact restore, versions."""

from __future__ import annotations

import inspect
import json
from dataclasses import asdict

import pytest

from .conftest import needs_sglang

pytestmark = [needs_sglang, pytest.mark.sglang]


def test_every_patch_target_resolves_with_the_pinned_signature(overlay):
    for spec in overlay.PATCHES:
        _, raw = overlay.resolve_target(spec)
        assert overlay.target_params(raw) == spec.params, spec.symbol


def test_patch_table_is_unique_and_complete(overlay):
    keys = [s.key for s in overlay.PATCHES]
    assert len(keys) == len(set(keys))
    assert len({(s.module, s.owner, s.attr) for s in overlay.PATCHES}) == len(keys)
    status = overlay.apply()
    assert sorted(p["key"] for p in status["patched"]) == sorted(keys)


def test_apply_is_idempotent_and_remove_restores_the_originals(overlay):
    originals = {}
    for spec in overlay.PATCHES:
        owner, raw = overlay.resolve_target(spec)
        originals[spec.key] = (owner, raw)
    overlay.apply()
    patched = {k: inspect.getattr_static(o, spec_attr(overlay, k)) for k, (o, _) in originals.items()}
    for k, (_, raw) in originals.items():
        assert patched[k] is not raw, k
    overlay.apply()  # same config: nothing re-wrapped
    for k, (o, _) in originals.items():
        assert inspect.getattr_static(o, spec_attr(overlay, k)) is patched[k], k
    overlay.apply(strict_verify=True)  # new config: re-applied on the originals, never wrapper-on-wrapper
    from sglang.srt.model_executor.model_runner import ModelRunner

    assert ModelRunner.__dict__["_forward_raw"].__wrapped__ is originals["verify.forward_raw"][1]
    overlay.remove()
    for k, (o, raw) in originals.items():
        assert inspect.getattr_static(o, spec_attr(overlay, k)) is raw, k
    overlay.remove()  # second remove is a no-op


def test_remove_keeps_a_patch_made_after_the_overlays(overlay, caplog):
    """A symbol someone patched over the overlay's (their wrapper may call ours) is left as it is, named in a
    warning; the others are restored. remove() restored SGLang's original there, dropping their patch. The
    verify counters go with the overlay (status() after remove() showed the old ones)."""
    from sglang.srt.model_executor.model_runner import ModelRunner

    original = ModelRunner.__dict__["_forward_raw"]
    originals = {spec.key: overlay.resolve_target(spec) for spec in overlay.PATCHES}
    overlay.apply()
    ours = ModelRunner.__dict__["_forward_raw"]

    def users(self, *args, **kwargs):
        return ours(self, *args, **kwargs)

    ModelRunner._forward_raw = users
    try:
        overlay.guard().finish(ran_graph_flag=False, batch_size=3, pre_reason="test")
        assert overlay.status()["verify"]["eager"] == 1
        with caplog.at_level("WARNING", logger="sglang_eagle3"):
            overlay.remove()
        assert ModelRunner.__dict__["_forward_raw"] is users
        assert "ModelRunner._forward_raw was replaced after the overlay patched it" in caplog.text
        for k, (o, raw) in originals.items():
            if k != "verify.forward_raw":
                assert inspect.getattr_static(o, spec_attr(overlay, k)) is raw, k
        status = overlay.status()
        assert status["verify"]["total"] == 0 and not status["applied"] and status["sglang_version"] is None
    finally:
        ModelRunner._forward_raw = original


def spec_attr(overlay, key):
    return next(s.attr for s in overlay.PATCHES if s.key == key)


def test_features_can_be_switched_off(overlay):
    status = overlay.apply(moe_routing=False, worker_env=False, draft_wiring=False)
    keys = {p["key"] for p in status["patched"]}
    assert keys == {"verify.forward_raw", "verify.decode_can_run_graph", "verify.prefill_can_run_graph",
                    "workers.run_scheduler_process_func"}
    import sglang.srt.layers.moe.topk as topk

    assert topk.biased_grouped_topk is topk.biased_grouped_topk_gpu


def test_other_versions_are_refused_unless_forced(overlay, monkeypatch, caplog):
    monkeypatch.setattr(overlay, "installed_sglang_version", lambda: "0.5.24")
    with pytest.raises(overlay.UnsupportedSGLangVersion, match=r"supports SGLang 0.5.23; found sglang 0.5.24"):
        overlay.apply()
    assert not overlay.is_applied()
    status = overlay.apply(force=True)
    assert status["applied"] and "continuing because force is set" in caplog.text


def test_changed_signature_is_an_error_and_skipped_under_force(overlay, monkeypatch):
    spec = overlay.PATCHES[1]
    bad = type(spec)(**{**spec.__dict__, "params": ("self", "forward_batch", "extra")})
    monkeypatch.setattr(overlay, "PATCHES", (bad, *overlay.PATCHES[2:]))
    with pytest.raises(overlay.PatchTargetError, match="can_run_graph: signature"):
        overlay.apply()
    status = overlay.apply(force=True)
    assert "verify.decode_can_run_graph" in status["skipped"]
    assert "verify.decode_can_run_graph" not in {p["key"] for p in status["patched"]}


def test_scheduler_bootstrap_is_picklable_and_wired(overlay):
    import pickle

    from sglang.srt.entrypoints.engine import Engine
    from sglang.srt.managers.scheduler import run_scheduler_process

    from sglang_eagle3.integration import worker_env

    overlay.apply()
    boot = Engine.run_scheduler_process_func
    assert boot.func is worker_env.run_scheduler_process_with_overlay and boot.args == (run_scheduler_process,)
    again = pickle.loads(pickle.dumps(boot))  # what multiprocessing's spawn does with the target
    assert again.func is boot.func and again.args == boot.args


def test_bootstrap_wraps_an_installed_override(overlay, monkeypatch):
    """SGLang's documented hook for forks is replacing Engine.run_scheduler_process_func: the bootstrap
    runs that function, not SGLang's stock one."""
    from sglang.srt.entrypoints.engine import Engine

    from sglang_eagle3.integration import worker_env

    calls = []

    def fork_entry(*args, **kwargs):  # another signature than SGLang's: still wrapped
        calls.append((args, kwargs))
        return "fork"

    monkeypatch.setattr(Engine, "run_scheduler_process_func", staticmethod(fork_entry))
    overlay.apply(moe_routing=False)
    boot = Engine.run_scheduler_process_func
    assert boot.func is worker_env.run_scheduler_process_with_overlay and boot.args == (fork_entry,)
    assert boot("server_args", tp_rank=0) == "fork" and calls == [(("server_args",), {"tp_rank": 0})]
    overlay.remove()
    assert Engine.__dict__["run_scheduler_process_func"].__func__ is fork_entry


def test_engine_workers_get_the_overlay_without_the_plugin(overlay, monkeypatch):
    """sglang.Engine spawns its workers with Engine.run_scheduler_process_func: the bootstrap alone (SGLang
    told to run no plugin of ours) brings the parent's overlay into the real scheduler entry point."""
    from sglang.srt.entrypoints.engine import Engine

    from tests.integration import spawn_probe

    monkeypatch.setenv("SGLANG_PLUGINS", "not_sglang_eagle3")  # inherited by the child
    status = overlay.apply(strict_verify=True, moe_routing=False)
    assert status["worker_plugin_problem"].startswith("SGLANG_PLUGINS='not_sglang_eagle3' does not name")
    exitcode, child = spawn_probe.spawned_report(Engine.run_scheduler_process_func)
    assert exitcode == 0 and child["error"]  # SGLang's entry point ran, and stopped at the rank placement
    assert child["forward_raw_patched"] and child["config"] == status["config"]


def test_set_envs_and_config_override_is_reported(overlay, monkeypatch, caplog):
    import sglang.srt.entrypoints.engine as engine

    def fake_original(server_args):  # what SGLang's engine start does to CUDA_DEVICE_MAX_CONNECTIONS
        import os

        os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] = "8"

    monkeypatch.setattr(engine, "_set_envs_and_config", fake_original)
    monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", "1")
    overlay.apply()
    engine._set_envs_and_config(None)
    assert overlay.status()["env_overridden_by_sglang"] == [
        "CUDA_DEVICE_MAX_CONNECTIONS: user set '1', SGLang's engine start changed it to '8'"]
    overlay.remove()
    assert engine._set_envs_and_config is fake_original


def test_env_changed_between_apply_and_engine_start_is_reported(overlay, monkeypatch):
    """SGLang's argument resolution (server_args.resolve_once, before _set_envs_and_config) writes some
    variables too, e.g. NCCL_ALGO=allreduce:tree for --enable-deterministic-inference with TP > 1."""
    import os

    import sglang.srt.entrypoints.engine as engine

    monkeypatch.setattr(engine, "_set_envs_and_config", lambda server_args: None)
    monkeypatch.setenv("NCCL_ALGO", "ring")
    monkeypatch.setenv("NCCL_MAX_NCHANNELS", "4")
    monkeypatch.setenv("NCCL_PROTO", "Simple")
    overlay.apply()
    os.environ["NCCL_ALGO"] = "allreduce:tree"  # what resolve_once does
    del os.environ["NCCL_MAX_NCHANNELS"]
    engine._set_envs_and_config(None)
    assert overlay.status()["env_overridden_by_sglang"] == [
        "NCCL_ALGO: user set 'ring' (when the overlay was applied), changed to 'allreduce:tree' before SGLang's "
        "engine start (by SGLang's argument resolution, e.g. --enable-deterministic-inference with TP > 1, or by "
        "the caller's own code)",
        "NCCL_MAX_NCHANNELS: user set '4' (when the overlay was applied), changed to '<unset>' before SGLang's "
        "engine start (by SGLang's argument resolution, e.g. --enable-deterministic-inference with TP > 1, or by "
        "the caller's own code)"]


def test_scheduler_info_carries_the_worker_env(overlay, monkeypatch):
    from types import SimpleNamespace

    import sglang.srt.managers.scheduler as scheduler_mod
    from sglang.srt.managers.io_struct import GetInternalStateReqOutput
    from sglang.srt.managers.scheduler import Scheduler

    overlay.apply()
    # get_init_info reads the serving config bag, which only a launched server publishes.
    monkeypatch.setattr(scheduler_mod, "get_serving", lambda: SimpleNamespace(grpc_port=None))
    sched = object.__new__(Scheduler)
    # get_init_info's own fields come from these attributes; the wrapper adds ours.
    sched.__dict__.update(max_total_num_tokens=1, max_req_input_len=1, startup_time=0.0,
                          enable_hierarchical_cache=False, page_size=1)
    info = Scheduler.get_init_info(sched)
    assert info["status"] == "ready"
    assert "env" in info["sglang_eagle3"]["worker_env"] and info["sglang_eagle3"]["overlay"]["applied"]
    # HTTP /server_info (and the deprecated /get_server_info) merges worker 0's handshake dict the same way.
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.utils.common import build_server_info
    from sglang.srt.utils.msgspec_utils import msgspec_to_builtins

    served = msgspec_to_builtins(build_server_info(prepare_server_args(["--model-path", "/nonexistent"]), info))
    assert json.loads(json.dumps(served))["sglang_eagle3"]["overlay"]["applied"] is True
    sched.internal_state = SimpleNamespace(
        get_internal_state=lambda req: GetInternalStateReqOutput(internal_state={"x": 1}))
    out = Scheduler.get_internal_state(sched, None)
    assert out.internal_state["sglang_eagle3"]["verify"]["total"] == 0


def test_plugin_is_registered_where_sglang_looks_for_it():
    from importlib.metadata import entry_points

    from sglang.srt.plugins import GENERAL_PLUGINS_GROUP

    from sglang_eagle3.integration import plugin

    assert plugin.GROUP == GENERAL_PLUGINS_GROUP
    ours = [ep for ep in entry_points(group=GENERAL_PLUGINS_GROUP) if ep.name == plugin.NAME]
    assert [ep.value for ep in ours] == [plugin.TARGET], (
        "reinstall sglang_eagle3 into this venv (bash .ci/install_sglang.sh does it)")
    assert ours[0].load() is plugin.load
    assert plugin.reachability_problem() is None


@pytest.fixture
def fresh_plugins(monkeypatch):
    """SGLang's real load_plugins, as a new process runs it: not yet loaded, ours the only plugin allowed."""
    import sglang.srt.plugins as plugins

    monkeypatch.setattr(plugins, "_plugins_loaded", False)
    monkeypatch.setenv("SGLANG_PLUGINS", "sglang_eagle3")
    return plugins


def test_sglang_load_plugins_applies_the_inherited_config(overlay, fresh_plugins, monkeypatch):
    monkeypatch.delenv(overlay.ENV_CONFIG, raising=False)
    fresh_plugins.load_plugins()
    assert not overlay.is_applied()  # no parent applied it: the plugin does nothing
    config = overlay.OverlayConfig(strict_verify=True, moe_routing=False)
    monkeypatch.setenv(overlay.ENV_CONFIG, json.dumps(asdict(config)))
    monkeypatch.setattr(fresh_plugins, "_plugins_loaded", False)
    fresh_plugins.load_plugins()
    assert overlay.status()["config"] == asdict(config)


def test_a_plugin_failure_stops_the_process(overlay, fresh_plugins, monkeypatch):
    """load_plugins logs and swallows a plugin's Exception; a worker must not run on without the overlay."""

    def broken():
        raise RuntimeError("target moved")

    monkeypatch.setenv(overlay.ENV_CONFIG, json.dumps(asdict(overlay.OverlayConfig())))
    monkeypatch.setattr(overlay, "apply_from_env", broken)
    with pytest.raises(SystemExit, match="could not be applied in SGLang process .*target moved"):
        fresh_plugins.load_plugins()


def test_workers_of_the_http_launcher_get_the_overlay(overlay):
    """`sglang serve` / `python -m sglang.launch_server` / `launch_server --backend sglang`: SGLang's HTTP
    launcher spawns its workers with the run_scheduler_process it bound at import, never with the Engine
    bootstrap. A spawned child running that very function must end up with the parent's overlay."""
    from sglang.srt.entrypoints import http_server
    from sglang.srt.managers.scheduler import run_scheduler_process

    from tests.integration import spawn_probe

    status = overlay.apply(strict_verify=True, moe_routing=False)
    entry = inspect.signature(http_server.launch_server).parameters["run_scheduler_process_func"].default
    assert entry is run_scheduler_process  # not the bootstrap: only the plugin can reach these workers
    exitcode, child = spawn_probe.spawned_report(entry)
    assert exitcode == 0 and child["error"]  # it stopped after load_plugins, at the rank placement
    assert child["forward_raw_patched"] and child["config"] == status["config"]


USER_SCRIPT = """
import json, sys
import sglang_eagle3.patch  # module level: applies the defaults, also when a spawned child re-imports this file
import sglang_eagle3
from tests.integration import spawn_probe

if __name__ == "__main__":
    sglang_eagle3.apply(strict_verify=True, moe_routing=False)
    from sglang.srt.managers.scheduler import run_scheduler_process
    _, child = spawn_probe.spawned_report(run_scheduler_process)
    print("RESULT " + json.dumps({"parent": spawn_probe.overlay_state(), "child": child}))
"""


def test_module_level_patch_import_does_not_reset_a_workers_options(tmp_path):
    """A script importing sglang_eagle3.patch at module level and calling apply(options) under __main__: the
    spawned worker re-imports the script (so the module-level apply runs again there) and must still run with
    the options the parent chose."""
    import os
    import subprocess
    import sys

    script = tmp_path / "user_script.py"
    script.write_text(USER_SCRIPT)
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {k: v for k, v in os.environ.items() if k != "SGLANG_EAGLE3_OVERLAY"}
    env["PYTHONPATH"] = repo
    out = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=600)
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert out.returncode == 0 and line, out.stderr[-3000:]
    result = json.loads(line[len("RESULT "):])
    chosen = {"strict_verify": True, "moe_routing": False}
    assert {k: result["parent"]["config"][k] for k in chosen} == chosen
    assert result["child"]["forward_raw_patched"]
    assert {k: result["child"]["config"][k] for k in chosen} == chosen


@pytest.mark.parametrize("options, named", [
    ({"strict_verify": "no"}, "strict_verify='no'"),  # a truthy string: strict mode would have been on
    ({"moe_routing": 0}, "moe_routing=0"),
    ({"verify_summary_every": "10"}, "verify_summary_every='10'"),
    ({"verify_summary_every": 2.5}, "verify_summary_every=2.5"),
])
def test_apply_refuses_option_values_of_the_wrong_type(overlay, options, named):
    with pytest.raises(TypeError) as e:
        overlay.apply(**options)
    assert named in str(e.value)
    assert not overlay.is_applied()


def test_force_from_the_environment_is_0_or_1(overlay, monkeypatch):
    monkeypatch.setenv("SGLANG_EAGLE3_FORCE", "true")  # was read as off without a word
    with pytest.raises(ValueError, match="SGLANG_EAGLE3_FORCE='true'"):
        overlay.apply()
    assert not overlay.is_applied()


@pytest.mark.parametrize("raw, named", [
    ("1", "SGLANG_EAGLE3_OVERLAY='1'"),  # read as an on switch
    ("{bad", "SGLANG_EAGLE3_OVERLAY='{bad'"),
    ('{"strict": true}', "unknown option(s) strict"),
    ('{"strict_verify": "false"}', "strict_verify='false'"),  # was applied with strict mode on
])
def test_a_bad_overlay_variable_stops_the_sglang_process_naming_it(overlay, fresh_plugins, monkeypatch, raw, named):
    monkeypatch.setenv(overlay.ENV_CONFIG, raw)
    with pytest.raises(SystemExit) as e:
        fresh_plugins.load_plugins()
    assert named in str(e.value) and "SGLANG_EAGLE3_OVERLAY" in str(e.value)
    assert not overlay.is_applied()


def test_force_variable_counts_for_a_hand_set_overlay_variable(overlay, fresh_plugins, monkeypatch):
    """`SGLANG_EAGLE3_FORCE=1 SGLANG_EAGLE3_OVERLAY='{}' sglang serve` on another SGLang version: force is on, as for
    apply()."""
    monkeypatch.setattr(overlay, "installed_sglang_version", lambda: "0.5.24")
    monkeypatch.setenv(overlay.ENV_CONFIG, "{}")
    monkeypatch.setenv("SGLANG_EAGLE3_FORCE", "1")
    fresh_plugins.load_plugins()
    assert overlay.is_applied() and overlay.status()["config"]["force"] is True


def test_every_worker_report_reaches_server_info_through_the_dp_controller(overlay, monkeypatch):
    """--dp-size > 1: SGLang's engine gets one handshake dict, the DP controller's (built from the schedulers' it
    recorded); the workers' reports must still reach Engine.get_server_info and /server_info."""
    import threading
    from types import SimpleNamespace

    import sglang.srt.managers.scheduler as scheduler_mod
    from sglang.srt.entrypoints.engine import Engine
    from sglang.srt.managers.data_parallel_controller import DataParallelController
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.utils.common import build_server_info
    from sglang.srt.utils.msgspec_utils import msgspec_to_builtins

    overlay.apply(moe_routing=False)
    monkeypatch.setattr(scheduler_mod, "get_serving", lambda: SimpleNamespace(grpc_port=None))
    scheduler_infos = []
    for _ in range(2):  # two DP ranks' schedulers
        sched = object.__new__(Scheduler)
        sched.__dict__.update(max_total_num_tokens=1, max_req_input_len=1, startup_time=0.0,
                              enable_hierarchical_cache=False, page_size=1)
        scheduler_infos.append(Scheduler.get_init_info(sched))
    controller = object.__new__(DataParallelController)
    controller.__dict__.update(_scheduler_init_info_lock=threading.Lock(), _scheduler_init_infos=[])
    controller._record_scheduler_init_infos(scheduler_infos)  # what the controller does with the replies
    dp_info = {"status": "ready", **DataParallelController.get_init_info(controller), "scheduler_pids": [1, 2]}

    served = msgspec_to_builtins(build_server_info(prepare_server_args(["--model-path", "/nonexistent"]), dp_info))
    assert served["sglang_eagle3"]["overlay"]["applied"] is True  # /server_info, as without DP

    engine = object.__new__(Engine)
    engine.__dict__.update(
        loop=SimpleNamespace(run_until_complete=lambda coro: []),
        tokenizer_manager=SimpleNamespace(get_internal_state=lambda: None, startup_time=0.0,
                                          server_args=SimpleNamespace(resolved_dict=dict, launch_command="x")),
        _scheduler_init_result=SimpleNamespace(scheduler_infos=[dp_info]))
    info = Engine.get_server_info(engine)
    assert [w["worker_env"]["pid"] for w in info["sglang_eagle3_workers"]] == \
        [i["sglang_eagle3"]["worker_env"]["pid"] for i in scheduler_infos]
