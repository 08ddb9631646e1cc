"""Tensor parallelism on CPU (gloo): TP=2/4 equal TP=1, worker environment hand-off, worker failures."""

from __future__ import annotations

import multiprocessing as mp
import os
import time

import pytest

from sglang_eagle3 import Engine
from sglang_eagle3.distributed.workers import FAULT_ENV, WorkerError
from sglang_eagle3.testing import tiny_config, tiny_draft_config, write_tiny_pair

# Logprobs of the chosen tokens agree across TP sizes to this (float32; only the summation order of the
# all-reduced partial sums differs).
LOGPROB_ATOL = 2e-4


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    cfg = tiny_config(vocab=192, hidden=64, heads=4, layers=4, experts=8, top_k=2, n_group=2, topk_group=1,
                      moe_inter=32, inter=64)
    dcfg = tiny_draft_config(cfg, draft_vocab=96, heads=4, kv_heads=4, inter=64, aux_ids=[1, 2, 3])
    return write_tiny_pair(str(tmp_path_factory.mktemp("tp")), cfg, dcfg, seed=11, scale=3.0)


PROMPTS = [[3, 1, 4, 1, 5, 9, 2], [6, 5, 3], [5, 8, 9, 7, 9, 3, 2, 3, 8, 4]]
GREEDY = {"max_new_tokens": 12, "temperature": 0}


def _run(pair, tp, spec, **kw):
    tpath, dpath = pair
    extra = dict(speculative_algorithm="EAGLE3", speculative_draft_model_path=dpath, speculative_num_steps=2) \
        if spec else {}
    eng = Engine(model_path=tpath, device="cpu", tp_size=tp, use_worker_processes=tp > 1, **extra, **kw)
    try:
        outs = eng.generate(input_ids=PROMPTS, sampling_params=GREEDY, return_logprob=True)
        return outs, eng.get_server_info()
    finally:
        eng.shutdown()


@pytest.fixture(scope="module")
def reference(pair):
    return _run(pair, 1, False)[0]


@pytest.mark.parametrize("tp", [2, 4])
@pytest.mark.parametrize("spec", [False, True])
def test_tp_matches_single_process(pair, reference, tp, spec):
    outs, info = _run(pair, tp, spec)
    assert [o["output_ids"] for o in outs] == [o["output_ids"] for o in reference]
    for o, r in zip(outs, reference, strict=True):
        got = [x[0] for x in o["meta_info"]["output_token_logprobs"]]
        want = [x[0] for x in r["meta_info"]["output_token_logprobs"]]
        assert max(abs(a - b) for a, b in zip(got, want, strict=True)) < LOGPROB_ATOL
    assert len(info["worker_env"]) == tp
    if spec:
        assert info["verify_forwards"] == sum(o["meta_info"]["spec_verify_ct"] for o in outs) > 0


def test_tp2_sampled_speculation_matches_single_process_plain(pair):
    """Sampled requests (seeded, and one drawing its seed from the engine's random_seed) at TP=2 with EAGLE-3 give
    the tokens TP=1 gives without speculation: every rank's scheduler derives the same keys, and the sampler's
    noise fixes each token whatever the rank count or the draft; with penalties (every rank keeps the same
    counts) too."""
    tpath, dpath = pair
    params = [{"max_new_tokens": 12, "temperature": 0.9, "seed": 5}, {"max_new_tokens": 10, "temperature": 1.2},
              {"max_new_tokens": 12, "temperature": 0.7, "top_p": 0.9, "seed": 2**50, "frequency_penalty": 1.2,
               "repetition_penalty": 1.4, "logit_bias": {"3": 1.5}}]
    outs = {}
    for tp, spec in ((1, False), (2, True)):
        extra = dict(speculative_algorithm="EAGLE3", speculative_draft_model_path=dpath, speculative_num_steps=2) \
            if spec else {}
        eng = Engine(model_path=tpath, device="cpu", tp_size=tp, use_worker_processes=tp > 1, **extra)
        try:
            outs[tp] = [o["output_ids"] for o in eng.generate(input_ids=PROMPTS, sampling_params=params)]
        finally:
            eng.shutdown()
    assert outs[2] == outs[1]


def test_tp2_adaptive_draft_length(pair):
    """speculative_adaptive at TP=2: the ranks time their rounds apart and agree on one table (each entry the
    slowest rank's), so fed the same accept counts they switch k in the same round; the output is TP=1's without
    speculation, and the policy moved. One request sampled: its rounds, and the resting draft's catch-ups that draw
    a proposal at every row (ModelRunner.catch_up), run alike on both ranks. (Whether the draft rests follows the
    round costs the ranks timed: it rested in 12 of 13 runs here, so the catch-ups are not asserted to have run.)"""
    tpath, dpath = pair
    greedy = {"max_new_tokens": 40, "temperature": 0}
    params = [greedy, {"max_new_tokens": 40, "temperature": 0.9, "seed": 11}, greedy]
    ref = Engine(model_path=tpath, device="cpu").generate(input_ids=PROMPTS, sampling_params=params)
    eng = Engine(model_path=tpath, device="cpu", tp_size=2, speculative_algorithm="EAGLE3",
                 speculative_draft_model_path=dpath, speculative_num_steps=3, speculative_adaptive=True,
                 speculative_adaptive_probe_rounds=4, max_running_requests=4)  # (3 prompts: buckets 1, 2, 4 timed)
    try:
        outs = eng.generate(input_ids=PROMPTS, sampling_params=params)
        info = eng.get_server_info()
    finally:
        eng.shutdown()
    assert [o["output_ids"] for o in outs] == [o["output_ids"] for o in ref]
    assert info["adaptive"]["rounds"] > 0 and info["adaptive"]["switches"] >= 1, info["adaptive"]["round_ms"]


def test_tp2_mha_prefill_matches_single_process(pair, reference):
    """The non-absorbed prefill from 4 tokens a request (the 7- and 10-token prompts; the 3-token one stays
    absorbed) at TP=2 with EAGLE-3, each rank decompressing its own heads through its slice of kv_b_proj: the tokens
    and logprobs of TP=1 with the absorbed prefill."""
    outs, info = _run(pair, 2, True, mha_prefill_tokens=4)
    assert info["args"]["mha_prefill_tokens"] == 4
    assert [o["output_ids"] for o in outs] == [o["output_ids"] for o in reference]
    for o, r in zip(outs, reference, strict=True):
        got = [x[0] for x in o["meta_info"]["output_token_logprobs"]]
        want = [x[0] for x in r["meta_info"]["output_token_logprobs"]]
        assert max(abs(a - b) for a, b in zip(got, want, strict=True)) < LOGPROB_ATOL


@pytest.fixture(scope="module")
def kimi_int4_pair(tmp_path_factory):
    """Kimi-K2.5's on-disk layout (wrapper config, language_model. prefix, pack-quantized INT4 experts, vision
    tensors beside) with an EAGLE-3 draft; expert intermediate 64: one INT4 group of 32 per rank at TP=2."""
    import torch

    from sglang_eagle3.models.eagle3 import Eagle3Draft
    from sglang_eagle3.models.loader import save_hf
    from sglang_eagle3.testing import random_d2t, randomize
    from tests.loaders.ckpt import write_kimi_int4

    root = str(tmp_path_factory.mktemp("tpint4"))
    cfg = tiny_config(vocab=256, hidden=64, heads=4, layers=3, q_lora=32, kv_lora=32, nope=16, rope=16, v=16,
                      experts=8, top_k=4, n_group=1, topk_group=1, moe_inter=64, inter=128, yarn=True, max_pos=512,
                      scaling=2.827)
    target, _ = write_kimi_int4(root, cfg, seed=21)
    draft = randomize(Eagle3Draft(tiny_draft_config(cfg, draft_vocab=128, heads=4, kv_heads=2, inter=128,
                                                    aux_ids=[0, 1, 2]), dtype=torch.float32), 22, 3.0)
    random_d2t(draft, 23)
    save_hf(draft, os.path.join(root, "draft"))
    return target, os.path.join(root, "draft")


def test_tp2_kimi_int4_layout_matches_single_process(kimi_int4_pair):
    """The checkpoint users have (INT4 experts kept packed, sliced per rank at load) at TP=2, with and without
    EAGLE-3: the tokens and logprobs of TP=1 without speculation."""
    ref, _ = _run(kimi_int4_pair, 1, False)
    for spec in (False, True):
        outs, info = _run(kimi_int4_pair, 2, spec)
        assert [o["output_ids"] for o in outs] == [o["output_ids"] for o in ref], spec
        for o, r in zip(outs, ref, strict=True):
            got = [x[0] for x in o["meta_info"]["output_token_logprobs"]]
            want = [x[0] for x in r["meta_info"]["output_token_logprobs"]]
            assert max(abs(a - b) for a, b in zip(got, want, strict=True)) < LOGPROB_ATOL
        assert len(info["worker_env"]) == 2


def test_worker_environment_reaches_every_rank(pair, monkeypatch):
    monkeypatch.setenv("NCCL_ALGO", "Ring")  # set in the launcher's environment
    eng = Engine(model_path=pair[0], device="cpu", tp_size=2, worker_env={"NCCL_PROTO": "Simple"})
    try:
        reports = eng.get_server_info()["worker_env"]
        assert [r["rank"] for r in reports] == [0, 1]
        for r in reports:
            flat = str(r)
            assert "NCCL_PROTO" in flat and "Simple" in flat, r
            assert "NCCL_ALGO" in flat and "Ring" in flat, r
            assert r["pid"] != os.getpid()
    finally:
        eng.shutdown()


def test_worker_environment_at_tp1_reaches_the_models_process(pair, monkeypatch):
    """worker_env at tp_size=1 used to be dropped without a word (the model ran in this process, which never got
    it): the model now runs in a spawned worker that gets it first thing, the caller's environment is left as it
    was, and the output is the in-process engine's."""
    monkeypatch.delenv("NCCL_PROTO", raising=False)
    ref = Engine(model_path=pair[0], device="cpu")
    try:
        want = ref.generate(input_ids=PROMPTS, sampling_params=GREEDY)
    finally:
        ref.shutdown()
    eng = Engine(model_path=pair[0], device="cpu", worker_env={"NCCL_PROTO": "Simple"})
    try:
        (report,) = eng.get_server_info()["worker_env"]
        assert report["pid"] != os.getpid() and "NCCL_PROTO" in str(report) and "Simple" in str(report), report
        assert "NCCL_PROTO" not in os.environ
        got = eng.generate(input_ids=PROMPTS, sampling_params=GREEDY)
        assert [o["output_ids"] for o in got] == [o["output_ids"] for o in want]
    finally:
        eng.shutdown()


def _no_workers_left():
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if not [p for p in mp.active_children() if p.name.startswith("sglang_eagle3-tp")]:
            return True
        time.sleep(0.1)
    return False


@pytest.mark.parametrize("at", ["start", "step:2"])
def test_failing_rank_is_reported_and_cleaned_up(pair, monkeypatch, at):
    monkeypatch.setenv(FAULT_ENV, f"rank=1,at={at}")
    t0 = time.monotonic()
    with pytest.raises(WorkerError, match=r"rank 1 failed.*fault injected"):
        eng = Engine(model_path=pair[0], device="cpu", tp_size=2, worker_timeout=60)
        try:
            eng.generate(input_ids=PROMPTS[0], sampling_params=GREEDY)
        finally:
            eng.shutdown()
    assert time.monotonic() - t0 < 60
    assert _no_workers_left()
