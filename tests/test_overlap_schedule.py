"""The overlap schedule (runtime/scheduler.py): the next greedy round is queued before the host reads the one in
flight, and that changes no output, no stop, no statistic and no page, and runs no round more.

Each case runs the same requests twice, with the overlap on (the default) and with disable_overlap_schedule=True,
on a fresh random tiny pair: outputs, finish reasons, verify counts and the accept-length histogram must be equal,
every page must come back, and with the overlap on a round must actually have been queued while another was in
flight (the scheduler's launch/read order is recorded), with it off never.
"""

from __future__ import annotations

import random

import pytest
import torch

from sglang_eagle3 import Engine
from sglang_eagle3.runtime import scheduler as sched_mod
from sglang_eagle3.testing import tiny_config, tiny_draft_config, write_tiny_pair

pytestmark = pytest.mark.usefixtures("torch_one_thread")
# float64: fresh random pairs and prompts compare greedy outputs of differently batched rounds, and float32's noise
# can flip a near-tie (tests/test_adaptive_k.py's CPU says more)
DTYPE = "float64"


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    seed = random.randrange(1 << 20)
    cfg = tiny_config(vocab=128, hidden=32, heads=2, layers=3, q_lora=16, kv_lora=16, nope=8, rope=4, v=8,
                      experts=4, top_k=2, n_group=2, topk_group=1, moe_inter=16, inter=48)
    dcfg = tiny_draft_config(cfg, heads=2, kv_heads=1, inter=48, aux_ids=[0, 1, 2])
    return write_tiny_pair(str(tmp_path_factory.mktemp("overlap")), cfg, dcfg, seed=seed, scale=3.0)


def _order(monkeypatch) -> list[str]:
    """Records the scheduler's round launches ("L") and reads ("R") in the order they happen."""
    log: list[str] = []
    launch, finish = sched_mod.Scheduler._launch, sched_mod.Scheduler._finish

    def spy_launch(self, *a, **kw):
        log.append("L")
        return launch(self, *a, **kw)

    def spy_finish(self, *a, **kw):
        log.append("R")
        return finish(self, *a, **kw)

    monkeypatch.setattr(sched_mod.Scheduler, "_launch", spy_launch)
    monkeypatch.setattr(sched_mod.Scheduler, "_finish", spy_finish)
    return log


def _run(pair, overlap: bool, prompts, params, *, k=None, max_running=32, simulate=None, abort_after=None,
         context=None, logprobs=None):
    tpath, dpath = pair
    spec = dict(speculative_algorithm="EAGLE3", speculative_draft_model_path=dpath, speculative_num_steps=k,
                speculative_simulate_accept_length=simulate) if k else {}
    eng = Engine(model_path=tpath, device="cpu", dtype=DTYPE, max_running_requests=max_running,
                 disable_overlap_schedule=not overlap, context_length=context, **spec)
    sched = eng.scheduler.scheduler
    free0 = sched.runner.allocator.num_free
    lp = [{} if logprobs is None else dict(return_logprob=True, top_logprobs_num=n) for n in logprobs or prompts]
    reqs = [eng.make_request(input_ids=p, sampling_params=sp, **x) for p, sp, x in zip(prompts, params, lp,
                                                                                       strict=True)]
    for r in reqs:
        eng.scheduler.add(r)
    steps = 0
    while eng.scheduler.has_work():
        eng.scheduler.step()
        steps += 1
        if abort_after is not None and steps == abort_after:
            assert eng.scheduler.abort(reqs[0].rid)
    assert sched._ahead is None, "a round still in flight after the last request finished"
    assert sched.runner.allocator.num_free == free0, "pages leaked"
    st = sched.stats
    return ([(r.output_ids, r.finished_reason, r.verify_ct, r.output_token_logprobs, r.output_top_logprobs)
             for r in reqs],
            (st.verify_forwards, st.accepted_tokens, dict(st.accept_length_hist), st.generated_tokens))


def _compare(monkeypatch, pair, prompts, params, same=True, **kw):
    log_on = _order(monkeypatch)
    on = _run(pair, True, prompts, params, **kw)
    monkeypatch.undo()
    log_off = _order(monkeypatch)
    off = _run(pair, False, prompts, params, **kw)
    monkeypatch.undo()
    if same:
        assert on == off
    seq_on, seq_off = "".join(log_on), "".join(log_off)
    assert "LL" not in seq_off, f"overlap off, yet a round was queued behind an unread one: {seq_off}"
    if not any(p.get("stop_token_ids") for p in params) and "abort_after" not in kw and \
            kw.get("max_running", 32) >= len(prompts):
        # Token limits are foreseen: no round is queued behind one that ends every request it holds. (With a
        # queue, a round queued behind one that ends some of its requests serves the others before the next
        # admission, so the counts may differ there without waste.)
        assert seq_on.count("L") == seq_off.count("L"), f"wasted rounds: {seq_on} against {seq_off}"
    return seq_on, on


@pytest.mark.parametrize("k", [None, 1, 3])
def test_overlap_changes_nothing(monkeypatch, pair, k):
    """Batches whose requests finish in different rounds (lengths, EOS-like stop ids inside a round)."""
    rng = random.Random(random.randrange(1 << 30))
    prompts = [[rng.randrange(128) for _ in range(n)] for n in (5, 11, 2, 7)]
    params = [{"max_new_tokens": m, "temperature": 0} for m in (17, 9, 30, 1)]
    seq, (outs, _) = _compare(monkeypatch, pair, prompts, params, k=k)
    assert "LL" in seq, f"the overlap never queued a round ahead: {seq}"
    # A stop id the target emits mid-way (taken from the run): the request stops there in both modes.
    first = outs[2][0]
    if len(first) > 4:
        params[2] = {"max_new_tokens": 30, "temperature": 0, "stop_token_ids": [first[4]]}
        _, (outs2, _) = _compare(monkeypatch, pair, prompts, params, k=k)
        assert outs2[2][1]["type"] == "stop"


def test_overlap_with_queue_and_abort(monkeypatch, pair):
    """More prompts than running slots (admissions wait for the round in flight) and an abort between steps."""
    rng = random.Random(random.randrange(1 << 30))
    prompts = [[rng.randrange(128) for _ in range(n)] for n in (3, 8, 5, 2, 6)]
    params = [{"max_new_tokens": m, "temperature": 0} for m in (12, 5, 20, 8, 3)]
    seq, _ = _compare(monkeypatch, pair, prompts, params, k=2, max_running=2)
    assert "LL" in seq
    _compare(monkeypatch, pair, prompts, params, k=2, max_running=2, abort_after=3)
    _compare(monkeypatch, pair, prompts, params, k=None, max_running=2, abort_after=2)


def test_overlap_simulated_accept_and_sampling(monkeypatch, pair):
    """A pinned accept length (acceptance on the device) overlaps; so do sampled requests (their tokens drawn on
    the device, from noise fixed by their keys and positions), with the same outputs either way."""
    rng = random.Random(random.randrange(1 << 30))
    prompts = [[rng.randrange(128) for _ in range(n)] for n in (4, 9)]
    greedy = [{"max_new_tokens": 20, "temperature": 0}] * 2
    # The pinned accept lengths are drawn from one stream as rounds are queued, and a round queued behind one
    # that finishes a request draws for it too: the two modes' draws (hence outputs: benchmarking mode, not the
    # target's) may part after the first finish. What must hold: the pinned mean, every page back.
    seq, (_, (verify, accepted, _, _)) = _compare(monkeypatch, pair, prompts, greedy, same=False, k=3, simulate=2.5)
    assert "LL" in seq
    assert 2.0 <= accepted / verify <= 3.0
    sampled = [{"max_new_tokens": 12, "temperature": 0.8, "seed": 5}, {"max_new_tokens": 12, "temperature": 0}]
    for k in (None, 2):
        seq, _ = _compare(monkeypatch, pair, prompts, sampled, k=k)
        assert "LL" in seq, f"a batch with a sampled request did not run ahead: {seq}"


@pytest.mark.parametrize("k", [None, 2])
def test_overlap_with_logprobs(monkeypatch, pair, k):
    """Requests that return logprobs (with top lists of 3 and 2 and without one, sampled and greedy) overlap too:
    their logprobs are gathered on the device before the round behind rewrites the logits, and equal what the
    overlap off records."""
    rng = random.Random(random.randrange(1 << 30))
    prompts = [[rng.randrange(128) for _ in range(n)] for n in (6, 3, 9)]
    params = [{"max_new_tokens": 14, "temperature": 0}, {"max_new_tokens": 11, "temperature": 0.9, "seed": 3},
              {"max_new_tokens": 16, "temperature": 0}]
    log_on = _order(monkeypatch)
    on, stats_on = _run(pair, True, prompts, params, k=k, logprobs=(0, 3, 2))
    monkeypatch.undo()
    off, stats_off = _run(pair, False, prompts, params, k=k, logprobs=(0, 3, 2))
    assert "LL" in "".join(log_on), log_on
    assert stats_on == stats_off
    # Tokens equal; the values to float32 rounding: a round queued behind one that ended a request still holds its
    # row (dropped when read), so the batch's shape, and the CPU matmuls' last bits, differ from the overlap off
    # (1.2e-5 seen with k=2 on this peaky model; the bound is test_kv_integrity's for logprobs computed over other
    # shapes).
    for (ids, fin, vct, lps, tops), (ids2, fin2, vct2, lps2, tops2), n in zip(on, off, (0, 3, 2), strict=True):
        assert (ids, fin, vct) == (ids2, fin2, vct2)
        assert [row[1] for row in lps] == ids == [row[1] for row in lps2] and all(row[0] <= 0 for row in lps)
        assert torch.allclose(torch.tensor([row[0] for row in lps]), torch.tensor([row[0] for row in lps2]),
                              atol=1e-4, rtol=0)
        assert len(tops) == len(tops2) == (len(ids) if n else 0) and all(len(t) == n for t in tops)
        assert [[x[1] for x in t] for t in tops] == [[x[1] for x in t] for t in tops2]


@pytest.mark.parametrize("k", [None, 3])
def test_overlap_at_the_context_limit(monkeypatch, pair, k):
    """Requests that run up to the context limit (max_new_tokens cut to what the context leaves), in a batch with
    a short one: no round is queued whose positions could pass the page table's width."""
    rng = random.Random(random.randrange(1 << 30))
    prompts = [[rng.randrange(128) for _ in range(n)] for n in (21, 9, 3)]
    # max_new_tokens left out (128) is cut to what the context leaves; an explicit 1000 would be refused.
    params = [{"temperature": 0}, {"temperature": 0}, {"max_new_tokens": 5, "temperature": 0}]
    seq, (outs, _) = _compare(monkeypatch, pair, prompts, params, k=k, context=48)
    assert "LL" in seq
    assert all(o[1]["type"] == "length" for o in outs)


def test_advance_builds_what_build_builds(pair):
    """ModelRunner.advance (the next round's batch, on the device) against build() of the same rows from host state:
    random batches, widths, page sizes and steps, every field equal."""
    import torch

    rng = random.Random(random.randrange(1 << 30))
    for page_size in (1, 4, 16):
        tpath, _ = pair
        runner = Engine(model_path=tpath, device="cpu", page_size=page_size, context_length=96).scheduler.runner
        for _ in range(10):
            B, T = rng.randint(1, 5), rng.randint(1, 6)
            firsts = [rng.randint(0, 40) for _ in range(B)]
            steps = [rng.randint(1, T + 1) for _ in range(B)]
            pages = [rng.sample(range(1, runner.allocator.num_pages), -(-(f + steps[i] + T) // page_size))
                     for i, f in enumerate(firsts)]
            ids = [[rng.randrange(128) for _ in range(T)] for _ in range(B)]
            bt = runner.build([([0] * T, f, p) for f, p in zip(firsts, pages, strict=True)])
            got = runner.advance(bt, T, torch.tensor(steps), torch.tensor(ids), pages)
            want = runner.build([(i, f + s, p) for i, f, s, p in zip(ids, firsts, steps, pages, strict=True)])
            for name in ("input_ids", "positions", "page_table", "seq_lens", "out_cache_loc"):
                assert torch.equal(getattr(got, name), getattr(want, name)), (name, page_size, B, T)
