"""The scheduler as heavy traffic meets it: more requests than KV pages, arrivals and aborts while others run,
speculative rounds that end a request mid-way. Each case draws its prompts and lengths and compares against a
target-only engine with room for everything (a seeded sampled request's output is the same token for token with
EAGLE-3 on or off: README, Sampling); none holds an output of this code.
"""

from __future__ import annotations

import random

import pytest
from conftest import scheduler_of, small_config, small_draft_config

from sglang_eagle3 import Engine
from sglang_eagle3.engine import RequestError

pytestmark = pytest.mark.usefixtures("torch_one_thread")

VOCAB = 96  # small_config's


@pytest.fixture(scope="module")
def pair(make_pair):
    cfg = small_config()
    return make_pair(cfg, small_draft_config(cfg, aux_ids=[0, 1, 2]), seed=3, scale=3.0)


def _engine(pair, k: int | None, **kw) -> Engine:
    spec = dict(speculative_algorithm="EAGLE3", speculative_draft_model_path=pair.draft, speculative_num_steps=k) \
        if k else {}
    # float64: these fresh random prompts compare greedy outputs across batchings, and float32's batching noise
    # (up to 1e-4 in a tiny pair's logits) can flip a near-tie (tests/test_adaptive_k.py's CPU says more)
    return Engine(model_path=pair.target, device="cpu", dtype="float64", skip_tokenizer_init=True, **spec, **kw)


def _prompts(rng: random.Random, n: int, lo: int = 3, hi: int = 20) -> list[list[int]]:
    return [[rng.randrange(VOCAB) for _ in range(rng.randrange(lo, hi))] for _ in range(n)]


def _reference(pair, prompts, params) -> list[dict]:
    """Target-only, one pool with room for every request: nothing is retracted."""
    return _engine(pair, None).generate(input_ids=prompts, sampling_params=params)


def _pool_whole(eng: Engine) -> None:
    sched, alloc = scheduler_of(eng), eng.runner.allocator
    assert not sched.waiting and not sched.running and sched._ahead is None
    assert len(set(alloc._free)) == len(alloc._free), f"a page freed twice: {sorted(alloc._free)}"
    assert alloc.num_free == alloc.num_pages - 1, f"{alloc.num_pages - 1 - alloc.num_free} KV page(s) leaked"


@pytest.mark.parametrize("k", [None, 3])
def test_no_request_is_retracted_before_it_gains_a_token(pair, k):
    """Many greedy requests, a pool of a fraction of their need: every request is served (queued, not failed),
    outputs are the unpressured ones, and admission leaves the running batch the pages of its next round: a
    request admitted into them was retracted by that round before it had decoded a token, re-prefilled, admitted
    again, retracted again (the same request up to 4 times at the same length; 3-6x the prompt tokens
    prefilled)."""
    rng = random.Random(random.randrange(1 << 30))
    prompts = _prompts(rng, 12)
    params = [{"max_new_tokens": rng.randrange(5, 40), "temperature": 0, "ignore_eos": True} for _ in prompts]
    ref = _reference(pair, prompts, params)
    eng = _engine(pair, k, max_total_tokens=96, page_size=4)
    sched = scheduler_of(eng)
    after_prefill: dict[str, int] = {}  # rid -> its output length when last (re)admitted
    wasted: list[tuple[str, int]] = []
    prefill, release = sched._prefill, sched._release

    def spy_prefill(reqs):
        out = prefill(reqs)
        after_prefill.update({r.rid: len(r.output_ids) for r in reqs})
        return out

    def spy_release(r):
        if not r.finished and len(r.output_ids) <= after_prefill[r.rid]:  # a retraction (no _unadmit here)
            wasted.append((r.rid, len(r.output_ids)))
        release(r)

    sched._prefill, sched._release = spy_prefill, spy_release
    outs = eng.generate(input_ids=prompts, sampling_params=params)
    assert [o["output_ids"] for o in outs] == [o["output_ids"] for o in ref]
    assert sched.stats.retracted_requests > 0, "the pool was never short: nothing was tested"
    assert not wasted, f"retracted with no token gained since admission (rid, tokens): {wasted}"
    _pool_whole(eng)


@pytest.mark.parametrize("overlap", [True, False])
def test_sampled_penalized_and_logprob_requests_survive_retraction(pair, overlap):
    """Seeded sampling, penalties (their counts rebuilt from the output after a retraction) and logprobs, in a
    pool that retracts: EAGLE-3 gives target-only's unpressured tokens; stop tokens taken from the reference end
    requests inside accepted runs there too."""
    rng = random.Random(random.randrange(1 << 30))
    prompts = _prompts(rng, 10)
    params = []
    for i in range(len(prompts)):
        sp = {"max_new_tokens": rng.randrange(15, 45), "temperature": rng.choice([0.7, 1.0]), "seed": rng.randrange(99),
              "ignore_eos": True}
        if i % 3 == 1:
            sp.update(frequency_penalty=0.6, repetition_penalty=1.3)
        if i % 4 == 2:
            sp["temperature"] = 0
        params.append(sp)
    ref = _reference(pair, prompts, params)
    for sp, o in zip(params, ref, strict=True):  # a stop token in the second half, for a third of the requests
        n = len(o["output_ids"])
        if rng.random() < 1 / 3:
            sp["stop_token_ids"] = [o["output_ids"][rng.randrange(n // 2, n - 1)]]
    ref = _reference(pair, prompts, params)
    eng = _engine(pair, 3, max_total_tokens=96, page_size=4, disable_overlap_schedule=not overlap)
    outs = eng.generate(input_ids=prompts, sampling_params=params, return_logprob=True)
    for o, r in zip(outs, ref, strict=True):
        assert o["output_ids"] == r["output_ids"]
        assert o["meta_info"]["finish_reason"] == r["meta_info"]["finish_reason"]
        assert o["meta_info"]["completion_tokens"] == len(r["output_ids"])
        lps = o["meta_info"]["output_token_logprobs"]
        assert [t for _, t, _ in lps] == o["output_ids"] and all(v <= 0 for v, _, _ in lps)
    assert scheduler_of(eng).stats.retracted_requests > 0, "the pool was never short: nothing was tested"
    _pool_whole(eng)


@pytest.mark.parametrize("k", [None, 2])
def test_queue_fifo_aborts_and_running_limit(pair, k):
    """Arrivals while others run, a long request at the head of the queue, aborts of a waiting request (one
    retracted, with output, if any), of a running one with a round in flight, and with nothing in flight: at every
    step the running set stays within max_running_requests, every page is either held by a running request or
    free, requests are admitted first in arrival order, and the others' outputs are the unpressured ones."""
    rng = random.Random(random.randrange(1 << 30))
    max_running = 3
    eng = _engine(pair, k, max_total_tokens=96, page_size=4, max_running_requests=max_running)
    sched, alloc = scheduler_of(eng), eng.runner.allocator
    start = alloc.num_free
    greedy = lambda m: {"max_new_tokens": m, "temperature": 0, "ignore_eos": True}  # noqa: E731
    first = [(p, greedy(rng.randrange(10, 30))) for p in _prompts(rng, 3)]
    long = ([rng.randrange(VOCAB) for _ in range(60)], greedy(eng.max_new_tokens_limit(60)))
    later = [(p, greedy(rng.randrange(3, 12))) for p in _prompts(rng, 6)]
    reqs, admitted, aborted = [], [], set()
    prefill = sched._prefill

    def spy_prefill(rs):
        admitted.extend(r.rid for r in rs if r.rid not in admitted)
        return prefill(rs)

    sched._prefill = spy_prefill

    def add(p, sp):
        r = eng.make_request(input_ids=p, sampling_params=sp)
        reqs.append(r)
        sched.add(r)

    for p, sp in first + [long]:
        add(p, sp)
    steps, peak = 0, 0
    while sched.has_work():
        sched.step()
        steps += 1
        assert steps < 2000, "no progress"
        if steps <= len(later):
            add(*later[steps - 1])
        if steps in (4, 11) and sched.running:  # (with the overlap, a round is in flight after a decode step)
            victim = sched.running[rng.randrange(len(sched.running))]
            assert sched.abort(victim.rid)
            aborted.add(victim.rid)
        if steps == 7 and sched.waiting:
            victim = max(sched.waiting, key=lambda r: len(r.output_ids))
            assert sched.abort(victim.rid)
            aborted.add(victim.rid)
        peak = max(peak, len(sched.running))
        assert len(sched.running) <= max_running
        assert sum(len(r.pages) for r in sched.running) + alloc.num_free == start
        assert all(not r.pages for r in sched.waiting)
    assert peak == max_running
    assert len(aborted) == 3
    assert admitted == [r.rid for r in reqs if r.rid in admitted], "admitted out of arrival order"
    _pool_whole(eng)
    kept = [r for r in reqs if r.rid not in aborted]
    ref = _reference(pair, [r.input_ids for r in kept], [greedy(r.params.max_new_tokens) for r in kept])
    assert [r.output_ids for r in kept] == [o["output_ids"] for o in ref]
    assert all(r.finished_reason["type"] == "abort" for r in reqs if r.rid in aborted)


@pytest.mark.parametrize("k", [None, 1, 4])
def test_largest_request_the_pool_allows_runs_among_others(pair, k):
    """A request given exactly max_new_tokens_limit(prompt) runs to its last token next to others (retracting
    them, never failing), and one token more is refused up front naming the numbers."""
    rng = random.Random(random.randrange(1 << 30))
    page_size = rng.choice([1, 3, 4, 16])
    eng = _engine(pair, k, max_total_tokens=rng.choice([64, 80, 100]), page_size=page_size)
    n = rng.randrange(5, 30)
    limit = eng.max_new_tokens_limit(n)
    assert limit > 0
    big = [rng.randrange(VOCAB) for _ in range(n)]
    with pytest.raises(RequestError, match=f"max_new_tokens={limit + 1} with a prompt of {n} tokens does not fit: "
                                           f"at most {limit} new tokens"):
        eng.generate(input_ids=big, sampling_params={"max_new_tokens": limit + 1})
    prompts = [big] + _prompts(rng, 3)
    params = [{"max_new_tokens": limit, "temperature": 0, "ignore_eos": True}] + [
        {"max_new_tokens": rng.randrange(5, 20), "temperature": 0, "ignore_eos": True} for _ in prompts[1:]]
    outs = eng.generate(input_ids=prompts, sampling_params=params)
    ref = _reference(pair, prompts, params)
    assert [o["output_ids"] for o in outs] == [o["output_ids"] for o in ref]
    assert len(outs[0]["output_ids"]) == limit
    _pool_whole(eng)
