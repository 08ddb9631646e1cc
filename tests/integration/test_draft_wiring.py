"""Draft wiring check: the compatibility rules and the init_attention_backends wrapper."""

from __future__ import annotations

import json
from types import MethodType
from types import SimpleNamespace as NS

import pytest

from sglang_eagle3.integration.draft_wiring import (
    DraftWiringError,
    check_draft_wiring,
    wrap_init_attention_backends,
)

from .conftest import needs_sglang

KIMI = {"text_config": {"num_hidden_layers": 61, "hidden_size": 7168, "vocab_size": 163840}}
DRAFT = {"hidden_size": 7168, "vocab_size": 163840, "draft_vocab_size": 32000,
         "eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 30, 58]}}


def test_compatible_pair_has_no_problems():
    assert check_draft_wiring(KIMI, DRAFT, [2, 30, 58]) == []


def test_every_problem_is_named():
    draft = {**DRAFT, "hidden_size": 4096, "vocab_size": 128256, "draft_vocab_size": 200000}
    problems = check_draft_wiring(KIMI, draft, [2, 30, 61])
    assert problems == [
        "aux layer ids [61] out of range for a target with 61 layers (valid 0..60; resolved ids [2, 30, 61])",
        "draft expects target hidden size 4096, the target has 7168",
        "draft vocab_size 128256 != target vocab_size 163840 (the draft embeds target token ids; "
        "its d2t maps into the target vocab)",
        "draft_vocab_size 200000 > vocab_size 128256",
    ]
    assert check_draft_wiring(KIMI, None, [5, 5]) == ["EAGLE-3 needs 3 aux layers, the target captures [5, 5]",
                                                      "aux layer ids [5, 5] repeat a layer"]


EAGLE3 = NS(name="EAGLE3", is_eagle3=lambda: True)


def _runner(**kw):
    """A target ModelRunner as the wrapper reads it (SGLang's real one: test_real_model_runner_path)."""
    base = dict(is_draft_worker=False, spec_algorithm=EAGLE3, pp_group=NS(is_last_rank=True),
                spec_aux_config=NS(eagle_use_aux_hidden_state=True, eagle_aux_hidden_state_layer_ids=[1, 29, 57],
                                   draft_model_config=None),
                model=NS(language_model=NS(model=NS(layers_to_capture=[2, 30, 58]))),
                model_config=NS(hf_config=NS(to_dict=lambda: KIMI)),
                server_args=NS(speculative_draft_model_path=None))
    return NS(**{**base, **kw})


def test_wrapper_checks_after_sglang_resolved_the_ids(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({**DRAFT, "vocab_size": 1000, "draft_vocab_size": 100}))
    record = {}
    wrapped = wrap_init_attention_backends(lambda self: "ok", record)
    runner = _runner(server_args=NS(speculative_draft_model_path=str(tmp_path)))
    with pytest.raises(DraftWiringError, match="draft vocab_size 1000 != target vocab_size 163840"):
        wrapped(runner)
    assert record["configured_ids"] == [1, 29, 57] and record["resolved_ids"] == [2, 30, 58]
    runner.server_args.speculative_draft_model_path = "org/hub-draft"  # not local, nothing loaded: ids only
    assert wrapped(runner) == "ok" and record["draft_config_checked"] is False
    runner.is_draft_worker = True
    assert wrapped(runner) == "ok"


def test_hub_draft_is_checked_from_the_config_sglang_loaded():
    record = {}
    wrapped = wrap_init_attention_backends(lambda self: "ok", record)
    loaded = NS(hf_config=NS(to_dict=lambda: {**DRAFT, "hidden_size": 4096}))
    runner = _runner(server_args=NS(speculative_draft_model_path="org/hub-draft"))
    runner.spec_aux_config.draft_model_config = loaded
    with pytest.raises(DraftWiringError, match="draft expects target hidden size 4096, the target has 7168"):
        wrapped(runner)
    assert record["draft_config_checked"] is True


def test_nothing_to_check_on_non_last_pipeline_ranks_and_without_a_draft():
    record = {}
    wrapped = wrap_init_attention_backends(lambda self: "ok", record)
    # A non-last PP rank: SGLang's set_eagle3_layers_to_capture returned early, layers_to_capture stays [].
    runner = _runner(pp_group=NS(is_last_rank=False), model=NS(model=NS(layers_to_capture=[])))
    assert wrapped(runner) == "ok" and record["skipped"].startswith("not the last pipeline rank")
    # --enable-return-aux-hidden-states without speculation: any number of layers, no draft.
    runner = _runner(spec_algorithm=NS(name="NONE", is_eagle3=lambda: False),
                     model=NS(model=NS(layers_to_capture=[4, 9])))
    assert wrapped(runner) == "ok" and "no EAGLE-3 draft (capture only)" in record["skipped"]


@needs_sglang
@pytest.mark.sglang
def test_real_model_runner_path(overlay, monkeypatch):
    """SGLang's own ModelRunner.init_attention_backends (patched by the overlay), SpecAuxHiddenStateConfig,
    SpeculativeAlgorithm and DeepseekV2ForCausalLM.set_eagle3_layers_to_capture; only the attention-backend
    construction after the capture set-up (GPU work) is stubbed."""
    import transformers
    from sglang.srt.model_executor import model_runner as mr_mod
    from sglang.srt.model_executor.model_runner import ModelRunner
    from sglang.srt.model_executor.model_runner_components import spec_aux_hidden_state as aux
    from sglang.srt.models.deepseek_v2 import DeepseekV2ForCausalLM
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    status = overlay.apply(verify_guard=False, moe_routing=False, worker_env=False)
    assert "wiring.init_attention_backends" in {p["key"] for p in status["patched"]}
    monkeypatch.setattr(mr_mod, "resolve_attention_backend_strs", lambda model_runner: NS(prefill="t", decode="t"))
    monkeypatch.setattr(mr_mod, "build_attention_backends", lambda model_runner: NS(
        attn_backend=None, decode_attn_backend=None, decode_attn_backend_group=None))
    monkeypatch.setattr(mr_mod, "get_parallel", lambda: NS(dcp_enabled=False))

    def runner(algo, aux_config, *, last_rank=True):
        pp = NS(is_last_rank=last_rank)
        model = NS(pp_group=pp, config=NS(num_hidden_layers=61), model=NS(layers_to_capture=[]))
        model.set_eagle3_layers_to_capture = MethodType(DeepseekV2ForCausalLM.set_eagle3_layers_to_capture, model)
        r = object.__new__(ModelRunner)
        r.__dict__.update(model=model, spec_algorithm=algo, spec_aux_config=aux_config, is_draft_worker=False,
                          pp_group=pp, model_config=NS(hf_config=NS(to_dict=lambda: KIMI)),
                          server_args=NS(speculative_draft_model_path="org/hub-draft"),
                          kv_index_translator=NS(bind_and_verify_backends=lambda backends: None))
        return r

    eagle3 = SpeculativeAlgorithm.from_string("EAGLE3")
    hub_draft = NS(hf_config=transformers.LlamaConfig(hidden_size=4096, vocab_size=163840, draft_vocab_size=32000))
    spec = aux.SpecAuxHiddenStateConfig(eagle_use_aux_hidden_state=True, eagle_aux_hidden_state_layer_ids=[1, 29, 57],
                                        draft_model_config=hub_draft)
    with pytest.raises(DraftWiringError, match="draft expects target hidden size 4096, the target has 7168"):
        runner(eagle3, spec).init_attention_backends()
    assert overlay.status()["draft_wiring"]["resolved_ids"] == [2, 30, 58]  # SpecForge's 1-based ids, +1
    hub_draft.hf_config.hidden_size = 7168
    runner(eagle3, spec).init_attention_backends()
    assert overlay.status()["draft_wiring"]["problems"] == []
    assert overlay.status()["draft_wiring"]["draft_config_checked"] is True

    r = runner(eagle3, spec, last_rank=False)
    r.init_attention_backends()  # a non-last pipeline rank captures nothing, and is not refused for it
    assert r.model.model.layers_to_capture == []
    assert overlay.status()["draft_wiring"]["skipped"].startswith("not the last pipeline rank")

    # --enable-return-aux-hidden-states --return-aux-hidden-state-layer-ids 4 9, no speculation: SGLang's own
    # resolution turns EAGLE-3 capture on without a draft.
    monkeypatch.setattr(aux, "get_exec", lambda: NS(features=NS(aux_hidden_state_capture="eagle3",
                                                                return_aux_hidden_state_layer_ids=[4, 9])))
    none = SpeculativeAlgorithm.from_string(None)
    capture_only = aux.resolve_spec_aux_hidden_state_config(
        server_args=None, model_config=NS(hf_text_config=NS(num_hidden_layers=61)), spec_algorithm=none,
        is_draft_worker=False)
    assert capture_only.eagle_use_aux_hidden_state and capture_only.eagle_aux_hidden_state_layer_ids == [4, 9]
    r = runner(none, capture_only)
    r.init_attention_backends()
    assert r.model.model.layers_to_capture == [4, 9]
    assert "no EAGLE-3 draft (capture only)" in overlay.status()["draft_wiring"]["skipped"]
