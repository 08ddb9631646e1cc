"""Bad input gets a clear error naming the field and the value, and nothing is left half-built: a rejected
Engine raises from its constructor, a rejected request (or batch) queues nothing and the engine keeps serving.
"""

from __future__ import annotations

import dataclasses
import json
import os

import pytest
from conftest import scheduler_of, small_config, small_draft_config

from sglang_eagle3.config import ConfigError, DraftConfig, ModelConfig
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
    # float64: test_generate_from_two_threads compares fresh random prompts batched against alone, and float32's
    # batching noise can flip a near-tie (tests/test_adaptive_k.py's CPU says more)
    return Engine(**_spec_kwargs(small_pair, context_length=64, dtype="float64"))


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
    # Types: each names the field and value (they failed later as TypeError / AttributeError, or read "no" as True).
    (dict(context_length=-5), ["context_length=-5"]),
    (dict(context_length=0), ["context_length=0"]),
    (dict(context_length="512"), ["context_length='512'", "integer"]),
    (dict(speculative_num_steps=3.0), ["speculative_num_steps=3.0", "integer"]),
    (dict(speculative_num_steps_candidates=[2, -1]), ["speculative_num_steps_candidates", "[-1]", "[0, 16]"]),
    (dict(speculative_num_steps_candidates=[100]), ["speculative_num_steps_candidates", "[100]"]),
    (dict(speculative_num_steps_candidates="12"), ["speculative_num_steps_candidates='12'"]),
    (dict(speculative_simulate_accept_length="x"), ["speculative_simulate_accept_length='x'"]),
    (dict(speculative_simulate_accept_length=0.5), ["speculative_simulate_accept_length=0.5", "[1, 17]"]),
    (dict(speculative_algorithm=3), ["speculative_algorithm=3", "string"]),
    (dict(device=0), ["device=0", "string"]),
    (dict(device="cuda:abc"), ["device='cuda:abc'"]),
    (dict(disable_cuda_graph="no"), ["disable_cuda_graph='no'", "True or False"]),
    (dict(skip_tokenizer_init="false"), ["skip_tokenizer_init='false'"]),
    (dict(tp_size=True), ["tp_size=True", "integer"]),
    (dict(mem_fraction_static=float("nan")), ["mem_fraction_static=nan"]),
    (dict(worker_env={"FOO": 1}), ["worker_env", "'FOO'", "string values"]),
    (dict(worker_env=["FOO=bar"]), ["worker_env", "FOO=bar"]),
    (dict(worker_timeout=-1), ["worker_timeout=-1"]),
    (dict(random_seed="abc"), ["random_seed='abc'", "integer"]),
    (dict(max_top_logprobs_num=-1), ["max_top_logprobs_num=-1", ">= 0"]),
    (dict(max_stop_strings="8"), ["max_stop_strings='8'", "integer"]),
    (dict(max_stop_str_len=0), ["max_stop_str_len=0", "positive"]),
], ids=lambda x: ",".join(x) if isinstance(x, dict) else None)
def test_bad_engine_args(small_pair, kwargs, needles):
    _raises(ConfigError, needles, Engine, **{**_spec_kwargs(small_pair), **kwargs})


@pytest.mark.parametrize("given", [
    dict(speculative_draft_model_path="DRAFT"), dict(speculative_num_steps=5),
    dict(speculative_simulate_accept_length=2.0), dict(speculative_num_steps_candidates=[0, 2]),
    dict(speculative_aux_layer_ids=[0, 1, 2]), dict(speculative_adaptive_probe_rounds=4),
])
def test_speculative_settings_without_the_algorithm(small_pair, given):
    """Left silently unused before (a draft path without speculative_algorithm ran without speculation)."""
    given = {k: (small_pair.draft if v == "DRAFT" else v) for k, v in given.items()}
    name = next(iter(given))
    _raises(ConfigError, [name, "speculative_algorithm is None", "EAGLE3"], Engine, model_path=small_pair.target,
            device="cpu", skip_tokenizer_init=True, **given)


def test_sglang_no_op_arguments_are_accepted(small_pair):
    e = Engine(**_spec_kwargs(small_pair, context_length=64), trust_remote_code=True)
    assert "trust_remote_code" not in e.get_server_info()["args"]


def test_eagle3_needs_a_draft_path(small_pair):
    _raises(ConfigError, ["speculative_draft_model_path"], Engine, model_path=small_pair.target,
            speculative_algorithm="EAGLE3", device="cpu", skip_tokenizer_init=True)


def test_aux_ids_override_at_the_edge_is_valid(small_pair):
    """id == num_layers (the final pre-norm state, ours only) is valid; repeated or descending ids are refused
    (SGLang captures each layer once, in layer order). The override replaces the draft's own ids."""
    L = ModelConfig.from_path(small_pair.target).num_hidden_layers
    for bad in ([0, 1, L + 1], [0, 1, 1], [L, 1, 0]):
        with pytest.raises(ConfigError, match=r"aux layer id"):
            Engine(**_spec_kwargs(small_pair, speculative_aux_layer_ids=bad))
    e = Engine(**_spec_kwargs(small_pair, speculative_aux_layer_ids=[0, 1, L]))
    assert e.aux_layer_ids == (0, 1, L)
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
    (dict(aux_layer_ids=(0, 2, 11)), ["aux layer id 11", "3 layers"]),
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


def test_failed_start_frees_the_loaded_models(small_pair, monkeypatch):
    """A start that fails after the weights loaded (here the model runner: the KV cache, a graph capture) frees
    the target's and the draft's storage: the raised error's traceback still names them (a notebook keeps it), and
    a retry would otherwise run out of memory beside them. The error itself comes through unchanged."""
    from sglang_eagle3.models import loader
    from sglang_eagle3.runtime import worker

    loaded = []
    for name in ("load_target", "load_draft"):
        real = getattr(loader, name)

        def spy(*a, real=real, **kw):
            loaded.append(real(*a, **kw))
            return loaded[-1]

        monkeypatch.setattr(loader, name, spy)

    def no_runner(*a, **kw):
        raise RuntimeError("CUDA out of memory (as the KV cache's allocation raises it)")

    monkeypatch.setattr(worker, "ModelRunner", no_runner)
    with pytest.raises(RuntimeError, match="CUDA out of memory") as kept:
        Engine(**_spec_kwargs(small_pair, context_length=64))
    assert kept.value.__traceback__ is not None and len(loaded) == 2
    for model in loaded:
        tensors = [*model.parameters(), *model.buffers()]
        assert tensors and all(t.untyped_storage().nbytes() == 0 for t in tensors), type(model).__name__


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
    ({"n": 0}, ["sampling_params.n=0", "[1, 128]"]),
    ({"n": 129}, ["sampling_params.n=129"]),
    ({"n": 2.0}, ["sampling_params.n=2.0"]),
    ({"n": True}, ["sampling_params.n=True"]),
    ({"stop": 5}, ["stop=5"]),
    ({"stop_token_ids": ["a"]}, ["stop_token_ids[0]='a'", "must be an integer"]),
    ({"stop_token_ids": [1, True]}, ["stop_token_ids[1]=True"]),
    ({"stop": ["ok", 3]}, ["stop[1]=3", "must be a string"]),
    ({"stop": ["ok", ""]}, ["stop[1]=''", "empty string"]),
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
    (dict(input_ids=[1, 2], top_logprobs_num=True, return_logprob=True), ["top_logprobs_num=True"]),
    (dict(input_ids=[1, 2], logprob_start_len=3, return_logprob=True), ["logprob_start_len=3", "[-1, 2]"]),
    (dict(input_ids=[1, 2], return_logprob="yes"), ["return_logprob='yes'"]),
    (dict(input_ids=[1, 2], sampling_params=[{"max_new_tokens": 4}]), ["sampling_params", "dict", "list"]),
    (dict(input_ids=[1, 2], sampling_params="greedy"), ["sampling_params", "str"]),
    (dict(input_ids=[1, 2], rid=7), ["rid=7", "string"]),
    (dict(input_ids=[[1, 2], [3]], rid=["x", "x"]), ["rid=['x', 'x']", "repeats"]),
    (dict(input_ids=[[1, 2], [3]], return_logprob=[True]), ["1 return_logprob", "2 prompts"]),
    (dict(input_ids=[[1, 2], [3]], sampling_params=[{}, "x"]), ["sampling_params[1]", "str"]),
], ids=lambda x: ",".join(f"{k}={v}" for k, v in x.items())[:40] if isinstance(x, dict) else None)
def test_bad_request(engine, kwargs, needles):
    _raises(RequestError, needles, engine.generate, **kwargs)
    _assert_idle(engine)


@pytest.mark.parametrize("params,needles", [
    ({"stop_token_ids": [-5]}, ["stop_token_ids=[-5]", "1 of 1 ids", f"[0, {VOCAB})"]),
    ({"stop_token_ids": [2 ** 70]}, ["stop_token_ids", f"[0, {VOCAB})"]),
    ({"stop": "the"}, ["stop=['the']", "tokenizer", "stop_token_ids"]),  # this engine has none
    ({"stop": [""]}, ["stop", "empty string"]),
    ({"ignore_eos": "false"}, ["ignore_eos='false'", "true or false"]),
    ({"no_stop_trim": 1}, ["no_stop_trim=1"]),
    ({"skip_special_tokens": "no"}, ["skip_special_tokens='no'"]),
])
def test_bad_sampling_params_need_the_engine(engine, params, needles):
    _raises(SamplingParamsError, needles, engine.generate, input_ids=[1, 2], sampling_params=params)
    _assert_idle(engine)


def test_top_logprobs_num_is_capped(engine):
    """top_logprobs_num was accepted up to the vocabulary: on a 163840-token one with a long output and
    logprob_start_len 0, one request built gigabytes of response. max_top_logprobs_num (default 20, OpenAI's cap
    on top_logprobs) bounds it, and the vocabulary still does where it is the smaller."""
    assert engine.args.max_top_logprobs_num == 20 < VOCAB
    _raises(RequestError, ["top_logprobs_num=21", "[0, 20]", "max_top_logprobs_num=20"], engine.generate,
            input_ids=[1, 2], return_logprob=True, top_logprobs_num=21)
    _raises(RequestError, ["top_logprobs_num=96", "[0, 20]"], engine.generate, input_ids=[[1, 2], [3]],
            return_logprob=True, top_logprobs_num=[1, VOCAB])
    _assert_idle(engine)
    out = engine.generate(input_ids=[1, 2], sampling_params={"max_new_tokens": 2}, return_logprob=True,
                          top_logprobs_num=20, logprob_start_len=0)
    assert [len(top) for top in out["meta_info"]["output_top_logprobs"]] == [20, 20]


def test_top_logprobs_num_cap_past_the_vocabulary(small_pair):
    with Engine(**_spec_kwargs(small_pair, context_length=64, max_top_logprobs_num=10 ** 6)) as e:
        _raises(RequestError, [f"top_logprobs_num={VOCAB + 1}", f"[0, {VOCAB}]", "vocabulary"], e.generate,
                input_ids=[1, 2], return_logprob=True, top_logprobs_num=VOCAB + 1)
        out = e.generate(input_ids=[1, 2], sampling_params={"max_new_tokens": 1}, return_logprob=True,
                         top_logprobs_num=VOCAB)
        assert len(out["meta_info"]["output_top_logprobs"][0]) == VOCAB


def test_stop_strings_are_capped(engine):
    """100000 stop strings (a 1.4 MB body) slowed every engine step by ~35 ms for the whole batch: their number and
    length are capped (max_stop_strings 128, max_stop_str_len 256), before the check that needs a tokenizer, with
    an error that names the count, not the list."""
    assert (engine.args.max_stop_strings, engine.args.max_stop_str_len) == (128, 256)
    many = [f"stop{i}" for i in range(100_000)]
    err = _raises(SamplingParamsError, ["stop=[100000 strings]", "max_stop_strings=128"], engine.generate,
                  input_ids=[1, 2], sampling_params={"stop": many})
    assert len(str(err)) < 200, str(err)
    _raises(SamplingParamsError, ["stop=[129 strings]", "max_stop_strings=128"], engine.generate,
            input_ids=[1, 2], sampling_params={"stop": many[:129]})
    _raises(SamplingParamsError, ["257 characters", "max_stop_str_len=256"], engine.generate,
            input_ids=[1, 2], sampling_params={"stop": ["ok", "x" * 257]})
    # At the limits the request passes them (and, this engine having no tokenizer, meets the next check).
    _raises(SamplingParamsError, ["needs a tokenizer"], engine.generate, input_ids=[1, 2],
            sampling_params={"stop": many[:127] + ["x" * 256]})
    _assert_idle(engine)


def test_list_errors_name_the_item_not_the_list(engine):
    """An empty string, a non-string item or an id outside the vocabulary among 10^5 list items printed the whole
    list (a megabyte error a client got back and the log kept): the message names the first bad item, its index
    and the list's length."""
    many = [f"stop{i}" for i in range(100_000)]
    for bad, needles in ((many[:50_000] + [""] + many[50_000:], ["stop[50000]=''", "100001 items"]),
                         (many[:70_000] + [7] + many[70_000:], ["stop[70000]=7", "100001 items"]),
                         (["x" * 10_000, None], ["stop[1]=None"])):
        err = _raises(SamplingParamsError, needles, engine.generate, input_ids=[1, 2], sampling_params={"stop": bad})
        assert len(str(err)) < 200, str(err)[:300]
    ids = list(range(VOCAB)) * 50 + [VOCAB + 3, -1] + [1] * 10
    err = _raises(SamplingParamsError, [f"stop_token_ids=[{VOCAB + 3}, -1]", f"2 of {len(ids)} ids",
                                        f"[0, {VOCAB})"], engine.generate, input_ids=[1, 2],
                  sampling_params={"stop_token_ids": ids})
    assert len(str(err)) < 200, str(err)[:300]
    err = _raises(SamplingParamsError, ["stop_token_ids[3]=", "must be an integer"], engine.generate,
                  input_ids=[1, 2], sampling_params={"stop_token_ids": [1, 2, 3, "4" * 100_000]})
    assert len(str(err)) < 250, str(err)[:300]
    _assert_idle(engine)


def test_top_k_past_the_vocabulary_keeps_every_token(engine):
    """SGLang reads a top_k past the vocabulary as no top_k; one of 2**63 crashed the sampled batch (int64)."""
    prompts = [[1, 2, 3], [4, 5]]
    outs = [engine.generate(input_ids=prompts, sampling_params={"max_new_tokens": 6, "temperature": 0.8,
                                                                   "seed": 5, "top_k": top_k})
            for top_k in (-1, VOCAB, 2 ** 63)]
    ids = [[o["output_ids"] for o in out] for out in outs]
    assert ids[0] == ids[1] == ids[2]
    _assert_idle(engine)


def test_batch_arguments_per_prompt(engine):
    """As SGLang's Engine.generate: a batch takes one value for all or a list of one per prompt."""
    prompts = [[1, 2, 3, 4], [5, 6, 7]]
    sp = {"max_new_tokens": 3, "temperature": 0}
    outs = engine.generate(input_ids=prompts, sampling_params=sp, return_logprob=[False, True],
                           logprob_start_len=[0, 1], rid=["first", "second"])
    assert [o["meta_info"]["id"] for o in outs] == ["first", "second"]
    # One string for a batch becomes <rid>_<i>, as SGLang's GenerateReqInput normalizes it.
    named = engine.generate(input_ids=prompts, sampling_params=sp, rid="job")
    assert [o["meta_info"]["id"] for o in named] == ["job_0", "job_1"]
    assert "input_token_logprobs" not in outs[0]["meta_info"]
    assert [t for _, t, _ in outs[1]["meta_info"]["input_token_logprobs"]] == prompts[1][1:]
    # logprob_start_len left out (-1): the output tokens only, as in SGLang.
    one = engine.generate(input_ids=prompts[0], sampling_params=sp, return_logprob=True, rid="single")
    assert one["meta_info"]["id"] == "single" and one["meta_info"]["input_token_logprobs"] == []
    assert [t for _, t, _ in one["meta_info"]["output_token_logprobs"]] == one["output_ids"]
    whole = engine.generate(input_ids=prompts[0], sampling_params=sp, return_logprob=True, logprob_start_len=0)
    assert [t for _, t, _ in whole["meta_info"]["input_token_logprobs"]] == prompts[0]
    # From a later start only the rows asked for are computed: the same values as the whole prompt's tail.
    tail = engine.generate(input_ids=prompts[0], sampling_params=sp, return_logprob=True, logprob_start_len=2)
    got, want = tail["meta_info"]["input_token_logprobs"], whole["meta_info"]["input_token_logprobs"][2:]
    assert [t for _, t, _ in got] == [t for _, t, _ in want] == prompts[0][2:]
    assert [v for v, _, _ in got] == pytest.approx([v for v, _, _ in want], abs=1e-5)
    _assert_idle(engine)


def test_shutdown_frees_and_refuses(small_pair):
    with Engine(**_spec_kwargs(small_pair, context_length=64)) as e:
        assert e.generate(input_ids=[1, 2], sampling_params={"max_new_tokens": 2})["output_ids"]
    assert e.runner is None and e.backend.runner is None  # models, cache and graphs released
    _raises(RuntimeError, ["shut down"], e.generate, input_ids=[1, 2])
    e.shutdown()  # twice is harmless


def test_prompt_longer_than_context(engine):
    # context_length=64 with k=3: 4 positions stay reserved for one speculative round.
    err = _raises(RequestError, ["61", "64"], engine.generate, input_ids=[1] * 61)
    assert "context" in str(err)
    _assert_idle(engine)
    # An explicit max_new_tokens past the context is refused with the most this prompt can get (SGLang refuses
    # too); left out, the default is cut to it.
    limit = engine.max_new_tokens_limit(60)
    assert limit == 64 - 60 - 3  # the context less the prompt and the 3 slots a round writes past its last token
    _raises(RequestError, ["max_new_tokens=50", "60 tokens", f"at most {limit} new tokens"], engine.generate,
            input_ids=[1] * 60, sampling_params={"max_new_tokens": 50, "temperature": 0})
    _assert_idle(engine)
    out = engine.generate(input_ids=[1] * 60, sampling_params={"max_new_tokens": limit, "temperature": 0,
                                                               "ignore_eos": True})
    assert len(out["output_ids"]) == limit
    out = engine.generate(input_ids=[1] * 60, sampling_params={"temperature": 0, "ignore_eos": True})
    assert len(out["output_ids"]) == limit
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


def test_generate_from_two_threads(engine):
    """One generate at a time (a lock): two threads stepping one scheduler read each other's rounds."""
    import random
    import threading

    rng = random.Random()
    prompts = [[rng.randrange(1, VOCAB) for _ in range(rng.randrange(2, 9))] for _ in range(8)]
    sp = {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}
    want = [o["output_ids"] for o in engine.generate(input_ids=prompts, sampling_params=sp)]
    got: dict[int, list] = {}

    def worker(i):
        got[i] = engine.generate(input_ids=prompts[i], sampling_params=sp)["output_ids"]

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert [got.get(i) for i in range(len(prompts))] == want
    _assert_idle(engine)


def test_a_request_queued_by_another_caller_does_not_break_generate(engine):
    """generate counts only its own requests (a foreign finished one made it look up a rid it never had)."""
    foreign = engine.make_request(input_ids=[1, 2, 3], sampling_params={"max_new_tokens": 2})
    engine.scheduler.add(foreign)
    out = engine.generate(input_ids=[4, 5], sampling_params={"max_new_tokens": 3, "temperature": 0})
    assert len(out["output_ids"]) == 3
    while engine.scheduler.has_work():
        engine.scheduler.step()
    _assert_idle(engine)


def test_lowering_k_keeps_the_reserve_of_the_configured_k(small_pair):
    """A request admitted while k is low must still fit once k is raised back (it overran the context)."""
    e = Engine(**_spec_kwargs(small_pair, context_length=64, speculative_num_steps_candidates=[1]))
    before = e.max_new_tokens_limit(20)
    e.set_speculative_num_steps(1)
    assert e.max_new_tokens_limit(20) == before == 64 - 20 - 4 + 1
