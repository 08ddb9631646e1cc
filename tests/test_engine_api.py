"""Engine's offline API against SGLang 0.5.23's (sglang/srt/entrypoints/engine.py, managers/io_struct.py,
managers/tokenizer_manager.py, sampling/sampling_params.py), on the embedded pair: what code written for
``sglang.Engine`` calls and reads works here as it does there. Each test names the SGLang rule it checks; the
expected values come from those rules or from this engine's own non-streamed, explicit-argument answer, never
from a recorded output."""

from __future__ import annotations

import asyncio
import os
import threading

import pytest
from conftest import scheduler_of

from sglang_eagle3 import Engine
from sglang_eagle3.engine import EMBEDDED_DIR, RequestError
from sglang_eagle3.runtime.sampling import SamplingParamsError

pytestmark = [pytest.mark.skipif(not os.path.exists(os.path.join(EMBEDDED_DIR, "target", "config.json")),
                                 reason="embedded weights not present"),
              pytest.mark.usefixtures("torch_one_thread")]
PROMPTS = ["And God said,", "In the beginning"]
GREEDY = {"max_new_tokens": 10, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def engine():
    # context_length 64 keeps a max_new_tokens=None request short (it runs to the context's end).
    with Engine(device="cpu", speculative_num_steps=3, context_length=64, log_level="error") as e:
        yield e


def _assert_idle(engine):
    sched = scheduler_of(engine)
    assert not sched.waiting and not sched.running, "work left queued"
    assert engine.runner.allocator.num_free == engine.runner.allocator.num_pages - 1, "pages still held"


# -- sampling_params: SamplingParams.__post_init__ reads null as the default ---------------------------------
@pytest.mark.parametrize("name", ["temperature", "top_p", "top_k", "min_p", "frequency_penalty",
                                  "presence_penalty", "repetition_penalty", "min_new_tokens", "n", "ignore_eos",
                                  "skip_special_tokens", "no_stop_trim"])
def test_null_sampling_param_is_its_default(engine, name):
    """SGLang's __post_init__ turns None into the field's default ("so that callers can pass null without crashing
    verify()"); temperature=None was refused here ("must be a finite number >= 0")."""
    sp = {"max_new_tokens": 6, "seed": 3, "ignore_eos": True}  # sampled (temperature 1.0 by default): seeded
    sp = {k: v for k, v in sp.items() if k != name}  # the default: the parameter left out
    want = engine.generate(PROMPTS[0], sp)
    got = engine.generate(PROMPTS[0], {**sp, name: None})
    assert (got["output_ids"], got["text"]) == (want["output_ids"], want["text"])


@pytest.mark.parametrize("name", ["json_schema", "regex", "ebnf"])
def test_empty_grammar_is_unset(engine, name):
    """SGLang: 'An empty grammar constraint means "unset", not "constrain to nothing"' (json_schema='' was a
    GrammarError here)."""
    assert engine.generate(PROMPTS[0], {**GREEDY, name: ""})["output_ids"] == \
        engine.generate(PROMPTS[0], GREEDY)["output_ids"]


def test_null_max_new_tokens_runs_to_the_context(engine):
    """SGLang's max_new_tokens=None is no limit but the context's (verify() skips its checks); it was refused."""
    ids = engine.tokenizer.encode(PROMPTS[0])
    out = engine.generate(PROMPTS[0], {"max_new_tokens": None, "temperature": 0, "ignore_eos": True})
    assert out["meta_info"]["completion_tokens"] == engine.max_new_tokens_limit(len(ids)) > 0
    assert out["meta_info"]["finish_reason"]["type"] == "length"


def test_spaces_between_special_tokens(engine):
    """A SGLang sampling parameter (default True): True or null is the text as decoded; False is refused naming it
    (it was refused as an unknown parameter whatever its value)."""
    want = engine.generate(PROMPTS[0], GREEDY)["text"]
    for v in (True, None):
        assert engine.generate(PROMPTS[0], {**GREEDY, "spaces_between_special_tokens": v})["text"] == want
    with pytest.raises(SamplingParamsError, match="spaces_between_special_tokens=False"):
        engine.generate(PROMPTS[0], {**GREEDY, "spaces_between_special_tokens": False})
    _assert_idle(engine)


# -- meta_info: tokenizer_manager._handle_batch_output ------------------------------------------------------
def test_meta_info_fields(engine):
    """cached_tokens is always there, e2e_latency on the finished result, spec_accept_length (completion_tokens /
    spec_verify_ct) where verify rounds ran."""
    for out in engine.generate(PROMPTS, GREEDY):
        meta = out["meta_info"]
        assert meta["cached_tokens"] == 0  # no prefix cache here
        assert meta["e2e_latency"] > 0
        assert meta["spec_verify_ct"] > 0
        assert meta["spec_accept_length"] == meta["completion_tokens"] / meta["spec_verify_ct"]


# -- parallel sampling: io_struct._handle_parallel_sampling, tokenizer_manager's n > 1 fan-out --------------------
def test_parallel_sampling_is_seeded_requests_prompt_major(engine):
    """sampling_params n > 1 (it was refused): each prompt sampled n times, answered as a list prompt-major (SGLang
    sends prompt i's n copies one after another), one prompt's n too; sample j of a seeded prompt equals the same
    prompt asked alone with seed + j (so sample 0 is what n=1 gives), its rid rid_j."""
    sp = {"max_new_tokens": 8, "seed": 5, "ignore_eos": True}
    singles = {(p, s): engine.generate(p, {**sp, "seed": s})["output_ids"] for p in PROMPTS for s in (5, 6, 7)}
    outs = engine.generate(PROMPTS, {**sp, "n": 3}, rid="b")
    assert [o["output_ids"] for o in outs] == [singles[(p, 5 + j)] for p in PROMPTS for j in range(3)]
    assert [o["meta_info"]["id"] for o in outs] == [f"b_{i}_{j}" for i in range(2) for j in range(3)]
    assert len({tuple(o["output_ids"]) for o in outs}) > 2  # the samples differ
    one = engine.generate(PROMPTS[1], {**sp, "n": 2}, rid="r")
    assert isinstance(one, list) and [o["output_ids"] for o in one] == [singles[(PROMPTS[1], 5)],
                                                                        singles[(PROMPTS[1], 6)]]
    assert [o["meta_info"]["id"] for o in one] == ["r_0", "r_1"]
    # per-prompt sampling params with one n; a greedy prompt's samples are its greedy output n times
    outs = engine.generate(PROMPTS, [{**GREEDY, "n": 2}, {**sp, "n": 2}])
    greedy = engine.generate(PROMPTS[0], GREEDY)["output_ids"]
    assert [o["output_ids"] for o in outs] == [greedy, greedy, singles[(PROMPTS[1], 5)], singles[(PROMPTS[1], 6)]]
    chunks = list(engine.generate(PROMPTS[0], {**sp, "n": 2}, stream=True))
    assert {c["index"] for c in chunks} == {0, 1}
    assert [[c for c in chunks if c["index"] == j][-1]["output_ids"] for j in (0, 1)] == \
        [singles[(PROMPTS[0], 5)], singles[(PROMPTS[0], 6)]]
    with pytest.raises(SamplingParamsError, match=r"n differ between the prompts of the batch \(\[1, 2\]\)"):
        engine.generate(PROMPTS, [{**GREEDY, "n": 2}, GREEDY])
    _assert_idle(engine)


# -- generate(stream=True): tokenizer_manager's non-incremental stream ---------------------------------------
def test_stream_chunks(engine):
    """Each chunk is the whole output so far (text, output_ids, meta_info); finish_reason is None until the last,
    which equals the non-streamed result; e2e_latency comes with the finished one only."""
    want = engine.generate(PROMPTS[0], GREEDY)
    chunks = list(engine.generate(PROMPTS[0], GREEDY, stream=True))
    assert len(chunks) > 1
    for a, b in zip(chunks, chunks[1:], strict=False):
        assert b["output_ids"][:len(a["output_ids"])] == a["output_ids"] and len(b["output_ids"]) > len(a["output_ids"])
        assert b["text"].startswith(a["text"])
    assert all(c["meta_info"]["finish_reason"] is None and "e2e_latency" not in c["meta_info"] for c in chunks[:-1])
    last = chunks[-1]
    assert (last["text"], last["output_ids"], last["meta_info"]["finish_reason"]) == \
        (want["text"], want["output_ids"], want["meta_info"]["finish_reason"])
    assert "index" not in last
    _assert_idle(engine)


def test_stream_batch_has_index(engine):
    """A batch's chunks carry index (the prompt's position), as _stream_batch_responses adds it."""
    want = engine.generate(PROMPTS, GREEDY)
    chunks = list(engine.generate(PROMPTS, GREEDY, stream=True))
    assert {c["index"] for c in chunks} == {0, 1}
    for i, w in enumerate(want):
        mine = [c for c in chunks if c["index"] == i]
        assert [c["meta_info"]["finish_reason"] is not None for c in mine] == [False] * (len(mine) - 1) + [True]
        assert (mine[-1]["text"], mine[-1]["output_ids"]) == (w["text"], w["output_ids"])
    _assert_idle(engine)


def test_stream_closed_early_aborts_and_frees(engine):
    it = engine.generate(PROMPTS[0], {**GREEDY, "max_new_tokens": 40}, stream=True)
    next(it)
    # The engine is this stream's until it ends: another generate on the same thread would wait for ever.
    with pytest.raises(RuntimeError, match="still open"):
        engine.generate(PROMPTS[1], GREEDY)
    it.close()
    _assert_idle(engine)
    assert engine.generate(PROMPTS[1], GREEDY)["meta_info"]["completion_tokens"] == 10


def test_stream_waits_for_another_threads_stream(engine):
    want = engine.generate(PROMPTS[1], GREEDY)["output_ids"]
    it = engine.generate(PROMPTS[0], GREEDY, stream=True)
    next(it)
    got = []
    t = threading.Thread(target=lambda: got.append(engine.generate(PROMPTS[1], GREEDY)["output_ids"]))
    t.start()
    t.join(timeout=0.5)
    assert t.is_alive() and not got  # waits for the stream, instead of stepping its requests
    list(it)
    t.join(timeout=120)
    assert got == [want]
    _assert_idle(engine)


# -- async_generate, flush_cache, get_server_info -----------------------------------------------------------
def test_async_generate(engine):
    want = engine.generate(PROMPTS, GREEDY)
    sync_chunks = list(engine.generate(PROMPTS[0], GREEDY, stream=True))

    async def main():
        outs = await asyncio.gather(*(engine.async_generate(p, GREEDY) for p in PROMPTS))
        batch = await engine.async_generate(PROMPTS, GREEDY)
        gen = await engine.async_generate(PROMPTS[0], GREEDY, stream=True)
        chunks = [c async for c in gen]
        with pytest.raises(SamplingParamsError, match="top_p=2"):  # raised by the call, as SGLang's
            await engine.async_generate(PROMPTS[0], {"top_p": 2}, stream=True)
        return outs, batch, chunks

    outs, batch, chunks = asyncio.run(main())
    key = [(o["text"], o["output_ids"]) for o in want]
    assert [(o["text"], o["output_ids"]) for o in outs] == key == [(o["text"], o["output_ids"]) for o in batch]
    assert [(c["text"], c["meta_info"]["finish_reason"]) for c in chunks] == \
        [(c["text"], c["meta_info"]["finish_reason"]) for c in sync_chunks]
    _assert_idle(engine)


def test_flush_cache_and_server_info(engine):
    assert engine.flush_cache().success is True  # SGLang's FlushCacheReqOutput.success
    info = engine.get_server_info()
    # SGLang's get_server_info: the server arguments at the top level, internal_states, version.
    assert info["model_path"] == engine.args.model_path and info["speculative_algorithm"] == "EAGLE3"
    assert info["max_total_num_tokens"] > 0 and isinstance(info["version"], str)
    assert info["internal_states"][0]["avg_spec_accept_length"] == info["avg_spec_accept_length"] > 1


# -- SGLang's other generate arguments ----------------------------------------------------------------------
def test_sglang_arguments_at_neutral_values(engine):
    """Code written for SGLang passes stream=False, lora_path=None, return_hidden_states=False ... explicitly:
    each was a TypeError. Values that ask for something this engine lacks are refused naming the argument."""
    want = engine.generate(PROMPTS, GREEDY)
    got = engine.generate(PROMPTS, GREEDY, stream=False, lora_path=[None, None], image_data=None,
                          return_hidden_states=False, custom_logit_processor=None, token_ids_logprob=None,
                          routed_dp_rank=0, external_trace_header={"traceparent": "00-x"}, priority=None)
    assert [o["output_ids"] for o in got] == [o["output_ids"] for o in want]
    for kw in (dict(lora_path="adapter"), dict(image_data=["cat.png"]), dict(return_hidden_states=True),
               dict(routed_dp_rank=1)):
        (name, value), = kw.items()
        with pytest.raises(RequestError, match=f"{name}={value!r}".replace("[", r"\[")):
            engine.generate(PROMPTS[0], GREEDY, **kw)
    with pytest.raises(TypeError, match="'lora_paths'"):  # a misspelling is Python's error, as before
        engine.generate(PROMPTS[0], GREEDY, lora_paths=None)
    with pytest.raises(RequestError, match="stream='yes'"):
        engine.generate(PROMPTS[0], GREEDY, stream="yes")
    _assert_idle(engine)
