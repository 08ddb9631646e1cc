"""TP on several GPUs with NCCL (skipped unless >= 2 GPUs): greedy tokens equal TP=1, graphs on."""

from __future__ import annotations

import os

import pytest
import torch

from sglang_eagle3 import Engine
from sglang_eagle3.testing import tiny_config, tiny_draft_config, write_tiny_pair

pytestmark = pytest.mark.gpu
if torch.cuda.device_count() < 2:
    pytest.skip("needs >= 2 GPUs", allow_module_level=True)

GREEDY = {"max_new_tokens": 24, "temperature": 0}
PROMPTS = [[11, 42, 7, 99, 3], [5, 6], [250, 251, 252, 253, 254, 255, 1, 2, 3]]
EMBEDDED = os.path.join(os.path.dirname(__file__), "..", "..", "sglang_eagle3", "assets", "embedded")


def kimi_like_pair(root):
    # Kimi-K2.5's structure at toy size: one dense layer, ungrouped routing, 1 shared expert, YaRN.
    cfg = tiny_config(vocab=512, hidden=128, heads=8, layers=6, q_lora=64, kv_lora=64, nope=32, rope=32, v=32,
                      experts=32, top_k=8, n_group=1, topk_group=1, moe_inter=64, inter=256, yarn=True,
                      max_pos=1024, scaling=2.827)
    dcfg = tiny_draft_config(cfg, draft_vocab=256, heads=8, kv_heads=4, inter=256, aux_ids=[1, 3, 5])
    return write_tiny_pair(root, cfg, dcfg, seed=9, scale=3.0)


@pytest.fixture(scope="module", params=["kimi_like", "embedded"])
def pair(request, tmp_path_factory):
    if request.param == "embedded":
        if not os.path.exists(os.path.join(EMBEDDED, "target", "config.json")):
            pytest.skip("embedded pair not installed")
        return os.path.join(EMBEDDED, "target"), os.path.join(EMBEDDED, "draft")
    return kimi_like_pair(str(tmp_path_factory.mktemp("tpcuda")))


def outputs(pair, tp, spec):
    extra = dict(speculative_algorithm="EAGLE3", speculative_draft_model_path=pair[1], speculative_num_steps=3) \
        if spec else {}
    eng = Engine(model_path=pair[0], device="cuda", dtype="float32", tp_size=tp, attention_backend="torch",
                 moe_runner_backend="torch", skip_tokenizer_init=True, **extra)
    try:
        outs = eng.generate(input_ids=PROMPTS, sampling_params=GREEDY)
        info = eng.get_server_info()
        return [o["output_ids"] for o in outs], info
    finally:
        eng.shutdown()


@pytest.mark.parametrize("spec", [False, True])
def test_tp2_equals_tp1_with_graphs(pair, spec):
    ref, _ = outputs(pair, 1, spec)
    got, info = outputs(pair, 2, spec)
    assert got == ref
    assert len(info["worker_env"]) == 2
    name = "target_verify" if spec else "target_decode"
    assert info["forward_counts"][name]["eager"] == 0 and info["forward_counts"][name]["graph"] > 0
