"""Strict thinking end to end (EngineArgs.enable_strict_thinking, SGLang 0.5.23's --enable-strict-thinking;
runtime/reasoning.py): through the tiny pair whose tokenizer holds <think> / </think> and Kimi's call markup as special
tokens, with --reasoning-parser kimi_k2.

Checked against: the rules (the thinking opened by a logit_bias on <think> holds exactly the budget's tokens, then
</think>, none of them the format's excluded tokens, which a logit_bias pushes), the same engine without strict
thinking (a pushed excluded token then fills the thinking: the rules changed the output), plain decoding (EAGLE-3's
output equals it, greedy and sampled), and SGLang's errors for what strict thinking cannot serve.
"""

from __future__ import annotations

import random

import pytest

from sglang_eagle3 import Engine
from sglang_eagle3.config import ConfigError
from sglang_eagle3.env import MAX_THINK_TOKENS, overrides
from sglang_eagle3.runtime.adaptive import DraftLengthPolicy
from sglang_eagle3.runtime.reasoning import REASONING_FORMATS
from sglang_eagle3.runtime.sampling import SamplingParamsError

from .conftest import random_words
from .test_reasoning import thinking_model  # noqa: F401  (the tiny pair with the markers as tokens: a fixture)
from .test_tools import SB

pytestmark = pytest.mark.usefixtures("torch_one_thread")
THINK, END = "<think>", "</think>"


def _engine(model, spec: bool, **kw) -> Engine:
    target, draft = model
    extra = dict(speculative_algorithm="EAGLE3", speculative_draft_model_path=draft, speculative_num_steps=3) \
        if spec else {}
    return Engine(model_path=target, device="cpu", log_level="warning", reasoning_parser="kimi_k2", **extra, **kw)


def _run(eng: Engine, prompts: list[str], params: list[dict]) -> list[list[int]]:
    return [o["output_ids"] for o in eng.generate(prompts, params)]


def test_budget_and_excluded_tokens_hold_and_speculation_is_exact(thinking_model):  # noqa: F811
    rng = random.Random()
    prompts = [" ".join(random_words(rng, rng.randint(2, 9))) for _ in range(3)]
    budgets = [rng.randint(1, 6), 0, rng.randint(7, 12)]
    seed = rng.randrange(2 ** 31)
    outputs = {}
    for spec in (False, True):
        eng = _engine(thinking_model, spec, enable_strict_thinking=True)
        tok = eng.tokenizer
        [think], [end], [sb] = tok.encode(THINK), tok.encode(END), tok.encode(SB)
        # <think> above everything at the start, Kimi's tool-section marker (excluded inside the thinking) above the
        # rest after it: the thinking would be that marker again and again were it allowed. (Gaps of 50: a tiny
        # model's own logits differ by ~10, which a sampled request's 0.8 temperature let through at +40 / +30.)
        # (</think> below everything: a sampled thinking never ends by itself before its budget; past it the mask
        # leaves the end marker alone, whatever its bias)
        bias = {think: 100.0, sb: 50.0, end: -100.0}
        params = [{"temperature": 0, "max_new_tokens": 20, "logit_bias": bias,
                   "custom_params": {"thinking_budget": b}} for b in budgets]
        params[2] = dict(params[2], temperature=0.8, seed=seed)
        outputs[spec] = _run(eng, prompts, params)
        eng.shutdown()
    assert outputs[True] == outputs[False]
    for ids, budget in zip(outputs[False], budgets, strict=True):
        assert ids[0] == think, ids
        assert ids[budget + 1] == end and end not in ids[1:budget + 1], (budget, ids)
        # Both pushed tokens are excluded inside the thinking (<think> too, in Kimi's list) and allowed after it,
        # where they are all the answer holds (greedy: the bias on <think> wins).
        assert think not in ids[1:budget + 1] and sb not in ids[1:budget + 1], (budget, ids)
        assert think in ids[budget + 2:] and set(ids[budget + 2:]) <= {think, sb}, (budget, ids)

    # Without strict thinking the same requests think with an excluded token (the pushed <think>), past any budget.
    eng = _engine(thinking_model, False)
    loose = _run(eng, prompts, [{"temperature": 0, "max_new_tokens": 8, "logit_bias": bias}] * 3)
    eng.shutdown()
    for ids in loose:
        assert ids[0] == think and ids[1:].count(think) >= 4 and end not in ids, ids


def test_engine_default_budget_and_a_request_without_limit(thinking_model):  # noqa: F811
    """SGLANG_MAX_THINK_TOKENS is the budget of a request that names none; thinking_budget -1 asks for no limit."""
    budget = random.randint(1, 5)
    with overrides({MAX_THINK_TOKENS.name: str(budget)}):
        eng = _engine(thinking_model, True, enable_strict_thinking=True)
    [think], [end] = eng.tokenizer.encode(THINK), eng.tokenizer.encode(END)
    sp = {"temperature": 0, "max_new_tokens": budget + 8, "logit_bias": {think: 40.0, end: -100.0}}
    default, unlimited = _run(eng, ["the cat sat", "the cat sat"],
                              [sp, dict(sp, custom_params={"thinking_budget": -1})])
    eng.shutdown()
    assert default[0] == think and default[budget + 1] == end and end not in default[1:budget + 1], default
    # The same greedy thinking, not ended at the default's budget (the model may end it later on its own).
    assert unlimited[:budget + 1] == default[:budget + 1] and unlimited[budget + 1] != end, unlimited


def test_what_strict_thinking_cannot_serve_is_refused(thinking_model, tiny_model):  # noqa: F811
    with pytest.raises(ConfigError, match="enable_strict_thinking=True needs a reasoning_parser"):
        Engine(model_path=thinking_model[0], device="cpu", enable_strict_thinking=True)
    with pytest.raises(ConfigError, match="'</think>' is not one token"):  # the tiny model's own tokenizer
        Engine(model_path=tiny_model.target, device="cpu", reasoning_parser="kimi_k2", enable_strict_thinking=True)
    with overrides({MAX_THINK_TOKENS.name: "lots"}), pytest.raises(ConfigError, match="SGLANG_MAX_THINK_TOKENS='lots'"):
        _engine(thinking_model, False, enable_strict_thinking=True)
    eng = _engine(thinking_model, False)  # no strict thinking: a budget it would not enforce is refused
    try:
        with pytest.raises(SamplingParamsError, match="thinking_budget=7 needs strict thinking"):
            eng.generate("hi", {"custom_params": {"thinking_budget": 7}})
        with pytest.raises(SamplingParamsError, match="custom_params=.* no custom logit processors"):
            eng.generate("hi", {"custom_params": {"thinking_budget": 7, "top_ngram": 3}})
        with pytest.raises(SamplingParamsError, match="thinking_budget=True must be an integer"):
            eng.generate("hi", {"custom_params": {"thinking_budget": True}})
        assert eng.generate("hi", {"custom_params": {}, "max_new_tokens": 2})["meta_info"]["completion_tokens"] == 2
    finally:
        eng.shutdown()


def test_tensor_parallel_ranks_hold_the_same_rules(thinking_model):  # noqa: F811
    """TP=2 worker processes: each rank makes its own matchers (SGLANG_MAX_THINK_TOKENS read in the workers, which
    inherit the launcher's environment); the output is TP=1's."""
    budget = random.randint(1, 4)
    with overrides({MAX_THINK_TOKENS.name: str(budget)}):
        outs = []
        for tp in (1, 2):
            # (plain decoding: the tiny draft's one KV head does not split over two ranks)
            eng = _engine(thinking_model, False, enable_strict_thinking=True, tp_size=tp)
            [think], [end] = eng.tokenizer.encode(THINK), eng.tokenizer.encode(END)
            sp = {"temperature": 0, "max_new_tokens": 10, "logit_bias": {think: 40.0, end: -100.0}}
            params = [sp, dict(sp, custom_params={"thinking_budget": 6})]
            outs.append(_run(eng, ["Pack my box", "How vexingly"], params))
            eng.shutdown()
    assert outs[1] == outs[0]
    assert outs[0][0][budget + 1] == end and outs[0][1][7] == end, outs[0]



class _Resting(DraftLengthPolicy):
    """The adaptive policy that always chooses k = 0 (the draft resting, caught up every probe_rounds rounds)."""

    def choose(self, current, batch, sampled=False):
        return 0


def test_a_resting_draft_is_checked_inside_the_thinking(thinking_model):  # noqa: F811
    """The adaptive policy's catch-up checks (runtime/scheduler.py _catch_up_checks) under strict thinking: a resting
    draft's catch-up proposals are checked against the thinking's tokens too (before, a request under any matcher had
    none), each where the thinking's rule allowed the proposal (a round's d_1 is the draft's choice among the allowed
    tokens, so a refused proposal says nothing): inside the thinking where it is not an excluded token, at the forced
    end marker only a proposal of it; outside the thinking every one. Every check the catch-ups made, recomputed here
    from the outputs, the proposals and those rules."""
    budget, probe = random.randint(14, 22), 4
    target, draft = thinking_model
    eng = Engine(model_path=target, device="cpu", log_level="warning", reasoning_parser="kimi_k2",
                 enable_strict_thinking=True, speculative_algorithm="EAGLE3", speculative_draft_model_path=draft,
                 speculative_num_steps=1, speculative_adaptive=True, speculative_num_steps_candidates=[0],
                 speculative_adaptive_probe_rounds=probe, max_running_requests=2)
    tok, sched = eng.tokenizer, eng.backend.scheduler
    # The draft rests at every round: left to the timed policy it did not always (its choice follows the round costs
    # the engine timed at start; once under a loaded CI box no round rested and no catch-up ran).
    sched.adaptive = _Resting(sched.adaptive.config, sched.adaptive.costs)
    [think], [end], [sb] = tok.encode(THINK), tok.encode(END), tok.encode(SB)
    excluded = {ids[0] for s in REASONING_FORMATS["kimi_k2"].excluded if len(ids := tok.encode(s)) == 1} - {end}
    assert {think, sb} <= excluded

    catch_ups, checks = {}, []  # id(reqs) -> each request's (rid, output offset of its row, rows); per read
    catch_up, read = sched._catch_up, sched._read_proposals

    def spy_catch_up(reqs, lazy=False):
        n = [len(sched._pending_aux.get(r.rid, ())) for r in reqs]
        catch_ups[id(reqs)] = [(r.rid, len(r.output_ids) - k, k) for r, k in zip(reqs, n, strict=True)]
        catch_up(reqs, lazy)

    def spy_read():
        before, pending = len(sched._first_checks), sched._proposals
        read()
        if pending is not None and pending[-1] is not None:
            reqs, host = pending[0], pending[1].tolist()
            checks.append((catch_ups[id(reqs)], host[len(reqs):], sched._first_checks[before:]))

    propose = sched.runner.catch_up

    def excluded_proposals(rows, aux, samp=None):  # every third proposal an excluded token (the draft's are seldom)
        every, hidden = propose(rows, aux, samp)
        every = every.clone()
        every[::3] = sb
        return every, hidden

    sched._catch_up, sched._read_proposals, sched.runner.catch_up = spy_catch_up, spy_read, excluded_proposals
    sp = {"temperature": 0, "max_new_tokens": budget + 3 * probe, "logit_bias": {think: 100.0, sb: 50.0, end: -100.0},
          "custom_params": {"thinking_budget": budget}}
    outs = eng.generate(["Pack my box", "How vexingly quick"], [sp, sp])
    eng.shutdown()
    output = {o["meta_info"]["id"]: o["output_ids"] for o in outs}
    for ids in output.values():  # <think>, the budget's tokens, </think>, the answer
        assert ids[0] == think and ids[budget + 1] == end and not excluded & set(ids[1:budget + 1]), ids

    assert checks
    inside = 0
    for rows, every, got in checks:
        want, start = [], 0
        for rid, offset, n in rows:
            ids = output[rid]
            for j in range(n - 1):  # row j proposes the token at output index offset + j + 1
                i, p = offset + j + 1, every[start + j]
                t = ids[i]
                if offset + n > budget + 1 or not 1 <= i <= budget + 1:  # the thinking ended: no rules left
                    want.append(int(p == t))
                elif i == budget + 1:  # the forced end
                    want += [1] if p == end else []
                else:
                    inside += 1
                    want += [int(p == t)] if p == t or p not in excluded else []
            start += n
        assert got == want, (rows, every, got, want)
    assert inside > 0, (budget, checks)
    assert sum(len(got) for _, _, got in checks) < sum(len(every) - len(rows) for rows, every, _ in checks)
