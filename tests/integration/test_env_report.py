"""env_report: a really spawned process reports the environment its parent gave it."""

from __future__ import annotations

import multiprocessing as mp
import os

from sglang_eagle3 import env_report


def _child_report(queue) -> None:
    queue.put(env_report.collect_env_report(include_device=False))


def test_spawned_child_reports_inherited_nccl_env(monkeypatch):
    monkeypatch.setenv("NCCL_PROTO", "Simple")
    monkeypatch.setenv("HF_TOKEN", "secret-value")
    monkeypatch.setenv("DISABLE_MMA_V3", "1")  # Triton's, outside the prefixes (SGLANG_EAGLE3_EMULATE_GPU's partner)
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_child_report, args=(queue,))
    proc.start()
    child = queue.get(timeout=120)
    proc.join(timeout=60)
    assert proc.exitcode == 0
    assert child["pid"] != os.getpid() and child["pid"] == proc.pid
    assert child["env"]["NCCL_PROTO"] == "Simple" and child["env"]["DISABLE_MMA_V3"] == "1"
    assert "HF_TOKEN" not in child["env"]  # secrets never leave the process
    parent = env_report.collect_env_report(include_device=False)
    assert env_report.compare_reports([parent, child]) == []  # pid/hostname differences are per-rank


def test_compare_reports_names_the_disagreeing_ranks():
    a = {"env": {"NCCL_PROTO": "Simple", "RANK": "0"}, "nccl": "2.27.3", "pid": 1}
    b = {"env": {"RANK": "1"}, "nccl": "2.27.3", "pid": 2}
    c = {"env": {"NCCL_PROTO": "Simple", "RANK": "2"}, "nccl": "2.21.5", "pid": 3}
    problems = env_report.compare_reports([a, b, c])
    assert problems == ["env.NCCL_PROTO differs: 'Simple' in [0, 2], <unset> in [1]",
                        "nccl differs: '2.27.3' in [0, 1], '2.21.5' in [2]"]


def test_sglang_override_warnings_only_for_user_set_values(caplog):
    env = {"CUDA_DEVICE_MAX_CONNECTIONS": "1", "NCCL_CUMEM_ENABLE": "1"}
    assert env_report.sglang_forced_env(env) == {"NCCL_NVLS_ENABLE": "0", "CUDA_DEVICE_MAX_CONNECTIONS": "8"}
    msgs = env_report.warn_sglang_overrides(env)
    # NCCL_CUMEM_ENABLE=1 is kept (user-set, no symm mem); CUDA_DEVICE_MAX_CONNECTIONS is always forced.
    assert len(msgs) == 1 and msgs[0].startswith("CUDA_DEVICE_MAX_CONNECTIONS: user set '1'")
    assert "CUDA_DEVICE_MAX_CONNECTIONS" in caplog.text
    with_symm = env_report.warn_sglang_overrides(env, enable_symm_mem=True)
    assert any(m.startswith("NCCL_CUMEM_ENABLE") for m in with_symm) is False  # symm mem writes "1" == user's
    assert env_report.warn_sglang_overrides({}) == []  # nothing user-set, nothing to warn about
