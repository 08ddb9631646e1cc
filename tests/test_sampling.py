"""Sampling under speculation has exactly the target's distribution, and is the same with speculation off.

Statistic: Pearson chi-square of observed counts against exact expected probabilities, with cells whose
expected count is below 5 merged into one; a test passes when its p-value is above ``P_MIN`` = 1e-4 (seeds are
fixed, so each test is deterministic; a correct sampler fails one of these with probability ~1e-4). Each
engine-level test also checks its own power: the same samples must REJECT (p < 1e-8) a nearby wrong
distribution (e.g. the one without the top_p / top_k truncation, or at temperature 1 instead of 0.7).

The exact target distribution is computed here, independently of runtime/sampling.py: full-sequence
``forward_dense`` logits for every prefix, then temperature / top_k / top_p / min_p applied by ``ref_probs``
below (top_k, then min_p, then top_p over the remaining renormalised mass; top_p keeps the smallest set of
most likely tokens whose mass reaches top_p).

The sampler (runtime/sampling.py) draws a token as the Gumbel-max of its row with noise hashed from the request's
key and the position, so with a seed the output is a function of the seed: the tests also check that speculation
(any k, any batch) returns exactly what plain decoding returns for the same seeds.
"""

from __future__ import annotations

import itertools
from collections import Counter

import pytest
import torch
from conftest import PatchedDraft, scheduler_of, small_config, small_draft_config

from sglang_eagle3 import Engine
from sglang_eagle3.runtime.sampling import (
    ALL_FILTERS,
    UNRANKED,
    Filters,
    SamplingParams,
    draft_candidates,
    draft_tokens,
    filtered_scores,
    sample_tokens,
    sampling_key,
    sampling_rows,
)

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


def sampler_inputs(param_rows: list[dict], keys: list[int]):
    f, i = sampling_rows([SamplingParams(**p) for p in param_rows], keys)
    return torch.tensor(f, dtype=torch.float32), torch.tensor(i, dtype=torch.int64)


def test_filtered_scores_match_reference():
    """Every parameter set of PARAM_SETS on rows of one batch (each row its own parameters): the softmax of the
    filtered scores is the reference's processed distribution."""
    g = torch.Generator().manual_seed(1)
    rows = [PARAM_SETS[i % len(PARAM_SETS)] for i in range(40)] + [dict(temperature=0.9, top_k=5, top_p=0.8,
                                                                        min_p=0.05)] * 8
    logits = torch.randn(len(rows), 33, generator=g) * 2.5
    samp_f, samp_i = sampler_inputs(rows, [0] * len(rows))
    z = filtered_scores(logits, samp_f[:, 0], samp_f[:, 1], samp_i[:, 0], samp_f[:, 2])
    want = torch.stack([ref_probs(row, **p) for row, p in zip(logits, rows, strict=True)])
    torch.testing.assert_close(torch.softmax(z.double(), -1), want, atol=1e-6, rtol=0)


def draws(logits: torch.Tensor, params: dict, keys: list[int], positions: list[int]) -> Counter:
    """The sampler's tokens for one row of logits [V], once per (key, position)."""
    n = len(keys)
    samp_f, samp_i = sampler_inputs([params] * n, keys)
    toks = sample_tokens(logits.expand(n, -1), samp_f, samp_i, torch.tensor(positions))
    return Counter(toks.tolist())


@pytest.mark.parametrize("params", PARAM_SETS + [dict(temperature=0.5, top_k=6, top_p=0.7)],
                         ids=lambda d: "-".join(f"{k}{v}" for k, v in d.items()))
def test_sampler_draws_the_processed_distribution(params):
    """Over many seeds at one position, and over many positions of one seed, the tokens follow the reference's
    processed distribution; the same draws reject the distribution without the filters (or at temperature 1)."""
    V, M = 24, 6000
    g = torch.Generator().manual_seed(len(params) + int(params["temperature"] * 10))
    logits = torch.randn(V, generator=g)
    exact = ref_probs(logits, **params)
    assert (exact > 0.02).sum() >= 3, exact  # a spread to test (no one token taking it all)
    wrong = ref_probs(logits, temperature=1.0 if params["temperature"] != 1.0 else 0.7)
    for keys, pos in (([sampling_key(s) for s in range(M)], [77] * M), ([sampling_key(3)] * M, list(range(M)))):
        c = draws(logits, params, keys, pos)
        pv, stat, dof = chi_square_pvalue(c, {i: exact[i].item() for i in range(V)}, M)
        assert pv > P_MIN, (f"chi2={stat:.1f} dof={dof} p={pv:.2e}", c)
        assert chi_square_pvalue(c, {i: wrong[i].item() for i in range(V)}, M)[0] < 1e-8


def test_sampler_tokens_depend_on_key_and_position_only():
    """A row's token is a function of its logits, parameters, key and position: the same in any batch, at any
    row; another key or position draws anew; greedy rows (temperature 0, top_k 1) take the argmax."""
    g = torch.Generator().manual_seed(5)
    V = 50
    logits = torch.randn(12, V, generator=g)
    rows = [dict(temperature=1.0)] * 6 + [dict(temperature=0.8, top_p=0.9)] * 4 + [dict(temperature=0.0),
                                                                                    dict(temperature=1.0, top_k=1)]
    keys = [sampling_key(s) for s in range(12)]
    pos = torch.arange(12) * 7 + 100
    samp_f, samp_i = sampler_inputs(rows, keys)
    toks = sample_tokens(logits, samp_f, samp_i, pos)
    perm = torch.randperm(12, generator=g)
    again = sample_tokens(logits[perm], samp_f[perm], samp_i[perm], pos[perm])
    assert torch.equal(again, toks[perm])
    for r in range(12):  # alone, in a batch of one
        assert sample_tokens(logits[r:r + 1], samp_f[r:r + 1], samp_i[r:r + 1], pos[r:r + 1]).item() == toks[r].item()
    assert toks[10].item() == logits[10].argmax().item() and toks[11].item() == logits[11].argmax().item()
    # flat rows: another key or position almost always draws another token, the same one never does
    flat = torch.zeros(64, 1000)
    samp_f, samp_i = sampler_inputs([dict(temperature=1.0)] * 64, [sampling_key(9)] * 64)
    base = sample_tokens(flat, samp_f, samp_i, torch.full((64,), 5))
    assert len(set(base.tolist())) == 1
    by_pos = sample_tokens(flat, samp_f, samp_i, torch.arange(64) + 5)
    samp_f, samp_i = sampler_inputs([dict(temperature=1.0)] * 64, [sampling_key(s) for s in range(64)])
    by_key = sample_tokens(flat, samp_f, samp_i, torch.full((64,), 5))
    assert len(set(by_pos.tolist())) > 55 and len(set(by_key.tolist())) > 55


def test_prefix_sums_over_chunks():
    from sglang_eagle3.runtime.sampling import SCAN_CHUNK, _prefix_sums

    g = torch.Generator().manual_seed(3)
    for V in (1, 33, SCAN_CHUNK, 2 * SCAN_CHUNK + 517):
        x = torch.rand(3, V, generator=g)
        torch.testing.assert_close(_prefix_sums(x).double(), x.double().cumsum(-1), rtol=1e-5, atol=1e-4)


def test_rows_sample_the_same_under_any_filter_set():
    """The round graphs apply a fixed filter set (all, or no sort) to whatever rows they get: a row whose parameters
    leave a filter off samples the same whichever set runs, so a request's tokens never depend on its batch."""
    g = torch.Generator().manual_seed(8)
    rows = [dict(temperature=1.0), dict(temperature=0.7, min_p=0.1), dict(temperature=1.1, top_p=0.8),
            dict(temperature=0.9, top_k=7), dict(temperature=0.0)] * 6
    logits = torch.randn(len(rows), 300, generator=g) * 3
    samp_f, samp_i = sampler_inputs(rows, [sampling_key(s) for s in range(len(rows))])
    pos = torch.arange(len(rows)) * 3
    full = sample_tokens(logits, samp_f, samp_i, pos, ALL_FILTERS)
    for r in range(len(rows)):
        own = Filters.of([SamplingParams(**rows[r])])
        assert sample_tokens(logits[r:r + 1], samp_f[r:r + 1], samp_i[r:r + 1], pos[r:r + 1], own).item() \
            == full[r].item(), (rows[r], own)
    unranked = [r for r, p in enumerate(rows) if "top_p" not in p and "top_k" not in p]
    assert torch.equal(sample_tokens(logits[unranked], samp_f[unranked], samp_i[unranked], pos[unranked], UNRANKED),
                       full[unranked])


def test_top_p_one_keeps_the_tail_behind_a_peak():
    """A row with top_p 1 keeps every token when its batch applies top_p for others, as a batch without top_p does,
    even where a token far ahead puts the tail's mass below the float rounding of the total (the prefix sums
    alone would drop it)."""
    g = torch.Generator().manual_seed(11)
    logits = torch.randn(2, 500, generator=g)
    logits[:, 7] += 30.0
    samp_f, samp_i = sampler_inputs([dict(temperature=1.0), dict(temperature=1.0, top_p=0.5)], [0, 1])
    z = filtered_scores(logits, samp_f[:, 0], samp_f[:, 1], samp_i[:, 0], samp_f[:, 2], ALL_FILTERS)
    assert torch.equal(z[0], logits[0])
    assert int((z[1] > float("-inf")).sum()) == 1


def test_sampler_radix_knob_selects_the_sort(monkeypatch):
    """SGLANG_EAGLE3_SAMPLER_RADIX=0 sends the filters to the sort path even where Triton is asked for (as on CUDA),
    for A/B runs; unset, Triton is taken (on this CPU without the interpreter: refused, naming it)."""
    g = torch.Generator().manual_seed(12)
    logits = torch.randn(3, 200, generator=g) * 2
    samp_f, samp_i = sampler_inputs([dict(temperature=0.8, top_p=0.7), dict(temperature=1.0, top_k=5),
                                     dict(temperature=0.9)], [0, 1, 2])
    args = (logits, samp_f[:, 0], samp_f[:, 1], samp_i[:, 0], samp_f[:, 2], ALL_FILTERS)
    monkeypatch.setenv("SGLANG_EAGLE3_SAMPLER_RADIX", "0")
    assert torch.equal(filtered_scores(*args, use_triton=True), filtered_scores(*args, use_triton=False))
    monkeypatch.delenv("SGLANG_EAGLE3_SAMPLER_RADIX")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET"):
        filtered_scores(*args, use_triton=True)
    monkeypatch.setenv("SGLANG_EAGLE3_SAMPLER_RADIX", "2")
    with pytest.raises(ValueError, match="SGLANG_EAGLE3_SAMPLER_RADIX"):
        filtered_scores(*args, use_triton=True)


def test_draft_samples_with_the_targets_noise():
    """A draft whose logits equal the target's proposes exactly the target's sample (shared noise: every
    proposal accepted), at any temperature, through a draft vocabulary mapped to target ids too; greedy rows
    propose the argmax."""
    g = torch.Generator().manual_seed(12)
    V = 400
    logits = torch.randn(20, V, generator=g) * 2
    rows = [dict(temperature=t) for t in (0.5, 0.8, 1.0, 1.3)] * 4 + [dict(temperature=0.0)] * 4
    samp_f, samp_i = sampler_inputs(rows, [sampling_key(s) for s in range(20)])
    pos = torch.arange(20) + 50
    target = sample_tokens(logits, samp_f, samp_i, pos, Filters(False, False, False))
    assert torch.equal(draft_tokens(logits, samp_f, samp_i, pos, torch.arange(V)), target)
    # a draft vocabulary of every third target token: its columns carry those tokens' noise
    sub = torch.arange(0, V, 3)
    masked = torch.full_like(logits, float("-inf"))
    masked[:, sub] = logits[:, sub]
    want = sample_tokens(masked, samp_f, samp_i, pos, Filters(False, False, False))
    assert torch.equal(sub[draft_tokens(logits[:, sub], samp_f, samp_i, pos, sub)], want)


def test_draft_candidates_are_the_choice_then_the_best():
    """draft_candidates' column 0 is draft_tokens' proposal (through a draft vocabulary mapped to target ids, -inf
    columns too), columns 1.. the k - 1 largest logits / temperature, best first (a greedy row's are its logits')."""
    g = torch.Generator().manual_seed(5)
    V, R, k = 300, 12, 5
    sub = torch.arange(1, 3 * V, 3)  # the draft's columns: every third target token
    logits = torch.randn(R, V, generator=g) * 3
    logits[torch.rand(R, V, generator=g) < 0.2] = float("-inf")
    temps = [0.6, 1.0, 1.4] * 3 + [0.0] * 3
    samp_f, samp_i = sampler_inputs([dict(temperature=t) for t in temps], [sampling_key(100 + s) for s in range(R)])
    pos = torch.randint(0, 5000, (R,), generator=g)
    got = draft_candidates(logits, samp_f, samp_i, pos, sub, k)
    assert got.shape == (R, k) and got.dtype == torch.int64
    assert torch.equal(got[:, 0], draft_tokens(logits, samp_f, samp_i, pos, sub))
    for r, t in enumerate(temps):
        order = sorted(range(V), key=lambda v: -float(logits[r, v]) / (t or 1.0))
        assert got[r, 1:].tolist() == order[:k - 1], r
    assert draft_candidates(logits, samp_f, samp_i, pos, sub, 1).shape == (R, 1)


def test_sampling_key_is_32_bits_and_spreads():
    keys = [sampling_key(s) for s in (0, 1, 2, -1, 2**63 - 1, 2**64 + 5, 123456789)]
    assert all(0 <= k < 2**32 for k in keys)
    assert len(set(keys)) == len(keys)
    assert sampling_key(5) == sampling_key(2**64 + 5)  # the low 64 bits of the seed


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
    hist = dict(scheduler_of(engine).stats.draft_accept_hist) if draft else {}
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
        assert min(hist.get(a, 0) for a in (0, 1, 2)) > 300, hist


@pytest.mark.parametrize("k,batch", [(1, 1), (3, 4), (5, 3)])
def test_speculative_sampled_output_equals_plain(make_pair, k, batch):
    """With the same seeds, EAGLE-3 returns token for token what plain decoding returns: the sampler's noise is
    fixed by each request's key and the positions (runtime/sampling.py), whatever round a token is verified in.
    Mixed batches (greedy beside sampled, seeded and not: unseeded requests draw keys from the engine's
    random_seed in arrival order); the draft proposes the target's argmax (PatchedDraft), so that rounds accept
    tokens and reject others."""
    cfg = small_config()
    pair = make_pair(cfg, small_draft_config(cfg), seed=3, scale=2.0)
    params = [dict(temperature=0.8, top_p=0.95, seed=11), dict(temperature=1.2, top_k=20, seed=2**40 + 7),
              dict(temperature=0.0), dict(temperature=0.6, min_p=0.05), dict(temperature=1.0, seed=11)][:batch + 1]
    params = [dict(p, max_new_tokens=18 + 3 * i) for i, p in enumerate(params)]
    prompts = [[3, 7, 1, 12, 5], [9, 9, 2], [40, 41, 42, 43], [1], [3, 7, 1, 12, 5]][:batch + 1]

    def run(spec: bool):
        extra = dict(speculative_algorithm="EAGLE3", speculative_draft_model_path=pair.draft,
                     speculative_num_steps=k) if spec else {}
        engine = Engine(model_path=pair.target, device="cpu", dtype="float32", skip_tokenizer_init=True,
                        max_running_requests=batch, **extra)
        if spec:
            def oracle(r, prefix):
                with torch.inference_mode():
                    return int(engine.runner.target.forward_dense(torch.tensor([prefix]))[0][0, -1].argmax())

            PatchedDraft(engine, oracle)
        outs = [o["output_ids"] for o in engine.generate(input_ids=prompts, sampling_params=params)]
        return outs, scheduler_of(engine).stats

    plain, _ = run(False)
    spec, stats = run(True)
    assert spec == plain
    assert stats.accepted_tokens > stats.verify_forwards, "no round accepted a draft token: nothing was tested"
    assert len({tuple(o) for o in plain}) == len(plain)  # the two requests on one prompt and seed 11 differ
