"""Prefill as CUDA graphs: a prompt replays the smallest token bucket that holds it, padded (ModelRunner.prefill).

CUDA graphs cannot exist here, so the padded path is checked through a stand-in for the two prefill runners that
runs the very function a graph would capture (the uniform PREFILL forward over the padded inputs) eagerly: the
padding (positions, scratch slots, the causal mask keeping real tokens from padded ones) must give what the
ragged eager prefill gives. The GPU tests (tests/test_graph_runner.py) replay the real graphs.
"""

from __future__ import annotations

import pytest
import torch
from conftest import sampled_catch_up_reference

from sglang_eagle3 import Engine
from sglang_eagle3.config import ConfigError
from sglang_eagle3.runtime.graph_runner import ForwardStats, GraphRunner

pytestmark = pytest.mark.usefixtures("torch_one_thread")


class EagerReplay:
    """Takes a prefill GraphRunner's place: every (1, T) with T a bucket 'replays' by running the captured
    function on the padded inputs, counted as a graph replay, as GraphRunner.__call__ would. Like real replays,
    whose outputs live in the one memory pool all graphs share, each call returns its outputs in the same
    storage, so a caller that keeps them past the next call reads the next call's numbers."""

    def __init__(self, runner: GraphRunner):
        self.runner, self.name = runner, runner.name
        self.enabled, self.disabled_reason = True, runner.disabled_reason
        # What a CUDA machine would have captured: the same runner enabled (shapes only, nothing captured).
        self.captured = GraphRunner(runner.name, runner.fn, runner.specs, ForwardStats(warn=False), enabled=True,
                                    max_bs=runner.max_bs, tokens_per_req=runner.tokens_per_req,
                                    max_tokens=runner.max_tokens)
        self.calls: list[tuple[int, int]] = []
        self.pool = torch.empty(0, dtype=torch.uint8)

    def __getattr__(self, name):  # buckets, graphs, ... for the engine's reports
        return getattr(self.runner, name)

    def why_not(self, bs: int, T: int):
        return self.captured.why_not(bs, T)

    def __call__(self, bs: int, T: int, **inputs):
        assert self.why_not(bs, T) is None
        for name, x in inputs.items():
            want = bs * T if self.runner.specs[name].per_token else bs
            assert x.shape[0] == want, (name, tuple(x.shape), want)
        self.calls.append((bs, T))
        self.runner.stats.record(self.name, graph=True)
        outs = self.runner.fn(**inputs, tokens_per_req=T)
        sizes = [-(-o.numel() * o.element_size() // 8) * 8 for o in outs]  # 8-byte aligned slots
        if self.pool.numel() < sum(sizes):
            self.pool = torch.empty(sum(sizes), dtype=torch.uint8)
        static, at = [], 0
        for o, size in zip(outs, sizes, strict=True):
            v = self.pool[at:at + o.numel() * o.element_size()].view(o.dtype).view(o.shape)
            v.copy_(o)
            static.append(v)
            at += size
        return tuple(static)


def _check_prefill_outputs(runner, rows):
    """runner.prefill's (logits at each request's last token, hidden, aux) against the ragged eager extend's
    logits of every row and aux, float64: the hidden rows give every row's logits through logits_of."""
    last, hidden, aux = runner.prefill(rows)
    ref_logits, ref_aux = runner.target_extend(runner.build(rows))
    ends = torch.tensor([len(toks) for toks, _, _ in rows]).cumsum(0) - 1
    assert last.shape == (len(rows), ref_logits.shape[1])
    assert torch.allclose(last, ref_logits[ends], rtol=0, atol=1e-9)
    # Not float64 throughout: the router's logits and the routing weights are float32 (as SGLang keeps them), so a
    # last-bit float64 difference in a row (the chunked prefill sums attention in another order than the ragged
    # extend) can flip one float32 rounding of a routing weight and move that row's MoE output by ~1e-7 relative;
    # on one CPU here a padded chunk's row differed by 7e-9 at a logit of 0.0067 (15 float32 ulps) while every
    # other row matched bit for bit. A wrong key or chunk boundary moves logits by O(1).
    assert torch.allclose(runner.logits_of(hidden), ref_logits, rtol=1e-6, atol=1e-6)
    assert torch.allclose(aux, ref_aux, rtol=0, atol=1e-9)


def _engine(pair, **kw):
    return Engine(model_path=pair.target, speculative_algorithm="EAGLE3", speculative_draft_model_path=pair.draft,
                  speculative_num_steps=3, device="cpu", dtype="float64", skip_tokenizer_init=True,
                  attention_backend="torch", moe_runner_backend="torch", **kw)


def test_padded_prefill_equals_ragged_prefill(small_pair):
    """Prompts of irregular lengths through the padded bucket path (one 'replay' per request, batched admission
    included) give the ragged eager prefill's tokens and log-probabilities (float64), with input logprobs and
    the speculative rounds after them; the counts say graph for every request."""
    buckets = (8, 16, 64)
    padded = _engine(small_pair, cuda_graph_prefill_tokens=buckets)
    runner = padded.runner
    assert runner.prefill_tokens == buckets
    runner.target_prefill = target = EagerReplay(runner.target_prefill)
    runner.draft_prefill = draft = EagerReplay(runner.draft_prefill)
    ragged = _engine(small_pair, cuda_graph_prefill_tokens=())
    g = torch.Generator().manual_seed(int(torch.randint(0, 2**31, ())))
    V = small_pair.config.vocab_size
    prompts = [torch.randint(0, V, (n,), generator=g).tolist() for n in (3, 16, 9, 41, 1)]
    sp = {"max_new_tokens": 12, "temperature": 0}
    a = padded.generate(input_ids=prompts, sampling_params=sp, return_logprob=True, logprob_start_len=0)
    b = ragged.generate(input_ids=prompts, sampling_params=sp, return_logprob=True, logprob_start_len=0)
    for x, y in zip(a, b, strict=True):
        assert x["output_ids"] == y["output_ids"]
        for key in ("input_token_logprobs", "output_token_logprobs"):
            lx = [r[0] for r in x["meta_info"][key] if r[0] is not None]
            ly = [r[0] for r in y["meta_info"][key] if r[0] is not None]
            assert len(lx) == len(ly), key
            assert max((abs(p - q) for p, q in zip(lx, ly, strict=True)), default=0.0) < 1e-9, key
    # Consecutive prompts together while the batch bucket x token bucket was captured (64 tokens at most):
    # 3, 16, 9 as bucket 4 x 16; then 41 alone (4 x 64 was not captured), then 1 (2 x 64 neither).
    assert target.calls == [(3, 16), (1, 64), (1, 8)] and draft.calls == target.calls
    counts = padded.get_server_info()["forward_counts"]
    assert counts["target_prefill"] == {"graph": 3, "eager": 0, "eager_reasons": {}}
    assert counts["draft_prefill"]["graph"] == 3
    theirs = ragged.get_server_info()["forward_counts"]["target_prefill"]
    assert theirs["graph"] == 0 and theirs["eager"] >= 1
    # The batch's prefill outputs themselves (the draft's inputs: a wrong aux row costs acceptance, not output).
    pages = [runner.allocator.alloc(len(p) // runner.page_size + 1) for p in prompts]
    rows = [(p, 0, pg) for p, pg in zip(prompts, pages, strict=True)]
    _check_prefill_outputs(runner, rows)
    _, _, aux = runner.prefill(rows)
    _, ref_aux = runner.target_extend(runner.build(rows))
    drows = [(p[1:] + [7], 0, pg) for p, pg in zip(prompts, pages, strict=True)]
    props, hidden = runner.prefill_draft(drows, aux)
    ref_props, ref_hidden = runner.draft_extend_ragged(runner.build(drows), ref_aux)
    assert torch.equal(props, ref_props) and torch.allclose(hidden, ref_hidden, rtol=0, atol=1e-9)


def test_short_prompts_admitted_together_replay_one_graph(small_pair):
    """Prompts admitted together replay one graph of their batch bucket (3 of 4 rows used) at the longest
    prompt's bucket, each request padded to it, while that pair was captured (16 tokens at most here), else
    consecutive groups: the ragged prefill's outputs."""
    e = _engine(small_pair, cuda_graph_prefill_tokens=(4, 8, 16))
    runner = e.runner
    runner.target_prefill = target = EagerReplay(runner.target_prefill)
    runner.draft_prefill = EagerReplay(runner.draft_prefill)
    ragged = _engine(small_pair, cuda_graph_prefill_tokens=())
    g = torch.Generator().manual_seed(int(torch.randint(0, 2**31, ())))
    V = small_pair.config.vocab_size
    sp = {"max_new_tokens": 5, "temperature": 0}
    for lengths, calls in (((3, 2, 4), [(3, 4)]), ((7, 1), [(2, 8)]), ((9, 2), [(1, 16), (1, 4)]),
                           ((2, 9, 3, 1, 2), [(1, 4), (1, 16), (3, 4)])):
        target.calls.clear()
        prompts = [torch.randint(0, V, (n,), generator=g).tolist() for n in lengths]
        a = e.generate(input_ids=prompts, sampling_params=sp, return_logprob=True, logprob_start_len=0)
        b = ragged.generate(input_ids=prompts, sampling_params=sp, return_logprob=True, logprob_start_len=0)
        assert target.calls == calls, (lengths, target.calls)  # (2, 16): 32 tokens, above the 16 captured
        for x, y in zip(a, b, strict=True):
            assert x["output_ids"] == y["output_ids"]
            lx, ly = ([r[0] for r in z["meta_info"]["input_token_logprobs"][1:]] for z in (x, y))
            assert max((abs(p - q) for p, q in zip(lx, ly, strict=True)), default=0.0) < 1e-9


def test_long_prompts_prefill_in_chunks(small_pair):
    """A prompt past the largest bucket prefills in chunks of that size (each chunk's queries reading the earlier
    chunks' keys from the cache), the last chunk padded to its own bucket: the ragged prefill's tokens and
    log-probabilities (float64), one replay per chunk."""
    chunked = _engine(small_pair, cuda_graph_prefill_tokens=(4, 8))
    runner = chunked.runner
    runner.target_prefill = target = EagerReplay(runner.target_prefill)
    runner.draft_prefill = EagerReplay(runner.draft_prefill)
    ragged = _engine(small_pair, cuda_graph_prefill_tokens=())
    g = torch.Generator().manual_seed(int(torch.randint(0, 2**31, ())))
    prompts = [torch.randint(0, small_pair.config.vocab_size, (n,), generator=g).tolist() for n in (3, 19, 8, 33)]
    sp = {"max_new_tokens": 6, "temperature": 0}
    a = chunked.generate(input_ids=prompts, sampling_params=sp, return_logprob=True, logprob_start_len=0)
    b = ragged.generate(input_ids=prompts, sampling_params=sp, return_logprob=True, logprob_start_len=0)
    for x, y in zip(a, b, strict=True):
        assert x["output_ids"] == y["output_ids"]
        lx, ly = ([r[0] for r in z["meta_info"]["input_token_logprobs"][1:]] for z in (x, y))
        assert max((abs(p - q) for p, q in zip(lx, ly, strict=True)), default=0.0) < 1e-9
    # 3 -> 4; 19 -> 8, 8, 4 (3 left); 8 -> 8; 33 -> 8, 8, 8, 8, 4 (1 left)
    assert target.calls == [(1, t) for t in (4, 8, 8, 4, 8, 8, 8, 8, 8, 4)]
    assert chunked.get_server_info()["forward_counts"]["target_prefill"] == {
        "graph": 10, "eager": 0, "eager_reasons": {}}
    # The outputs themselves: one logits row a prompt (not one a chunk), every row's from the hidden states.
    pages = [runner.allocator.alloc(len(p) // runner.page_size + 1) for p in prompts]
    _check_prefill_outputs(runner, [(p, 0, pg) for p, pg in zip(prompts, pages, strict=True)])


def test_prefill_that_cannot_pad_runs_the_batch_eager(small_pair):
    """Where a prompt's last chunk, padded to a bucket, would run past the page table (the context's end), the
    whole admitted batch prefills ragged and eager, counted with a reason that names no length (one warning,
    not one per prompt). Pages of 16 tokens: a page table of 7 pages reaches 112 positions."""
    e = _engine(small_pair, cuda_graph_prefill_tokens=(8, 64), context_length=100, page_size=16)
    runner = e.runner
    assert runner.max_pages * runner.page_size == 112
    runner.target_prefill = EagerReplay(runner.target_prefill)
    runner.draft_prefill = EagerReplay(runner.draft_prefill)
    e.generate(input_ids=[[1, 2, 3], list(range(1, 91))], sampling_params={"max_new_tokens": 2, "temperature": 0})
    counts = e.get_server_info()["forward_counts"]
    want = "a prompt's last chunk, padded to a bucket, would run past the context's page table"
    assert counts["target_prefill"] == {"graph": 0, "eager": 1, "eager_reasons": {want: 1}}  # 26 at 64: 128 > 112
    assert counts["draft_prefill"]["eager_reasons"] == {want: 1}
    e.generate(input_ids=list(range(1, 70)), sampling_params={"max_new_tokens": 2, "temperature": 0})
    assert e.get_server_info()["forward_counts"]["target_prefill"]["graph"] == 2  # 64 at 0, then 5 at 64 -> 8


def test_prefill_buckets_follow_the_context(small_pair):
    """Buckets past the page table's reach are dropped; a bucket fits a prompt only if its padded positions
    stay within that reach; on CPU every prefill is eager with the CPU reason."""
    e = _engine(small_pair, cuda_graph_prefill_tokens=(16, 32, 128, 100000), context_length=100)
    runner = e.runner
    reach = runner.max_pages * runner.page_size
    assert reach >= 100 and runner.prefill_tokens == tuple(t for t in (16, 32, 128) if t <= reach)
    # Batches of short prompts up to the largest configured bucket's tokens, whatever the context.
    assert runner.target_prefill.max_tokens == 100000

    def bucket(*rows):  # rows of (tokens, first position)
        return runner.prefill_bucket([([7] * n, first, []) for n, first in rows])

    assert bucket((1, 0)) == 16 and bucket((17, 0)) == 32 and bucket((3, 0), (17, 0)) == 32
    assert bucket((33, 0)) == (128 if 128 <= reach else None)
    assert bucket((10, reach - 12)) is None  # 16 padded tokens would run past the table
    assert bucket((10, reach - 16)) == 16 and bucket((10, reach - 16), (3, 0)) == 16
    e.generate(input_ids=[3, 4, 5], sampling_params={"max_new_tokens": 1})
    reasons = e.get_server_info()["forward_counts"]["target_prefill"]["eager_reasons"]
    assert reasons == {"CUDA graphs need a CUDA device (running on CPU)": 1}
    # The eager prefill gives what the graphs give: logits at the last tokens, every row's from the hidden states.
    pages = [runner.allocator.alloc(4) for _ in range(3)]
    g = torch.Generator().manual_seed(int(torch.randint(0, 2**31, ())))
    _check_prefill_outputs(runner, [(torch.randint(0, small_pair.config.vocab_size, (n,), generator=g).tolist(), 0, p)
                                    for n, p in zip((5, 1, 40), pages, strict=True)])


def test_batch_with_more_pages_than_the_table_is_refused(small_pair):
    """A request whose page list is longer than the page table's width (the context limit) is refused with the
    counts, before anything is uploaded (it once surfaced as a reshape error)."""
    runner = _engine(small_pair, context_length=100).runner
    width = runner.max_pages
    with pytest.raises(ValueError, match=rf"holds {width + 1} pages, more than the page table's width {width}"):
        runner.build([([1, 2, 3], 0, list(range(1, width + 2)))], width=width)
    runner.build([([1, 2, 3], 0, list(range(1, width + 1)))], width=width)  # exactly the width: fine


@pytest.mark.parametrize("bad", [(0,), (16, -1), (True,), (8.0,), [16]])
def test_bad_prefill_buckets_are_refused(small_pair, bad):
    from sglang_eagle3.engine import EngineArgs

    if isinstance(bad, list):  # the Engine turns a list into a tuple; EngineArgs itself wants a tuple
        with pytest.raises(ConfigError, match="cuda_graph_prefill_tokens"):
            EngineArgs(cuda_graph_prefill_tokens=bad)
        return
    with pytest.raises(ConfigError, match="cuda_graph_prefill_tokens"):
        Engine(model_path=small_pair.target, device="cpu", skip_tokenizer_init=True, cuda_graph_prefill_tokens=bad)


def test_launch_server_flag():
    from sglang_eagle3.launch_server import build_parser, engine_kwargs

    args = build_parser().parse_args(["--cuda-graph-prefill-tokens", "64,128 256"])
    assert engine_kwargs(args)["cuda_graph_prefill_tokens"] == (64, 128, 256)
    args = build_parser().parse_args(["--cuda-graph-prefill-tokens", ""])
    assert engine_kwargs(args)["cuda_graph_prefill_tokens"] == ()
    assert "cuda_graph_prefill_tokens" not in engine_kwargs(build_parser().parse_args([]))


def test_prefill_capture_out_of_memory_leaves_eager_prefill(small_pair, monkeypatch, caplog):
    """Prefill graphs that do not fit beside the KV cache do not stop the engine: a warning, the prefill runners
    disabled with that reason (counted on every prefill), the other graphs captured as before."""
    import logging

    e = _engine(small_pair, cuda_graph_prefill_tokens=(8, 16))
    runner = e.runner
    captured = []

    def capture(self, make_inputs):
        if self.name == "target_prefill":
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        captured.append(self.name)

    monkeypatch.setattr(GraphRunner, "capture", capture)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    with caplog.at_level(logging.WARNING, logger="sglang_eagle3.runtime.model_runner"):
        runner.capture_graphs()
    assert "target_verify" in captured and "draft_prefill" not in captured
    assert any("prefill graphs not captured: CUDA out of memory" in r.getMessage() for r in caplog.records)
    monkeypatch.undo()
    e.generate(input_ids=[4, 5, 6], sampling_params={"max_new_tokens": 2})
    reasons = e.get_server_info()["forward_counts"]["target_prefill"]["eager_reasons"]
    assert len(reasons) == 1 and next(iter(reasons)).startswith("prefill graphs not captured: CUDA out of memory")


def test_sampled_catch_up_draws_every_row_inside_the_graph(small_pair):
    """A resting draft's catch-up over sampled requests (ModelRunner.catch_up with sampler inputs) replays
    draft_prefill_sampled, whose rows draw their proposals inside the graph with their request's sampler inputs,
    padded to the bucket: the proposals and hidden states of the draft's extend followed by its head and draw per
    row (the eager composition it replaced). The graphs cover the buckets up to the first above probe_rounds; a
    longer catch-up runs eager, counted with the reason, and gives the same."""
    from sglang_eagle3.runtime.sampling import SamplingParams

    e = _engine(small_pair, cuda_graph_prefill_tokens=(4, 8, 16), speculative_adaptive=True,
                speculative_adaptive_probe_rounds=5)
    runner = e.runner
    assert runner.draft_prefill_sampled.tokens_per_req == (4, 8)  # 8: the first bucket above 5 tokens
    runner.draft_prefill_sampled = twin = EagerReplay(runner.draft_prefill_sampled)
    g = torch.Generator().manual_seed(int(torch.randint(0, 2**31, ())))
    V, H = small_pair.config.vocab_size, small_pair.config.hidden_size
    # greedy, two temperatures with their own keys: a row given another request's inputs draws another token
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=1.3), SamplingParams(temperature=0.7)]
    keys = torch.randint(0, 2**31, (3,), generator=g).tolist()

    def check(lengths):
        rows = []
        for n in lengths:
            first = int(torch.randint(0, 20, (), generator=g))
            rows.append((torch.randint(0, V, (n,), generator=g).tolist(), first,
                         runner.allocator.alloc((first + n) // runner.page_size + 1)))
        aux = torch.randn(sum(lengths), 3 * H, generator=g, dtype=torch.float64)
        samp = runner.sampler_batch(params[:len(rows)], keys[:len(rows)])
        props, hidden = runner.catch_up(rows, aux, samp)
        ref, ref_every, ref_hidden = sampled_catch_up_reference(runner, rows, aux, params, keys)
        assert torch.allclose(hidden, ref_hidden, rtol=0, atol=1e-9)
        assert torch.equal(props, ref)
        # the greedy request's rows propose the argmax (the greedy catch-up's); the sampled ones' not always
        n0 = lengths[0]
        assert torch.equal(props[:n0], ref_every[:n0])
        return int((props[n0:] != ref_every[n0:]).sum())

    drawn = check([3, 5, 6])  # 2 x 8 tokens, then 1 x 8 (16 tokens a replay at most: the largest bucket)
    assert twin.calls == [(2, 8), (1, 8)]
    sampled = runner.stats.as_dict()["draft_prefill_sampled"]
    assert sampled["graph"] == 2 and sampled["eager"] == 0
    drawn += check([9, 2])  # 9 tokens: bucket 16, not captured for catch-ups
    assert drawn > 0  # (else the sampled rows were argmaxes and the check above proved nothing of their inputs)
    assert twin.calls == [(2, 8), (1, 8)]
    sampled = runner.stats.as_dict()["draft_prefill_sampled"]
    assert sampled["eager"] == 1 and "not captured" in next(iter(sampled["eager_reasons"]))
