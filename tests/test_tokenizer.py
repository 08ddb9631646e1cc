"""Tokenizers from a model directory: tokenizer.json and tiktoken.model, special tokens, chat templates."""

from __future__ import annotations

import base64
import json
import os

import pytest

from sglang_eagle3.tokenizer import DEFAULT_CHAT_TEMPLATE, ChatTemplateError, load_tokenizer

BOS, EOS = "<|bos|>", "<|eos|>"
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]


def _bpe_dir(path, config: dict | None = None, jinja: str | None = None) -> str:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=[BOS, EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["hello world, the quick brown fox " * 20], trainer)
    tok.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", special_tokens=[(BOS, 0)])
    os.makedirs(path, exist_ok=True)
    tok.save(os.path.join(path, "tokenizer.json"))
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": BOS, "eos_token": {"content": EOS}, **(config or {})}, f)
    if jinja is not None:
        with open(os.path.join(path, "chat_template.jinja"), "w") as f:
            f.write(jinja)
    return str(path)


def test_tokenizer_json_special_tokens_and_round_trip(tmp_path):
    tok = load_tokenizer(_bpe_dir(tmp_path))
    assert (tok.bos_token_id, tok.eos_token_id) == (0, 1)
    ids = tok.encode("hello world")
    assert ids[0] != 0  # no BOS unless asked: the engine's prompts are BOS-less
    assert tok.encode("hello world", add_special_tokens=True) == [0, *ids]
    assert tok.decode(ids) == "hello world"
    assert tok.encode(f"{EOS}hello")[0] == 1  # a special-token string in the text is its id
    assert tok.decode([1, *ids]) == "hello world" and tok.decode([1, *ids], skip_special_tokens=False) == EOS + \
        "hello world"


def test_tokenizer_json_encodes_as_the_library(tmp_path):
    """Ours encodes through encode_batch (it releases the GIL); ids must be the library's encode's, on fresh text."""
    import random

    from tokenizers import Tokenizer

    path = _bpe_dir(tmp_path)
    ours, lib = load_tokenizer(path), Tokenizer.from_file(os.path.join(path, "tokenizer.json"))
    rng = random.Random()
    pieces = ["hello", " world", ",", " the", "quick", " brown", "fox", " ", "\n", "é", "漢", EOS, "zz", "12"]
    for _ in range(20):
        text = "".join(rng.choice(pieces) for _ in range(rng.randrange(1, 40)))
        for special in (False, True):
            assert ours.encode(text, special) == lib.encode(text, add_special_tokens=special).ids, text


def test_chat_template_sources(tmp_path):
    default = load_tokenizer(_bpe_dir(tmp_path / "a"))
    assert default.chat_template == DEFAULT_CHAT_TEMPLATE and not default.has_own_chat_template
    assert default.apply_chat_template(MESSAGES) == "<|system|>\nBe brief.\n<|user|>\nHi there\n<|assistant|>\n"
    own = "{{ bos_token }}{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
    from_config = load_tokenizer(_bpe_dir(tmp_path / "b", {"chat_template": own}))
    assert from_config.apply_chat_template(MESSAGES) == f"{BOS}[system] Be brief.\n[user] Hi there\n"
    ids = from_config.encode_chat(MESSAGES)
    assert ids[0] == 0 and ids.count(0) == 1  # the template's BOS, once
    from_file = load_tokenizer(_bpe_dir(tmp_path / "c", jinja=own))
    assert from_file.has_own_chat_template and from_file.encode_chat(MESSAGES) == ids


def test_chat_template_extra_variables(tmp_path):
    """chat_template_kwargs (SGLang's): a template's own switches reach it; the renderer's variables win."""
    own = ("{% for m in messages %}{{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}"
           "{% if thinking %}<think>{% else %}<answer>{% endif %}{% endif %}")
    tok = load_tokenizer(_bpe_dir(tmp_path, {"chat_template": own}))
    assert tok.apply_chat_template(MESSAGES).endswith("<answer>")
    assert tok.apply_chat_template(MESSAGES, extra={"thinking": True}).endswith("<think>")
    assert tok.apply_chat_template(MESSAGES, extra={"thinking": False}).endswith("<answer>")


def test_chat_template_raise_exception_is_a_client_error(tmp_path):
    strict = "{% if messages[0]['role'] != 'user' %}{{ raise_exception('first message must be user') }}{% endif %}"
    tok = load_tokenizer(_bpe_dir(tmp_path, {"chat_template": strict}))
    with pytest.raises(ChatTemplateError, match="first message must be user"):
        tok.apply_chat_template(MESSAGES)


def test_tiktoken_model_file(tmp_path):
    pytest.importorskip("tiktoken")
    ranks = [bytes([b]) for b in range(256)] + [b"he", b"ll", b"hell", b"hello"]
    with open(tmp_path / "tiktoken.model", "w") as f:
        for rank, token in enumerate(ranks):
            f.write(f"{base64.b64encode(token).decode()} {rank}\n")
    special = {str(len(ranks)): {"content": "[BOS]"}, str(len(ranks) + 1): {"content": "[EOS]"}}
    with open(tmp_path / "tokenizer_config.json", "w") as f:
        json.dump({"added_tokens_decoder": special, "bos_token": "[BOS]", "eos_token": "[EOS]", "add_bos_token": True,
                   "chat_template": "{% for m in messages %}{{ m['content'] }}[EOS]{% endfor %}"}, f)
    tok = load_tokenizer(str(tmp_path))
    # (Kimi's tokenizer reserves 256 special ids past the ranks, named or not: tests/test_tokenizer_reserved.py)
    assert tok.vocab_size == len(ranks) + 256 and (tok.bos_token_id, tok.eos_token_id) == (260, 261)
    ids = tok.encode("hello")
    assert ids == [259] and tok.decode(ids) == "hello"
    assert tok.encode("hello", add_special_tokens=True) == [260, 259]
    assert tok.encode_chat([{"role": "user", "content": "hello"}]) == [259, 261]  # [EOS] written by the template


def test_tiktoken_decode_drops_ids_it_lacks(tmp_path):
    """A model's vocabulary padded past the tokenizer's: ids no token owns (past the end, or a gap between the ranks
    and the special tokens) decode to nothing, as with Hugging Face tokenizers; tiktoken raised KeyError, which failed
    the whole engine step when a stop string was checked."""
    pytest.importorskip("tiktoken")
    with open(tmp_path / "tiktoken.model", "w") as f:
        for i in range(256):
            f.write(f"{base64.b64encode(bytes([i])).decode()} {i}\n")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"added_tokens_decoder": {"300": {"content": "<|end|>", "special": True}}, "eos_token": "<|end|>"}))
    tok = load_tokenizer(str(tmp_path))
    ids = tok.encode("hi")
    # 256..511: Kimi's reserved special ids (tests/test_tokenizer_reserved.py); 600, 10000: past them
    assert tok.decode(ids + [299, 10_000]) == "hi"
    assert tok.decode([600] + ids + [300], skip_special_tokens=False) == "hi<|end|>"
    assert tok.decode(ids + [300], skip_special_tokens=True) == "hi"
