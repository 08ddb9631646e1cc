"""Penalties (frequency / presence / repetition_penalty, min_new_tokens) with speculation stay exact.

SGLang 0.5.23 applies a request's penalties to every verify row alike (its orchestrator's ``repeat``), so a draft
token accepted earlier in the same round is not counted for the rows after it, and speculative output can differ
from plain decoding. Here each verify row counts the drafts before it (sampling.penalized_logits). Checked against:
a naive per-row loop (the function), an independent greedy generator over the target's dense forward with
penalties applied token by token in plain Python (the engine without speculation), and plain decoding (the engine
with EAGLE-3, drafts scripted from the plain output with noise so that rounds accept 0..k tokens, and with
penalties that favour repeats so that accepted drafts repeat tokens within a round).
"""

from __future__ import annotations

import random

import pytest
import torch
from conftest import PatchedDraft, reference_draft, scheduler_of, small_config, small_draft_config

from sglang_eagle3 import Engine
from sglang_eagle3.runtime.sampling import Penalties, SamplingParams, SamplingParamsError, penalized_logits

pytestmark = pytest.mark.usefixtures("torch_one_thread")


def _naive_row(z: list[float], counts: dict[int, int], f: float, p: float, r: float, blocked: set[int],
               bias: dict[int, float] | None = None) -> list[float]:
    """One row's penalized logits, token by token (SGLang's order: additive, then the repetition scaling, then
    logit_bias)."""
    def f32(v):
        return torch.tensor(v, dtype=torch.float32)

    out = []
    for v, x in enumerate(z):
        c = counts.get(v, 0)
        x = f32(x)
        if c:  # float32 arithmetic in the kernel's order, so that the bits can be compared
            x = x - f32(f) * f32(c) - f32(p)
            x = x * f32(r) if x < 0 else x / f32(r)
        x = f32(float("-inf")) if v in blocked else x
        out.append(float(x + f32((bias or {}).get(v, 0.0))))
    return out


@pytest.mark.parametrize("B,T,V,seed", [(1, 1, 7, 0), (3, 4, 11, 1), (2, 6, 5, 2), (4, 3, 29, 3)])
def test_penalized_logits_count_the_drafts_before_each_row(B, T, V, seed):
    g = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    outputs = [[rng.randrange(V) for _ in range(rng.randrange(0, 9))] for _ in range(B)]
    params = [SamplingParams(frequency_penalty=rng.choice([0.0, 0.7, -1.3]), presence_penalty=rng.choice([0.0, 1.1]),
                             repetition_penalty=rng.choice([1.0, 1.6, 0.45]), min_new_tokens=rng.choice([0, 3, 9]),
                             stop_token_ids=[rng.randrange(V)], max_new_tokens=64,
                             logit_bias=rng.choice([None, {rng.randrange(V): rng.uniform(-100, 100), 1: 2.5}]))
              for _ in range(B)]
    eos = {V - 1}
    pen = Penalties.build(params, outputs, eos, V, lambda t: t)
    logits = torch.randn(B * T, V, generator=g) * 3
    # Draft ids with repeats (a small alphabet), the verify's [last, d_1 .. d_{T-1}].
    drafts = torch.tensor([[rng.randrange(V)] + [rng.randrange(3) for _ in range(T - 1)] for _ in range(B)])
    got = penalized_logits(logits, pen, drafts if T > 1 else None)
    for b, (sp, out) in enumerate(zip(params, outputs, strict=True)):
        for j in range(T):
            seq = out + drafts[b, 1:j + 1].tolist()
            counts = {v: seq.count(v) for v in set(seq)} if sp.penalized else {}
            blocked = set(sp.stop_token_ids) | eos if len(seq) < sp.min_new_tokens else set()
            want = _naive_row(logits[b * T + j].tolist(), counts, sp.frequency_penalty, sp.presence_penalty,
                              sp.repetition_penalty, blocked, sp.logit_bias)
            assert got[b * T + j].tolist() == want, (b, j)


def test_penalized_logits_advance_counts_the_emitted_tokens():
    V = 9
    params = [SamplingParams(frequency_penalty=0.5), SamplingParams(presence_penalty=1.0, min_new_tokens=4)]
    pen = Penalties.build(params, [[1, 1], [2]], {8}, V, lambda t: t)
    pen.advance(torch.tensor([[1, 3, 5], [2, 2, 7]]), torch.tensor([2, 3]))
    fresh = Penalties.build(params, [[1, 1, 1, 3], [2, 2, 2, 7]], {8}, V, lambda t: t)
    assert torch.equal(pen.counts, fresh.counts) and torch.equal(pen.min_left, fresh.min_left)


@pytest.mark.parametrize("field,value,needle", [
    ("frequency_penalty", 2.5, "must be a number in [-2, 2]"),
    ("presence_penalty", "1", "must be a number in [-2, 2]"),
    ("repetition_penalty", 0, "(0, 2]"),
    ("repetition_penalty", 2.01, "(0, 2]"),
    ("min_new_tokens", -1, "[0, max_new_tokens=128]"),
    ("min_new_tokens", 129, "[0, max_new_tokens=128]"),
    ("min_new_tokens", 2.0, "must be an integer"),
    ("logit_bias", {"5": 101}, "logit_bias[5]=101 must be a number in [-100, 100]"),
    ("logit_bias", {"x": 1}, "logit_bias key 'x' must be a token id"),
    # int() reads these as 5 too: {"5": 1, "05": -1} kept one of the two biases without a word.
    *[("logit_bias", {"5": 1, key: -1}, f"logit_bias key {key!r} must be a token id")
      for key in (" 5", "05", "+5", "5_0", "\u0665", "5 ", "--5")],
    ("logit_bias", {"-0": 1}, "logit_bias key '-0' must be a token id"),
    ("logit_bias", {"9" * 5000: 1}, "(5002 characters) must be a token id"),
    ("logit_bias", [1, 2], "must be an object"),
    ("logit_bias", {str(i): 1 for i in range(301)}, "301 entries, more than 300"),
])
def test_bad_penalties_name_the_field(field, value, needle):
    with pytest.raises(SamplingParamsError) as e:
        SamplingParams.from_dict({field: value})
    assert needle in str(e.value) and len(str(e.value)) < 200, str(e.value)
    if field != "logit_bias":
        assert f"{field}={value!r}" in str(e.value), str(e.value)


# -- the engine ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def pair(make_pair):
    cfg = small_config()
    return make_pair(cfg, small_draft_config(cfg), seed=5, scale=2.0)


def _engine(pair, k: int | None, **kw) -> Engine:
    spec = dict(speculative_algorithm="EAGLE3", speculative_draft_model_path=pair.draft,
                speculative_num_steps=k) if k else {}
    return Engine(model_path=pair.target, device="cpu", dtype="float32", skip_tokenizer_init=True,
                  max_running_requests=8, **spec, **kw)


def _reference_greedy(engine: Engine, prompt: list[int], sp: dict, eos: set[int]) -> list[int]:
    """Greedy decoding with penalties, independent of the engine's sampler: the target's dense forward over the
    whole sequence, then each token's penalty computed from the outputs so far in plain Python."""
    p = SamplingParams.from_dict(sp)
    out: list[int] = []
    while len(out) < p.max_new_tokens:
        with torch.inference_mode():
            z = engine.runner.target.forward_dense(torch.tensor([prompt + out]))[0][0, -1].float().tolist()
        stops = set(p.stop_token_ids) | (set() if p.ignore_eos else eos)
        row = _naive_row(z, {v: out.count(v) for v in set(out)}, p.frequency_penalty, p.presence_penalty,
                         p.repetition_penalty, stops if len(out) < p.min_new_tokens else set(), p.logit_bias)
        tok = max(range(len(row)), key=lambda v: (row[v], -v))  # argmax, first of ties
        out.append(tok)
        if tok in stops:
            break
    return out


PENALTY_SETS = [
    dict(frequency_penalty=1.5),
    dict(presence_penalty=-2.0, repetition_penalty=0.6),  # favours repeats: drafts repeat within a round
    dict(frequency_penalty=-1.0, repetition_penalty=1.7),
    dict(presence_penalty=1.2, min_new_tokens=9),
    dict(logit_bias={"5": 4.0, "17": -100, "30": 2.5}),
]


def test_plain_greedy_penalties_match_an_independent_reference(pair):
    engine = _engine(pair, None)
    eos = set(scheduler_of(engine).eos)
    prompts = [[3, 7, 1, 12, 5], [9, 9, 2], [40, 41, 42, 43], [1, 2], [8, 8]]
    params = [dict(p, max_new_tokens=14, temperature=0, stop_token_ids=[7]) for p in PENALTY_SETS]
    outs = engine.generate(input_ids=prompts, sampling_params=params)
    for prompt, sp, o in zip(prompts, params, outs, strict=True):
        assert o["output_ids"] == _reference_greedy(engine, prompt, sp, eos), sp
    unpenalized = engine.generate(input_ids=prompts, sampling_params={"max_new_tokens": 14, "temperature": 0})
    assert [o["output_ids"] for o in outs] != [o["output_ids"] for o in unpenalized]  # the penalties did something


@pytest.mark.parametrize("k", [1, 3, 5])
def test_speculative_penalized_output_equals_plain(pair, k):
    """Mixed batches (penalized and not, greedy and sampled); drafts scripted from the plain output with noise, so
    rounds accept every length and the penalties' per-row counts decide acceptance."""
    prompts = [[3, 7, 1, 12, 5], [9, 9, 2], [40, 41, 42, 43], [1, 2], [6], [8, 30, 2], [11, 4]]
    params = [dict(PENALTY_SETS[0], temperature=0), dict(PENALTY_SETS[1], temperature=0.9, seed=7),
              dict(temperature=0), dict(PENALTY_SETS[2], temperature=0.7, top_p=0.9, seed=2),
              dict(PENALTY_SETS[3], temperature=0, stop_token_ids=[7]), dict(temperature=1.1, seed=5),
              dict(PENALTY_SETS[4], temperature=0.8, seed=1)]
    params = [dict(p, max_new_tokens=26 + 3 * i) for i, p in enumerate(params)]
    plain = [o["output_ids"] for o in _engine(pair, None).generate(input_ids=prompts, sampling_params=params)]
    refs = {tuple(p): p + o + [0] * (k + 2) for p, o in zip(prompts, plain, strict=True)}
    engine = _engine(pair, k)
    PatchedDraft(engine, reference_draft(refs, "noisy", pair.config.vocab_size, noise=0.25, seed=k))
    spec = [o["output_ids"] for o in engine.generate(input_ids=prompts, sampling_params=params)]
    assert spec == plain
    stats = scheduler_of(engine).stats
    assert stats.accepted_tokens > 1.5 * stats.verify_forwards, "few drafts accepted: the rows were not exercised"
    counts = engine.get_server_info()["forward_counts"]
    assert counts["spec_round_penalized"]["eager"] > 0
    # Repeats inside accepted runs: the case the per-row counts exist for.
    assert any(len(set(o[i:i + 3])) < 3 for o in plain[1:2] for i in range(len(o) - 2))


def test_min_new_tokens_holds_back_stop_tokens_and_strings(pair):
    engine = _engine(pair, None)
    greedy = engine.generate(input_ids=[3, 7, 1], sampling_params={"max_new_tokens": 12, "temperature": 0})
    first = greedy["output_ids"][0]  # a stop token the model emits at once
    out = engine.generate(input_ids=[3, 7, 1], sampling_params={"max_new_tokens": 12, "temperature": 0,
                                                                "stop_token_ids": [first], "min_new_tokens": 5})
    ids = out["output_ids"]
    assert len(ids) >= 5 and first not in ids[:4], ids
    stopped = engine.generate(input_ids=[3, 7, 1], sampling_params={"max_new_tokens": 12, "temperature": 0,
                                                                    "stop_token_ids": [first]})
    assert stopped["output_ids"] == [first]


def test_logit_bias_outside_the_vocabulary_is_refused(pair):
    engine = _engine(pair, None)
    V = pair.config.vocab_size
    with pytest.raises(SamplingParamsError) as e:
        engine.generate(input_ids=[1, 2], sampling_params={"logit_bias": {"3": 1.0, str(V): 2.0, "-1": 1.0}})
    assert f"logit_bias keys [{V}, -1]" in str(e.value) and f"[0, {V})" in str(e.value), str(e.value)
    # A token biased to the top is what greedy decoding emits, every time.
    out = engine.generate(input_ids=[1, 2], sampling_params={"logit_bias": {"7": 100}, "temperature": 0,
                                                             "max_new_tokens": 5})
    assert out["output_ids"] == [7] * 5


def test_rows_that_overflow_float32_stay_exact(pair):
    """A repetition_penalty near 0 divides a seen token's positive logit to +inf. The speculative round applies
    every filter (min_p 0 included, which should leave a row as it is), and inf + log(0) made its threshold NaN:
    every token dropped, token 0 sampled, where plain decoding (no min_p in its batch) sampled the inf token."""
    from sglang_eagle3.runtime.sampling import ALL_FILTERS, Filters, filtered_scores

    z = torch.tensor([[1.0, float("inf"), -2.0, float("inf")], [0.5, -1.0, 3.0, 2.0]])
    ones, off = torch.ones(2), torch.zeros(2)
    none = Filters(top_k=False, min_p=False, top_p=False)
    assert torch.equal(filtered_scores(z, ones, ones, -torch.ones(2, dtype=torch.long), off, ALL_FILTERS),
                       filtered_scores(z, ones, ones, -torch.ones(2, dtype=torch.long), off, none))
    sp = {"max_new_tokens": 12, "repetition_penalty": 1e-300, "temperature": 0.7, "seed": 1}
    plain = _engine(pair, None).generate(input_ids=[3, 7, 1], sampling_params=sp)["output_ids"]
    assert _engine(pair, 3).generate(input_ids=[3, 7, 1], sampling_params=sp)["output_ids"] == plain


def test_a_temperature_near_zero_is_greedy(pair):
    """logits / 1e-45 overflow float32: every positive logit was +inf, and the sample the lowest such token id,
    not the argmax. Below 1e-6 (SGLang's threshold) a temperature is greedy."""
    greedy = _engine(pair, None).generate(input_ids=[3, 7, 1], sampling_params={"max_new_tokens": 10,
                                                                                 "temperature": 0})["output_ids"]
    for k in (None, 3):
        for t in (1e-45, 1e-30, 5e-7):
            out = _engine(pair, k).generate(input_ids=[3, 7, 1], sampling_params={"max_new_tokens": 10, "seed": 1,
                                                                                  "temperature": t})
            assert out["output_ids"] == greedy, (k, t)


def test_a_temperature_past_float32_keeps_min_new_tokens(pair):
    """temperature 1e39 is a finite float but +inf as float32: a blocked stop token's -inf / inf was NaN, which the
    sampler's argmax picked, so min_new_tokens let the stop token out first."""
    for k in (None, 3):
        out = _engine(pair, k).generate(input_ids=[3, 7, 1], sampling_params={
            "max_new_tokens": 8, "temperature": 1e39, "seed": 2, "min_new_tokens": 6, "stop_token_ids": [5]})
        assert len(out["output_ids"]) >= 6 and 5 not in out["output_ids"][:6], (k, out["output_ids"])
