"""Sampling under speculation has exactly the target's distribution.

Statistic: Pearson chi-square of observed counts against exact expected probabilities, with cells whose
expected count is below 5 merged into one; a test passes when its p-value is above ``P_MIN`` = 1e-4 (seeds are
fixed, so each test is deterministic; a correct sampler fails one of these with probability ~1e-4). Each
engine-level test also checks its own power: the same samples must REJECT (p < 1e-8) a nearby wrong
distribution (e.g. the one without the top_p / top_k truncation, or at temperature 1 instead of 0.7).

The exact target distribution is computed here, independently of runtime/sampling.py: full-sequence
``forward_dense`` logits for every prefix, then temperature / top_k / top_p / min_p applied by ``ref_probs``
below (top_k, then min_p, then top_p over the remaining renormalised mass; top_p keeps the smallest set of
most likely tokens whose mass reaches top_p).
"""

from __future__ import annotations

import itertools
from collections import Counter

import pytest
import torch
from conftest import PatchedDraft, scheduler_of, small_config, small_draft_config

from sglang_eagle3 import Engine
from sglang_eagle3.runtime.sampling import SamplingParams, accept_draft, processed_probs

pytestmark = pytest.mark.usefixtures("torch_one_thread")

P_MIN = 1e-4


# ------------------------------------------------------------------------------------------------------------
# Statistics and the reference distribution
# ------------------------------------------------------------------------------------------------------------
def chi_square_pvalue(counts: Counter, probs: dict, n: int) -> tuple[float, float, int]:
    """(p-value, statistic, dof) of counts vs probs; cells with expected < 5 are merged into one bin.
    An observed outcome with zero probability gives p = 0."""
    if any(probs.get(x, 0.0) == 0.0 for x in counts):
        return 0.0, float("inf"), 0
    big = {x: p for x, p in probs.items() if p * n >= 5}
    cells = sorted(((counts.get(x, 0), p * n) for x, p in big.items()), key=lambda c: c[1])
    rest = (n - sum(o for o, _ in cells), (1.0 - sum(big.values())) * n)
    if rest[1] >= 5 or not cells:
        cells.append(rest)
    elif rest[1] > 1e-9:  # too small a bin on its own: merge it into the smallest cell
        cells[0] = (cells[0][0] + rest[0], cells[0][1] + rest[1])
    stat = sum((o - e) ** 2 / e for o, e in cells)
    dof = len(cells) - 1
    p = torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                torch.tensor(stat / 2, dtype=torch.float64)).item()
    return p, stat, dof


def ref_probs(logits: torch.Tensor, temperature: float = 1.0, top_p: float = 1.0, top_k: int = -1,
              min_p: float = 0.0) -> torch.Tensor:
    """Independent reference for the processed distribution of one row of logits [V] (float64)."""
    p = torch.softmax(logits.double() / temperature, -1)
    order = p.argsort(descending=True).tolist()
    keep = set(order[:top_k] if top_k > 0 else order)
    if min_p > 0:
        keep = {i for i in keep if p[i] >= min_p * p.max()}
    if top_p < 1:
        mass = sum(p[i].item() for i in keep)
        kept, acc = set(), 0.0
        for i in order:
            if i in keep and acc < top_p * mass:
                kept.add(i)
                acc += p[i].item()
        keep = kept
    out = torch.zeros_like(p)
    idx = torch.tensor(sorted(keep))
    out[idx] = p[idx]
    return out / out.sum()


def test_chi_square_helper_detects_a_biased_coin():
    g = torch.Generator().manual_seed(0)
    draws = (torch.rand(20000, generator=g) < 0.52).long().tolist()
    c = Counter(draws)
    assert chi_square_pvalue(c, {0: 0.48, 1: 0.52}, 20000)[0] > P_MIN
    assert chi_square_pvalue(c, {0: 0.5, 1: 0.5}, 20000)[0] < 1e-6


PARAM_SETS = [
    dict(temperature=1.0),
    dict(temperature=0.7, top_p=0.9),
    dict(temperature=0.7, top_k=3),
    dict(temperature=1.3, min_p=0.1),
]


@pytest.mark.parametrize("params", PARAM_SETS, ids=lambda d: "-".join(f"{k}{v}" for k, v in d.items()))
def test_processed_probs_matches_reference(params):
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(64, 33, generator=g) * 2.5
    got = processed_probs(logits, SamplingParams(**params)).double()
    want = torch.stack([ref_probs(row, **params) for row in logits])
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)


# ------------------------------------------------------------------------------------------------------------
# accept_draft on its own
# ------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("params,draft_rank", [
    (dict(temperature=1.0), 0),  # draft = the most likely token
    (dict(temperature=1.0), 4),
    (dict(temperature=0.7, top_p=0.9), 1),
    (dict(temperature=0.7, top_k=3), 6),  # draft outside the top-k: p(d) = 0, always rejected
], ids=["t1-argmax", "t1-rank4", "t0.7-topp0.9", "topk3-outside"])
def test_accept_draft_emits_the_target_distribution(params, draft_rank):
    """k=1: the first emitted token ~ p0 whatever the draft; after an accepted draft the bonus token ~ p1."""
    V, M = 8, 6000
    g = torch.Generator().manual_seed(draft_rank * 7 + len(params))
    logits = torch.randn(2, V, generator=g) * 1.5
    p0, p1 = ref_probs(logits[0], **params), ref_probs(logits[1], **params)
    d = int(torch.softmax(logits[0], -1).argsort(descending=True)[draft_rank])
    sp = SamplingParams(**params)
    first, bonus = Counter(), Counter()
    for _ in range(M):
        a, nxt = accept_draft(logits, [d], sp, g)
        assert a in (0, 1)
        first[d if a == 1 else nxt] += 1
        if a == 1:
            bonus[nxt] += 1
        else:
            assert nxt != d, "a rejected draft token was emitted as the correction"
    dist0 = {i: p0[i].item() for i in range(V)}
    pv, stat, dof = chi_square_pvalue(first, dist0, M)
    assert pv > P_MIN, (f"first token: chi2={stat:.1f} dof={dof} p={pv:.2e}", first, dist0)
    n_acc = sum(bonus.values())
    if p0[d] == 0:
        assert n_acc == 0
    else:
        pv, stat, dof = chi_square_pvalue(bonus, {i: p1[i].item() for i in range(V)}, n_acc)
        assert pv > P_MIN, f"bonus token after acceptance: chi2={stat:.1f} dof={dof} p={pv:.2e}"


def test_accept_draft_chain_positions():
    """k=3 under a target that is one-hot on the draft at rows 0-1, near 50/50 between 3 and the draft's 4 at
    row 2, and uniform at row 3: a is 2 (correction 3, never the rejected 4) or 3 (bonus uniform over V)."""
    V = 6
    logits = torch.full((4, V), -30.0)
    logits[0, 1] = logits[1, 2] = 30.0
    logits[2, 3], logits[2, 4] = 0.1, 0.0
    logits[3] = 0.0
    g = torch.Generator().manual_seed(0)
    seen = Counter(accept_draft(logits, [1, 2, 4], SamplingParams(temperature=1.0), g) for _ in range(600))
    assert {a for a, _ in seen} == {2, 3}, seen
    assert all(nxt == 3 for a, nxt in seen if a == 2), seen
    assert 220 < seen[(2, 3)] < 410, seen
    assert {nxt for a, nxt in seen if a == 3} == set(range(V)), seen
    # Greedy: the longest agreeing prefix of the argmax chain, then the target's token.
    assert accept_draft(logits, [1, 2, 4], SamplingParams(temperature=0), None) == (2, 3)
    assert accept_draft(logits, [5, 2, 4], SamplingParams(temperature=0), None) == (0, 1)
    assert accept_draft(logits, [1, 2, 3], SamplingParams(top_k=1), None) == (3, 0)


# ------------------------------------------------------------------------------------------------------------
# End to end: the engine's samples vs the exact target distribution
# ------------------------------------------------------------------------------------------------------------
PROMPT = [3, 7, 1, 12, 5]
VOCAB = 16


@pytest.fixture(scope="module")
def vocab16_pair(make_pair):
    cfg = small_config(vocab=VOCAB)
    return make_pair(cfg, small_draft_config(cfg, draft_vocab=12), seed=5, scale=2.0)


@pytest.fixture(scope="module")
def exact_logits(vocab16_pair):
    """Target logits [V] after PROMPT + every continuation of 0, 1 and 2 tokens: {tuple(continuation): logits}."""
    engine = Engine(model_path=vocab16_pair.target, device="cpu", dtype="float32", skip_tokenizer_init=True)
    model = engine.runner.target
    conts = [()] + [(a,) for a in range(VOCAB)] + list(itertools.product(range(VOCAB), repeat=2))
    table = {}
    with torch.inference_mode():
        for L in (0, 1, 2):
            group = [c for c in conts if len(c) == L]
            ids = torch.tensor([PROMPT + list(c) for c in group])
            logits, _ = model.forward_dense(ids)
            table.update({c: logits[i, -1] for i, c in enumerate(group)})
    return table


def joint_probs(table, params: dict, n_tokens: int) -> dict:
    """Exact probability of each sequence of n_tokens generated after PROMPT."""
    out = {(): 1.0}
    for _ in range(n_tokens):
        nxt = {}
        for seq, p in out.items():
            row = ref_probs(table[seq], **params)
            for t in torch.nonzero(row).flatten().tolist():
                nxt[seq + (t,)] = p * row[t].item()
        out = nxt
    return out


def argmax_draft(table):
    """PatchedDraft proposals = the target's argmax after the request's actual prefix (committed tokens + the
    tokens drafted this round): at these temperatures drafts are accepted about half the time, so both the
    accept and the reject branch run often."""

    def propose(r, prefix):
        cont = prefix[len(PROMPT):]
        return int(table[cont].argmax()) if cont in table else 0

    return propose


def sample_sequences(pair, params: dict, n: int, *, draft: str | None, table=None, k: int = 2,
                     seed0: int = 0) -> tuple[Counter, dict]:
    spec = {} if draft is None else dict(speculative_algorithm="EAGLE3", speculative_draft_model_path=pair.draft,
                                         speculative_num_steps=k)
    engine = Engine(model_path=pair.target, device="cpu", dtype="float32", skip_tokenizer_init=True,
                    max_running_requests=1024, max_total_tokens=1024 * 32, page_size=16, **spec)
    if draft == "argmax":
        PatchedDraft(engine, argmax_draft(table))
    sps = [dict(params, max_new_tokens=3, seed=seed0 + i) for i in range(n)]
    outs = engine.generate(input_ids=[PROMPT] * n, sampling_params=sps)
    hist = dict(scheduler_of(engine).stats.accept_length_hist) if draft else {}
    return Counter(tuple(o["output_ids"]) for o in outs), hist


ENGINE_CASES = [
    # (params, draft, wrong params for the power check)
    (dict(temperature=0.7, top_p=0.9), "argmax", dict(temperature=0.7)),
    (dict(temperature=0.7, top_k=4), "argmax", dict(temperature=0.7)),
    (dict(temperature=0.7, top_p=0.9), "real", dict(temperature=0.7)),
    (dict(temperature=0.7, top_p=0.9), None, dict(temperature=0.7)),
]


@pytest.mark.parametrize("params,draft,wrong", ENGINE_CASES,
                         ids=["topp-argmax", "topk-argmax", "topp-realdraft", "topp-nospec"])
def test_engine_joint_distribution_of_three_tokens(vocab16_pair, exact_logits, params, draft, wrong):
    """Joint distribution of (x1, x2, x3) after a fixed prompt, k=2: x1 comes from prefill, x2 and x3 from the
    first verify round (accepted drafts or corrections) or the second."""
    n = 3000
    counts, hist = sample_sequences(vocab16_pair, params, n, draft=draft, table=exact_logits)
    exact = joint_probs(exact_logits, params, 3)
    pv, stat, dof = chi_square_pvalue(counts, exact, n)
    assert pv > P_MIN, f"{params} draft={draft}: chi2={stat:.1f} dof={dof} p={pv:.2e} (accept hist {hist})"
    # Power: these samples are far enough from a nearby wrong distribution to reject it.
    assert chi_square_pvalue(counts, joint_probs(exact_logits, wrong, 3), n)[0] < 1e-8
    if draft == "argmax":
        # Both branches ran many times: rounds with 0, 1 and 2 accepted drafts.
        assert min(hist.get(a, 0) for a in (1, 2, 3)) > 300, hist
