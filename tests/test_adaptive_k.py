"""Switching the draft length between rounds (an adaptive policy) keeps the output lossless."""

from __future__ import annotations

import random

import pytest

from sglang_eagle3 import Engine
from sglang_eagle3.config import ConfigError
from sglang_eagle3.testing import tiny_config, tiny_draft_config, write_tiny_pair


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    cfg = tiny_config(vocab=128, hidden=32, heads=2, layers=3, q_lora=16, kv_lora=16, nope=8, rope=4, v=8,
                      experts=4, top_k=2, n_group=2, topk_group=1, moe_inter=16, inter=48)
    dcfg = tiny_draft_config(cfg, heads=2, kv_heads=1, inter=48, aux_ids=[0, 1, 2])
    return write_tiny_pair(str(tmp_path_factory.mktemp("adaptive")), cfg, dcfg, seed=21, scale=3.0)


def test_switching_num_steps_between_rounds_is_lossless(pair):
    tpath, dpath = pair
    prompts = [[random.randrange(128) for _ in range(n)] for n in (5, 9, 2)]
    greedy = {"max_new_tokens": 30, "temperature": 0}
    ref = Engine(model_path=tpath, device="cpu").generate(input_ids=prompts, sampling_params=greedy)
    eng = Engine(model_path=tpath, device="cpu", speculative_algorithm="EAGLE3", speculative_draft_model_path=dpath,
                 speculative_num_steps=2, speculative_num_steps_candidates=[1, 4])
    reqs = [eng.make_request(input_ids=p, sampling_params=greedy) for p in prompts]
    for r in reqs:
        eng.scheduler.add(r)
    done, ks = {}, [1, 4, 2]
    step = 0
    while len(done) < len(reqs):
        if step % 3 == 0:
            eng.set_speculative_num_steps(ks[(step // 3) % len(ks)])
        for r in eng.scheduler.step():
            if r.finished:
                done[r.rid] = r
        step += 1
    assert [done[r.rid].output_ids for r in reqs] == [o["output_ids"] for o in ref]
    with pytest.raises(ConfigError, match="speculative_num_steps=9"):
        eng.set_speculative_num_steps(9)
