"""MLA prefill in the non-absorbed form (EngineArgs.mha_prefill_tokens; layers/mla.py): the engine's outputs with it
equal the absorbed prefill's (float64, where the two forms differ only in the order of their sums), for ragged
eager batches mixing requests above and below the threshold, padded bucket 'replays' and chunked long prompts;
the speculative rounds after it stay lossless. The kernel itself is checked in tests/kernels (mla_prefill_checks).
"""

from __future__ import annotations

import pytest
import torch

from tests.test_prefill_graphs import EagerReplay, _engine

pytestmark = pytest.mark.usefixtures("torch_one_thread")


def _logprobs(out) -> list[float]:
    return [r[0] for r in out["meta_info"]["input_token_logprobs"] if r[0] is not None] + [
        r[0] for r in out["meta_info"]["output_token_logprobs"]]


def _same(a, b, tol=1e-9):
    for x, y in zip(a, b, strict=True):
        assert x["output_ids"] == y["output_ids"]
        lx, ly = _logprobs(x), _logprobs(y)
        assert len(lx) == len(ly)
        assert max((abs(p - q) for p, q in zip(lx, ly, strict=True)), default=0.0) < tol


@pytest.mark.parametrize("buckets", [(), (4, 8)], ids=["ragged", "bucketed_chunks"])
def test_mha_prefill_equals_absorbed(small_pair, buckets):
    """Prompts of 3..33 tokens with the threshold at 9: ragged batches mix both forms (a request below it keeps the
    absorbed one); with buckets (4, 8) long prompts go in chunks of 8 (MHA), each over the earlier chunks' keys,
    with tails of 4 (absorbed). Tokens and every log-probability (input and output) equal the absorbed prefill's;
    the scratch exists only where asked for."""
    mha = _engine(small_pair, cuda_graph_prefill_tokens=buckets, mha_prefill_tokens=8)
    absorbed = _engine(small_pair, cuda_graph_prefill_tokens=buckets, mha_prefill_tokens=0)
    assert mha.runner.target_kv.mha_scratch is not None and absorbed.runner.target_kv.mha_scratch is None
    layers = mha.runner.target.model.layers
    assert all(layer.self_attn.mha_prefill_tokens == 8 for layer in layers)
    calls = []
    if buckets:
        for e in (mha, absorbed):
            e.runner.target_prefill = EagerReplay(e.runner.target_prefill)
            e.runner.draft_prefill = EagerReplay(e.runner.draft_prefill)
    # Count the forwards that took each form, on the MHA engine's layer 0.
    attn = layers[0].self_attn
    orig = attn._mha

    def counting(*args, **kw):
        calls.append(args[6])  # tokens a request
        return orig(*args, **kw)

    attn._mha = counting
    g = torch.Generator().manual_seed(int(torch.randint(0, 2**31, ())))
    V = small_pair.config.vocab_size
    prompts = [torch.randint(0, V, (n,), generator=g).tolist() for n in (3, 19, 9, 33, 7)]
    sp = {"max_new_tokens": 8, "temperature": 0}
    a = mha.generate(input_ids=prompts, sampling_params=sp, return_logprob=True, logprob_start_len=0)
    b = absorbed.generate(input_ids=prompts, sampling_params=sp, return_logprob=True, logprob_start_len=0)
    _same(a, b)
    assert calls and all(n >= 8 for n in calls), calls
    if buckets:  # 19 -> 8, 8, (4); 9 -> 8, (4); 33 -> 8 x 4, (4); 7 -> 8 (padded): the 8-token calls only
        assert calls == [8] * 8, calls
    else:  # one ragged batch: the requests of 19, 9 and 33 tokens
        assert sorted(calls) == [9, 19, 33], calls


def test_mha_prefill_keeps_speculation_lossless(small_pair):
    """With every prefill of >= 4 tokens non-absorbed, EAGLE-3's greedy output is the target's alone (no draft)."""
    from sglang_eagle3 import Engine

    spec = _engine(small_pair, mha_prefill_tokens=4)
    plain = Engine(model_path=small_pair.target, device="cpu", dtype="float64", skip_tokenizer_init=True,
                   attention_backend="torch", moe_runner_backend="torch", mha_prefill_tokens=4)
    g = torch.Generator().manual_seed(int(torch.randint(0, 2**31, ())))
    prompts = [torch.randint(0, small_pair.config.vocab_size, (n,), generator=g).tolist() for n in (5, 12, 26)]
    sp = {"max_new_tokens": 16, "temperature": 0}
    a = spec.generate(input_ids=prompts, sampling_params=sp)
    b = plain.generate(input_ids=prompts, sampling_params=sp)
    assert [x["output_ids"] for x in a] == [y["output_ids"] for y in b]
