"""Greedy speculative decoding is lossless: EAGLE-3 output equals target-only output token for token.

Random tiny pairs over the configuration space the issue names (grouped and ungrouped routing, q_lora or
none, 0 or 1 dense layers, YaRN, k = 1..7, batches of 1..4 prompts of different lengths, reduced draft
vocabularies through d2t), plus paging and queueing variations (page sizes 1..16, fewer running slots than
prompts, stop tokens landing inside an accepted draft). Weights use ``randomize(scale=3)`` so argmax margins
stay far above float32 rounding between the decode (T=1) and verify (T=k+1) paths.

Oracle and adversarial drafts replace ``ModelRunner._draft_propose``: the real draft still runs (its KV cache
and hidden states stay real) but its proposals are overwritten with the target's known greedy continuation
(oracle: every draft token accepted) or a token guaranteed to differ (adversarial: none accepted).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import random

import pytest
from conftest import PatchedDraft, reference_draft, scheduler_of, small_config, small_draft_config

from sglang_eagle3 import Engine

pytestmark = pytest.mark.usefixtures("torch_one_thread")


@dataclasses.dataclass(frozen=True)
class Case:
    seed: int
    k: int
    n_group: int  # 1 = ungrouped routing
    q_lora: int | None
    dense: int
    yarn: bool
    draft_vocab: int
    n_prompts: int
    page_size: int
    max_running: int = 32
    draft_naming: str = "midlayer"
    stop_inside: bool = False  # stop_token_ids set to a token the target emits mid-generation

    def __str__(self):
        return (f"s{self.seed}-k{self.k}-g{self.n_group}-q{self.q_lora}-d{self.dense}-y{int(self.yarn)}"
                f"-dv{self.draft_vocab}-b{self.n_prompts}-p{self.page_size}")


def _cases() -> list[Case]:
    """24 cases; each option cycles with a different period so the combinations mix."""
    out = []
    for i in range(24):
        out.append(Case(
            seed=100 + i,
            k=1 + i % 7,
            n_group=(1, 2, 4)[i % 3],
            q_lora=(16, None)[(i // 2) % 2],
            dense=(0, 1)[(i // 3) % 2],
            yarn=(i % 5) in (1, 3),
            draft_vocab=(96, 40, 64)[(i // 4) % 3],
            n_prompts=1 + (i * 3) % 4,
            page_size=(16, 4, 1, 8)[(i // 6) % 4],
            max_running=2 if i % 8 == 5 else 32,
            draft_naming="layers.0" if i % 6 == 2 else "midlayer",
            stop_inside=i % 7 == 4,
        ))
    return out


CASES = _cases()


def test_case_table_covers_the_issue():
    """The lossless sweep must keep covering every option the issue lists."""
    assert len({c.seed for c in CASES}) >= 20
    assert {c.k for c in CASES} == set(range(1, 8))
    assert {c.n_group for c in CASES} >= {1, 2}
    assert {c.q_lora for c in CASES} == {16, None}
    assert {c.dense for c in CASES} == {0, 1}
    assert {c.yarn for c in CASES} == {False, True}
    assert {c.n_prompts for c in CASES} == {1, 2, 3, 4}
    assert any(c.draft_vocab < 96 for c in CASES)


def _pair_for(make_pair, c: Case):
    experts = 8 if c.n_group == 4 else 4
    cfg = small_config(n_group=c.n_group, topk_group=2 if c.n_group == 4 else 1, experts=experts,
                       q_lora=c.q_lora, dense=c.dense, yarn=c.yarn, max_pos=512 if c.yarn else 256)
    dcfg = small_draft_config(cfg, draft_vocab=c.draft_vocab)
    return make_pair(cfg, dcfg, seed=c.seed, scale=3.0, draft_naming=c.draft_naming)


def _prompts(rng: random.Random, n: int, vocab: int) -> list[list[int]]:
    lengths = rng.sample(range(1, 24), n)  # distinct lengths
    return [[rng.randrange(vocab) for _ in range(L)] for L in lengths]


def first_difference(a: list[int], b: list[int]) -> int | None:
    return next((j for j, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None if len(a) == len(b)
                else min(len(a), len(b)))


def _engine(pair, *, k: int | None, page_size: int = 16, max_running: int = 32, **kw) -> Engine:
    spec = dict(speculative_algorithm="EAGLE3", speculative_draft_model_path=pair.draft,
                speculative_num_steps=k) if k else {}
    return Engine(model_path=pair.target, device="cpu", dtype="float32", skip_tokenizer_init=True,
                  page_size=page_size, max_running_requests=max_running, **spec, **kw)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_greedy_lossless(make_pair, case: Case):
    """Target-only vs EAGLE-3 with the real draft (random weights: nearly every draft rejected) and with a
    noisy oracle draft (each token right with probability 0.7: rounds end at every accept length); all three
    outputs identical, and every KV page returned at the end."""
    pair = _pair_for(make_pair, case)
    rng = random.Random(case.seed)
    prompts = _prompts(rng, case.n_prompts, pair.config.vocab_size)
    max_new = [rng.randrange(6, 22) for _ in prompts]
    params = [{"max_new_tokens": m, "temperature": 0} for m in max_new]

    refs = reference_sequences(pair, prompts, max(max_new) + case.k + 2)
    if case.stop_inside:
        # Stop at a token the target emits a few tokens in, so the stop usually falls inside an accepted run.
        stops = [refs[tuple(p)][len(p) + 4] for p in prompts]
        params = [dict(sp, stop_token_ids=[t]) for sp, t in zip(params, stops, strict=True)]
    base = _engine(pair, k=None).generate(input_ids=prompts, sampling_params=params)
    if case.stop_inside:
        assert all(out["meta_info"]["finish_reason"]["type"] == "stop" for out in base)

    for draft in ("real", "noisy"):
        engine = _engine(pair, k=case.k, page_size=case.page_size, max_running=case.max_running)
        if draft == "noisy":
            PatchedDraft(engine, reference_draft(refs, "noisy", pair.config.vocab_size, noise=0.3, seed=case.seed))
        free0 = engine.runner.allocator.num_free
        spec = engine.generate(input_ids=prompts, sampling_params=params)
        for i, (b, s) in enumerate(zip(base, spec, strict=True)):
            assert s["output_ids"] == b["output_ids"], (
                f"{case} ({draft} draft): prompt {i} (len {len(prompts[i])}) diverged at token "
                f"{first_difference(s['output_ids'], b['output_ids'])}")
            assert s["meta_info"]["finish_reason"] == b["meta_info"]["finish_reason"]
            n, v = s["meta_info"]["completion_tokens"], s["meta_info"]["spec_verify_ct"]
            # One token from prefill, then 1..k+1 per verify round.
            assert math.ceil((n - 1) / (case.k + 1)) <= v <= max(n - 1, 0), (n, v, case.k)
        sched = scheduler_of(engine)
        assert engine.runner.allocator.num_free == free0, "KV pages leaked after all requests finished"
        assert not sched.running and not sched.waiting


# ------------------------------------------------------------------------------------------------------------
# Oracle and adversarial drafts
# ------------------------------------------------------------------------------------------------------------
def reference_sequences(pair, prompts, max_new: int, page_size: int = 16) -> dict[tuple[int, ...], list[int]]:
    """Target-only greedy prompt + continuation (long enough for any draft lookahead used here)."""
    outs = _engine(pair, k=None, page_size=page_size).generate(
        input_ids=prompts, sampling_params={"max_new_tokens": max_new, "temperature": 0})
    return {tuple(p): p + o["output_ids"] for p, o in zip(prompts, outs, strict=True)}


@pytest.mark.parametrize("k", [1, 3, 7])
def test_oracle_draft_accepts_everything(small_pair, k):
    rng = random.Random(k)
    prompts = _prompts(rng, 3, small_pair.config.vocab_size)
    max_new = 17
    refs = reference_sequences(small_pair, prompts, max_new + k + 2)
    engine = _engine(small_pair, k=k, page_size=4)
    PatchedDraft(engine, reference_draft(refs, "oracle", engine.model_config.vocab_size))
    outs = engine.generate(input_ids=prompts, sampling_params={"max_new_tokens": max_new, "temperature": 0})
    rounds = math.ceil((max_new - 1) / (k + 1))
    for p, o in zip(prompts, outs, strict=True):
        assert o["output_ids"] == refs[tuple(p)][len(p):len(p) + max_new]
        assert o["meta_info"]["spec_verify_ct"] == rounds, (k, o["meta_info"])
    stats = scheduler_of(engine).stats
    assert stats.accept_length_hist == {k + 1: 3 * rounds}, stats.accept_length_hist
    assert stats.avg_accept_length == k + 1


@pytest.mark.parametrize("k", [3, 5])
def test_accept_counters_count_only_tokens_output(small_pair, k):
    """A round cut by max_new_tokens (or a stop) counts the tokens the request got, as SGLang's verify cuts its
    accept lengths at the finish: the engine-wide accepted tokens are every request's output less its prefill
    token, and the cut round's length is in the histogram. (Counted whole, a run of short requests read as a
    longer accept length than SGLang's for the same outputs.)"""
    rng = random.Random(20 + k)
    prompts = _prompts(rng, 3, small_pair.config.vocab_size)
    max_new = rng.choice([m for m in range(2 * k + 4, 4 * k + 8) if (m - 1) % (k + 1)])  # the last round is cut
    refs = reference_sequences(small_pair, prompts, max_new + k + 2)
    engine = _engine(small_pair, k=k, page_size=4)
    PatchedDraft(engine, reference_draft(refs, "oracle", engine.model_config.vocab_size))
    outs = engine.generate(input_ids=prompts, sampling_params={"max_new_tokens": max_new, "temperature": 0})
    stats = scheduler_of(engine).stats
    full, cut = divmod(max_new - 1, k + 1)
    assert stats.accept_length_hist == {k + 1: 3 * full, cut: 3}, stats.accept_length_hist
    assert stats.draft_accept_hist == {k: 3 * (full + 1)}  # every verify accepted all k: the draft's own record
    assert stats.accepted_tokens == sum(len(o["output_ids"]) - 1 for o in outs) == 3 * (max_new - 1)
    assert stats.verify_forwards == sum(o["meta_info"]["spec_verify_ct"] for o in outs)


@pytest.mark.parametrize("k", [1, 4, 7])
def test_adversarial_draft_accepts_nothing(small_pair, k):
    rng = random.Random(10 + k)
    prompts = _prompts(rng, 4, small_pair.config.vocab_size)
    max_new = 12
    refs = reference_sequences(small_pair, prompts, max_new + k + 2)
    engine = _engine(small_pair, k=k, page_size=4)
    PatchedDraft(engine, reference_draft(refs, "adversarial", engine.model_config.vocab_size))
    outs = engine.generate(input_ids=prompts, sampling_params={"max_new_tokens": max_new, "temperature": 0})
    for p, o in zip(prompts, outs, strict=True):
        assert o["output_ids"] == refs[tuple(p)][len(p):len(p) + max_new]
        assert o["meta_info"]["spec_verify_ct"] == max_new - 1
    assert scheduler_of(engine).stats.accept_length_hist == {1: 4 * (max_new - 1)}


def test_oracle_and_real_draft_agree_with_max_new_tokens_cut(small_pair):
    """max_new_tokens that end in the middle of an accepted run: output is cut exactly there."""
    k = 5
    prompts = [[3, 1, 4, 1, 5, 9, 2, 6]]
    refs = reference_sequences(small_pair, prompts, 40)
    for max_new in (0, 1, 2, 7, 9):
        engine = _engine(small_pair, k=k)
        PatchedDraft(engine, reference_draft(refs, "oracle", engine.model_config.vocab_size))
        out = engine.generate(input_ids=prompts[0], sampling_params={"max_new_tokens": max_new, "temperature": 0})
        assert out["output_ids"] == refs[tuple(prompts[0])][8:8 + max_new]
        assert out["meta_info"]["finish_reason"] == {"type": "length", "length": max_new}


def test_noisy_draft_reaches_every_accept_length(small_pair):
    """A draft right ~75% of the time: rounds end at every accept length 0..k, output still exact."""
    k = 5
    rng = random.Random(7)
    prompts = _prompts(rng, 4, small_pair.config.vocab_size)
    max_new = 48
    refs = reference_sequences(small_pair, prompts, max_new + k + 2)
    engine = _engine(small_pair, k=k, page_size=4)
    PatchedDraft(engine, reference_draft(refs, "noisy", engine.model_config.vocab_size, noise=0.25, seed=3))
    outs = engine.generate(input_ids=prompts, sampling_params={"max_new_tokens": max_new, "temperature": 0})
    for p, o in zip(prompts, outs, strict=True):
        assert o["output_ids"] == refs[tuple(p)][len(p):len(p) + max_new]
    hist = scheduler_of(engine).stats.accept_length_hist
    assert set(hist) == set(range(1, k + 2)), hist


def test_eos_from_config_and_ignore_eos(make_pair, tmp_path):
    """An eos id from config.json stops inside an accepted run exactly where target-only stops; ignore_eos
    runs on. The eos is chosen as a token the target emits a few tokens in."""
    cfg = small_config()
    pair = make_pair(cfg, small_draft_config(cfg), seed=77, scale=3.0)
    prompt = [9, 8, 7, 6]
    ref = reference_sequences(pair, [prompt], 30)[tuple(prompt)][len(prompt):]
    eos = ref[6]
    target = tmp_path / "target"
    target.mkdir()
    for f in os.listdir(pair.target):
        os.symlink(os.path.join(pair.target, f), target / f)
    hf = json.loads((target / "config.json").read_text())
    (target / "config.json").unlink()
    (target / "config.json").write_text(json.dumps({**hf, "eos_token_id": [eos, 95]}))
    eos_pair = dataclasses.replace(pair, target=str(target))
    for ignore in (False, True):
        sp = {"max_new_tokens": 24, "temperature": 0, "ignore_eos": ignore}
        base = _engine(eos_pair, k=None).generate(input_ids=prompt, sampling_params=sp)
        engine = _engine(eos_pair, k=5)
        refs = {tuple(prompt): prompt + ref}
        PatchedDraft(engine, reference_draft(refs, "oracle", cfg.vocab_size))
        spec = engine.generate(input_ids=prompt, sampling_params=sp)
        assert spec["output_ids"] == base["output_ids"]
        assert spec["meta_info"]["finish_reason"] == base["meta_info"]["finish_reason"]
        if ignore:
            assert len(spec["output_ids"]) == 24
        else:
            assert spec["output_ids"] == ref[:ref.index(eos) + 1]
            assert spec["meta_info"]["finish_reason"] == {"type": "stop", "matched": eos}


def test_generation_up_to_the_context_limit(make_pair):
    """context_length = max_position_embeddings: the last verify rounds write the last rope positions; output
    is the target-only output (which may run a few tokens further, having no draft lookahead to reserve)."""
    cfg = small_config(max_pos=48)
    pair = make_pair(cfg, small_draft_config(cfg, draft_vocab=64), seed=78, scale=3.0)
    prompts = [[1, 2, 3] * 7, [4] * 30]
    sp = {"temperature": 0}  # max_new_tokens left out: cut to what the context leaves (an explicit 100 is refused)
    base = _engine(pair, k=None).generate(input_ids=prompts, sampling_params=sp)
    for k in (1, 4, 7):
        engine = _engine(pair, k=k, page_size=4)
        outs = engine.generate(input_ids=prompts, sampling_params=sp)
        for p, b, s in zip(prompts, base, outs, strict=True):
            assert len(p) + len(s["output_ids"]) == 48 - k  # k positions stay reserved for the last round
            assert s["output_ids"] == b["output_ids"][:len(s["output_ids"])]
            assert len(p) + len(b["output_ids"]) == 48


def test_greedy_requests_stay_exact_next_to_sampled_ones(small_pair):
    """Per-request acceptance: a sampled request in the same batch does not disturb a greedy one."""
    prompts = [[3, 1, 4, 1, 5], [2, 7, 1, 8, 2, 8, 1], [1, 6, 1, 8]]
    greedy = {"max_new_tokens": 20, "temperature": 0}
    base = _engine(small_pair, k=None).generate(input_ids=[prompts[0], prompts[2]], sampling_params=greedy)
    params = [greedy, {"max_new_tokens": 20, "temperature": 1.0, "seed": 3}, greedy]
    outs = _engine(small_pair, k=3).generate(input_ids=prompts, sampling_params=params)
    assert [outs[0]["output_ids"], outs[2]["output_ids"]] == [b["output_ids"] for b in base]
    assert len(outs[1]["output_ids"]) == 20


@pytest.mark.parametrize("accept", [1.0, 2.5, 4.0])
def test_simulated_accept_length_is_pinned(small_pair, accept):
    """Benchmarking mode (SGLang's SGLANG_SIMULATE_ACC_LEN): rounds accept floor/ceil of the pinned mean, whatever
    the draft proposes, and each request still gets exactly max_new_tokens."""
    k, max_new = 3, 60
    prompts = _prompts(random.Random(5), 3, small_pair.config.vocab_size)
    engine = _engine(small_pair, k=k, speculative_simulate_accept_length=accept)
    outs = engine.generate(input_ids=prompts, sampling_params={"max_new_tokens": max_new, "temperature": 0,
                                                               "ignore_eos": True})
    assert [len(o["output_ids"]) for o in outs] == [max_new] * 3
    stats = scheduler_of(engine).stats
    # (drafts accepted: the pinned length less the target's token; a request's last round may keep fewer)
    assert set(stats.draft_accept_hist) <= {math.floor(accept) - 1, math.ceil(accept) - 1}, stats.draft_accept_hist
    assert abs(stats.avg_accept_length - accept) < 0.35, stats.avg_accept_length
