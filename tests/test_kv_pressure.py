"""A KV pool too small for the whole batch: requests are retracted and resumed, outputs unchanged."""

from __future__ import annotations

import random

import pytest
from conftest import small_config, small_draft_config

from sglang_eagle3 import Engine
from sglang_eagle3.engine import RequestError


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    from sglang_eagle3.testing import write_tiny_pair

    cfg = small_config()
    return write_tiny_pair(str(tmp_path_factory.mktemp("kvp")), cfg, small_draft_config(cfg, aux_ids=[0, 1, 2]),
                           seed=3, scale=3.0)


@pytest.mark.parametrize("spec", [False, True])
def test_retraction_under_kv_pressure_keeps_outputs(pair, spec):
    tpath, dpath = pair
    rng = random.Random(4)
    prompts = [[rng.randrange(96) for _ in range(10)] for _ in range(4)]
    greedy = {"max_new_tokens": 30, "temperature": 0}
    ref = Engine(model_path=tpath, device="cpu").generate(input_ids=prompts, sampling_params=greedy)
    extra = dict(speculative_algorithm="EAGLE3", speculative_draft_model_path=dpath, speculative_num_steps=3) \
        if spec else {}
    eng = Engine(model_path=tpath, device="cpu", max_total_tokens=64, page_size=4, **extra)
    outs = eng.generate(input_ids=prompts, sampling_params=greedy)
    assert [o["output_ids"] for o in outs] == [o["output_ids"] for o in ref]
    info = eng.get_server_info()
    assert info["kv_pages_free"] == info["kv_pages_total"]  # everything returned
    assert info["max_total_num_tokens"] == 64  # max_total_tokens as asked (CPU: not cut to memory)
    assert eng.scheduler.scheduler.stats.retracted_requests > 0
    # SGLang's meta_info.num_retractions: each request's own count, summing to the scheduler's
    assert sum(o["meta_info"]["num_retractions"] for o in outs) == eng.scheduler.scheduler.stats.retracted_requests
    assert all(o["meta_info"]["num_retractions"] == 0 for o in ref)
    if spec:  # SGLang's per-request acceptance: correct drafts over proposed (k a verify round), no bonus token
        for o in outs:
            m = o["meta_info"]
            assert m["spec_num_proposed_drafts"] == 3 * m["spec_verify_ct"]
            assert 0 <= m["spec_num_correct_drafts"] <= m["spec_num_proposed_drafts"]
            assert m["spec_accept_rate"] == m["spec_num_correct_drafts"] / m["spec_num_proposed_drafts"]
            # the kept tokens: the prefill's, then correct drafts plus one a round (less what a stop cut off)
            assert m["completion_tokens"] <= 1 + m["spec_num_correct_drafts"] + m["spec_verify_ct"]


def test_request_larger_than_the_pool_is_refused(pair):
    eng = Engine(model_path=pair[0], device="cpu", max_total_tokens=64, page_size=4)
    with pytest.raises(RequestError, match="max_new_tokens=60 with a prompt of 40 tokens does not fit: at most 23 "):
        eng.generate(input_ids=[1] * 40, sampling_params={"max_new_tokens": 60})
    with pytest.raises(RequestError, match="prompt of 70 tokens does not fit the KV cache"):
        eng.generate(input_ids=[1] * 70, sampling_params={"max_new_tokens": 0})
    # Left out, max_new_tokens is cut to what fits (64 - 40 - 1 slot of lookahead) instead of refused.
    out = eng.generate(input_ids=[1] * 40, sampling_params={"ignore_eos": True})
    assert out["meta_info"]["completion_tokens"] == 23 == eng.max_new_tokens_limit(40)
