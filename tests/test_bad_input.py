"""Bad input gets a clear error naming the field and the value, and nothing is left half-built: a rejected
Engine raises from its constructor, a rejected request (or batch) queues nothing and the engine keeps serving.
"""

from __future__ import annotations

import dataclasses
import json
import os

import pytest
from conftest import scheduler_of, small_config, small_draft_config

from sglang_eagle3.config import ConfigError, DraftConfig
from sglang_eagle3.engine import Engine, RequestError, SamplingParamsError
from sglang_eagle3.models.eagle3 import Eagle3Draft
from sglang_eagle3.models.loader import save_hf
from sglang_eagle3.testing import randomize

pytestmark = pytest.mark.usefixtures("torch_one_thread")

VOCAB = 96


def _spec_kwargs(pair, **kw):
    return dict(model_path=pair.target, speculative_algorithm="EAGLE3", speculative_draft_model_path=pair.draft,
                speculative_num_steps=3, device="cpu", skip_tokenizer_init=True, **kw)


@pytest.fixture(scope="module")
def engine(small_pair):
    return Engine(**_spec_kwargs(small_pair, context_length=64))


def _assert_idle(engine):
    sched = scheduler_of(engine)
    assert not sched.waiting and not sched.running, "a rejected request left work queued"
    assert engine.runner.allocator.num_free == engine.runner.allocator.num_pages - 1, "pages held after rejection"


def _raises(exc, needles, fn, *args, **kwargs):
    with pytest.raises(exc) as e:
        fn(*args, **kwargs)
    for needle in needles:
        assert needle in str(e.value), (needle, str(e.value))
    return e.value


# ----------------------------------------------------------------------------------------------------------
# Engine construction
# ----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs,needles", [
    (dict(speculative_algorithm="MEDUSA"), ["speculative_algorithm", "MEDUSA"]),
    (dict(speculative_eagle_topk=4), ["speculative_eagle_topk=4"]),
    (dict(speculative_num_steps=0), ["speculative_num_steps=0"]),
    (dict(speculative_num_steps=17), ["speculative_num_steps=17"]),
    (dict(speculative_num_steps=3, speculative_num_draft_tokens=6), ["speculative_num_draft_tokens=6", "4"]),
    (dict(device="tpu"), ["device", "tpu"]),
    (dict(dtype="int8"), ["dtype", "int8"]),
    (dict(page_size=0), ["page_size=0"]),
    (dict(max_running_requests=-1), ["max_running_requests=-1"]),
    (dict(attention_backend="flash"), ["attention_backend", "flash"]),
    (dict(speculative_aux_layer_ids=(0, 1, 9)), ["aux layer id 9", "3 layers"]),
    (dict(speculative_aux_layer_ids=[0, 1]), ["3 ids", "[0, 1]"]),
    (dict(not_an_arg=1), ["not_an_arg"]),
], ids=lambda x: ",".join(x) if isinstance(x, dict) else None)
def test_bad_engine_args(small_pair, kwargs, needles):
    _raises(ConfigError, needles, Engine, **{**_spec_kwargs(small_pair), **kwargs})


def test_eagle3_needs_a_draft_path(small_pair):
    _raises(ConfigError, ["speculative_draft_model_path"], Engine, model_path=small_pair.target,
            speculative_algorithm="EAGLE3", device="cpu", skip_tokenizer_init=True)


def test_aux_ids_override_at_the_edge_is_valid(small_pair):
    """id == num_layers (the final pre-norm state) is valid; the override replaces the draft's own ids."""
    e = Engine(**_spec_kwargs(small_pair, speculative_aux_layer_ids=[0, 1, 3]))
    assert e.aux_layer_ids == (0, 1, 3)
    out = e.generate(input_ids=[1, 2, 3], sampling_params={"max_new_tokens": 4, "temperature": 0})
    assert len(out["output_ids"]) == 4


def _write_draft(root, dcfg: DraftConfig, target_path: str):
    d = randomize(Eagle3Draft(dcfg), seed=3)
    path = os.path.join(root, "draft")
    save_hf(d, path)
    return path


@pytest.mark.parametrize("change,needles", [
    (dict(hidden_size=48, head_dim=24), ["hidden size 48", "hidden_size is 32"]),
    (dict(hidden_size=48, head_dim=24, target_hidden_size=32), ["hidden_size=48", "32"]),
    (dict(target_hidden_size=48), ["target hidden size 48", "32"]),
    (dict(vocab_size=128, draft_vocab_size=128), ["vocab_size=128", "96"]),
    (dict(aux_layer_ids=(2, 3, 11)), ["aux layer id 11", "3 layers"]),
], ids=["hidden", "hidden-fc-ok", "target_hidden", "vocab", "aux_ids"])
def test_draft_inconsistent_with_target(small_pair, tmp_path, change, needles):
    dcfg = dataclasses.replace(small_draft_config(small_config()), **change)
    draft = _write_draft(str(tmp_path), dcfg, small_pair.target)
    _raises(ConfigError, needles, Engine, model_path=small_pair.target, speculative_algorithm="EAGLE3",
            speculative_draft_model_path=draft, device="cpu", skip_tokenizer_init=True)


def test_draft_without_head_needs_full_vocab(small_pair, tmp_path):
    dcfg = small_draft_config(small_config(), draft_vocab=48)
    draft = Eagle3Draft(dcfg, has_lm_head=False)
    randomize(draft, seed=4)
    path = str(tmp_path / "draft")
    save_hf(draft, path)
    _raises(ConfigError, ["lm_head", "draft_vocab_size=48"], Engine, model_path=small_pair.target,
            speculative_algorithm="EAGLE3", speculative_draft_model_path=path, device="cpu", skip_tokenizer_init=True)


def test_target_config_missing_field(small_pair, tmp_path):
    with open(os.path.join(small_pair.target, "config.json")) as f:
        cfg = json.load(f)
    del cfg["qk_rope_head_dim"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    _raises(ConfigError, ["qk_rope_head_dim", "missing"], Engine, model_path=str(tmp_path), device="cpu",
            skip_tokenizer_init=True)
    cfg["qk_rope_head_dim"], cfg["n_group"] = 4, 3
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    _raises(ConfigError, ["n_routed_experts=4", "n_group=3"], Engine, model_path=str(tmp_path), device="cpu",
            skip_tokenizer_init=True)


# ----------------------------------------------------------------------------------------------------------
# Requests
# ----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("params,needles", [
    ({"temperature": -0.5}, ["temperature=-0.5"]),
    ({"temperature": float("nan")}, ["temperature=nan"]),
    ({"temperature": float("inf")}, ["temperature=inf"]),
    ({"temperature": "hot"}, ["temperature='hot'"]),
    ({"top_p": 0}, ["top_p=0"]),
    ({"top_p": 1.5}, ["top_p=1.5"]),
    ({"top_p": -0.1}, ["top_p=-0.1"]),
    ({"top_k": 0}, ["top_k=0"]),
    ({"top_k": -2}, ["top_k=-2"]),
    ({"top_k": 2.5}, ["top_k=2.5"]),
    ({"min_p": 1.5}, ["min_p=1.5"]),
    ({"max_new_tokens": -1}, ["max_new_tokens=-1"]),
    ({"max_new_tokens": 2.5}, ["max_new_tokens=2.5"]),
    ({"max_new_tokens": "8"}, ["max_new_tokens='8'"]),
    ({"max_new_tokens": True}, ["max_new_tokens=True"]),
    ({"temprature": 0.5}, ["temprature"]),
    ({"n": 2}, ["n=2"]),
    ({"stop": 5}, ["stop=5"]),
    ({"stop_token_ids": ["a"]}, ["stop_token_ids=['a']"]),
    ({"seed": "x"}, ["seed='x'"]),
], ids=lambda x: str(x) if isinstance(x, dict) else None)
def test_bad_sampling_params(engine, params, needles):
    _raises(SamplingParamsError, needles, engine.generate, input_ids=[1, 2, 3], sampling_params=params)
    _assert_idle(engine)


@pytest.mark.parametrize("kwargs,needles", [
    (dict(input_ids=[3, VOCAB]), [str(VOCAB), "vocabulary"]),
    (dict(input_ids=[-1, 4]), ["-1", "vocabulary"]),
    (dict(input_ids=[]), ["empty"]),
    (dict(input_ids=[1, "2"]), ["input_ids"]),
    (dict(input_ids=[1, True]), ["input_ids"]),
    (dict(input_ids=[1, 2.0]), ["input_ids"]),
    (dict(prompt="hello"), ["tokenizer"]),
    (dict(), ["exactly one"]),
    (dict(prompt="a", input_ids=[1]), ["exactly one"]),
    (dict(input_ids=[1, 2], logprob_start_len=-2, return_logprob=True), ["logprob_start_len=-2"]),
    (dict(input_ids=[1, 2], top_logprobs_num=VOCAB + 1, return_logprob=True), [f"top_logprobs_num={VOCAB + 1}"]),
], ids=lambda x: ",".join(f"{k}={v}" for k, v in x.items())[:40] if isinstance(x, dict) else None)
def test_bad_request(engine, kwargs, needles):
    _raises(RequestError, needles, engine.generate, **kwargs)
    _assert_idle(engine)


def test_prompt_longer_than_context(engine):
    # context_length=64 with k=3: 4 positions stay reserved for one speculative round.
    err = _raises(RequestError, ["61", "64"], engine.generate, input_ids=[1] * 61)
    assert "context" in str(err)
    _assert_idle(engine)
    out = engine.generate(input_ids=[1] * 60, sampling_params={"max_new_tokens": 50, "temperature": 0})
    assert 1 <= len(out["output_ids"]) < 50  # capped to what the context holds
    target_only = Engine(model_path=engine.args.model_path, device="cpu", skip_tokenizer_init=True, context_length=64)
    _raises(RequestError, ["64 tokens", "64"], target_only.generate, input_ids=[1] * 64)


def test_bad_request_in_a_batch_queues_nothing(engine):
    good = [[1, 2, 3], [4, 5]]
    _raises(RequestError, ["vocabulary"], engine.generate, input_ids=[*good, [VOCAB + 7]])
    _assert_idle(engine)
    _raises(SamplingParamsError, ["top_p=2"], engine.generate, input_ids=[*good, [6]],
            sampling_params=[{"temperature": 0}, {"temperature": 0}, {"top_p": 2}])
    _assert_idle(engine)
    _raises(RequestError, ["2 sampling_params", "3 prompts"], engine.generate, input_ids=[*good, [6]],
            sampling_params=[{}, {}])
    _assert_idle(engine)
    # The engine still serves, and the rejected batches left no trace in the results.
    outs = engine.generate(input_ids=good, sampling_params={"max_new_tokens": 5, "temperature": 0})
    assert [len(o["output_ids"]) for o in outs] == [5, 5]
    _assert_idle(engine)
