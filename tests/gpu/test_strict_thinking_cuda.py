"""Strict thinking (EngineArgs.enable_strict_thinking; runtime/reasoning.py) on CUDA with graphs (skipped without
CUDA): its masks ride the grammar rounds' graphs, which an engine captures for it even without xgrammar.

Checked against: plain decoding eager (EAGLE-3 with graphs and plain with graphs equal it), and the rules (the pushed
thinking holds exactly the budget's tokens, then its end marker). CPU twin: tests/server/test_strict_thinking.py.
"""

from __future__ import annotations

import os
import random

import pytest
import torch

from sglang_eagle3 import Engine
from sglang_eagle3.testing import tiny_config, tiny_draft_config, write_tiny_pair

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)

THINK, END = "<think>", "</think>"
_CORPUS = "The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs. " * 4


def _write_tokenizer(path: str) -> int:
    """A byte-level BPE with the thinking's markers as special tokens (tests/server's tokenizers import the server,
    whose packages a GPU machine may lack); its vocabulary size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, min_frequency=1, special_tokens=["<|bos|>", THINK, END],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([_CORPUS], trainer)
    os.makedirs(path, exist_ok=True)
    tok.save(os.path.join(path, "tokenizer.json"))
    return tok.get_vocab_size()


def test_strict_thinking_with_graphs_equals_plain_eager(tmp_path):
    tok_dir = str(tmp_path / "tok")
    vocab = _write_tokenizer(tok_dir)
    cfg = tiny_config(vocab=vocab, hidden=32, layers=3, heads=2, q_lora=16, kv_lora=16, nope=8, rope=4, v=8,
                      experts=4, top_k=2, n_group=2, topk_group=1, moe_inter=16, inter=48, max_pos=256)
    target, draft = write_tiny_pair(str(tmp_path), cfg, tiny_draft_config(cfg, heads=2, kv_heads=1, inter=48), seed=3,
                                    scale=4.0)
    os.replace(os.path.join(tok_dir, "tokenizer.json"), os.path.join(target, "tokenizer.json"))
    rng = random.Random()
    budgets = [rng.randint(0, 4), rng.randint(5, 9), -1, rng.randint(1, 6)]
    prompts = ["Pack my box", "The quick brown fox", "How vexingly quick", "Sphinx of black quartz"]

    def run(**kw):
        eng = Engine(model_path=target, device="cuda", dtype="float32", attention_backend="torch",
                     moe_runner_backend="torch", reasoning_parser="kimi_k2", enable_strict_thinking=True,
                     cuda_graph_max_bs=4, log_level="warning", **kw)
        [think], [end] = eng.tokenizer.encode(THINK), eng.tokenizer.encode(END)
        # (</think> below everything: a sampled thinking never ends by itself before its budget)
        params = [{"temperature": 0, "max_new_tokens": 16, "logit_bias": {think: 100.0, end: -100.0},
                   "custom_params": {"thinking_budget": b}} for b in budgets]
        params[1] = dict(params[1], temperature=0.8, seed=rng.randrange(2 ** 31))
        outs = [o["output_ids"] for o in eng.generate(prompts, params)]
        counts = eng.get_server_info()["forward_counts"]
        ids = think, end
        eng.shutdown()
        return outs, counts, ids

    seed_state = rng.getstate()
    eager, _, (think, end) = run(disable_cuda_graph=True)
    rng.setstate(seed_state)
    graphs, _, _ = run()
    rng.setstate(seed_state)
    spec, counts, _ = run(speculative_algorithm="EAGLE3", speculative_draft_model_path=draft, speculative_num_steps=3)
    assert graphs == eager and spec == eager
    for ids, b in zip(eager, budgets, strict=True):
        assert ids[0] == think
        if b >= 0:
            assert ids[b + 1] == end and end not in ids[1:b + 1], (b, ids)
    assert counts["target_verify"]["eager"] == 0 and counts["target_verify"]["graph"] > 0, counts
    assert counts["spec_round_grammar"]["eager"] == 0 and counts["spec_round_grammar"]["graph"] > 0, counts
