"""The adaptive draft length: switching k between rounds keeps the output lossless; the policy's estimates and
choices (runtime/adaptive.py) against brute-force references; the engine's start-up timing and reports."""

from __future__ import annotations

import dataclasses
import math
import random
import sys
from pathlib import Path

import pytest
import torch

from sglang_eagle3 import Engine
from sglang_eagle3.config import ConfigError
from sglang_eagle3.runtime.adaptive import CATCH_UP, DECODE, AdaptiveConfig, DraftLengthPolicy, RoundCosts
from sglang_eagle3.testing import tiny_config, tiny_draft_config, write_tiny_pair

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.simulate_adaptive import chain_accepts, simulate  # noqa: E402

# The lossless comparisons run in float64. In float32 the tiny pair's greedy logits differ by up to 1e-4 between
# batchings (plain decoding at batch 3 against batch 1 alone, as well as verify against decode), and among a few
# thousand fresh random tokens a top-2 gap that small turns up: CI once saw speculative output leave plain
# decoding's at such a tie. float64 takes the noise below 1e-6 (measured: 7e-7, the float32 logprobs' rounding),
# far below any gap these prompts meet.
CPU = {"device": "cpu", "dtype": "float64"}


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
    ref = Engine(model_path=tpath, **CPU).generate(input_ids=prompts, sampling_params=greedy)
    eng = Engine(model_path=tpath, **CPU, speculative_algorithm="EAGLE3", speculative_draft_model_path=dpath,
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


# -- the policy (runtime/adaptive.py) ------------------------------------------------------------------------------

def _costs(a: float, b: float, batches=(1, 4)) -> RoundCosts:
    """A round of k drafts costs a + b k at batch 1 (twice that at 4); a plain decode step a - b / 2; a resting
    draft's catch-up over 16 tokens 8 b, so that k = 0 costs a resting too (a decode step and 1/16 of a catch-up)."""
    costs = {(k, B): (a + b * k) * B ** 0.5 for k in range(0, 8) for B in batches}
    return RoundCosts(costs | {(DECODE, B): (a - b / 2) * B ** 0.5 for B in batches}
                      | {(CATCH_UP, B): 8 * b * B ** 0.5 for B in batches})


def test_acceptance_estimates_follow_the_chain():
    """Per-position acceptance given the positions before it, estimated from accept counts alone, against the rates
    the rounds were drawn with; E(k) against the product formula on the true rates. (The change test off: over
    3000 rounds of constant rates it fired 1.2 times on average, restarting the estimates from its recent window,
    and 3 of 40 seeds then missed these bounds.)"""
    rng = random.Random()
    true_p = [rng.uniform(0.3, 0.95) for _ in range(5)]
    pol = DraftLengthPolicy(AdaptiveConfig(candidates=(1, 3, 5), halflife_rounds=1e9, change_nats=math.inf),
                            _costs(1.0, 0.1))
    for _ in range(3000):
        pol.observe(5, [chain_accepts(rng, true_p, 5) for _ in range(4)])
    est = pol.acceptance()
    # the deeper positions are reached less often: their error bars are wider
    for i, (e, t) in enumerate(zip(est, true_p, strict=True)):
        reach = math.prod(true_p[:i])
        assert abs(e - t) < 4 * math.sqrt(t * (1 - t) / (12000 * reach)) + 0.01, (i, est, true_p)
    for k in (1, 3, 5):
        want = 1 + sum(math.prod(est[:j]) for j in range(1, k + 1))
        assert pol.expected_tokens(k) == pytest.approx(want, rel=1e-12)


def test_unreached_positions_borrow_the_one_before():
    """Rounds of 2 drafts tell nothing of positions 3..5: their estimates are position 2's (optimistic), so the
    policy will try a longer k when position 2 is accepted often."""
    pol = DraftLengthPolicy(AdaptiveConfig(candidates=(2, 5)), _costs(1.0, 0.1))
    for _ in range(50):
        pol.observe(2, [2, 2, 1, 2])
    p = pol.acceptance()
    assert p[2] == p[3] == p[4] == pytest.approx(p[1])


@pytest.mark.parametrize("trial", range(6))
def test_choice_maximises_predicted_throughput(trial):
    """With acceptance known (a fixed rate a position) and costs a + b k, the k chosen is the candidate of most
    expected tokens a second, computed here by brute force from the closed form (1 - p^(k+1)) / (1 - p). The change
    test is off: at a constant rate it fires under once in 1000 rounds, and one in the last few of the 4000 leaves the
    deep positions a handful of rounds of evidence (2 of 200 seeded trials chose k = 1 so, each with a fire in its
    last 11 rounds; none of 200 without it). The change test has its own tests (test_change_*)."""
    rng = random.Random()
    p, a, b = rng.uniform(0.2, 0.95), rng.uniform(1.0, 5.0), rng.uniform(0.05, 1.0)
    cands = (0, 1, 2, 3, 5, 7)
    pol = DraftLengthPolicy(AdaptiveConfig(candidates=cands, interval=1, halflife_rounds=1e9, min_gain=0.0,
                                           change_nats=math.inf), _costs(a, b))
    for _ in range(4000):  # every position reached: rounds of 7
        pol.observe(7, [chain_accepts(rng, [p] * 7, 7)])

    def rate(k, q):
        return (1 - q ** (k + 1)) / (1 - q) / (a + b * k)

    chosen = pol.choose(3, 1)
    # the estimate is within sampling error of p: the choice must be the best for some q near p, and within 2%
    # of the best rate at the true p
    assert rate(chosen, p) >= max(rate(k, p) for k in cands) * 0.98, (p, a, b, chosen)


def test_hysteresis_and_interval():
    pol = DraftLengthPolicy(AdaptiveConfig(candidates=(1, 3), interval=4, min_gain=1.0, halflife_rounds=1e9),
                            _costs(2.0, 0.1))
    for _ in range(3):
        pol.observe(3, [3])
        assert pol.choose(1, 1) == 1  # no decision before 4 rounds
    pol.observe(3, [3])
    rates = pol.predicted_rates(1)
    assert rates[3] > rates[1] and rates[3] < 2.0 * rates[1]
    assert pol.choose(1, 1) == 1  # better, but by less than min_gain
    big = DraftLengthPolicy(AdaptiveConfig(candidates=(1, 3), interval=4, min_gain=0.0, halflife_rounds=1e9),
                            _costs(2.0, 0.1))
    for _ in range(4):
        big.observe(3, [3])
    assert big.choose(1, 1) == 3 and big.switches == 1


@pytest.mark.parametrize("batch", [1, 2, 3, 5, 8, 13])
def test_first_decision_waits_for_evidence_not_rounds(batch):
    """The first decision comes once position 1 was checked first_evidence times or after interval rounds, whichever
    is first (a round of `batch` requests checks it `batch` times); every later one after interval rounds, whatever
    the batch. Drafts never accepted: each decision that is made leaves the configured k = 3 for a shorter one."""
    rng = random.Random()
    interval, evidence = rng.randint(3, 9), rng.randint(4, 20)
    pol = DraftLengthPolicy(AdaptiveConfig(candidates=(1, 3), interval=interval, first_evidence=evidence,
                                           min_gain=0.0, halflife_rounds=1e9), _costs(2.0, 0.5))
    first = min(interval, -(-evidence // batch))  # rounds until the first decision
    k = 3
    for r in range(1, first + 2 * interval + 1):
        pol.observe(k, [0] * batch)
        k_next = pol.choose(k, batch)
        due = r == first or (r > first and (r - first) % interval == 0)
        assert pol.decisions == (r >= first) + max(0, (r - first) // interval), (r, first, interval)
        assert (k_next != k) == (due and k == 3), (r, first, k, k_next)
        k = k_next
    with pytest.raises(ValueError, match="first_evidence=0"):
        AdaptiveConfig(candidates=(1,), first_evidence=0)


def test_policy_comes_back_up_after_acceptance_rises():
    """Poor drafts push k down to 1; when they turn good, the half-life forgets positions 2+'s old evidence and
    the policy climbs back to the longest candidate."""
    rng = random.Random()
    pol = DraftLengthPolicy(AdaptiveConfig(candidates=(1, 3, 5), halflife_rounds=32), _costs(3.0, 0.2))
    k = 3
    for _ in range(200):
        k = pol.choose(k, 1)
        pol.observe(k, [chain_accepts(rng, [0.1] * 5, k)])
    assert k == 1
    for _ in range(600):
        k = pol.choose(k, 1)
        pol.observe(k, [chain_accepts(rng, [0.97] * 5, k)])
    assert k == 5


def test_resting_policy_drafts_again_soon_after_acceptance_rises():
    """1000 rounds of a draft accepted 5% of the time rest it (k = 0, a catch-up every 16 rounds); when its
    acceptance turns 85%, the policy (the default config, each rested token checked at its catch-up) drafts again
    within 80 rounds, median of 9 runs (measured ~32). Fed only the rounds that checked a draft (before `1115be2`:
    resting rounds neither aged the evidence nor counted toward a decision) it takes more than 150 (measured ~270).
    Both without the change test (test_policy_rests_soon_after_acceptance_drops), which shortens either. Same costs
    as test_policy_keeps_up_with_the_best_fixed_k (benchmarks/simulate_adaptive.py's loop), fresh draws."""
    ms = {DECODE: 2.3, 0: 3.1, 1: 3.4, 3: 5.1, 5: 6.6, CATCH_UP: 4.0}
    costs = RoundCosts({(k, 1): v / 1e3 for k, v in ms.items()})
    rng = random.Random()
    for feeding, ok in (("tokens", lambda m: m <= 80), ("evidence", lambda m: m > 150)):
        back = []
        for _ in range(9):
            pol = DraftLengthPolicy(AdaptiveConfig(candidates=(0, 1, 3, 5), change_nats=math.inf), costs)
            _, _, first, _ = simulate(pol, [(0.05, 1000), (0.85, 2000)], rng, feeding=feeding)
            assert first[1] != 0, "the policy did not rest the poor draft"
            back.append(2000 if first[1] is None else first[1])
        assert ok(sorted(back)[4]), (feeding, back)


def test_policy_rests_soon_after_acceptance_drops():
    """1000 rounds of a draft accepted 85% of the time, then 500 at 5%: with the change test (the default config) the
    policy rests the draft within 25 rounds of the drop, median of 9 runs (measured ~7-12 at batch 1, ~5-6 at 16
    requests); without it (change_nats inf) the old passes must decay below the break-even rate at the 24-round
    half-life first: more than 32 rounds (measured ~48 and ~41). Same costs as the test above, fresh draws; the
    rounds counted are those before the policy first chose k = 0 in the second phase."""
    ms = {DECODE: 2.3, 0: 3.1, 1: 3.4, 3: 5.1, 5: 6.6, CATCH_UP: 4.0}
    costs = RoundCosts({(k, b): v / 1e3 * b ** 0.5 for k, v in ms.items() for b in (1, 16)})
    rng = random.Random()
    for batch in (1, 16):
        for nats, ok in ((AdaptiveConfig.change_nats, lambda m: m <= 25), (math.inf, lambda m: m > 32)):
            down, changes = [], []
            for _ in range(9):
                pol = DraftLengthPolicy(AdaptiveConfig(candidates=(0, 1, 3, 5), change_nats=nats), costs)
                _, _, _, rest = simulate(pol, [(0.85, 1000), (0.05, 500)], rng, batch=batch)
                down.append(500 if rest[1] is None else rest[1])
                changes.append(pol.changes)
            assert ok(sorted(down)[4]), (nats, batch, down)
            assert (nats < math.inf) == (sorted(changes)[4] >= 1), (nats, changes)


def test_change_evidence_against_windows_summed_by_hand():
    """The change test's statistic after random rounds (k = 0..4, a few requests, catch-up checks) against its
    definition computed from the whole history: the recent window and the long evidence as sums of each round's
    position-1 checks weighed by decay ** age, the older checks their difference, and the log-likelihood of both
    under a rate each (add-a-half) less that under one rate. And a change resets position 1 to the recent window."""
    rng = random.Random()
    h, hf = rng.uniform(10, 40), rng.uniform(2, 6)
    pol = DraftLengthPolicy(AdaptiveConfig(candidates=(0, 1, 4), halflife_rounds=h, change_halflife_rounds=hf,
                                           change_nats=math.inf), _costs(1.0, 0.1))
    history = []  # (checks of position 1, passed) a round
    p = rng.uniform(0.2, 0.9)
    for r in range(rng.randint(30, 90)):
        if r == 20:
            p = 1.0 - p
        k = rng.choice((0, 1, 4))
        acc = [chain_accepts(rng, p, k) for _ in range(rng.randint(0, 3))]
        checks = [int(rng.random() < p) for _ in range(rng.choice((0, 0, 5)))]
        pol.observe(k, acc, checks)
        history.append(((len(acc) if k else 0) + len(checks), (sum(a >= 1 for a in acc) if k else 0) + sum(checks)))

    def window(halflife):
        w = [0.5 ** ((len(history) - 1 - t) / halflife) for t in range(len(history))]
        return (sum(wi * n for wi, (n, _) in zip(w, history, strict=True)),
                sum(wi * s for wi, (_, s) in zip(w, history, strict=True)))

    def loglik(n, s, q):
        return s * math.log(q) + (n - s) * math.log(1 - q)

    (n_new, s_new), (n_all, s_all) = window(hf), window(h)
    n_old, s_old = n_all - n_new, s_all - s_new
    rate = (s_all + 0.5) / (n_all + 1)
    want = (loglik(n_new, s_new, (s_new + 0.5) / (n_new + 1)) + loglik(n_old, s_old, (s_old + 0.5) / (n_old + 1))
            - loglik(n_new, s_new, rate) - loglik(n_old, s_old, rate))
    assert pol.change_evidence() == pytest.approx(want, rel=1e-9, abs=1e-9)
    # a change: position 1 keeps the recent window only, deeper positions shrink by as much
    before = pol.acceptance()
    reached = list(pol._reached)
    pol._forget()
    assert (pol._reached[1], pol._passed[1]) == pytest.approx((n_new, s_new), rel=1e-9)
    if reached[2]:
        assert pol._reached[2] == pytest.approx(reached[2] * n_new / n_all, rel=1e-9)
    assert pol.acceptance()[1:] != before[1:] or not reached[2]


def test_change_decides_at_once():
    """After 200 rounds of k = 3 with every draft accepted, drafts that stop landing are a change within 4 rounds
    (measured: the first failure, against ~0.99 of the older checks), the round after it decides at once,
    mid-interval, and the policy leaves k = 3 within 40 failures (measured 26: at these costs the break-even rate
    is ~0.1, and the estimate now rests on the recent window); without the test (change_nats inf) it still drafts 3
    after 40 (measured: it leaves after 80)."""
    for nats in (AdaptiveConfig.change_nats, math.inf):
        pol = DraftLengthPolicy(AdaptiveConfig(candidates=(0, 1, 3), change_nats=nats), _costs(3.0, 0.3))
        k = pol.choose(3, 1)
        for _ in range(200):
            pol.observe(k, [k])
            k = pol.choose(k, 1)
        assert k == 3 and pol.changes == 0 and pol.acceptance()[0] > 0.95
        for failures in range(1, 41):
            due = pol._rounds_since_decision + 1 >= pol.config.interval  # (a decision due anyway)
            decisions, changes = pol.decisions, pol.changes
            pol.observe(k, [0])
            k = pol.choose(k, 1)
            if pol.changes > changes:  # this round's failure was the change: decided at once, due or not
                assert failures <= 4 and pol.decisions == decisions + 1 and pol.acceptance()[0] < 0.8, (due, failures)
            else:
                assert pol.decisions == decisions + due
            if k < 3:
                break
        assert (pol.changes == 1 and k < 3) if nats < math.inf else (pol.changes == 0 and k == 3), (nats, failures)
    with pytest.raises(ValueError, match="change_halflife_rounds=30"):
        AdaptiveConfig(candidates=(1,), change_halflife_rounds=30)


def test_step_up_tries_one_candidate_past_the_evidence():
    """After a rest (position 1 checked alone, accepted 90% of the time, the deeper positions' evidence decayed
    away), a decision picks no k past 3, the first candidate beyond position 1, though every longer k is priced as
    position 1 (borrowed) and 5 looks best; without step_up it jumps to 5. Once rounds of 3 have checked positions 2
    and 3 (accepted alike), 5 is reachable and chosen. Each choice is the best rate among the reachable candidates,
    computed by hand."""
    rng = random.Random()
    costs = _costs(3.0, 0.25)
    for step_up in (False, True):  # (the stepping policy goes on below)
        pol = DraftLengthPolicy(AdaptiveConfig(candidates=(0, 1, 3, 5), interval=1, step_up=step_up,
                                               change_nats=math.inf), costs)
        for _ in range(60):
            pol.observe(1, [int(rng.random() < 0.9) for _ in range(4)])
        assert pol._reached[2] == 0 and pol.reachable() == ((0, 1, 3) if step_up else (0, 1, 3, 5))
        rates = pol.predicted_rates(1)
        assert max(rates, key=rates.get) == 5
        want = max(pol.reachable(), key=lambda k: rates[k])
        assert pol.choose(0, 1) == want == (3 if step_up else 5)
    assert pol.config.step_up
    for _ in range(30):  # rounds of 3, positions 2 and 3 checked
        pol.observe(3, [chain_accepts(rng, 0.9, 3) for _ in range(4)])
    assert pol.reachable() == (0, 1, 3, 5) and pol.choose(3, 1) == 5
    with pytest.raises(ValueError, match="step_up=1"):
        AdaptiveConfig(candidates=(1,), step_up=1)


def test_resting_estimate_follows_the_draft_not_the_prior():
    """A draft accepted 2% of the time, 1200 rounds from k = 3: the policy rests it, and its position-1 estimate stays
    near 2% (median of 9 runs under 0.08; measured ~0.045) because each catch-up checks the proposal at every token
    it covers. With one check a catch-up (the forty-fourth session's scheduler) the 24-round half-life leaves about
    three observations' weight against the prior's two at 0.5: the estimate sat above 0.15 (measured ~0.23)."""
    ms = {DECODE: 2.3, 0: 3.1, 1: 3.4, 3: 5.1, 5: 6.6, CATCH_UP: 4.0}
    costs = RoundCosts({(k, 1): v / 1e3 for k, v in ms.items()})
    rng = random.Random()
    for feeding, ok in (("tokens", lambda p: p < 0.08), ("rounds", lambda p: p > 0.15)):
        est = []
        for _ in range(9):
            pol = DraftLengthPolicy(AdaptiveConfig(candidates=(0, 1, 3, 5)), costs)
            simulate(pol, [(0.02, 1200)], rng, feeding=feeding)
            est.append(pol.acceptance()[0])
        assert ok(sorted(est)[4]), (feeding, est)


def test_round_costs_buckets_and_errors():
    c = RoundCosts({(DECODE, 1): 1.0, (DECODE, 8): 2.0, (2, 1): 3.0, (2, 8): 5.0})
    assert c.batch_sizes == (1, 8)
    assert c.at(2, 1) == 3.0 and c.at(2, 3) == 5.0 and c.at(2, 8) == 5.0 and c.at(2, 16) == 10.0
    with pytest.raises(ValueError, match="positive finite"):
        RoundCosts({(DECODE, 1): 0.0})
    with pytest.raises(ValueError, match="lack draft lengths"):
        DraftLengthPolicy(AdaptiveConfig(candidates=(2, 3)), c)
    # k = 0 rests the draft (probe_rounds > 0): its cost is a decode step and a share of a catch-up, which must be timed
    c0 = RoundCosts(dict(c.seconds) | {(0, 1): 9.0, (0, 8): 9.0})
    with pytest.raises(ValueError, match=r"lack draft lengths \['catch_up'\]"):
        DraftLengthPolicy(AdaptiveConfig(candidates=(0, 2)), c0)
    assert DraftLengthPolicy(AdaptiveConfig(candidates=(0, 2), probe_rounds=0), c0).cost(0, 1) == 9.0
    c0 = RoundCosts(dict(c0.seconds) | {(CATCH_UP, 1): 0.4, (CATCH_UP, 8): 0.8})
    rest = DraftLengthPolicy(AdaptiveConfig(candidates=(0, 2), probe_rounds=4), c0)
    assert rest.cost(0, 1) == pytest.approx(1.1) and rest.cost(0, 5) == pytest.approx(2.2)
    assert rest.cost(2, 1) == 3.0 and rest.predicted_rates(1)[0] == pytest.approx(1 / 1.1)
    with pytest.raises(ValueError, match="probe_rounds=-1"):
        AdaptiveConfig(candidates=(0,), probe_rounds=-1)
    with pytest.raises(ValueError, match="candidates"):
        AdaptiveConfig(candidates=())
    pol = DraftLengthPolicy(AdaptiveConfig(candidates=(2,)), c)
    with pytest.raises(ValueError, match="outside"):
        pol.observe(2, [1, 3])
    with pytest.raises(ValueError, match="1 .passed. or 0, got \\[1, 2\\]"):
        pol.observe(2, [1], [1, 2])
    assert pol.rounds == 0 and pol.report(2, 1)["position_1_checks"] == 0  # (nothing counted from a refused round)


# -- in the engine ---------------------------------------------------------------------------------------------------
class _Cycling(DraftLengthPolicy):
    """Switches k at every decision (the scheduler's side of a switch, not the policy's judgement)."""

    def __init__(self, base: DraftLengthPolicy, order):
        super().__init__(dataclasses.replace(base.config, interval=1), base.costs)
        self.order, self.seen, self.calls = list(order), [], 0

    def observe(self, k, accepted, first_checks=()):
        self.seen.append((k, list(accepted)))
        super().observe(k, accepted, first_checks)

    def choose(self, current, batch, sampled=False):
        # each k for two steps: with the overlap, a switch's first step only reads the round in flight
        self.calls += 1
        return self.order[self.calls // 2 % len(self.order)]


def test_sampled_round_costs_price_a_sampled_batch():
    """RoundCosts' sampled table serves batches with sampled requests (greedy ones keep the greedy table, as does a
    RoundCosts timed without it), it must time what the greedy one does, and the policy's choice follows the kind:
    with the sampled rounds dearer than their decode step by more than the greedy ones, the same acceptance makes a
    greedy batch draft and a sampled one rest. Each choice against the best rate computed by hand from the policy's
    acceptance estimates and the kind's table."""
    rng = random.Random()
    a, b, extra = rng.uniform(2.0, 4.0), rng.uniform(0.2, 0.5), rng.uniform(0.15, 0.3)
    greedy = {(k, 1): (a + b * k) for k in (0, 1, 3)} | {(DECODE, 1): a - b / 2, (CATCH_UP, 1): 4 * b}
    # a sampled round: the sampler at each of its k + 1 rows (extra a row), the decode step's at one, a catch-up's
    # proposals drawn in one batch
    sampled = {(k, 1): (a + b * k + extra * (k + 1)) for k in (0, 1, 3)} | {
        (DECODE, 1): a - b / 2 + extra, (CATCH_UP, 1): 4 * b + extra}
    costs = RoundCosts(greedy, sampled=sampled)
    assert costs.at(3, 1) == greedy[(3, 1)] and costs.at(3, 1, sampled=True) == sampled[(3, 1)]
    assert RoundCosts(greedy).at(3, 1, sampled=True) == greedy[(3, 1)]
    assert costs.as_dict()["sampled"][3][1] == round(sampled[(3, 1)] * 1e3, 4)
    with pytest.raises(ValueError, match="sampled round costs must time what the greedy ones do"):
        RoundCosts(greedy, sampled={key: v for key, v in sampled.items() if key != (3, 1)})
    config = AdaptiveConfig(candidates=(0, 1, 3), interval=1, halflife_rounds=1e9, min_gain=0.0, prior_weight=1e-9,
                            change_nats=math.inf)

    def resting(table):
        return table[(DECODE, 1)] + table[(CATCH_UP, 1)] / config.probe_rounds

    # position 1 accepted at p, position 2 never (rounds of 3 accepting one draft): k = 1 against resting, whose
    # break-even rate is c(1) / c(rest) - 1; p between the two kinds' break-evens
    even_g, even_s = greedy[(1, 1)] / resting(greedy) - 1, sampled[(1, 1)] / resting(sampled) - 1
    assert even_g < even_s, (even_g, even_s)
    passes = round((even_g + even_s) / 2 * 1000)
    chosen = {}
    for kind, table in ((False, greedy), (True, sampled)):
        pol = DraftLengthPolicy(config, costs)
        pol.observe(3, [1] * passes + [0] * (1000 - passes))
        est = pol.acceptance()
        rate = {k: (1 + sum(math.prod(est[:j]) for j in range(1, k + 1))) / (table[(k, 1)] if k else resting(table))
                for k in (0, 1, 3)}
        chosen[kind] = pol.choose(3, 1, sampled=kind)
        assert chosen[kind] == max(rate, key=rate.get), (kind, rate)
    assert chosen == {False: 1, True: 0}
    assert pol.report(0, 1, sampled=True)["predicted_for"] == "sampled"
    assert pol.report(0, 1)["predicted_for"] == "greedy"


def test_scheduler_prices_rounds_by_the_batch_kind(pair):
    """The scheduler tells the policy whether the batch it chooses for runs the sampler (a sampled, penalized or
    grammar request in it), and the engine's start-up timed both kinds: greedy requests alone choose as greedy, a
    batch with one sampled request as sampled."""
    tpath, dpath = pair
    eng = Engine(model_path=tpath, **CPU, speculative_algorithm="EAGLE3", speculative_draft_model_path=dpath,
                 speculative_num_steps=3, speculative_adaptive=True, max_running_requests=3)
    sched = eng.backend.scheduler
    assert sched.adaptive.costs.sampled is not None
    kinds = []

    class Recording(DraftLengthPolicy):
        def choose(self, current, batch, sampled=False):
            kinds.append((batch, sampled))
            return super().choose(current, batch, sampled)

    sched.adaptive = Recording(sched.adaptive.config, sched.adaptive.costs)
    prompts = [[random.randrange(128) for _ in range(n)] for n in (5, 9)]
    eng.generate(input_ids=prompts, sampling_params={"max_new_tokens": 12, "temperature": 0})
    assert kinds and not any(s for _, s in kinds)
    kinds.clear()
    eng.generate(input_ids=prompts, sampling_params=[{"max_new_tokens": 12, "temperature": 0},
                                                     {"max_new_tokens": 12, "temperature": 0.7, "seed": 3}])
    assert any(s for b, s in kinds if b == 2) and all(s for b, s in kinds if b == 2), kinds


def test_time_rounds_sampled_kind_runs_the_sampler(pair, monkeypatch):
    """time_rounds(sampled=True) times the sampled round (sampled_round, temperature rows), the sampled decode step
    and a catch-up that draws a proposal at every row; the greedy kind none of them."""
    tpath, dpath = pair
    eng = Engine(model_path=tpath, **CPU, speculative_algorithm="EAGLE3", speculative_draft_model_path=dpath,
                 speculative_num_steps=2, speculative_num_steps_candidates=[0, 1], max_running_requests=2)
    runner = eng.backend.scheduler.runner
    seen = []
    for name in ("sampled_round", "catch_up", "sample"):
        real = getattr(runner, name)

        def spy(*args, _real=real, _name=name, **kw):
            samp = next((x for x in args if hasattr(x, "f")), None)
            seen.append((_name, None if samp is None else float(samp.f[0, 0])))
            return _real(*args, **kw)
        monkeypatch.setattr(runner, name, spy)
    greedy = runner.time_rounds((0, 1, 2), [1, 2], iters=1, min_seconds=0.0, catch_up_tokens=4)
    assert all(s is None for name, s in seen), seen
    seen.clear()
    sampled = runner.time_rounds((0, 1, 2), [1, 2], iters=1, min_seconds=0.0, catch_up_tokens=4, sampled=True)
    assert set(sampled) == set(greedy)
    names = {name for name, s in seen if s == pytest.approx(0.8)}
    assert names == {"sampled_round", "catch_up", "sample"}, seen


@pytest.mark.parametrize("overlap", [True, False])
def test_adaptive_switching_inside_the_scheduler_is_lossless(pair, overlap):
    """k changed by the scheduler's policy between rounds, with the overlap's round in flight or without: greedy
    output equals plain decoding's, every round's accept counts reach the policy with the k it drafted."""
    tpath, dpath = pair
    prompts = [[random.randrange(128) for _ in range(n)] for n in (5, 9, 2, 7)]
    greedy = {"max_new_tokens": 30, "temperature": 0}
    ref = Engine(model_path=tpath, **CPU).generate(input_ids=prompts, sampling_params=greedy)
    eng = Engine(model_path=tpath, **CPU, speculative_algorithm="EAGLE3", speculative_draft_model_path=dpath,
                 speculative_num_steps=3, speculative_adaptive=True, disable_overlap_schedule=not overlap,
                 max_running_requests=3)
    sched = eng.backend.scheduler
    sched.adaptive = _Cycling(sched.adaptive, [1, 5, 0, 3, 3, 0, 1])
    out = eng.generate(input_ids=prompts, sampling_params=greedy)
    assert [o["output_ids"] for o in out] == [o["output_ids"] for o in ref]
    ks = {k for k, _ in sched.adaptive.seen}
    assert ks == {1, 3, 5}, ks  # (a k = 0 round reports its position 1 as a round of 1)
    assert sched.stats.accept_length_hist.get(1, 0) > 0
    assert all(0 <= a <= k for k, acc in sched.adaptive.seen for a in acc)
    assert sched.runner.allocator.num_free == sched.runner.allocator.num_pages - 1


def test_adaptive_engine_times_rounds_and_moves_k(pair):
    """speculative_adaptive=True: the round costs are timed at start-up for every candidate and batch bucket (and
    leave the forward counts at zero), the tiny pair's poor drafts move k down to 0 (the draft following the target
    alone), the output stays the target's, and server info reports it; k cannot be set by hand then."""
    tpath, dpath = pair
    prompts = [[random.randrange(128) for _ in range(n)] for n in (5, 9, 2)]
    greedy = {"max_new_tokens": 40, "temperature": 0}
    ref = Engine(model_path=tpath, **CPU).generate(input_ids=prompts, sampling_params=greedy)
    eng = Engine(model_path=tpath, **CPU, speculative_algorithm="EAGLE3", speculative_draft_model_path=dpath,
                 speculative_num_steps=3, speculative_adaptive=True, max_running_requests=4)
    info = eng.get_server_info()
    assert info["forward_counts"] == {} or all(v["graph"] == v["eager"] == 0 for v in info["forward_counts"].values())
    ad = info["adaptive"]
    assert ad["candidates"] == [0, 1, 3, 5] and ad["rounds"] == 0
    sampled = ad["round_ms"].pop("sampled")  # the same rounds timed with sampled requests
    assert set(ad["round_ms"]) == set(sampled) == {DECODE, CATCH_UP, 0, 1, 3, 5}
    assert all(set(v) == {1, 2, 4} for v in (*ad["round_ms"].values(), *sampled.values()))
    out = eng.generate(input_ids=prompts, sampling_params=greedy)
    assert [o["output_ids"] for o in out] == [o["output_ids"] for o in ref]
    info = eng.get_server_info()
    hist = info["accept_length_hist"]
    assert sum(n * c for n, c in hist.items()) / sum(hist.values()) < 1.5  # the premise: poor drafts
    assert info["adaptive"]["rounds"] == info["verify_forwards"] or info["adaptive"]["rounds"] > 0
    # the cheapest rounds: 0 (a decode step, the draft resting) or 1, whichever the timing on this machine and the
    # acceptance seen put first at the last decision
    ad = info["adaptive"]
    assert info["speculative_num_steps"] in (0, 1) and ad["switches"] >= 1, ad
    assert ad["resting"] == (info["speculative_num_steps"] == 0) and ad["probe_rounds"] == 16
    assert 0 <= ad["changes"] <= ad["decisions"], ad  # (a change makes the next round decide)
    # the policy's evidence, undecayed: each request's round checks position 1 once, a resting one's when its catch-up
    # is read (a request's last rested rounds, up to probe_rounds - 1, never are)
    assert info["verify_forwards"] - 15 * len(prompts) <= ad["position_1_checks"] <= info["verify_forwards"], ad
    with pytest.raises(ConfigError, match="adaptive"):
        eng.set_speculative_num_steps(3)


def test_adaptive_change_test_knob(pair, monkeypatch):
    """SGLANG_EAGLE3_ADAPTIVE_CHANGE_NATS sets the change test's threshold when the engine starts (inf: no test, for
    A/B runs), SGLANG_EAGLE3_ADAPTIVE_STEP_UP whether a decision steps up; bad values are refused naming the
    variable, before any round runs."""
    tpath, dpath = pair
    kw = dict(model_path=tpath, device="cpu", speculative_algorithm="EAGLE3", speculative_draft_model_path=dpath,
              speculative_num_steps=3, speculative_adaptive=True, max_running_requests=2)
    test = Engine(**kw).get_server_info()["adaptive"]["change_test"]
    assert test == {"nats": AdaptiveConfig.change_nats, "halflife_rounds": AdaptiveConfig.change_halflife_rounds}
    monkeypatch.setenv("SGLANG_EAGLE3_ADAPTIVE_CHANGE_NATS", "inf")
    assert Engine(**kw).get_server_info()["adaptive"]["change_test"] is None
    for bad, err in (("0", ConfigError), ("lots", ValueError)):
        monkeypatch.setenv("SGLANG_EAGLE3_ADAPTIVE_CHANGE_NATS", bad)
        with pytest.raises(err, match=f"SGLANG_EAGLE3_ADAPTIVE_CHANGE_NATS.*{bad}"):
            Engine(**kw)
    monkeypatch.delenv("SGLANG_EAGLE3_ADAPTIVE_CHANGE_NATS")
    # and SGLANG_EAGLE3_ADAPTIVE_STEP_UP=0 lets a decision jump to any candidate
    assert Engine(**kw).get_server_info()["adaptive"]["step_up"] is True
    monkeypatch.setenv("SGLANG_EAGLE3_ADAPTIVE_STEP_UP", "0")
    assert Engine(**kw).get_server_info()["adaptive"]["step_up"] is False
    monkeypatch.setenv("SGLANG_EAGLE3_ADAPTIVE_STEP_UP", "yes")
    with pytest.raises(ValueError, match="SGLANG_EAGLE3_ADAPTIVE_STEP_UP='yes'"):
        Engine(**kw)


def test_adaptive_args():
    from sglang_eagle3.engine import EngineArgs

    assert EngineArgs(speculative_algorithm="EAGLE3", speculative_num_steps=4,
                      speculative_adaptive=True).step_candidates() == (0, 1, 4, 6)
    assert EngineArgs(speculative_algorithm="EAGLE3", speculative_num_steps=4, speculative_adaptive=True,
                      speculative_num_steps_candidates=(2,)).step_candidates() == (2, 4)
    assert EngineArgs(speculative_algorithm="EAGLE3", speculative_num_steps=16,
                      speculative_adaptive=True).step_candidates() == (0, 1, 16)
    with pytest.raises(ConfigError, match="speculative_adaptive=True given but speculative_algorithm is None"):
        EngineArgs(model_path="x", speculative_adaptive=True)
    with pytest.raises(ConfigError, match="speculative_adaptive='yes' must be True or False"):
        EngineArgs(speculative_adaptive="yes")
    with pytest.raises(ConfigError, match="speculative_adaptive_probe_rounds=-2 must be an integer >= 0"):
        EngineArgs(speculative_algorithm="EAGLE3", speculative_num_steps=4, speculative_adaptive_probe_rounds=-2)


def test_probe_rounds_reach_the_policy(pair):
    """speculative_adaptive_probe_rounds=0: the policy never rests the draft, so no catch-up is timed; 5: timed,
    and k = 0 costs a decode step and a fifth of a catch-up."""
    tpath, dpath = pair
    for probe in (0, 5):
        eng = Engine(model_path=tpath, **CPU, speculative_algorithm="EAGLE3",
                     speculative_draft_model_path=dpath, speculative_num_steps=2, speculative_adaptive=True,
                     speculative_adaptive_probe_rounds=probe, max_running_requests=2)
        pol = eng.backend.scheduler.adaptive
        assert pol.config.probe_rounds == probe and eng.get_server_info()["adaptive"]["probe_rounds"] == probe
        assert ((CATCH_UP, 1) in pol.costs.seconds) == bool(probe)
        want = pol.costs.at(0, 1) if not probe else pol.costs.at(DECODE, 1) + pol.costs.at(CATCH_UP, 1) / 5
        assert pol.cost(0, 1) == pytest.approx(want)


def test_catch_up_timing_stays_inside_the_page_table(pair):
    """time_rounds' catch-up rows sit where their prefill bucket (32 tokens here, for 5) ends inside the context, as
    a request's catch-up graph would replay them (past it, the timing would be of the eager fallback)."""
    tpath, dpath = pair
    eng = Engine(model_path=tpath, **CPU, speculative_algorithm="EAGLE3", speculative_draft_model_path=dpath,
                 speculative_num_steps=2, speculative_num_steps_candidates=[0], context_length=96, page_size=16)
    runner, seen = eng.backend.runner, []
    prefill_draft = runner.prefill_draft

    def spy(rows, aux):
        seen.extend(rows)
        return prefill_draft(rows, aux)

    runner.prefill_draft = spy
    times = runner.time_rounds((0, 2), [1, 2], iters=1, min_seconds=0.0, catch_up_tokens=5)
    assert {(k, b) for k, b in times} == {(k, b) for k in (DECODE, CATCH_UP, 0, 2) for b in (1, 2)}
    bucket = min(t for t in runner.prefill_tokens if t >= 5)
    assert seen and all(len(toks) == 5 and 0 < first and first + bucket <= runner.max_context
                        for toks, first, _ in seen), (seen[:2], bucket)
    assert runner.prefill_bucket(seen[:1]) == bucket


def test_draft_length_zero_with_sampling_and_penalties(pair):
    """k = 0 rounds (set by hand here) between rounds of 1 and 3, for sampled, filtered and penalized requests
    beside greedy ones: the tokens plain decoding gives (each sampled token is fixed by its request's key and
    position, sampling.py)."""
    tpath, dpath = pair
    prompts = [[random.randrange(128) for _ in range(n)] for n in (5, 9, 2, 7)]
    params = [{"max_new_tokens": 30, "temperature": 0}, {"max_new_tokens": 30, "temperature": 0.9, "seed": 5},
              {"max_new_tokens": 25, "temperature": 0.7, "top_p": 0.9, "top_k": 20, "seed": 2},
              {"max_new_tokens": 30, "temperature": 0, "frequency_penalty": 1.2, "repetition_penalty": 1.3}]
    ref = Engine(model_path=tpath, **CPU).generate(input_ids=prompts, sampling_params=params)
    eng = Engine(model_path=tpath, **CPU, speculative_algorithm="EAGLE3", speculative_draft_model_path=dpath,
                 speculative_num_steps=3, speculative_num_steps_candidates=[0, 1])
    reqs = [eng.make_request(input_ids=p, sampling_params=sp) for p, sp in zip(prompts, params, strict=True)]
    for r in reqs:
        eng.scheduler.add(r)
    done, step = {}, 0
    while len(done) < len(reqs):
        eng.set_speculative_num_steps((0, 0, 1, 3, 0)[step % 5])
        done.update({r.rid: r for r in eng.scheduler.step() if r.finished})
        step += 1
    assert [done[r.rid].output_ids for r in reqs] == [o["output_ids"] for o in ref]


@pytest.mark.parametrize("sampled", [False, True])
@pytest.mark.parametrize("probe_rounds", [0, 2])
def test_draft_length_zero_observes_the_drafts_first_position(probe_rounds, sampled):
    """A k = 0 round checks no draft, yet its target token tells whether the round before's d_1 was right: on the
    embedded pair (a trained draft) the policy's position-1 acceptance from rounds of 0 alone matches the share of
    k = 1 rounds that accepted their draft (the same greedy outputs, so nearly the same positions), within
    sampling error; a wrong comparison (with the new proposal, or none) would sit near 0. Resting (probe_rounds 2),
    the round after each catch-up checks the proposal the catch-up made for its token, and the catch-up itself the
    proposals of the rows before its last (runtime/adaptive.py): every token is evidence still, and a check against
    the wrong token (one row off) would again sit near 0. Sampled (temperature 0.8), every proposal is the draft's
    sample with the target's noise at its position, a catch-up's rows' too."""
    prompts = ["And God said,", "In the beginning", "The king of Israel", "And he answered"]
    greedy = ([{"max_new_tokens": 48, "temperature": 0.8, "seed": s} for s in range(len(prompts))] if sampled
              else {"max_new_tokens": 48, "temperature": 0})
    one = Engine(device="cpu", speculative_num_steps=1)
    one.generate(prompts, greedy)
    hist = one.get_server_info()["accept_length_hist"]
    share = hist.get(2, 0) / sum(hist.values())
    zero = Engine(device="cpu", speculative_num_steps=1, speculative_adaptive=True,
                  speculative_num_steps_candidates=[0], max_running_requests=len(prompts))  # (buckets up to 4 timed)
    sched = zero.backend.scheduler

    class Zero(DraftLengthPolicy):
        seen = caught = 0

        def choose(self, current, batch, sampled=False):
            return 0

        def observe(self, k, accepted, first_checks=()):
            self.seen += len(accepted) + len(first_checks)
            self.caught += len(first_checks)
            super().observe(k, accepted, first_checks)

    sched.adaptive = Zero(dataclasses.replace(sched.adaptive.config, probe_rounds=probe_rounds), sched.adaptive.costs)
    outs = zero.generate(prompts, greedy)
    assert [o["output_ids"] for o in outs] == [o["output_ids"] for o in one.generate(prompts, greedy)]
    p1, n = sched.adaptive.acceptance()[0], sched.adaptive.seen
    tokens = sum(len(o["output_ids"]) for o in outs)
    # every round reaches the policy, a resting one without evidence too (the half-life and interval are in rounds)
    counts = zero.get_server_info()["forward_counts"]
    rounds = counts["target_decode" if probe_rounds else "spec_round_sampled" if sampled else "spec_round"]
    assert sched.adaptive.rounds == rounds["graph"] + rounds["eager"] > 0, (sched.adaptive.rounds, rounds)
    # every token is evidence (resting: a catch-up's rows but the last as it is read; a request's last rested tokens
    # are never caught up on), a round's or a catch-up's
    assert 0.8 * tokens < n <= tokens and (sched.adaptive.caught > 0.3 * tokens) == bool(probe_rounds), (n, tokens)
    assert share > 0.3 and abs(p1 - share) < 4 * math.sqrt(share * (1 - share) / n) + 0.05, (p1, share, n)


@pytest.mark.parametrize("probe_rounds", [0, 16])
@pytest.mark.parametrize("p", [0.3, 0.5, 0.77, 0.9])
def test_policy_keeps_up_with_the_best_fixed_k(p, probe_rounds):
    """250 rounds from k = 3 with a constant acceptance a position and round costs like a small model's (decode
    2.3 ms; k = 0, 1, 3, 5: 3.1, 3.4, 5.1, 6.6; a resting draft's catch-up over 16 tokens 4 ms): the policy's tokens
    a second, over fresh random draws, within 5% of the best fixed candidate's expected rate (learning included),
    whichever that is. Resting (probe_rounds 16), k = 0 costs a decode step and 1/16 of a catch-up, and its rounds
    tell the policy of position 1 only once every 16, as the scheduler's do."""
    ms = {DECODE: 2.3, 0: 3.1, 1: 3.4, 3: 5.1, 5: 6.6, CATCH_UP: 4.0}
    costs = RoundCosts({(k, 1): v / 1e3 for k, v in ms.items()})
    config = AdaptiveConfig(candidates=(0, 1, 3, 5), probe_rounds=probe_rounds)
    cost = DraftLengthPolicy(config, costs).cost

    def fixed(k):
        return sum(p ** j for j in range(k + 1)) / cost(k, 1)

    rng, rates = random.Random(), []
    for _ in range(20):
        tokens, seconds, _, _ = simulate(DraftLengthPolicy(config, costs), [(p, 250)], rng)
        rates.append(tokens / seconds)
    assert sum(rates) / len(rates) >= 0.95 * max(fixed(k) for k in (0, 1, 3, 5)), (p, rates)


# -- the resting draft (k = 0 without the draft, caught up in one extend) ----------------------------------------------
class _Scripted(DraftLengthPolicy):
    """k by the scheduler's step count: ``ks[i]`` at step i, the last one after."""

    def __init__(self, base: DraftLengthPolicy, ks, probe_rounds: int):
        super().__init__(dataclasses.replace(base.config, interval=1, probe_rounds=probe_rounds), base.costs)
        self.ks, self.calls = list(ks), 0

    def choose(self, current, batch, sampled=False):
        self.calls += 1
        return self.ks[min(self.calls - 1, len(self.ks) - 1)]


def test_resting_draft_catches_up_where_k_zero_rounds_would_have_left_it(pair):
    """Twelve rounds at k = 0, then k = 2, without the overlap (a round a step in both): with the draft resting and
    caught up every 4 rounds (catch-ups of 4 tokens before rounds 5 and 9, and before k = 2) each request's next d_1 and
    draft hidden at the first round of 2 equal those of an engine whose k = 0 rounds ran the draft's one-token
    extend (the extend over n tokens computes each row as n one-token extends do, within float rounding); the
    kept rows never pass probe_rounds; the output is the target's."""
    tpath, dpath = pair
    prompts = [[random.randrange(128) for _ in range(n)] for n in (6, 3)]
    greedy = {"max_new_tokens": 24, "temperature": 0}
    ref = Engine(model_path=tpath, **CPU).generate(input_ids=prompts, sampling_params=greedy)
    states = {}
    for probe in (0, 4):
        eng = Engine(model_path=tpath, **CPU, speculative_algorithm="EAGLE3",
                     speculative_draft_model_path=dpath, speculative_num_steps=2, speculative_adaptive=True,
                     speculative_num_steps_candidates=[0], disable_overlap_schedule=True)
        sched = eng.backend.scheduler
        sched.adaptive = _Scripted(sched.adaptive, [0] * 12 + [2], probe)  # (no choice at step 0: none running)
        launch, most = sched._launch, [0]

        def spy(reqs, bt, hidden, samp=None, sched=sched, launch=launch, probe=probe, most=most):
            most[0] = max([most[0], *(len(v) for v in sched._pending_aux.values())])
            if sched.num_steps == 2 and probe not in states:
                states[probe] = {r.rid[-1:] + str(i): (r.next_draft_token, sched._draft_hidden[r.rid].clone(),
                                                        len(r.output_ids)) for i, r in enumerate(reqs)}
            return launch(reqs, bt, hidden, samp)

        sched._launch = spy
        out = eng.generate(input_ids=prompts, sampling_params=greedy, rid=["a", "b"])
        assert [o["output_ids"] for o in out] == [o["output_ids"] for o in ref]
        assert most[0] == (0 if probe == 0 else 3), most  # (a catch-up once 4 are kept: before their round)
        if probe:
            assert not sched._pending_aux  # caught up when k went to 2
    assert states[0].keys() == states[4].keys()
    for key, (tok, hid, n) in states[4].items():
        tok0, hid0, n0 = states[0][key]
        assert n == n0 == 13 and tok == tok0  # the prefill's token and 12 rounds
        # float rounding scales with the row's largest entries (~1e2 here: 4-9e-5 apart, a few ulp of them), so the
        # absolute slack does too; a wrong position or a missed catch-up is off by the entries' own size
        torch.testing.assert_close(hid, hid0, rtol=1e-4, atol=1e-5 * float(hid0.abs().max()))


@pytest.mark.parametrize("overlap", [True, False])
def test_resting_draft_is_lossless_with_sampling_penalties_and_logprobs(pair, overlap):
    """Stretches at k = 0 with the draft resting (catch-ups every 3 rounds and whenever k turns positive), between
    rounds of 1 and 3, for greedy, sampled, filtered, penalized and logprob requests together: the tokens and
    logprobs plain decoding gives."""
    tpath, dpath = pair
    prompts = [[random.randrange(128) for _ in range(n)] for n in (5, 9, 2, 7)]
    params = [{"max_new_tokens": 30, "temperature": 0}, {"max_new_tokens": 30, "temperature": 0.9, "seed": 5},
              {"max_new_tokens": 25, "temperature": 0.7, "top_p": 0.9, "top_k": 20, "seed": 2},
              {"max_new_tokens": 30, "temperature": 0, "frequency_penalty": 1.2, "repetition_penalty": 1.3}]
    logprob = [True, False, True, False]
    ref = Engine(model_path=tpath, **CPU).generate(input_ids=prompts, sampling_params=params,
                                                          return_logprob=logprob, top_logprobs_num=2)
    eng = Engine(model_path=tpath, **CPU, speculative_algorithm="EAGLE3", speculative_draft_model_path=dpath,
                 speculative_num_steps=3, speculative_adaptive=True, disable_overlap_schedule=not overlap)
    sched = eng.backend.scheduler
    sched.adaptive = _Scripted(sched.adaptive, ([0] * 9 + [1, 1, 3, 3] + [0] * 4 + [3]) * 4, 3)
    out = eng.generate(input_ids=prompts, sampling_params=params, return_logprob=logprob, top_logprobs_num=2)
    assert [o["output_ids"] for o in out] == [o["output_ids"] for o in ref]
    for o, r, lp in zip(out, ref, logprob, strict=True):
        if lp:
            got, want = o["meta_info"]["output_token_logprobs"], r["meta_info"]["output_token_logprobs"]
            assert [t for _, t, _ in got] == [t for _, t, _ in want]
            assert [v for v, _, _ in got] == pytest.approx([v for v, _, _ in want], abs=1e-4)
    assert sched.stats.accept_length_hist.get(1, 0) > 0 and not sched._pending_aux


def test_overlapped_catch_ups_leave_the_draft_where_k_zero_rounds_do(pair):
    """With the overlap, a resting draft's catch-up covers the rounds read and is queued behind the round in flight
    (its proposal is for that round's token): after every catch-up, each request's draft hidden and proposal equal
    those an engine whose k = 0 rounds ran the draft's extend had after reading as many tokens (within float
    rounding); the output is the target's."""
    tpath, dpath = pair
    prompts = [[random.randrange(128) for _ in range(n)] for n in (6, 3)]
    greedy = {"max_new_tokens": 30, "temperature": 0}
    ref = Engine(model_path=tpath, **CPU).generate(input_ids=prompts, sampling_params=greedy)
    states: dict[int, dict] = {0: {}, 4: {}}
    for probe in (0, 4):
        eng = Engine(model_path=tpath, **CPU, speculative_algorithm="EAGLE3",
                     speculative_draft_model_path=dpath, speculative_num_steps=2, speculative_adaptive=True,
                     speculative_num_steps_candidates=[0])
        sched, seen = eng.backend.scheduler, states[probe]
        sched.adaptive = _Scripted(sched.adaptive, [0], probe)

        def record(reqs, sched=sched, seen=seen):
            sched._read_proposals()
            for r in reqs:
                if r.output_ids and r.rid in sched._draft_hidden:
                    seen[(r.rid, len(r.output_ids))] = (r.next_draft_token, sched._draft_hidden[r.rid].clone())

        if probe:  # the resting draft's state is whole right after a catch-up
            extend = sched._extend_draft

            def spy(reqs, rows, aux, samp, lazy=False, checks=None, extend=extend, record=record):
                extend(reqs, rows, aux, samp, lazy, checks)
                record(reqs)

            sched._extend_draft = spy
        else:  # the extending draft's, after each round read
            finish = sched._finish

            def spy(rnd, in_flight=False, finish=finish, record=record):
                changed = finish(rnd, in_flight)
                record(rnd.reqs)
                return changed

            sched._finish = spy
        out = eng.generate(input_ids=prompts, sampling_params=greedy, rid=["a", "b"])
        assert [o["output_ids"] for o in out] == [o["output_ids"] for o in ref]
    assert len(states[4]) >= 8 and set(states[4]) <= set(states[0]), (sorted(states[4]), sorted(states[0]))
    for key, (tok, hid) in states[4].items():
        assert tok == states[0][key][0], key
        # (float32 sums in another order: the catch-up extends n rows at once; a wrong row or position differs by O(1))
        torch.testing.assert_close(hid, states[0][key][1], rtol=1e-4, atol=1e-4)


def test_simulate_adaptive_script(tmp_path):
    """benchmarks/simulate_adaptive.py on the checked-in Kimi slice costs: every scenario under the three feedings
    (the scheduler's with the change test and without),
    rates no better than the oracle's by more than the draws allow; a JSON without a timed catch-up is refused by
    name."""
    import json
    import subprocess

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "simulate_adaptive.py"
    out = tmp_path / "sim.json"
    proc = subprocess.run([sys.executable, str(script), "--runs", "3", "--out", str(out)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads(out.read_text())
    assert res["round_ms"]["catch_up"] and len(res["scenarios"]) >= 5
    for row in res["scenarios"]:
        # the scheduler's feeding with the change test and without, the two older feedings without, the default
        # without stepping up
        assert len(row["variants"]) == 5, row
        for v in row["variants"].values():
            assert 0.5 < v["of_oracle"] < 1.05, row
    # --batch: one policy over a batch, at the costs the run timed for that bucket (refused by name where it timed none)
    c16 = script.parents[0] / "results" / "h200" / "e2e_rest_kimi_c16_2f3662c.json"
    proc = subprocess.run([sys.executable, str(script), "--runs", "1", "--costs", str(c16), "--batch", "16", "--out",
                           str(out)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads(out.read_text())
    assert res["batch"] == 16 and set(res["round_ms"]["decode"]) == {"16"}
    assert all(0.5 < v["of_oracle"] < 1.05 for row in res["scenarios"] for v in row["variants"].values())
    proc = subprocess.run([sys.executable, str(script), "--batch", "16"], capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "not --batch 16" in proc.stderr
    bad = tmp_path / "no_adaptive.json"
    bad.write_text(json.dumps({"runs": [{"name": "baseline"}]}))
    proc = subprocess.run([sys.executable, str(script), "--costs", str(bad)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode != 0 and "no adaptive run with a timed catch-up" in proc.stderr
