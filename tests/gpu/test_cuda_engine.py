"""End to end on CUDA (skipped without it): graphs on, speculative == target-only, fallback accounting,
kernels vs references, TP=1 through the worker machinery."""

from __future__ import annotations

import pytest
import torch

from sglang_eagle3 import Engine, env
from sglang_eagle3.testing import tiny_config, tiny_draft_config, write_tiny_pair

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)

PROMPTS = [[5, 3, 9, 1, 22, 7], [4, 4, 8], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11], [30], [9, 8, 7, 6, 5]]
GREEDY = {"max_new_tokens": 24, "temperature": 0}


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    cfg = tiny_config(vocab=512, hidden=128, heads=8, layers=5, q_lora=64, kv_lora=64, nope=32, rope=32, v=32,
                      experts=16, top_k=4, n_group=4, topk_group=2, moe_inter=64, inter=256, yarn=True, max_pos=1024)
    dcfg = tiny_draft_config(cfg, draft_vocab=256, heads=8, kv_heads=4, inter=256, aux_ids=[1, 3, 4])
    return write_tiny_pair(str(tmp_path_factory.mktemp("gpu")), cfg, dcfg, seed=5, scale=3.0)


def make(pair, spec=True, k=3, **kw):
    """float32 with the torch reference ops: exact-equality tests check the graph machinery, not kernels."""
    tpath, dpath = pair
    extra = dict(speculative_algorithm="EAGLE3", speculative_draft_model_path=dpath, speculative_num_steps=k) \
        if spec else {}
    kw = {"attention_backend": "torch", "moe_runner_backend": "torch", "dtype": "float32", **kw}
    return Engine(model_path=tpath, device="cuda", **extra, **kw)


@pytest.fixture(scope="module")
def reference(pair):
    eng = make(pair, spec=False, disable_cuda_graph=True)
    return [o["output_ids"] for o in eng.generate(input_ids=PROMPTS, sampling_params=GREEDY)]


@pytest.mark.parametrize("k", [1, 3, 5, 7])
def test_spec_with_graphs_equals_reference(pair, reference, k):
    eng = make(pair, k=k, cuda_graph_max_bs=8)
    outs = eng.generate(input_ids=PROMPTS, sampling_params=GREEDY)
    assert [o["output_ids"] for o in outs] == reference
    counts = eng.get_server_info()["forward_counts"]
    assert counts["target_verify"]["eager"] == 0 and counts["target_verify"]["graph"] > 0
    assert counts["draft_extend"]["eager"] == 0
    if k > 1:
        assert counts["draft_decode"]["eager"] == 0


def test_decode_graphs_equal_reference(pair, reference):
    eng = make(pair, spec=False, cuda_graph_max_bs=4)
    outs = eng.generate(input_ids=PROMPTS[:4], sampling_params=GREEDY)
    assert [o["output_ids"] for o in outs] == reference[:4]
    assert eng.get_server_info()["forward_counts"]["target_decode"]["eager"] == 0


def test_fallback_counted_only_when_batch_exceeds_buckets(pair, reference):
    eng = make(pair, cuda_graph_max_bs=2)
    outs = eng.generate(input_ids=PROMPTS[:2], sampling_params=GREEDY)
    assert eng.get_server_info()["forward_counts"]["target_verify"]["eager"] == 0
    outs = eng.generate(input_ids=PROMPTS, sampling_params=GREEDY)  # 5 > 2: eager, counted with a reason
    assert [o["output_ids"] for o in outs] == reference
    verify = eng.get_server_info()["forward_counts"]["target_verify"]
    assert verify["eager"] > 0
    assert any("above the largest captured bucket" in r for r in verify["eager_reasons"])


def test_disable_cuda_graph_counts_every_verify_as_eager(pair, reference):
    eng = make(pair, disable_cuda_graph=True)
    outs = eng.generate(input_ids=PROMPTS, sampling_params=GREEDY)
    assert [o["output_ids"] for o in outs] == reference
    info = eng.get_server_info()
    verify = info["forward_counts"]["target_verify"]  # batch forwards (verify_forwards counts per request)
    assert verify["graph"] == 0 and 0 < verify["eager"] <= info["verify_forwards"]
    assert list(verify["eager_reasons"]) == ["disable_cuda_graph=True"]


def test_spec_with_kernels_equals_target_only_with_kernels(pair):
    """Losslessness on the default CUDA path (Triton kernels, bf16, graphs)."""
    outs = {}
    for spec in (False, True):
        eng = make(pair, spec=spec, dtype="bfloat16", attention_backend="triton", moe_runner_backend="triton")
        outs[spec] = [o["output_ids"] for o in eng.generate(input_ids=PROMPTS, sampling_params=GREEDY)]
    assert outs[True] == outs[False]


@pytest.mark.parametrize("spec", [False, True])
def test_overlap_schedule_changes_nothing(pair, spec):
    """The next greedy round queued before the host reads the one in flight (pinned copies, events, the next
    batch built on the device) gives what reading each round first gives, on the default CUDA path."""
    outs, free = {}, {}
    for overlap in (True, False):
        eng = make(pair, spec=spec, dtype="bfloat16", attention_backend="triton", moe_runner_backend="triton",
                   disable_overlap_schedule=not overlap, max_running_requests=3)
        sched = eng.scheduler.scheduler
        free0 = sched.runner.allocator.num_free
        outs[overlap] = [(o["output_ids"], o["meta_info"]["finish_reason"])
                         for o in eng.generate(input_ids=PROMPTS, sampling_params=GREEDY)]
        free[overlap] = (sched.runner.allocator.num_free, free0)
        assert sched._ahead is None
    assert outs[True] == outs[False]
    assert free[True][0] == free[True][1] and free[False][0] == free[False][1]


SAMPLED = {  # graphs with the sort (top_k, top_p), and without it (temperature, min_p)
    "spec_round_filtered": [{"max_new_tokens": 24, "temperature": 0.8, "top_p": 0.95, "seed": 1},
                            {"max_new_tokens": 20, "temperature": 1.3, "top_k": 50, "seed": 2}, GREEDY,
                            {"max_new_tokens": 24, "temperature": 0.6, "min_p": 0.02},
                            {"max_new_tokens": 17, "temperature": 1.0}],
    "spec_round_sampled": [{"max_new_tokens": 24, "temperature": 0.8, "seed": 1}, GREEDY,
                           {"max_new_tokens": 20, "temperature": 1.3, "min_p": 0.05, "seed": 2},
                           {"max_new_tokens": 24, "temperature": 0.6}, {"max_new_tokens": 17, "temperature": 1.0}],
}


def _plain_and_speculative(pair, params, k: int, max_running: int):
    """PROMPTS with ``params`` (one per prompt), graph buckets up to 4: plain (graphs), plain (eager), EAGLE-3 k
    (graphs, overlap schedule) and EAGLE-3 k without the overlap -> their outputs and the EAGLE-3 run's
    forward_counts."""
    def run(**kw):
        eng = make(pair, max_running_requests=max_running, cuda_graph_max_bs=4, **kw)
        outs = [o["output_ids"] for o in eng.generate(input_ids=PROMPTS, sampling_params=params)]
        return outs, eng.get_server_info()["forward_counts"]

    plain, _ = run(spec=False)
    eager, _ = run(spec=False, disable_cuda_graph=True)
    spec, counts = run(k=k)
    spec_off, _ = run(k=k, disable_overlap_schedule=True)
    return plain, eager, spec, spec_off, counts


@pytest.mark.parametrize("k,graphs", [(1, "spec_round_filtered"), (3, "spec_round_filtered"),
                                      (3, "spec_round_sampled")])
def test_sampled_spec_with_graphs_equals_plain(pair, k, graphs):
    """Sampled requests (mixed with greedy ones, seeded and not) through the sampled round's graphs, the Gumbel
    kernel and the overlap schedule give token for token what plain decoding (graphs, and eager) gives for the
    same seeds; and the same with the overlap off."""
    plain, eager, spec, spec_off, counts = _plain_and_speculative(pair, SAMPLED[graphs], k, max_running=3)
    assert plain == eager
    assert spec == plain
    assert spec_off == plain
    assert counts[graphs]["graph"] > 0 and counts[graphs]["eager"] == 0, counts
    assert counts["target_verify"]["eager"] == 0
    assert len({tuple(o) for o in plain}) == len(plain)


PENALIZED = [dict(GREEDY, frequency_penalty=1.5), dict(GREEDY, presence_penalty=-2.0, repetition_penalty=0.6,
                                                        temperature=0.9, seed=3),
             dict(GREEDY), dict(GREEDY, repetition_penalty=1.7, min_new_tokens=6, temperature=0.7, top_p=0.9),
             dict(GREEDY, temperature=1.1, seed=8)]


@pytest.mark.parametrize("k", [1, 4])
def test_penalized_spec_equals_plain(pair, k):
    """Penalties (sampling.penalized_logits; each verify row counts the drafts before it), mixed with unpenalized,
    greedy and sampled requests, with graphs and the overlap schedule: speculative == plain (graphs) == plain
    (eager). The penalized round runs as its parts: the verify forward still replays its graph."""
    plain, eager, spec, spec_off, counts = _plain_and_speculative(pair, PENALIZED, k, max_running=4)
    assert plain == eager
    assert spec == plain and spec_off == plain
    assert counts["spec_round_penalized"]["eager"] > 0, counts
    assert counts["target_verify"]["eager"] == 0 and counts["target_verify"]["graph"] > 0, counts


def test_grammar_spec_equals_plain():
    """Structured output (runtime/grammar.py) on the embedded pair (it has a tokenizer and an eos): EAGLE-3 with
    graphs == plain with graphs == plain eager; the grammar round's parts each replay a graph."""
    pytest.importorskip("xgrammar")
    import json

    from sglang_eagle3.engine import EMBEDDED_DIR

    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 16}, "n": {"type": "integer"}},
              "required": ["name", "n"]}
    params = [{"regex": r"(yes|no|maybe)[.!]{1,3}", "temperature": 0},
              {"regex": r"[A-Z][a-z]+( [a-z]+){2,12}\.", "temperature": 0.8, "seed": 2},
              {"json_schema": json.dumps(schema), "temperature": 0}, {"json_schema": "$$ANY$$", "temperature": 0.7,
                                                                      "seed": 5},
              {"ebnf": 'root ::= "The " word (" " word)* "."\nword ::= [a-z]+', "temperature": 0}, {"temperature": 0},
              {"regex": r"[a-z]+( [a-z]+){8,30}\.", "temperature": 0, "repetition_penalty": 1.8}]
    params = [dict(p, max_new_tokens=40) for p in params]
    prompts = ["And God said,", "In the beginning", "The king of Israel", "And he answered", "Then", "And God",
               "And the LORD"]

    def run(k_now=None, **kw):
        # float32 and the torch reference ops, as make() (equality checks the machinery, not kernels)
        eng = Engine(model_path=kw.pop("model_path", None), device="cuda", max_running_requests=4,
                     cuda_graph_max_bs=4, dtype="float32", attention_backend="torch", moe_runner_backend="torch",
                     **kw)
        if k_now is not None:
            eng.set_speculative_num_steps(k_now)
        outs = [o["output_ids"] for o in eng.generate(prompts, params)]
        return outs, eng.get_server_info()["forward_counts"]

    target = f"{EMBEDDED_DIR}/target"
    plain, _ = run(model_path=target)
    eager, _ = run(model_path=target, disable_cuda_graph=True)
    assert plain == eager
    # The draft's rows filled after its steps (its candidates checked on the host; the JSON schema's forced tokens
    # refilled), before them (masked candidates), and as the default chooses.
    for below in ("0", "inf", None):
        with env.overrides({env.GRAMMAR_PREFILL_BELOW_US.name: below}):
            spec, counts = run(speculative_num_steps=3)
        assert spec == plain, below
        # Every part of a grammar round replays its graph (ModelRunner.grammar_spec_round).
        for name in ("spec_round_grammar", "grammar_draft_head", "grammar_draft_decode", "target_verify"):
            assert counts[name]["eager"] == 0 and counts[name]["graph"] > 0, (below, name, counts)
    # k = 0 (the adaptive draft length's cheapest round): the verify of the last token under its mask row, then the
    # draft's one-token extend, each a graph replay
    spec, counts = run(k_now=0, speculative_num_steps=3, speculative_num_steps_candidates=(0,))
    assert spec == plain
    for name in ("spec_round_grammar", "target_verify"):
        assert counts[name]["eager"] == 0 and counts[name]["graph"] > 0, (name, counts)


def test_kernel_logits_match_references(pair):
    """The same verify batch through the Triton kernels and through the torch references (bf16)."""
    logits = {}
    for backend in ("torch", "triton"):
        eng = make(pair, spec=False, dtype="bfloat16", disable_cuda_graph=True, attention_backend=backend,
                   moe_runner_backend=backend)
        runner = eng.runner
        torch.manual_seed(0)
        for kv in runner.target_kv.layers:
            kv.copy_(torch.randn_like(kv, dtype=torch.float32))
        pages = runner.allocator.alloc(6)
        bt = runner.build([([7, 8, 9, 10], 40, pages[:3]), ([11, 12, 13, 14], 17, pages[3:])])
        logits[backend] = runner.target_uniform(bt, 4, verify=True)[0].float()
    # bf16 through 5 layers of a peaky random model (weights x3): the two paths round differently at every op;
    # a wrong kernel shows up as O(1). Measured on the H200: 3.3e-2.
    err = (logits["triton"] - logits["torch"]).norm() / logits["torch"].norm()
    assert err < 6e-2, err


def test_tp1_through_worker_processes(pair, reference):
    eng = make(pair, use_worker_processes=True)
    try:
        outs = eng.generate(input_ids=PROMPTS, sampling_params=GREEDY)
        assert [o["output_ids"] for o in outs] == reference
        report = eng.get_server_info()["worker_env"]
        assert len(report) == 1 and report[0]["rank"] == 0
        # The graph capture reported progress to the start-up bound (worker_start_timeout counts time without it).
        assert "CUDA graphs" in eng.backend._doing[0][0], eng.backend._doing
    finally:
        eng.shutdown()


def test_adaptive_num_steps_replays_graphs_for_every_candidate(pair, reference):
    eng = make(pair, k=3, speculative_num_steps_candidates=[1, 5], cuda_graph_max_bs=8)
    reqs = [eng.make_request(input_ids=p, sampling_params=GREEDY) for p in PROMPTS]
    for r in reqs:
        eng.scheduler.add(r)
    done, step = {}, 0
    while len(done) < len(reqs):
        eng.set_speculative_num_steps([1, 5, 3][step % 3])
        done.update({r.rid: r for r in eng.scheduler.step() if r.finished})
        step += 1
    assert [done[r.rid].output_ids for r in reqs] == reference
    counts = eng.get_server_info()["forward_counts"]
    assert counts["target_verify"]["eager"] == 0 and counts["draft_extend"]["eager"] == 0


@pytest.mark.parametrize("overlap", [True, False])
def test_resting_draft_with_graphs(pair, reference, overlap):
    """The adaptive policy held at k = 0 for 14 steps with the draft resting (a catch-up every 3 rounds: with the
    overlap queued behind the round in flight, its proposals read with it), then k = 3: the output is the
    reference's, the resting rounds replay the decode step's graph and every catch-up a draft prefill graph, and
    the rounds after catch-ups report position 1 to the policy."""
    import dataclasses

    from sglang_eagle3.runtime.adaptive import DraftLengthPolicy

    eng = make(pair, k=3, speculative_adaptive=True, speculative_num_steps_candidates=[0], cuda_graph_max_bs=8,
               disable_overlap_schedule=not overlap)
    sched = eng.backend.scheduler
    seen = []

    class Rest(DraftLengthPolicy):
        steps = 0

        def choose(self, current, batch, sampled=False):
            self.steps += 1
            return 0 if self.steps <= 14 else 3

        def observe(self, k, accepted, first_checks=()):
            seen.append((k, len(accepted), len(first_checks)))
            super().observe(k, accepted, first_checks)

    sched.adaptive = Rest(dataclasses.replace(sched.adaptive.config, probe_rounds=3), sched.adaptive.costs)
    outs = eng.generate(input_ids=PROMPTS, sampling_params=GREEDY)
    assert [o["output_ids"] for o in outs] == reference
    counts = eng.get_server_info()["forward_counts"]
    assert counts["target_decode"]["eager"] == 0 and counts["target_decode"]["graph"] >= 10, counts
    # the prefill's draft extend and at least two catch-ups a batch of rest
    assert counts["draft_prefill"]["eager"] == 0 and counts["draft_prefill"]["graph"] >= 3, counts
    assert counts["spec_round"]["eager"] == 0 and counts["spec_round"]["graph"] > 0, counts
    # (every round reaches the policy; a resting one between catch-ups without evidence of its own; a catch-up of 3
    # rows checks the proposals of its first 2 for each greedy request, with the round that reads it)
    assert any(k == 1 and n for k, n, _ in seen) and any(k == 1 and not n for k, n, _ in seen), seen
    assert sum(c for _, _, c in seen) >= 2 * len(PROMPTS), seen
    assert any(k == 3 for k, _, _ in seen), seen
    assert not sched._pending_aux


def test_speculative_adaptive_with_graphs(pair, reference):
    """speculative_adaptive=True on CUDA: the start-up timing replays every candidate's round graph on every bucket
    (k = 0 too: the verify of one token and the draft's one-token extend) and the resting draft's catch-up without
    counting, the policy's k moves among the candidates (forced to cycle here), every round replays a graph (k = 0:
    the decode step's, the draft resting; its catch-ups the draft prefill's), and the output is the reference's;
    with xgrammar present, a regex request through the same cycle gives plain decoding's output. The timed table is
    what the policy uses: a round of more drafts is not cheaper than one of fewer at batch 1 (graph replays are
    stable enough to order them)."""
    from sglang_eagle3.runtime.adaptive import DraftLengthPolicy

    eng = make(pair, k=3, speculative_adaptive=True, cuda_graph_max_bs=8)
    info = eng.get_server_info()
    assert all(v["graph"] == v["eager"] == 0 for v in info["forward_counts"].values()), info["forward_counts"]
    ms = info["adaptive"]["round_ms"]
    sampled = ms.pop("sampled")  # (the same rounds with sampled requests: the sampler's graphs)
    assert set(ms) == set(sampled) == {"decode", "catch_up", 0, 1, 3, 5}
    assert all(set(v) == {1, 2, 4, 8} for v in (*ms.values(), *sampled.values()))
    assert ms["decode"][1] < ms[0][1] < ms[5][1] and ms[1][1] < ms[5][1], ms
    assert sampled["decode"][1] < sampled[5][1] and sampled[1][1] < sampled[5][1], sampled
    sched = eng.backend.scheduler
    seen = []

    class Cycling(DraftLengthPolicy):
        def choose(self, current, batch, sampled=False):
            seen.append(current)
            return (1, 1, 0, 0, 5, 5, 3, 3)[len(seen) % 8]

    sched.adaptive = Cycling(sched.adaptive.config, sched.adaptive.costs)
    outs = eng.generate(input_ids=PROMPTS, sampling_params=GREEDY)
    assert [o["output_ids"] for o in outs] == reference
    assert {0, 1, 3, 5} <= set(seen)
    counts = eng.get_server_info()["forward_counts"]
    assert counts["spec_round"]["eager"] == 0 and counts["spec_round"]["graph"] > 0, counts
    assert counts["target_decode"]["eager"] == counts["draft_prefill"]["eager"] == 0, counts
    assert counts["target_decode"]["graph"] > 0, counts
    if eng.grammar is not None and eng.grammar.available:
        regex = {"max_new_tokens": 24, "temperature": 0, "regex": "[a-z]+( [a-z]+)*"}
        plain = make(pair, spec=False).generate(input_ids=PROMPTS[:2], sampling_params=regex)
        got = eng.generate(input_ids=PROMPTS[:2], sampling_params=regex)
        assert [o["output_ids"] for o in got] == [o["output_ids"] for o in plain]
        assert eng.get_server_info()["forward_counts"]["spec_round_grammar"]["eager"] == 0


def test_kv_pool_sized_to_memory(pair, reference):
    """The default pool (max_running_requests x context_length) cut to what mem_fraction_static leaves (here
    ~24 MB past the reserve), outputs unchanged; an explicit max_total_tokens that cannot fit is refused before
    anything is allocated (ConfigError naming it), not an out-of-memory error."""
    from sglang_eagle3.config import ConfigError

    free, total = torch.cuda.mem_get_info()
    frac = 1 - (free - (24 << 20)) / total
    eng = make(pair, spec=False, max_running_requests=64, cuda_graph_max_bs=4, mem_fraction_static=frac)
    page = eng.args.page_size
    wanted = 64 * (1024 + page)
    assert 0 < eng._pool_tokens < wanted, (eng._pool_tokens, wanted)
    info = eng.get_server_info()
    assert info["kv_pages_total"] == eng._pool_tokens // page + 1 and info["max_total_num_tokens"] == eng._pool_tokens
    outs = eng.generate(input_ids=PROMPTS, sampling_params=GREEDY)
    assert [o["output_ids"] for o in outs] == reference
    del eng
    with pytest.raises(ConfigError, match=r"max_total_tokens=1099511627776 does not fit"):
        make(pair, spec=False, max_total_tokens=1 << 40)
