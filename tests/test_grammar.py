"""Structured output (json_schema / regex / ebnf) is exact with speculation.

Checked against: a per-token loop (the bitmask), a fresh matcher fed each row's drafts (the verify rows' masks),
an independent constrained greedy generator (the target's dense forward, the allowed tokens found by Python's
``regex`` partial matching of the decoded text, no xgrammar), and plain decoding (EAGLE-3 with the real draft,
and with drafts scripted from the plain output with noise drawn from the output's own tokens, so that rounds
accept 0..k tokens, and refused, allowed-but-wrong and stop-token drafts all occur). On the embedded pair: it has
a real tokenizer and an eos.
"""

from __future__ import annotations

import json
import os
import random

import pytest
import regex
import torch
from conftest import PatchedDraft, scheduler_of

from sglang_eagle3 import Engine
from sglang_eagle3.config import ConfigError
from sglang_eagle3.engine import EMBEDDED_DIR
from sglang_eagle3.runtime.grammar import (
    GrammarBackend,
    GrammarBatch,
    GrammarError,
    GrammarSpec,
    apply_token_bitmask,
)
from sglang_eagle3.runtime.sampling import SamplingParams, SamplingParamsError
from sglang_eagle3.tokenizer import load_tokenizer

pytest.importorskip("xgrammar")
TARGET = os.path.join(EMBEDDED_DIR, "target")
pytestmark = [pytest.mark.skipif(not os.path.exists(os.path.join(TARGET, "config.json")),
                                 reason="embedded weights not present"),
              pytest.mark.usefixtures("torch_one_thread")]
PROMPTS = ["And God said,", "In the beginning", "The king of Israel", "And he answered"]
# ASCII patterns (the reference matches decoded text), each with many ways to go on, some that end early.
REGEXES = [r"(yes|no|maybe)[.!]{1,3}", r"[A-Z][a-z]+( [a-z]+){2,5}\.", r"[0-9]{1,4}( (and|or) [0-9]{1,4})*",
           r"(the|a|an) [a-z ]{3,20}(,|;) [a-z]+"]
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                           "age": {"type": "integer"}, "tags": {"type": "array", "maxItems": 3,
                                                                                 "items": {"type": "string"}}},
          "required": ["name", "age"]}


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(TARGET)


@pytest.fixture(scope="module")
def engines():
    return {"plain": Engine(model_path=TARGET, device="cpu"),
            "eagle3": Engine(device="cpu", speculative_num_steps=3)}  # the embedded pair, EAGLE-3 on


# -- the mask arithmetic ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("R,V,seed", [(1, 5, 0), (3, 70, 1), (4, 97, 2), (2, 64, 3)])
def test_apply_token_bitmask_matches_a_per_token_loop(R, V, seed):
    g = torch.Generator().manual_seed(seed)
    words = (V + 31) // 32
    bitmask = torch.randint(-2**31, 2**31 - 1, (R, words), generator=g, dtype=torch.int64).to(torch.int32)
    logits = torch.randn(R, V, generator=g, dtype=torch.float64).to(torch.bfloat16)
    got = apply_token_bitmask(logits, bitmask)
    assert got.dtype == torch.float32
    for r in range(R):
        for v in range(V):
            word = int(bitmask[r, v // 32]) & 0xFFFFFFFF
            want = float(logits[r, v]) if (word >> (v % 32)) & 1 else float("-inf")
            assert float(got[r, v]) == want, (r, v)


@pytest.fixture(scope="module")
def backend(tok):
    return GrammarBackend(tok, 4096, [tok.eos_token_id])


def _row(backend, spec, prefix: list[int]) -> torch.Tensor | None:
    """The mask after ``prefix`` from a fresh matcher (None where the grammar refuses it or has ended)."""
    m = backend.matcher(spec)
    if not all(m.accept(t) for t in prefix) or m.terminated:
        return None
    mask = torch.zeros(1, 128, dtype=torch.int32)
    m.fill(mask, 0)
    return mask[0]


@pytest.mark.parametrize("dear", [False, True])
def test_verify_rows_are_masked_as_after_the_drafts_before_them(backend, tok, dear, monkeypatch):
    """host_masks' row j of a request == a fresh matcher's mask after its output and d_1..d_j; all allowed from a
    refused draft on, and after a stop token; the live matchers are left where they were. Rows filled one by one,
    and (``dear``: rows that took long before) together on the RowFiller's threads from forks of the matchers."""
    from sglang_eagle3.runtime.grammar import RowFiller

    backend = GrammarBackend(tok, 4096, [tok.eos_token_id], fill_threads=2)
    rng = random.Random(0)
    spec = GrammarSpec("regex", REGEXES[1])
    text = "Abc de fgh ij."
    ids = tok.encode(text)
    out = ids[:2]
    eos = tok.eos_token_id
    cases = [ids[2:6], ids[2:4] + [tok.encode("Q")[0]] + ids[4:5],  # a refused draft mid-row
             ids[2:] + [eos], ids[2:] + [eos, ids[0]],  # the whole text, the stop token, then past the end
             [rng.randrange(4096) for _ in range(4)]]
    T = 1 + max(len(c) for c in cases)
    matchers = []
    for _ in cases:
        m = backend.matcher(spec)
        assert all(m.accept(t) for t in out)
        matchers.append(m)
    matchers.append(None)  # a request without a grammar
    together = []
    fill = RowFiller.fill
    monkeypatch.setattr(RowFiller, "fill", lambda self, forks, bitmask, rows: (together.append(len(forks)),
                                                                             fill(self, forks, bitmask, rows)))
    for m in matchers[:-1]:
        m.fill_seconds = 1.0 if dear else 0.0
    drafts = [[out[-1]] + c + [0] * (T - 1 - len(c)) for c in cases] + [[0] * T]
    before = GrammarBatch(matchers, 4096, lambda t: t).host_masks(None, 1)
    got = GrammarBatch(matchers, 4096, lambda t: t).host_masks(drafts, T)
    assert torch.equal(GrammarBatch(matchers, 4096, lambda t: t).host_masks(None, 1), before)
    ones = torch.full((128,), -1, dtype=torch.int32)
    for b, d in enumerate(drafts):
        for j in range(T):
            want = _row(backend, spec, out + d[1:j + 1]) if b < len(cases) else None
            assert torch.equal(got[b * T + j], ones if want is None else want), (b, j)
    assert not torch.equal(got[0], ones) and torch.equal(got[len(cases) * T], ones)
    batch = GrammarBatch(matchers, 4096, lambda t: t)
    assert torch.equal(batch.masks(torch.tensor(drafts), T), got) and torch.equal(batch.masks(drafts, T), got)
    assert bool(together) == dear and all(n > 1 for n in together), together


def _allows(mask: torch.Tensor | None, t: int) -> bool:
    return mask is None or bool((int(mask[t // 32]) >> (t % 32)) & 1)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_drafts_are_the_first_candidates_the_grammar_accepts(backend, tok, seed):
    """GrammarBatch over a round's draft steps (random candidate lists: tokens of the text, which the grammar allows
    here and there, and random ids) against fresh matchers. step_mask's row for a request whose fills are cheap is
    a fresh matcher's mask after the drafts before it, every token for the others; a request's draft is its first
    candidate the grammar allows after them, the first candidate where it has no grammar, has ended or refused
    before; a request none of whose candidates is allowed is stuck, and refill()'s row for it is the fresh matcher's
    mask (every token for the others); take() of a token the row allows continues it, of one it refuses ends its
    constraint for the round. end_drafts leaves the matchers as before, and the verify's masks, the rows filled for
    the drafts among them, are those of a batch that filled none."""
    rng = random.Random(seed)
    spec = GrammarSpec("regex", REGEXES[1])
    ids = tok.encode("Abc de fgh ij klm no.")
    pool = ids + [tok.eos_token_id] + [rng.randrange(4096) for _ in range(6)]
    out = ids[:2]
    matchers = []
    for i in range(6):
        m = backend.matcher(spec)
        assert all(m.accept(t) for t in out)
        m.fill_seconds = 0.0 if i % 2 else 1e9  # cheap to fill ahead, or not (step_mask(1.0))
        matchers.append(m)
    matchers.append(None)
    batch = GrammarBatch(matchers, 4096, lambda t: t)
    before = batch.host_masks(None, 1)
    prefixes = [[] for _ in matchers]
    refused = [False] * len(matchers)
    ones = torch.full((128,), -1, dtype=torch.int32)
    stuck_seen = filled_ahead = 0
    T = 6
    for _ in range(T - 1):
        rows = {b: None if matchers[b] is None or refused[b] else _row(backend, spec, out + prefixes[b])
                for b in range(len(matchers))}
        live = {b for b, r in rows.items() if r is not None}
        cheap_below = rng.choice([0.0, 1.0, float("inf"), None])  # None: by kind (a regex's rows after the step)
        ahead = batch.step_mask(cheap_below)
        for b in range(len(matchers)):
            cheap = b in live and cheap_below is not None and matchers[b].fill_seconds < cheap_below
            want = rows[b] if b in live and cheap else ones
            filled_ahead += want is not ones
            assert torch.equal(ahead[b], want), (b, cheap_below)
        cands = [[rng.choice(pool) for _ in range(rng.randint(1, 3))] for _ in matchers]
        chosen, stuck = batch.choose(cands)
        for b, c in enumerate(cands):
            want = next((t for t in c if _allows(rows[b], t)), None) if b in live else c[0]
            assert (b in stuck) == (b in live and want is None), (b, c, stuck)
            if b not in stuck:
                assert chosen[b] == want, (b, c, chosen)
        if stuck:
            stuck_seen += 1
            mask = batch.refill(stuck)
            for b in range(len(matchers)):
                assert torch.equal(mask[b], rows[b] if b in stuck else ones), b
            for b in stuck:  # an allowed token for some, a refused one for others
                t = next((t for t in range(4096) if _allows(rows[b], t)), 0) if rng.random() < 0.5 else cands[b][0]
                batch.take(b, t)
                chosen[b] = t
                refused[b] = not _allows(rows[b], t)
        for b, t in enumerate(chosen):
            prefixes[b].append(t)
    batch.end_drafts()
    assert torch.equal(batch.host_masks(None, 1), before)
    assert stuck_seen and filled_ahead, "the test would not see refill or step_mask's rows"
    drafts = [[out[-1]] + p for p in prefixes]
    assert batch._known  # the rows filled for the drafts, kept for the verify
    got = batch.masks(drafts, T)
    assert torch.equal(got, GrammarBatch(matchers, 4096, lambda t: t).host_masks(drafts, T)) and not batch._known


# -- the engine ------------------------------------------------------------------------------------------------
def _allowed(tok, pattern: str, text: bytes, t: int, eos: int) -> bool:
    if t == eos:
        return regex.fullmatch(pattern, text.decode()) is not None
    if t in tok.special_ids:
        return False
    piece = tok.token_bytes(t)
    if not piece or not (text + piece).isascii():
        return False
    return regex.fullmatch(pattern, (text + piece).decode(), partial=True) is not None


def _reference(engine: Engine, tok, prompt: list[int], pattern: str, max_new: int) -> list[int]:
    """Constrained greedy decoding without xgrammar: the target's dense forward, the best token whose text keeps
    the output a prefix of a match (eos where it is a whole match)."""
    eos, out, text = tok.eos_token_id, [], b""
    while len(out) < max_new:
        with torch.inference_mode():
            z = engine.runner.target.forward_dense(torch.tensor([prompt + out]))[0][0, -1].float()
        t = next(int(t) for t in z.argsort(descending=True, stable=True) if _allowed(tok, pattern, text, int(t), eos))
        out.append(t)
        if t == eos:
            break
        text += tok.token_bytes(t)
    return out


def test_plain_regex_output_matches_an_independent_reference(engines, tok):
    eng = engines["plain"]
    for prompt, pattern in zip(PROMPTS, REGEXES, strict=True):
        ids = tok.encode(prompt)
        out = eng.generate(input_ids=ids, sampling_params={"regex": pattern, "max_new_tokens": 24, "temperature": 0})
        assert out["output_ids"] == _reference(eng, tok, ids, pattern, 24), pattern
        if out["meta_info"]["finish_reason"]["type"] == "stop":
            assert regex.fullmatch(pattern, out["text"]), (pattern, out["text"])
        else:
            assert regex.fullmatch(pattern, out["text"], partial=True), (pattern, out["text"])


def _params():
    grammars = [{"regex": r} for r in REGEXES] + [
        {"json_schema": json.dumps(SCHEMA)}, {"json_schema": "$$ANY$$"},
        {"ebnf": 'root ::= "The " word (" " word)* "."\nword ::= [a-z]+'}]
    samplings = [{"temperature": 0}, {"temperature": 0.8, "seed": 3}, {"temperature": 1.0, "top_p": 0.9, "seed": 1},
                 {"temperature": 0, "repetition_penalty": 1.3}, {"temperature": 0.7, "top_k": 20, "seed": 4}]
    return [dict(g, **samplings[i % len(samplings)], max_new_tokens=40) for i, g in enumerate(grammars)]


def test_speculative_equals_plain_under_grammars(engines):
    """Mixed batches (one request without a grammar): the real draft."""
    params = _params() + [{"temperature": 0, "max_new_tokens": 40}]
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(len(params))]
    plain = engines["plain"].generate(prompts, params)
    spec = engines["eagle3"].generate(prompts, params)
    assert [o["output_ids"] for o in spec] == [o["output_ids"] for o in plain]
    for sp, o in zip(params, plain, strict=True):
        if "json_schema" in sp and o["meta_info"]["finish_reason"]["type"] == "stop":
            value = json.loads(o["text"])
            if sp["json_schema"] != "$$ANY$$":
                assert set(value) >= {"name", "age"} and isinstance(value["age"], int), o["text"]
    counts = engines["eagle3"].get_server_info()["forward_counts"]
    assert counts["spec_round_grammar"]["eager"] > 0


def test_draft_length_zero_under_grammars(engines):
    """k = 0 (the verify of the last token alone, the draft's extend following it: adaptive.py) in batches with
    grammars, penalties and sampling, switched to and from between rounds: the output is plain decoding's."""
    params = _params() + [{"temperature": 0, "max_new_tokens": 40}]
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(len(params))]
    plain = engines["plain"].generate(prompts, params)
    eng = Engine(device="cpu", speculative_num_steps=2, speculative_num_steps_candidates=[0])
    runner, widths = eng.backend.runner, []
    inner = runner.grammar_spec_round

    def recorded(bt, hidden, sim, T, samp):
        widths.append(T)
        return inner(bt, hidden, sim, T, samp)

    runner.grammar_spec_round = recorded
    try:
        reqs = [eng.make_request(prompt=p, sampling_params=sp) for p, sp in zip(prompts, params, strict=True)]
        for r in reqs:
            eng.scheduler.add(r)
        done, step = {}, 0
        while len(done) < len(reqs):
            eng.set_speculative_num_steps((0, 0, 2, 0)[step % 4])
            done.update({r.rid: r for r in eng.scheduler.step() if r.finished})
            step += 1
        assert [done[r.rid].output_ids for r in reqs] == [o["output_ids"] for o in plain]
        assert set(widths) == {1, 3}, widths
    finally:
        eng.shutdown()


def test_penalties_under_a_grammar(engines):
    """Penalties and a grammar on one request: each verify row penalized (the drafts before it counted), then
    masked, as plain decoding does; the penalties change these outputs (so a round that skipped them would show)."""
    base = {"regex": r"[a-z]+( [a-z]+){8,30}\.", "max_new_tokens": 40}
    penalties = [{"frequency_penalty": 1.0}, {"repetition_penalty": 1.8}, {"presence_penalty": 1.5},
                 {"frequency_penalty": 0.8, "temperature": 0.8, "seed": 3}]
    params = [{**base, "temperature": 0, **p} for p in penalties]
    free = [{k: v for k, v in p.items() if not k.endswith("penalty")} for p in params]
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(len(params))]
    plain = [o["output_ids"] for o in engines["plain"].generate(prompts, params)]
    unpenalized = [o["output_ids"] for o in engines["plain"].generate(prompts, free)]
    assert sum(a != b for a, b in zip(plain, unpenalized, strict=True)) >= 2, (plain, unpenalized)
    spec = [o["output_ids"] for o in engines["eagle3"].generate(prompts, params)]
    assert spec == plain


@pytest.mark.parametrize("k", [1, 4])
def test_scripted_drafts_accept_every_length(engines, tok, k):
    """Drafts from the plain output, a quarter of them swapped for another of its tokens (allowed by the grammar
    as often as not) or for eos: rounds accept every length, the output stays plain decoding's."""
    params = [p for p in _params() if p.get("temperature") == 0 or "seed" in p]
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(len(params))]
    plain = [o["output_ids"] for o in engines["plain"].generate(prompts, params)]
    ids = [tok.encode(p) for p in prompts]
    refs = {tuple(i): i + o + [0] * (k + 2) for i, o in zip(ids, plain, strict=True)}
    rng = random.Random(k)

    def propose(r, prefix):
        ref = refs[tuple(r.input_ids)]
        want = ref[len(prefix)] if len(prefix) < len(ref) else 0
        if rng.random() < 0.25:
            return rng.choice(ref[len(r.input_ids):] + [tok.eos_token_id])
        return want

    eng = Engine(device="cpu", speculative_num_steps=k, max_running_requests=4)
    eng.runner.grammar_drafts = False  # the scripted proposals as they are, refused ones too
    PatchedDraft(eng, propose)
    spec = [o["output_ids"] for o in eng.generate(input_ids=ids, sampling_params=params)]
    assert spec == plain
    hist = scheduler_of(eng).stats.accept_length_hist
    assert set(hist) == set(range(1, k + 2)), hist


def test_drafts_proposed_within_the_grammar_are_accepted_more(engines):
    """The draft's proposals masked by the grammar (ModelRunner._pick_in_grammar): the same output, more drafts
    accepted than with the draft's own proposals (which a JSON schema refuses nearly always on this pair)."""
    params = [{"json_schema": "$$ANY$$", "temperature": 0, "max_new_tokens": 48},
              {"json_schema": json.dumps(SCHEMA), "temperature": 0.9, "seed": 3, "max_new_tokens": 48}]
    runs = {}
    for on in (False, True):
        eng = Engine(device="cpu", speculative_num_steps=3)
        eng.runner.grammar_drafts = on
        outs = [o["output_ids"] for o in eng.generate(PROMPTS[:2], params)]
        runs[on] = outs, scheduler_of(eng).stats.avg_accept_length
    assert runs[True][0] == runs[False][0]
    assert runs[True][1] > runs[False][1] + 0.5, runs


def _verify_drafts(candidates: int, prefill_below_s: float, params: dict) -> tuple[list, list, dict]:
    """(each verify's drafts [B][k], the outputs, the runner's grammar_proposals) of the embedded pair at k = 4 with
    ``candidates`` a draft step, rows filled ahead of the steps where they took under ``prefill_below_s``."""
    eng = Engine(device="cpu", speculative_num_steps=4)
    eng.runner.grammar_candidates = candidates
    eng.runner.grammar_prefill_below_s = prefill_below_s
    verify, seen = eng.runner.target_verify, []

    def recording(bs, T, **inputs):
        seen.append(inputs["input_ids"].view(bs, T)[:, 1:].tolist())
        return verify(bs, T, **inputs)

    eng.runner.target_verify = recording
    outs = eng.generate(PROMPTS, [params] * len(PROMPTS))
    eng.runner.target_verify = verify
    return seen, outs, eng.get_server_info()["grammar_proposals"]


@pytest.mark.parametrize("temperature", [0, 0.9])
def test_every_draft_is_proposed_within_the_grammar(tok, temperature):
    """A grammar the same at every position ([a-z ]+: a token is allowed wherever it spells only those characters,
    or is the eos): every draft the verify sees (d_1 from the head again, d_2..d_k from the draft steps'
    candidates) up to the first eos is such a token. The draft alone, trained on capitalised and punctuated text,
    proposes others. Whether the rows are filled ahead of the steps (prefill_below_s infinite: the candidates
    masked, the first taken) or every step is chosen again under its row (one candidate a step, rows after it:
    refill), a draft is the draft's choice under the row: the same drafts. With 8 candidates and rows after the
    steps the first allowed candidate is taken: the same greedy drafts (the best allowed), and sampled ones where
    the sample is allowed (the others fall back to the best allowed logits, without the noise)."""
    params = {"regex": "[a-z ]+", "temperature": temperature, "seed": 7, "max_new_tokens": 40}
    runs = {mode: _verify_drafts(*mode, params) for mode in ((8, 0.0), (1, 0.0), (8, float("inf")))}
    seen, outs, counts = runs[(8, 0.0)]
    assert all(regex.fullmatch("[a-z ]+", o["text"]) for o in outs), [o["text"] for o in outs]
    drafts = [t for batch in seen for row in batch for t in row[:row.index(tok.eos_token_id) if tok.eos_token_id
                                                                   in row else None]]
    assert len(drafts) > 40
    bad = sorted({t for t in drafts if not regex.fullmatch(b"[a-z ]+", tok.token_bytes(t))})
    assert not bad, [tok.token_bytes(t) for t in bad]
    assert counts["proposed"] >= len(drafts)
    for mode, (_, outs_2, _) in runs.items():
        assert [o["output_ids"] for o in outs_2] == [o["output_ids"] for o in outs], mode
    assert runs[(1, 0.0)][0] == runs[(8, float("inf"))][0]
    if temperature == 0:
        assert seen == runs[(1, 0.0)][0]
    assert runs[(1, 0.0)][2]["refilled"] > max(10, counts["refilled"]), runs
    assert runs[(8, float("inf"))][2]["refilled"] == 0, runs


def test_prefill_threshold_knob(monkeypatch):
    """SGLANG_EAGLE3_GRAMMAR_PREFILL_BELOW_US sets the runner's threshold; a value that is no number >= 0 stops the
    engine's start with an error naming it and the value."""
    from sglang_eagle3.runtime.grammar import PREFILL_BELOW_S

    monkeypatch.setenv("SGLANG_EAGLE3_GRAMMAR_PREFILL_BELOW_US", "250")
    assert Engine(device="cpu", speculative_num_steps=2).runner.grammar_prefill_below_s == pytest.approx(250e-6)
    monkeypatch.setenv("SGLANG_EAGLE3_GRAMMAR_PREFILL_BELOW_US", "")
    runner = Engine(device="cpu", speculative_num_steps=2).runner
    assert runner.grammar_prefill_below_s == pytest.approx(PREFILL_BELOW_S)
    monkeypatch.setenv("SGLANG_EAGLE3_GRAMMAR_PREFILL_BELOW_US", "-3")
    with pytest.raises(ValueError, match="SGLANG_EAGLE3_GRAMMAR_PREFILL_BELOW_US='-3'"):
        Engine(device="cpu", speculative_num_steps=2)


def test_ignore_eos_still_ends_where_the_grammar_ends(engines):
    sp = {"regex": "(yes|no)!", "temperature": 0, "max_new_tokens": 30, "ignore_eos": True}
    for eng in engines.values():
        out = eng.generate("And God said,", sp)
        assert out["meta_info"]["finish_reason"]["type"] == "stop" and out["text"] in ("yes!", "no!"), out


def test_a_grammar_kept_through_retraction():
    """A small KV cache retracts requests mid-output; their matchers keep their place."""
    params = [{"regex": r"[a-z]+( [a-z]+){40,60}\.", "temperature": t, "seed": 5, "max_new_tokens": 48}
              for t in (0, 0.8, 0, 1.0)]
    prompts = PROMPTS
    free = Engine(device="cpu", speculative_num_steps=3).generate(prompts, params)
    assert min(len(o["output_ids"]) for o in free) > 30
    tight = Engine(device="cpu", speculative_num_steps=3, max_total_tokens=128, page_size=16)
    out = tight.generate(prompts, params)
    assert [o["output_ids"] for o in out] == [o["output_ids"] for o in free]
    assert scheduler_of(tight).stats.retracted_requests > 0


def test_tp_ranks_compile_their_own(engines):
    """TP=2 worker processes: each rank compiles the grammars and masks (verify and draft) itself; the ranks agree
    and the output is TP=1's."""
    eng = Engine(device="cpu", speculative_num_steps=2, tp_size=2)
    try:
        params = _params()[:3]
        got = eng.generate(PROMPTS[:3], params)
        want = engines["plain"].generate(PROMPTS[:3], params)
        assert [o["output_ids"] for o in got] == [o["output_ids"] for o in want]
    finally:
        eng.shutdown()


# -- errors ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("sp,needle", [
    ({"regex": "a("}, "regex='a(' does not compile: Regex parsing error"),
    ({"json_schema": "{bad"}, "json_schema='{bad' does not compile"),
    ({"json_schema": '{"type": "foo"}'}, 'Unsupported type "foo"'),
    ({"ebnf": "root ::= foo"}, 'Rule "foo" is not defined'),
    ({"json_schema": {"type": "object"}}, "json_schema={'type': 'object'} must be a string (the schema serialized"),
    ({"regex": 5}, "regex=5 must be a string"),
    ({"regex": "a", "ebnf": "root ::= \"a\""}, "regex and ebnf are given"),
    ({"regex": "a+", "min_new_tokens": 2}, "min_new_tokens=2 cannot be combined with regex"),
])
def test_bad_grammars_name_the_field(engines, sp, needle):
    with pytest.raises(SamplingParamsError) as e:
        engines["plain"].generate("And God said,", sp)
    assert needle in str(e.value) and len(str(e.value)) < 500, str(e.value)
    assert not scheduler_of(engines["plain"]).running and not scheduler_of(engines["plain"]).waiting


def test_grammar_error_is_a_sampling_error():
    assert issubclass(GrammarError, SamplingParamsError)
    assert SamplingParams.from_dict({"json_schema": None, "regex": None}).grammar is None


def test_engines_that_cannot_constrain_say_why():
    off = Engine(model_path=TARGET, device="cpu", grammar_backend="none")
    with pytest.raises(GrammarError, match=r"off in this engine \(grammar_backend='none'\)"):
        off.generate("And", {"regex": "a+"})
    assert off.generate("And", {"max_new_tokens": 2, "temperature": 0})["output_ids"]
    bare = Engine(model_path=TARGET, device="cpu", skip_tokenizer_init=True)
    with pytest.raises(GrammarError, match="needs the engine's tokenizer"):
        bare.generate(input_ids=[5, 6], sampling_params={"regex": "a+"})
    with pytest.raises(ConfigError, match="grammar_backend='outlines' must be xgrammar or none"):
        Engine(model_path=TARGET, device="cpu", grammar_backend="outlines")


def test_json_whitespace_flag():
    """constrained_json_disable_any_whitespace: the separators are fixed, so the output is json.dumps' own."""
    eng = Engine(model_path=TARGET, device="cpu", constrained_json_disable_any_whitespace=True)
    out = eng.generate("And God said,", {"json_schema": json.dumps(SCHEMA), "temperature": 0.9, "seed": 2,
                                         "max_new_tokens": 60})
    if out["meta_info"]["finish_reason"]["type"] == "stop":
        assert out["text"] == json.dumps(json.loads(out["text"])), out["text"]
    else:
        assert "  " not in out["text"] and "\n" not in out["text"], out["text"]
