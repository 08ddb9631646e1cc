"""generation_config.json as SGLang 0.5.23 reads it (srt/configs/model_config.py: _get_hf_eos_token_id,
get_default_sampling_params; managers/schedule_batch.py: _check_token_based_finish): a request ends at config.json's
eos_token_id, generation_config.json's, the tokenizer's EOS and its turn-final tokens; the sampling fields the file
writes are the chat endpoint's defaults (tests/server/test_sampling_defaults.py). A file with a value no request may
set is refused at start-up, naming it."""

from __future__ import annotations

import json
import os
import shutil
from types import SimpleNamespace

import pytest

from sglang_eagle3 import Engine
from sglang_eagle3.config import ConfigError, GenerationConfig
from sglang_eagle3.engine import EMBEDDED_DIR, engine_eos

pytestmark = pytest.mark.usefixtures("torch_one_thread")
TARGET = os.path.join(EMBEDDED_DIR, "target")
needs_embedded = pytest.mark.skipif(not os.path.exists(os.path.join(TARGET, "config.json")),
                                    reason="embedded weights not present")


def _checkpoint(tmp_path, generation: dict | None) -> str:
    """The embedded target in a folder of its own (weights linked), with ``generation`` as its
    generation_config.json."""
    out = tmp_path / "target"
    out.mkdir(parents=True)
    for name in os.listdir(TARGET):
        src = os.path.join(TARGET, name)
        if name.endswith(".safetensors"):
            os.symlink(src, out / name)
        else:
            shutil.copy(src, out / name)
    if generation is not None:
        (out / "generation_config.json").write_text(json.dumps(generation))
    return str(out)


def test_eos_is_the_union_sglang_stops_at():
    """SGLang: config ∪ generation_config eos ∪ {tokenizer.eos_token_id} ∪ additional_stop_token_ids. Here the
    tokenizer's counted only where config.json named none."""
    tok = SimpleNamespace(eos_token_id=7, additional_stop_ids=(9,))
    gen = GenerationConfig(eos_token_id=(5, 1))
    got = engine_eos((1, 2), gen, tok)
    assert set(got) == {1, 2} | {5, 1} | {7} | {9} and len(got) == len(set(got))
    assert set(engine_eos((1,), GenerationConfig(), None)) == {1}
    assert set(engine_eos((), GenerationConfig(), SimpleNamespace(eos_token_id=None, additional_stop_ids=()))) == set()


def test_generation_config_fields(tmp_path):
    (tmp_path / "generation_config.json").write_text(json.dumps(
        {"eos_token_id": [3, 4], "temperature": 0.6, "top_p": None, "top_k": 20, "max_length": 4096,
         "do_sample": True}))
    gen = GenerationConfig.from_path(str(tmp_path))
    assert gen.eos_token_id == (3, 4)
    assert gen.sampling_defaults() == {"temperature": 0.6, "top_k": 20}  # null and the non-sampling fields left out
    assert GenerationConfig.from_path(str(tmp_path / "absent")) == GenerationConfig()
    (tmp_path / "generation_config.json").write_text(json.dumps({"top_k": "20"}))
    with pytest.raises(ConfigError, match=r"generation_config\.json: top_k must be an integer, got '20'"):
        GenerationConfig.from_path(str(tmp_path))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": "</s>"}))
    with pytest.raises(ConfigError, match=r"generation_config\.json: eos_token_id must be a token id"):
        GenerationConfig.from_path(str(tmp_path))


@needs_embedded
def test_generation_config_eos_ends_a_request(tmp_path):
    """A token generation_config.json names as EOS (and config.json does not) ends a request there; it ran on to
    max_new_tokens (the file was not read)."""
    greedy = {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}
    with Engine(model_path=_checkpoint(tmp_path / "a", None), device="cpu", context_length=64,
                log_level="error") as eng:
        ids = eng.generate("In the beginning", greedy)["output_ids"]
        base_eos = set(eng.get_server_info()["model"]["eos_token_ids"])
    at = next((i for i in range(2, len(ids)) if ids[i] not in ids[:i] and ids[i] not in base_eos), None)
    if at is None:
        pytest.skip(f"no fresh token to name EOS in {ids}")
    path = _checkpoint(tmp_path / "b", {"eos_token_id": ids[at], "temperature": 0.7})
    with Engine(model_path=path, device="cpu", context_length=64, log_level="error") as eng:
        out = eng.generate("In the beginning", {**greedy, "ignore_eos": False})
        info = eng.get_server_info()["model"]
    assert out["output_ids"][:at] == ids[:at] and len(out["output_ids"]) <= at + 1, (out["output_ids"], ids, at)
    assert out["meta_info"]["finish_reason"]["type"] == "stop"
    assert ids[at] in info["eos_token_ids"] and info["sampling_defaults"] == {"temperature": 0.7}
    assert info["generation_config"] == os.path.join(path, "generation_config.json")


@needs_embedded
def test_bad_sampling_default_is_named_at_start(tmp_path):
    with pytest.raises(ConfigError, match=r"generation_config\.json: .*top_p"):
        Engine(model_path=_checkpoint(tmp_path, {"top_p": 1.5}), device="cpu", context_length=64, log_level="error")
