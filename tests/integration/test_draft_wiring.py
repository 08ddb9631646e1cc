"""Draft wiring check: the compatibility rules and the init_attention_backends wrapper."""

from __future__ import annotations

import json
from types import SimpleNamespace as NS

import pytest

from sglang_eagle3.integration.draft_wiring import (
    DraftWiringError,
    check_draft_wiring,
    wrap_init_attention_backends,
)

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


def test_wrapper_checks_after_sglang_resolved_the_ids(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({**DRAFT, "vocab_size": 1000, "draft_vocab_size": 100}))
    record = {}
    wrapped = wrap_init_attention_backends(lambda self: "ok", record)
    runner = NS(is_draft_worker=False,
                spec_aux_config=NS(eagle_use_aux_hidden_state=True, eagle_aux_hidden_state_layer_ids=[1, 29, 57]),
                model=NS(language_model=NS(model=NS(layers_to_capture=[2, 30, 58]))),
                model_config=NS(hf_config=NS(to_dict=lambda: KIMI)),
                server_args=NS(speculative_draft_model_path=str(tmp_path)))
    with pytest.raises(DraftWiringError, match="draft vocab_size 1000 != target vocab_size 163840"):
        wrapped(runner)
    assert record["configured_ids"] == [1, 29, 57] and record["resolved_ids"] == [2, 30, 58]
    runner.server_args.speculative_draft_model_path = "org/hub-draft"  # not local: ids checked only
    assert wrapped(runner) == "ok" and record["draft_config_checked"] is False
    runner.is_draft_worker = True
    assert wrapped(runner) == "ok"
