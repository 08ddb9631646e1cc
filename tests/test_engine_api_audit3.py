"""A third audit of Engine's offline API against SGLang 0.5.23's, as a script moved from ``sglang.Engine`` meets it:
the arguments and sampling params SGLang takes (sglang/srt/managers/io_struct.py GenerateReqInput,
sglang/srt/sampling/sampling_params.py SamplingParams.__post_init__ / verify), the result's finish_reason, use after
shutdown and the CLI's errors. Each test names the SGLang rule it checks (read from its source) and failed before
its fix; the expected outputs are this engine's own answers to the equivalent plain request."""

from __future__ import annotations

import os

import pytest

from sglang_eagle3 import Engine, generate
from sglang_eagle3.engine import EMBEDDED_DIR
from sglang_eagle3.runtime.request import Request
from sglang_eagle3.runtime.sampling import SamplingParams, SamplingParamsError
from tests.test_engine_api import _assert_idle

pytestmark = [pytest.mark.skipif(not os.path.exists(os.path.join(EMBEDDED_DIR, "target", "config.json")),
                                 reason="embedded weights not present"),
              pytest.mark.usefixtures("torch_one_thread")]
PROMPT = "And God said,"
GREEDY = {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}
SAMPLED = {"max_new_tokens": 8, "ignore_eos": True}  # temperature 1.0 (the default): a seed fixes the output


@pytest.fixture(scope="module")
def engine():
    with Engine(device="cpu", speculative_num_steps=3, context_length=64, log_level="error") as e:
        yield e


def _key(out):
    return out["text"], out["output_ids"], out["meta_info"]["finish_reason"]


# -- generate's arguments: GenerateReqInput normalizes return_logprob None to False -------------------------------
def test_return_logprob_none_is_false(engine):
    """GenerateReqInput's return_logprob defaults to None and _normalize_single_inputs / normalize_param read None
    as False (one value or a batch's item); it was refused here ("return_logprob=None must be true or false")."""
    want = engine.generate(PROMPT, GREEDY)
    got = engine.generate(PROMPT, GREEDY, return_logprob=None)
    assert _key(got) == _key(want) and "output_token_logprobs" not in got["meta_info"]
    a, b = engine.generate([PROMPT, "In the beginning"], GREEDY, return_logprob=[None, True])
    assert "output_token_logprobs" not in a["meta_info"]
    assert [t for _, t, _ in b["meta_info"]["output_token_logprobs"]] == b["output_ids"]
    _assert_idle(engine)


# -- sampling_params: the sequence types SGLang's SamplingParams takes ---------------------------------------------
def test_stop_sequences_as_tuples_and_sets(engine):
    """SGLang's stop_token_ids is a Set[int] (__post_init__ makes a set of whatever iterable it gets) and stop /
    stop_regex are iterated as given: a tuple or a set was refused here ("must be a list")."""
    free = engine.generate(PROMPT, GREEDY)
    stop_id = free["output_ids"][3]
    want = engine.generate(PROMPT, {**GREEDY, "stop_token_ids": [stop_id]})
    assert want["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop_id}
    for ids in ((stop_id,), {stop_id}, frozenset({stop_id, 0})):
        assert _key(engine.generate(PROMPT, {**GREEDY, "stop_token_ids": ids})) == _key(want)
    word = free["text"].split()[1]
    want = engine.generate(PROMPT, {**GREEDY, "stop": [word]})
    assert want["meta_info"]["finish_reason"] == {"type": "stop", "matched": word}
    assert _key(engine.generate(PROMPT, {**GREEDY, "stop": (word,)})) == _key(want)
    want = engine.generate(PROMPT, {**GREEDY, "stop_regex": [word[:2] + "+"]})
    assert _key(engine.generate(PROMPT, {**GREEDY, "stop_regex": (word[:2] + "+",)})) == _key(want)
    _assert_idle(engine)


# -- sampling_params: SGLang's fields this engine lacks --------------------------------------------------------------
@pytest.mark.parametrize("name,value", [("beam_width", None), ("beam_width", 1), ("structural_tag", None),
                                        ("structural_tag", ""), ("stream_interval", None), ("stream_interval", 1),
                                        ("custom_params", None), ("custom_params", {}), ("watermark", None)])
def test_sglang_sampling_fields_at_neutral_values(engine, name, value):
    """SGLang's SamplingParams has beam_width (1 or None: not a beam request), structural_tag ('' is unset, as
    __post_init__ reads it; a tag is a grammar, tests/test_structural_tag.py), stream_interval, custom_params and
    watermark: code that builds full sampling_params passes them unset, and each was refused here as an "unknown
    sampling parameter"."""
    assert _key(engine.generate(PROMPT, {**GREEDY, name: value})) == _key(engine.generate(PROMPT, GREEDY))


@pytest.mark.parametrize("name,value,what", [("beam_width", 4, "beam search"),
                                             ("stream_interval", 4, "stream intervals"),
                                             ("custom_params", {"k": 1}, "custom logit processors"),
                                             ("watermark", {"key": 1}, "watermarks")])
def test_sglang_sampling_fields_that_ask_for_something_are_refused(engine, name, value, what):
    """A value that asks for what this engine does not do is refused naming the field and what it asks for (it was
    called an unknown parameter, as a misspelling is), and the engine still serves."""
    with pytest.raises(SamplingParamsError, match=f"{name}=.* is not supported: this engine has no {what}"):
        engine.generate(PROMPT, {**GREEDY, name: value})
    _assert_idle(engine)
    assert engine.generate(PROMPT, GREEDY)["meta_info"]["completion_tokens"] == 8


def test_misspelt_sampling_param_is_still_unknown():
    with pytest.raises(SamplingParamsError, match="unknown sampling parameter.*'beam_widht'"):
        SamplingParams.from_dict({"beam_widht": 1})


# -- sampling_params: SamplingParams.verify's bounds on sampling_seed ------------------------------------------------
@pytest.mark.parametrize("name", ["seed", "sampling_seed"])
@pytest.mark.parametrize("value", [2 ** 63, -(2 ** 63) - 1, 2 ** 64 + 5, 1.5, "7"])
def test_seed_outside_int64_is_refused(engine, name, value):
    """verify(): "sampling_seed must be in [-2**63, 2**63 - 1]" (and an integer). A seed of 2**64 + 5 ran here as
    seed 5 (its low 64 bits), silently; the error names the parameter the caller used (sampling_seed was reported
    as seed)."""
    bounds = r"must be an integer in \[-2\*\*63, 2\*\*63 - 1\]"
    with pytest.raises(SamplingParamsError, match=rf"^{name}={value!r} {bounds}"):
        engine.generate(input_ids=[1, 2, 3], sampling_params={**SAMPLED, name: value})
    _assert_idle(engine)


def test_seed_bounds_and_sampling_seed_are_seeds(engine):
    for s in (2 ** 63 - 1, -(2 ** 63)):
        want = engine.generate(PROMPT, {**SAMPLED, "seed": s})["output_ids"]
        assert engine.generate(PROMPT, {**SAMPLED, "sampling_seed": s})["output_ids"] == want
    with pytest.raises(SamplingParamsError, match="seed=3 and sampling_seed=4 differ"):
        engine.generate(PROMPT, {**SAMPLED, "seed": 3, "sampling_seed": 4})
    both = engine.generate(PROMPT, {**SAMPLED, "seed": 3, "sampling_seed": 3})["output_ids"]
    assert both == engine.generate(PROMPT, {**SAMPLED, "seed": 3})["output_ids"]
    _assert_idle(engine)


def test_parallel_samples_of_a_sampling_seed_differ(engine):
    """n > 1 draws sample j with seed + j; SGLang's own name for the seed, sampling_seed, was left as it was, so
    every sample of a prompt was the same text. At the top of the int64 range seed + j wraps (sample 1 of
    2**63 - 1 is -2**63's output) instead of being refused as a seed out of range."""
    by_seed = [o["output_ids"] for o in engine.generate(PROMPT, {**SAMPLED, "seed": 5, "n": 3})]
    assert len({tuple(ids) for ids in by_seed}) == 3
    assert [o["output_ids"] for o in engine.generate(PROMPT, {**SAMPLED, "sampling_seed": 5, "n": 3})] == by_seed
    top = engine.generate(PROMPT, {**SAMPLED, "sampling_seed": 2 ** 63 - 1, "n": 2})
    assert [o["output_ids"] for o in top] == [engine.generate(PROMPT, {**SAMPLED, "seed": s})["output_ids"]
                                              for s in (2 ** 63 - 1, -(2 ** 63))]
    _assert_idle(engine)


# -- sampling_params: __post_init__ makes a greedy request's top_k 1 before verify() -------------------------------
@pytest.mark.parametrize("top_k", [0, -5])
def test_greedy_request_with_top_k_off_by_zero(engine, top_k):
    """SGLang: 0 <= temperature < 1e-6 sets top_k = 1 (and temperature 1.0) in __post_init__, so verify() never
    sees a top_k of 0; {"temperature": 0, "top_k": 0} (top_k 0 is "off" to some clients) was refused here. With a
    temperature that samples, top_k 0 stays an error, as SGLang's verify() says."""
    assert _key(engine.generate(PROMPT, {**GREEDY, "top_k": top_k})) == _key(engine.generate(PROMPT, GREEDY))
    with pytest.raises(SamplingParamsError, match=f"top_k={top_k} must be -1"):
        engine.generate(PROMPT, {**GREEDY, "temperature": 0.5, "top_k": top_k})
    _assert_idle(engine)


# -- meta_info.finish_reason: FINISH_ABORT.to_json ------------------------------------------------------------------
def test_abort_finish_reason_has_sglangs_keys(engine):
    """SGLang's abort finish_reason is {"type": "abort", "message", "status_code", "err_type"}; here it lacked the
    last two (a KeyError for code that reads them). The request's own dict is left as it was."""
    r = Request(rid="x", input_ids=[1, 2], params=SamplingParams(), output_ids=[5],
                finished_reason={"type": "abort", "message": "token 5 is outside the request's grammar"})
    fr = engine.result(r)["meta_info"]["finish_reason"]
    assert fr == {"type": "abort", "message": "token 5 is outside the request's grammar", "status_code": None,
                  "err_type": None}
    assert r.finished_reason == {"type": "abort", "message": "token 5 is outside the request's grammar"}


# -- after shutdown -----------------------------------------------------------------------------------------------
def test_every_call_after_shutdown_says_so(small_pair):
    """generate refused after shutdown with a RuntimeError naming it, but get_server_info and
    set_speculative_num_steps failed with an AttributeError on a freed model ('NoneType' object has no attribute
    ...), and flush_cache answered success=True for an engine that no longer exists."""
    e = Engine(model_path=small_pair.target, speculative_algorithm="EAGLE3",
               speculative_draft_model_path=small_pair.draft, speculative_num_steps=3,
               speculative_num_steps_candidates=[1], device="cpu", skip_tokenizer_init=True, context_length=64)
    assert e.get_server_info()["speculative_algorithm"] == "EAGLE3"
    e.shutdown()
    for call in (e.get_server_info, e.flush_cache, lambda: e.set_speculative_num_steps(1),
                 lambda: e.generate(input_ids=[1, 2])):
        with pytest.raises(RuntimeError, match="this Engine was shut down"):
            call()


# -- the CLI ------------------------------------------------------------------------------------------------------
def test_cli_sampling_error_from_the_engine_is_one_line(capsys):
    """A stop string past the engine's max_stop_str_len passes the parser's checks and is refused by the engine
    with a SamplingParamsError, which the CLI did not catch: a traceback instead of one line naming the flag."""
    code = generate.main(["--device", "cpu", "--max-new-tokens", "4", "--stop", "x" * 300])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err
    line, = [ln for ln in err.splitlines() if "error:" in ln]
    assert line.startswith("python -m sglang_eagle3.generate: error: --stop=[") and "max_stop_str_len=256" in line
