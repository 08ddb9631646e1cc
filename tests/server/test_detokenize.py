"""The driver's incremental detokenisation: text only grows, never shows half a UTF-8 character or the start of
a stop string, and ends equal to a full decode."""

from __future__ import annotations

import types

from sglang_eagle3.runtime.request import Request
from sglang_eagle3.runtime.sampling import SamplingParams
from sglang_eagle3.server.driver import EngineDriver, _Tracked
from sglang_eagle3.tokenizer import load_tokenizer

from .conftest import write_tokenizer


def _driver_and_tokenizer(tmp_path):
    write_tokenizer(str(tmp_path))
    tok = load_tokenizer(str(tmp_path))
    return EngineDriver(types.SimpleNamespace(scheduler=None, tokenizer=tok)), tok


def _feed(driver, tok, text: str, stop: list[str], skip_special_tokens: bool = True) -> list[str]:
    ids = tok.encode(text)
    req = Request(rid="r", input_ids=[1], params=SamplingParams(stop=stop, skip_special_tokens=skip_special_tokens))
    t = _Tracked(req, None, 0, max((len(s) for s in stop), default=1) - 1, False)
    shown = []
    for n in range(1, len(ids) + 1):
        req.output_ids = ids[:n]
        shown.append(driver._visible_text(t, req))
    return shown


def test_multibyte_characters_are_never_split(tmp_path):
    driver, tok = _driver_and_tokenizer(tmp_path)
    text = "fox €uro — naïve 狐狸 done"
    assert len(tok.encode("€")) > 1  # the pangram BPE has no merge for it: one token per byte
    shown = _feed(driver, tok, text, [])
    for a, b in zip(shown, shown[1:], strict=False):
        assert b.startswith(a)
    assert all("\ufffd" not in s for s in shown)
    assert shown[-1] == text == tok.decode(tok.encode(text))


def test_stop_string_prefix_is_held_back(tmp_path):
    driver, tok = _driver_and_tokenizer(tmp_path)
    # The output so far ends with "brow": it may still become the stop string "brown", so none of it shows.
    shown = _feed(driver, tok, "the quick brow", ["brown"])
    assert shown[-1] == "the quick "
    assert all("b" not in s for s in shown)


def test_special_tokens_stream_as_the_final_text_decodes_them(tmp_path):
    """skip_special_tokens=false: the streamed text carries the special tokens that Engine.result's final text
    carries, so the final text still extends what was streamed."""
    driver, tok = _driver_and_tokenizer(tmp_path)
    text = "fox <|bos|> dog"
    assert "<|bos|>" not in tok.decode(tok.encode(text))  # a special token: skipped by default
    kept = _feed(driver, tok, text, [], skip_special_tokens=False)
    assert kept[-1] == tok.decode(tok.encode(text), skip_special_tokens=False) == text
    skipped = _feed(driver, tok, text, [])
    assert "<|bos|>" not in skipped[-1] and skipped[-1] == tok.decode(tok.encode(text))
