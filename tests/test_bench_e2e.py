"""benchmarks/bench_e2e.py on CPU with the embedded pair: several timed passes per configuration, the median
reported and every pass kept, speculative output identical to the baseline's, bad --repeat refused."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
EMBEDDED = REPO / "sglang_eagle3" / "assets" / "embedded"


needs_embedded = pytest.mark.skipif(not (EMBEDDED / "target" / "config.json").exists(),
                                    reason="embedded pair not installed")


def bench_e2e(*args: str, timeout: float) -> subprocess.CompletedProcess:
    """benchmarks/bench_e2e.py on CPU in a fresh process (this checkout's package), output captured."""
    return subprocess.run([sys.executable, str(REPO / "benchmarks" / "bench_e2e.py"), "--device", "cpu", *args],
                          capture_output=True, text=True, timeout=timeout, env={**os.environ, "PYTHONPATH": str(REPO)})


def bench_e2e_json(tmp_path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    """A run that must succeed, and the JSON it wrote."""
    out = tmp_path / "e2e.json"
    proc = bench_e2e(*args, "--out", str(out), timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc, json.loads(out.read_text())


@needs_embedded
def test_e2e_repeat_keeps_every_pass(tmp_path):
    proc, res = bench_e2e_json(tmp_path, "--num-prompts", "2", "--max-new-tokens", "8", "--ks", "2", "--repeat", "3")
    base, spec = res["runs"]
    for r in (base, spec):
        assert len(r["tok_per_s_runs"]) == 3 and r["tok_per_s"] == pytest.approx(
            statistics.median(r["tok_per_s_runs"]), rel=1e-2)
        assert r["tokens"] == 3 * 2 * 8  # three passes of two prompts, 8 tokens each (greedy, no EOS this early)
    assert spec["lossless_first4"] is True
    assert "median of 3:" in proc.stdout


@needs_embedded
def test_e2e_overlap_variants(tmp_path):
    """--overlap-schedule on off: the embedded pair with the engine's overlap schedule and without, every
    configuration under both, output identical across them and to the baseline."""
    _, res = bench_e2e_json(tmp_path, "--num-prompts", "2", "--max-new-tokens", "6", "--ks", "2",
                            "--overlap-schedule", "on", "off")
    names = [r["name"] for r in res["runs"]]
    assert names == ["baseline[overlap schedule on]", "eagle3_k2[overlap schedule on]",
                     "baseline[overlap schedule off]", "eagle3_k2[overlap schedule off]"]
    assert all(r.get("lossless_first4", True) and r.get("identical_across_variants", True) for r in res["runs"])


@needs_embedded
def test_e2e_concurrency_batches_the_prompts(tmp_path):
    """--concurrency 2: three prompts as a batch of two then one; every token counted, output still lossless."""
    _, res = bench_e2e_json(tmp_path, "--num-prompts", "3", "--max-new-tokens", "6", "--ks", "2", "--concurrency", "2")
    assert res["workload"]["concurrency"] == 2 and res["workload"]["single_stream"] is False
    base, spec = res["runs"]
    assert base["requests_per_call"] == spec["requests_per_call"] == [2, 1]
    assert base["tokens"] == spec["tokens"] == 3 * 6  # (greedy, no EOS this early)
    assert spec["lossless_first4"] is True


@needs_embedded
def test_e2e_adaptive_only_leaves_out_the_fixed_k_runs(tmp_path):
    """--adaptive --adaptive-only: the baseline and one adaptive run a probe_rounds value, no fixed k; output
    lossless; --adaptive-only alone is refused."""
    _, res = bench_e2e_json(tmp_path, "--num-prompts", "2", "--max-new-tokens", "6", "--ks", "2", "--k", "2",
                            "--adaptive", "--adaptive-only", "--adaptive-probe-rounds", "0", "4")
    names = [r["name"] for r in res["runs"]]
    assert names[0] == "baseline" and len(names) == 3 and all("adaptive" in n for n in names[1:]), names
    assert all(r.get("lossless_first4", True) for r in res["runs"])
    proc = bench_e2e("--adaptive-only", timeout=120)
    assert proc.returncode != 0 and "--adaptive-only" in proc.stderr and "give --adaptive" in proc.stderr


def test_e2e_concurrency_must_be_positive():
    proc = bench_e2e("--concurrency", "0", timeout=120)
    assert proc.returncode == 2 and "--concurrency must be >= 1, got 0" in proc.stderr


def test_e2e_repeat_must_be_positive():
    proc = bench_e2e("--repeat", "0", timeout=120)
    assert proc.returncode == 2 and "--repeat must be >= 1, got 0" in proc.stderr


@needs_embedded
def test_e2e_embedded_tensor_parallel(tmp_path):
    """--tp-size 2 runs the embedded pair in two worker processes (gloo on CPU), output still lossless."""
    _, res = bench_e2e_json(tmp_path, "--num-prompts", "2", "--max-new-tokens", "6", "--ks", "2", "--tp-size", "2")
    assert res["workload"]["tp_size"] == 2 and res["runs"][1]["lossless_first4"] is True


def test_e2e_comm_gpus_is_for_the_kimi_slice():
    proc = bench_e2e("--comm-gpus", "2", timeout=120)
    assert proc.returncode == 2 and "--comm-gpus is for --kimi-slice" in proc.stderr, proc.stderr[-500:]


def test_e2e_routing_arguments_are_checked():
    """--routing: a value it cannot read, a drawn routing for the embedded workload, and reuse:P (a chain of a
    request's tokens) beside more than one request a step are refused, each named, before anything is built."""
    for args, said in ((("--routing", "own", "reuse:1.5"), "--routing 'reuse:1.5': expected own, uniform, reuse:P"),
                       (("--routing", "uniform"), "--routing draws the Kimi slice's expert ids: give --kimi-slice"),
                       (("--kimi-slice", "--routing", "uniform", "reuse:0.5", "--concurrency", "2"),
                        "--routing reuse:0.5 chains a request's tokens")):
        proc = bench_e2e(*args, timeout=120)
        assert proc.returncode == 2 and said in proc.stderr, (args, proc.stderr[-500:])


@needs_embedded
def test_e2e_penalized_sampling_is_lossless(tmp_path):
    """--sampling with penalties: the embedded pair's EAGLE-3 output equals its baseline's under them (the penalized
    round); an unknown name is refused."""
    spec = "temperature=0,frequency_penalty=1.5,repetition_penalty=1.3"
    _, res = bench_e2e_json(tmp_path, "--num-prompts", "2", "--max-new-tokens", "10", "--ks", "2", "--sampling",
                            "greedy", spec)
    assert [r["name"] for r in res["runs"]][2:] == [f"baseline[sampling {spec}]", f"eagle3_k2[sampling {spec}]"]
    assert all(r.get("lossless_first4", True) for r in res["runs"]), res["runs"]
    proc = bench_e2e("--sampling", "frequency=1", timeout=120)
    assert proc.returncode != 0 and "frequency_penalty" in proc.stderr


@needs_embedded
def test_e2e_env_variants_hold_while_their_engines_run(tmp_path):
    """--env-variants on the embedded workload: each setting holds while its engines are built and run (a value the
    engine refuses stops the run naming it), and the run names carry the setting."""
    proc = bench_e2e("--num-prompts", "1", "--max-new-tokens", "4", "--ks", "2", "--env-variants", "",
                     "SGLANG_EAGLE3_GRAMMAR_PREFILL_BELOW_US=-1", timeout=600)
    assert proc.returncode != 0 and "SGLANG_EAGLE3_GRAMMAR_PREFILL_BELOW_US='-1'" in proc.stderr, proc.stderr[-2000:]
    assert "baseline[environment as is]" in proc.stdout
    _, res = bench_e2e_json(tmp_path, "--num-prompts", "1", "--max-new-tokens", "4", "--ks", "2", "--env-variants",
                            "", "SGLANG_EAGLE3_GRAMMAR_PREFILL_BELOW_US=0")
    assert [r["name"] for r in res["runs"]] == [
        "baseline[environment as is]", "eagle3_k2[environment as is]",
        "baseline[SGLANG_EAGLE3_GRAMMAR_PREFILL_BELOW_US=0]", "eagle3_k2[SGLANG_EAGLE3_GRAMMAR_PREFILL_BELOW_US=0]"]


def test_e2e_accept_phases_follow_the_policy_pass_by_pass(tmp_path):
    """timed_phases (--accept-phases, the Kimi slice's runs) on a CPU engine of the tiny pair, adaptive from k = 3:
    pass 0 at a pinned accept length of 1 (no draft accepted) ends resting, pass 1 at 3 drafts again once its
    evidence comes, pass 2 at 1 rests again; each pass reports its own accept length, tok/s and steps at each k; bad
    values are refused by name."""
    sys.path.insert(0, str(REPO))
    from benchmarks.bench_e2e import WorkerEngine, timed_phases
    from sglang_eagle3 import Engine
    from sglang_eagle3.runtime.adaptive import CATCH_UP, DECODE, RoundCosts
    from sglang_eagle3.testing import tiny_config, tiny_draft_config, write_tiny_pair

    cfg = tiny_config(vocab=128, hidden=32, heads=2, layers=3, q_lora=16, kv_lora=16, nope=8, rope=4, v=8,
                      experts=4, top_k=2, n_group=2, topk_group=1, moe_inter=16, inter=48)
    tpath, dpath = write_tiny_pair(str(tmp_path), cfg, tiny_draft_config(cfg, heads=2, kv_heads=1, inter=48,
                                                                         aux_ids=[0, 1, 2]), seed=4)
    eng = Engine(model_path=tpath, device="cpu", speculative_algorithm="EAGLE3", speculative_draft_model_path=dpath,
                 speculative_num_steps=3, speculative_adaptive=True, speculative_simulate_accept_length=1.0)
    # Prices of the shape this CPU's timings have (a round 1.4 + 0.3 k ms, a decode step 1.05, a catch-up 0.4), set
    # rather than timed: the decisions checked here must not follow another process's load on the machine (timed
    # beside a second pytest, k = 3 cost 6.3 ms against k = 1's 1.8, and pass 1 never drafted in 3 runs of 4).
    policy = eng.backend.scheduler.adaptive
    ms = {k: 1.4e-3 + 0.3e-3 * k for k in policy.config.candidates} | {DECODE: 1.05e-3, CATCH_UP: 0.4e-3}
    policy.costs = RoundCosts({(k, b): s * b ** 0.5 for k, s in ms.items() for b in policy.costs.batch_sizes})
    prompts = [[(7 * i + j) % 128 for j in range(5 + i)] for i in range(3)]
    r = timed_phases(WorkerEngine(eng.backend), prompts, {"max_new_tokens": 60, "temperature": 0}, [1.0, 3.0], 3)
    assert [p["accept_length"] for p in r["phases"]] == [1.0, 3.0, 1.0]
    assert [p["tok_per_s"] for p in r["phases"]] == r["tok_per_s_runs"]
    for p in r["phases"]:
        assert sum(p["steps_at_k"].values()) == p["steps"] > 0, p
    rest, draft, again = r["phases"]
    assert rest["first_step_resting"] is not None and rest["steps_at_k"].get(0, 0) > rest["steps"] // 2, rest
    assert draft["first_step_drafting"] is not None and sum(n for k, n in draft["steps_at_k"].items() if k) > 0, draft
    assert again["first_step_resting"] is not None, again
    assert r["tokens"] == 3 * 3 * 60
    proc = bench_e2e("--kimi-slice", "--adaptive", "--accept-phases", "1", "0.5", timeout=120)
    assert proc.returncode != 0 and "--accept-phases [0.5]" in proc.stderr
    proc = bench_e2e("--accept-phases", "1", "3", timeout=120)
    assert proc.returncode != 0 and "give --kimi-slice and --adaptive" in proc.stderr
