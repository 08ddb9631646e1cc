"""The overlay against the real SGLang 0.5.23: targets, signatures, idempotence, exact restore, versions."""

from __future__ import annotations

import inspect
import multiprocessing as mp

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
    from sglang.srt.entrypoints.engine import Engine

    from sglang_eagle3.integration import worker_env

    overlay.apply()
    assert Engine.run_scheduler_process_func is worker_env.run_scheduler_process_with_overlay
    import pickle

    assert pickle.loads(pickle.dumps(Engine.run_scheduler_process_func)) is Engine.run_scheduler_process_func


def _child_apply_from_env(queue) -> None:
    from sglang_eagle3.integration import sglang_overlay

    status = sglang_overlay.apply_from_env()
    queue.put({"config": status["config"], "patched": len(status["patched"]), "pid": status["pid"]})


def test_spawned_worker_gets_the_same_overlay(overlay):
    status = overlay.apply(strict_verify=True, moe_routing=False)
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_child_apply_from_env, args=(queue,))
    proc.start()
    child = queue.get(timeout=180)
    proc.join(timeout=60)
    assert proc.exitcode == 0 and child["pid"] != status["pid"]
    assert child["config"] == status["config"] and child["patched"] == len(status["patched"])


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
    sched.internal_state = SimpleNamespace(
        get_internal_state=lambda req: GetInternalStateReqOutput(internal_state={"x": 1}))
    out = Scheduler.get_internal_state(sched, None)
    assert out.internal_state["sglang_eagle3"]["verify"]["total"] == 0
