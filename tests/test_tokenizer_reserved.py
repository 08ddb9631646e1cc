"""Kimi's tiktoken tokenizer reserves 256 special-token ids after its BPE ranks; tokenization_kimi.py names the ones
tokenizer_config leaves unnamed ``<|reserved_token_{id}|>``, and they are tokens like the named ones. The reference
below is a tiktoken Encoding built by that rule (Kimi's encode and decode are tiktoken's, with every special token
allowed in the text)."""

from __future__ import annotations

import base64
import json

import pytest

from sglang_eagle3.tokenizer import load_tokenizer

tiktoken = pytest.importorskip("tiktoken")

RANKS = [bytes([b]) for b in range(256)] + [b"he", b"ll", b"hell", b"hello", b" w", b"or", b"ld"]
BASE = len(RANKS)
# Named as Kimi names a few of its slots: scattered over the range, not contiguous.
NAMED = {BASE: "[BOS]", BASE + 1: "[EOS]", BASE + 2: "<|im_end|>", BASE + 9: "[EOT]", BASE + 254: "[UNK]"}


@pytest.fixture
def kimi_dir(tmp_path):
    with open(tmp_path / "tiktoken.model", "w") as f:
        for rank, token in enumerate(RANKS):
            f.write(f"{base64.b64encode(token).decode()} {rank}\n")
    added = {str(i): {"content": name, "special": True} for i, name in NAMED.items()}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"added_tokens_decoder": added, "bos_token": "[BOS]", "eos_token": "[EOS]"}))
    return str(tmp_path)


def _kimi_reference() -> tiktoken.Encoding:
    from tests.test_config_audit import KIMI_PAT

    specials = {NAMED.get(i, f"<|reserved_token_{i}|>"): i for i in range(BASE, BASE + 256)}
    ranks = {token: rank for rank, token in enumerate(RANKS)}
    return tiktoken.Encoding(name="kimi-reference", pat_str=KIMI_PAT, mergeable_ranks=ranks, special_tokens=specials)


def test_reserved_ids_decode_to_their_names(kimi_dir):
    tok, ref = load_tokenizer(kimi_dir), _kimi_reference()
    reserved = [i for i in range(BASE, BASE + 256) if i not in NAMED]
    assert len(reserved) == 256 - len(NAMED)
    for i in reserved:
        assert tok.decode([i], skip_special_tokens=False) == ref.decode([i]) == f"<|reserved_token_{i}|>"
        # What a logprob response names the token by (Kimi's convert_ids_to_tokens gives the name).
        assert tok.token_bytes(i) == ref.decode_single_token_bytes(i)
    ids = tok.encode("hello") + reserved[:3] + [BASE + 2] + tok.encode(" world")
    assert tok.decode(ids, skip_special_tokens=False) == ref.decode(ids)


def test_reserved_names_encode_to_their_ids(kimi_dir):
    tok, ref = load_tokenizer(kimi_dir), _kimi_reference()
    first = min(i for i in range(BASE, BASE + 256) if i not in NAMED)
    assert tok.encode(f"<|reserved_token_{first}|>") == [first]
    text = f"hello<|reserved_token_{BASE + 100}|> world<|im_end|><|reserved_token_{BASE + 255}|>[EOT]"
    assert tok.encode(text) == ref.encode(text, allowed_special="all")
    assert tok.decode(tok.encode(text), skip_special_tokens=False) == text


def test_reserved_ids_are_special_tokens(kimi_dir):
    """Control tokens as the named ones are: a grammar never allows them, skip_special_tokens leaves them out of the
    text, and the vocabulary counts every slot (Kimi's vocab_size: ranks + 256)."""
    tok, ref = load_tokenizer(kimi_dir), _kimi_reference()
    assert tok.vocab_size == ref.n_vocab == BASE + 256
    assert set(range(BASE, BASE + 256)) <= tok.special_ids
    assert {name: i for name, i in tok.special_tokens.items() if i in NAMED} == {v: k for k, v in NAMED.items()}
    assert (tok.bos_token_id, tok.eos_token_id) == (BASE, BASE + 1)
    hello = tok.encode("hello")
    assert tok.decode(hello + [BASE + 3, BASE + 2, BASE + 200]) == "hello"
    # Past the reserved slots no token owns an id (a model's padded vocabulary): nothing, and no KeyError.
    assert tok.decode(hello + [BASE + 256, BASE + 300], skip_special_tokens=False) == "hello"
    assert tok.token_bytes(BASE + 256) == b""
