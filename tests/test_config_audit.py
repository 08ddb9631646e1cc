"""Audit of config.json / tokenizer parsing against what real checkpoints ship, checked against independent
references: transformers' own chat-template renderer and tokenizer loading, the ``regex`` module running Kimi's
pre-tokenisation pattern with a textbook BPE, and the published config fields SGLang / vLLM read."""

from __future__ import annotations

import base64
import json
import os

import pytest

from sglang_eagle3.config import ConfigError, DraftConfig, ModelConfig
from sglang_eagle3.tokenizer import load_tokenizer
from tests.test_config import KIMI_K25

# ----------------------------------------------------------------------------------------------------------
# Tokenizers
# ----------------------------------------------------------------------------------------------------------
# tokenization_kimi.py's pat_str, as Moonshot publishes it (the tokenizer under test must pre-tokenise as this).
KIMI_PAT = "|".join([
    r"[\p{Han}]+",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"\p{N}{1,3}",
    r" ?[^\s\p{L}\p{N}]+[\r\n]*",
    r"\s*[\r\n]+",
    r"\s+(?!\S)",
    r"\s+",
])


def _ref_bpe(piece: bytes, ranks: dict[bytes, int]) -> list[int]:
    """Byte-pair encoding as tiktoken defines it: merge the adjacent pair whose union ranks lowest, until none."""
    parts = [bytes([b]) for b in piece]
    while True:
        pairs = [(ranks.get(parts[i] + parts[i + 1]), i) for i in range(len(parts) - 1)]
        pairs = [p for p in pairs if p[0] is not None]
        if not pairs:
            return [ranks[p] for p in parts]
        _, i = min(pairs)
        parts[i:i + 2] = [parts[i] + parts[i + 1]]


def test_kimi_tiktoken_keeps_han_out_of_letter_runs(tmp_path):
    """Kimi's pattern intersects its letter classes with [^\\p{Han}], so "a漢" is two pre-tokens and " 漢字" splits
    before the Han run. The loader used to strip the intersections, and merged across the boundary."""
    pytest.importorskip("tiktoken")
    regex = pytest.importorskip("regex")
    han = "漢".encode()
    merges = [b"a" + han[:1], b"a" + han[:2], b"a" + han, b" " + han[:1], b" " + han[:2], b" " + han,
              han[:2], han, b"He", b"Hel", b"Hell", b"Hello"]
    ranks = {bytes([b]): b for b in range(256)}
    for m in merges:
        ranks[m] = len(ranks)
    with open(tmp_path / "tiktoken.model", "w") as f:
        for tok, rank in ranks.items():
            f.write(f"{base64.b64encode(tok).decode()} {rank}\n")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"added_tokens_decoder": {}}))
    tok = load_tokenizer(str(tmp_path))
    for text in ["a漢", " 漢字", "Hello漢 漢a", "don't 漢Hello", "x 漢\n漢"]:
        pieces = regex.findall("(?V1)" + KIMI_PAT, text)
        assert "".join(pieces) == text
        want = [i for p in pieces for i in _ref_bpe(p.encode(), ranks)]
        assert tok.encode(text) == want, (text, pieces)
        assert tok.decode(tok.encode(text)) == text


def _hf_render(template: str, messages, tools=None, add_generation_prompt=True, **kw) -> str:
    chat_template_utils = pytest.importorskip("transformers.utils.chat_template_utils")
    rendered, _ = chat_template_utils.render_jinja_template(
        conversations=[messages], tools=tools, chat_template=template, add_generation_prompt=add_generation_prompt,
        **kw)
    return rendered[0]


def _tiny_hf_dir(path, config: dict | None = None, files: dict[str, str] | None = None) -> str:
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.BPE(vocab={chr(c): i for i, c in enumerate(range(32, 127))}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    os.makedirs(path, exist_ok=True)
    tok.save(os.path.join(path, "tokenizer.json"))
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": "!", "eos_token": "~", **(config or {})}, f)
    for name, text in (files or {}).items():
        os.makedirs(os.path.dirname(os.path.join(path, name)), exist_ok=True)
        with open(os.path.join(path, name), "w") as f:
            f.write(text)
    return str(path)


TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Wetter in <Zürich> & 東京",
                                           "parameters": {"type": "object", "required": ["city"],
                                                          "properties": {"city": {"type": "string"}}}}}]
CHAT = [{"role": "system", "content": "Sé breve."}, {"role": "user", "content": "Hi <b>"},
        {"role": "assistant", "content": "Hello", "tool_calls": [
            {"id": "functions.get_weather:0", "type": "function",
             "function": {"name": "get_weather", "arguments": {"city": "東京"}}}]},
        {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": "{\"temp\": 21}"}]

TEMPLATES = {
    # Kimi-K2.5's tool declaration: compact separators (Jinja's own tojson takes no `separators` and raised).
    "kimi_tools": ("{% if tools %}<|im_system|>tool_declare<|im_middle|>{{ tools | tojson(separators=(',', ':')) }}"
                   "<|im_end|>{% endif %}{% for m in messages %}<|im_{{ m.role }}|>{{ m.content }}"
                   "{% if m.tool_calls %}{% for c in m.tool_calls %}{{ c.id }}{{ c.function.arguments | tojson }}"
                   "{% endfor %}{% endif %}<|im_end|>{% endfor %}{% if add_generation_prompt %}<|im_assistant|>"
                   "{% endif %}"),
    # Plain tojson: key order and non-ASCII / HTML characters as transformers writes them (Jinja's sorted and
    # escaped them).
    "plain_tojson": "{{ tools | tojson }}{% for m in messages %}{{ m | tojson(indent=2) }}{% endfor %}",
    # transformers' {% generation %} block and strftime_now global.
    "generation": ("{{ bos_token }}{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}"
                   "{{ m.content }}{{ eos_token }}{% endgeneration %}{% else %}{{ m.content }}{% endif %}{% endfor %}"
                   "{{ strftime_now('%Y') | length }}"),
}


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_chat_template_renders_as_transformers(tmp_path, name):
    tok = load_tokenizer(_tiny_hf_dir(tmp_path, {"chat_template": TEMPLATES[name]}))
    for tools in (TOOLS, None):
        for gen in (True, False):
            want = _hf_render(TEMPLATES[name], CHAT, tools=tools, add_generation_prompt=gen, bos_token="!",
                              eos_token="~")
            assert tok.apply_chat_template(CHAT, gen, tools) == want


def test_chat_template_sources_as_transformers(tmp_path):
    """Where the template comes from, as transformers' tokenizer loading decides: the chat_template.jinja file over
    tokenizer_config's entry (a repository that updated its template in the file kept the stale one here), and a
    named "tool_use" template for requests with tools."""
    transformers = pytest.importorskip("transformers")
    old, new, tool_use = "OLD{{ messages[0].content }}", "NEW{{ messages[0].content }}", "TOOLS{{ tools | length }}"
    cases = {
        "both": ({"chat_template": old}, {"chat_template.jinja": new}),
        "named": ({"chat_template": [{"name": "default", "template": old}, {"name": "tool_use", "template": tool_use}]},
                  {}),
        "files": ({"chat_template": old}, {"chat_template.jinja": new,
                                           "additional_chat_templates/tool_use.jinja": tool_use}),
    }
    for case, (config, files) in cases.items():
        path = _tiny_hf_dir(tmp_path / case, config, files)
        hf = transformers.PreTrainedTokenizerFast.from_pretrained(path)
        ours = load_tokenizer(path)
        for tools in (None, TOOLS):
            want = _hf_render(hf.get_chat_template(tools=tools), CHAT, tools=tools)
            assert ours.apply_chat_template(CHAT, True, tools) == want, (case, tools)


def test_malformed_tokenizer_config_names_the_file(tmp_path):
    path = _tiny_hf_dir(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text('{"bos_token": "!",}')
    with pytest.raises(ValueError, match=r"tokenizer_config\.json is not valid JSON"):
        load_tokenizer(path)


# ----------------------------------------------------------------------------------------------------------
# Target configs
# ----------------------------------------------------------------------------------------------------------
def _kimi_text(**change) -> dict:
    """Kimi-K2-Instruct / K2.5's language-model fields as published (tests/test_config.py's KIMI_K25), model_type
    kimi_k2, with ``change`` applied (_DROP: the field left out)."""
    cfg = {**KIMI_K25["text_config"], "model_type": "kimi_k2"}
    for k, v in change.items():
        if v is _DROP:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    return cfg


_DROP = object()


def test_yarn_parse_matches_transformers_rope():
    """The parsed rope gives transformers' YaRN inverse frequencies and cos/sin scale (its DeepseekV3Config reads
    the same rope_scaling), for Kimi's and DeepSeek-V3's published values."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from sglang_eagle3.layers.rotary import rope_inv_freq

    deepseek = {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                "original_max_position_embeddings": 4096, "type": "yarn"}
    for theta, max_pos, scaling in ((50000.0, 262144, _kimi_text()["rope_scaling"]), (10000.0, 163840, deepseek)):
        ours = ModelConfig.from_hf(_kimi_text(rope_theta=theta, max_position_embeddings=max_pos, rope_scaling=scaling))
        hf = transformers.DeepseekV3Config(rope_scaling=dict(scaling), rope_theta=theta,
                                           max_position_embeddings=max_pos, qk_rope_head_dim=64)
        want_inv, want_scale = ROPE_INIT_FUNCTIONS["yarn"](hf, "cpu")
        inv, scale = rope_inv_freq(ours.qk_rope_head_dim, ours.rope)
        torch.testing.assert_close(inv, want_inv.double(), rtol=1e-6, atol=0)
        assert scale == pytest.approx(want_scale, rel=1e-12)


def test_rope_interleave_false_is_refused():
    """transformers' DeepseekV3Config has rope_interleave (default true); false rotates q/k as halves, over
    checkpoints whose rope columns were permuted for it. It was ignored: the interleaved rope ran on them."""
    transformers = pytest.importorskip("transformers")
    assert transformers.DeepseekV3Config().rope_interleave is True
    assert ModelConfig.from_hf(_kimi_text(rope_interleave=True)) == ModelConfig.from_hf(_kimi_text())
    with pytest.raises(ConfigError, match=r"rope_interleave=False"):
        ModelConfig.from_hf(_kimi_text(rope_interleave=False))
    nested = {"architectures": ["KimiK25ForConditionalGeneration"], "text_config": _kimi_text(rope_interleave=False)}
    with pytest.raises(ConfigError, match=r"config\.text_config: rope_interleave=False"):
        ModelConfig.from_hf(nested)


@pytest.mark.parametrize("knob,value", [("truncate", False), ("attention_factor", 1.3), ("attn_factor", 0.9),
                                        ("extrapolation_factor", 0.5)])
def test_yarn_knobs_that_change_the_rope_are_refused(knob, value):
    """Keys of transformers' / SGLang's YaRN that DeepSeek's fixes. transformers' own rope shows the first two
    change the maths (the SGLang ones scale cos/sin and the kept frequencies by definition); they were ignored."""
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    # DeepSeek-V3's published rope_scaling (Kimi's beta_fast = beta_slow = 1 puts both ramp ends in one gap, where
    # truncating changes nothing).
    scaling = {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
               "original_max_position_embeddings": 4096, "type": "yarn"}
    if knob in ("truncate", "attention_factor"):
        def hf(extra):
            cfg = transformers.DeepseekV3Config(rope_scaling={**scaling, **extra}, rope_theta=10000.0,
                                                max_position_embeddings=163840, qk_rope_head_dim=64)
            inv, scale = ROPE_INIT_FUNCTIONS["yarn"](cfg, "cpu")
            return inv.tolist(), scale
        assert hf({knob: value}) != hf({})
    with pytest.raises(ConfigError) as e:
        ModelConfig.from_hf(_kimi_text(rope_scaling={**scaling, knob: value}))
    assert f"rope_scaling: {knob}={value!r}" in str(e.value), str(e.value)


@pytest.mark.parametrize("key", ["factor", "original_max_position_embeddings"])
def test_yarn_without_factor_or_original_length_is_refused(key):
    """A yarn rope_scaling without its factor parsed as factor 1 (no scaling at all) and without its original
    length as 4096 (where transformers takes max_position_embeddings and SGLang fails): required, named."""
    scaling = {k: v for k, v in _kimi_text()["rope_scaling"].items() if k != key}
    with pytest.raises(ConfigError, match=rf"rope_scaling: required field '{key}' is missing"):
        ModelConfig.from_hf(_kimi_text(rope_scaling=scaling))


# ----------------------------------------------------------------------------------------------------------
# EAGLE-3 drafts
# ----------------------------------------------------------------------------------------------------------
# TorchSpec's Kimi-K2.5 draft config (configs/draft_models/kimi_k25_eagle3.json), as published.
TORCHSPEC_KIMI_DRAFT = {
    "architectures": ["LlamaForCausalLMEagle3"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 163584, "eos_token_id": 163585, "head_dim": 128, "hidden_act": "silu", "hidden_size": 7168,
    "initializer_range": 0.02, "intermediate_size": 12288, "max_position_embeddings": 262144,
    "max_window_layers": 36, "model_type": "llama", "num_attention_heads": 64, "num_hidden_layers": 1,
    "num_key_value_heads": 64, "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000,
    "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "transformers_version": "4.51.0", "use_cache": True, "use_sliding_window": False, "vocab_size": 163840,
}


def test_published_kimi_draft_config_parses():
    d = DraftConfig.from_hf(TORCHSPEC_KIMI_DRAFT)
    assert (d.hidden_size, d.head_dim, d.num_key_value_heads, d.draft_vocab_size, d.rope_theta) == \
        (7168, 128, 64, 163840, 1e6)
    with_ids = {**TORCHSPEC_KIMI_DRAFT, "draft_vocab_size": 32000,
                "eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 30, 58], "use_aux_hidden_state": True}}
    assert DraftConfig.from_hf(with_ids).aux_layer_ids == (2, 30, 58)


@pytest.mark.parametrize("change,needle", [
    # SGLang's llama_eagle3: lm_head = the embedding when tied; fc gets a bias from "bias".
    ({"tie_word_embeddings": True}, "tie_word_embeddings=True"),
    ({"bias": True}, "bias=True"),
    # vLLM / speculators drafts: the residual is hidden_norm(h); an RMSNorm before fc.
    ({"norm_before_residual": True}, "norm_before_residual=True"),
    ({"norm_before_fc": True}, "norm_before_fc=True"),
    # SGLang reads eagle_config.use_aux_hidden_state: false feeds the draft the last hidden state, no fc.
    ({"eagle_config": {"use_aux_hidden_state": False}}, "eagle_config: use_aux_hidden_state=False"),
    # vLLM's MLA draft for DeepSeek targets: not the Llama layer built here.
    ({"architectures": ["Eagle3DeepseekV2ForCausalLM"], "kv_lora_rank": 512}, "MLA"),
    ({"kv_lora_rank": 512}, "MLA"),
])
def test_draft_variants_we_do_not_build_are_refused(change, needle):
    """Fields of published EAGLE-3 formats that change the head's maths: each was ignored, so such a head loaded
    and drafted garbage (a low accept rate, nothing else to see)."""
    with pytest.raises(ConfigError) as e:
        DraftConfig.from_hf({**TORCHSPEC_KIMI_DRAFT, **change})
    assert needle in str(e.value), str(e.value)


def test_special_tokens_from_special_tokens_map(tmp_path):
    """Repositories that name BOS / EOS only in special_tokens_map.json: transformers reads them there (the chat
    template's {{ bos_token }}, the EOS id); the loader read tokenizer_config alone and had none."""
    transformers = pytest.importorskip("transformers")
    path = _tiny_hf_dir(tmp_path, files={"special_tokens_map.json": json.dumps(
        {"bos_token": {"content": "#", "special": True}, "eos_token": "$"})})
    cfg = json.loads((tmp_path / "tokenizer_config.json").read_text())
    del cfg["bos_token"], cfg["eos_token"]
    cfg["chat_template"] = "{{ bos_token }}{{ messages[0].content }}{{ eos_token }}"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(cfg))
    hf = transformers.PreTrainedTokenizerFast.from_pretrained(path)
    ours = load_tokenizer(path)
    assert (ours.bos_token, ours.eos_token) == (hf.bos_token, hf.eos_token) == ("#", "$")
    assert (ours.bos_token_id, ours.eos_token_id) == (hf.bos_token_id, hf.eos_token_id)
    assert ours.apply_chat_template(CHAT, False) == hf.apply_chat_template(CHAT, tokenize=False)


def test_transformers_saved_config_parses_as_the_original(tmp_path):
    """transformers >= 5 saves DeepseekV3Config with rope_parameters (both type keys, theta inside) and
    rope_interleave: the stricter rope checks must still take it, as the same model."""
    transformers = pytest.importorskip("transformers")
    original = _kimi_text(model_type="deepseek_v3")
    fields = {k: v for k, v in original.items() if k not in ("architectures", "model_type")}
    transformers.DeepseekV3Config(**fields).save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert "rope_parameters" in saved
    assert ModelConfig.from_hf(saved) == ModelConfig.from_hf(original)
