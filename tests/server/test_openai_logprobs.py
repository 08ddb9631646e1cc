"""OpenAI ``logprobs`` and ``n`` against the live server (tiny random EAGLE-3 pair, speculation on), checked against
/generate's logprob rows and the tokenizer itself (not the server's formatting code); the shipped embedded pair's
in process, against a dense forward of its target.

The tokenizer side: ``Tokenizer.token_bytes`` concatenates to the text's UTF-8 for byte-level, tiktoken and
SentencePiece-style byte-fallback tokenizers."""

from __future__ import annotations

import asyncio
import base64
import json
import os

import httpx
import pytest
import torch

from sglang_eagle3.server.logprobs import ChoiceTokens, TokenTable, tokens_of
from sglang_eagle3.tokenizer import load_tokenizer

from .conftest import write_tokenizer

MODEL = "tiny"
CHAT = [{"role": "user", "content": "Name a quick fox."}]


@pytest.fixture(scope="module")
def tok(tiny_model):
    return load_tokenizer(tiny_model.target)


def _post(server, path: str, body: dict) -> dict:
    r = httpx.post(server.url + path, json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def _error(server, path: str, body: dict) -> dict:
    r = httpx.post(server.url + path, json=body, timeout=60)
    assert r.status_code == 400, r.text
    return r.json()["error"]


def _stream(server, path: str, body: dict) -> list[dict]:
    with httpx.stream("POST", server.url + path, json={**body, "stream": True}, timeout=60) as r:
        assert r.status_code == 200, r.read()
        events = [line[len("data: "):] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def _generate_rows(server, body: dict, top: int, start: int) -> dict:
    return _post(server, "/generate", {**body, "return_logprob": True, "top_logprobs_num": top,
                                       "logprob_start_len": start})["meta_info"]


def _common_prefix(a: str, b: str) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def _name(tok, token_id: int) -> str:
    """A token as /v1/completions names it: its text, or (part of a UTF-8 character) OpenAI's "bytes:\\xNN"."""
    text = tok.decode([token_id], skip_special_tokens=False)
    if "\ufffd" not in text:
        return text
    return "bytes:" + "".join(f"\\x{b:02x}" for b in tok.token_bytes(token_id))


def _expected_completion(tok, prompt_ids: list[int], echo_text: str, meta: dict, out_ids: list[int],
                         text: str) -> dict:
    """What /v1/completions must answer with echo, from /generate's rows and the tokenizer's own decode: each
    token's text is its decoded bytes; its offset the characters that the tokens before it produce of the text."""
    rows = meta["input_token_logprobs"] + meta["output_token_logprobs"]
    tops = meta["input_top_logprobs"] + meta["output_top_logprobs"]
    ids = prompt_ids + out_ids
    assert [r[1] for r in rows] == ids
    full = echo_text + text
    offsets = []
    for i in range(len(ids)):
        if i < len(prompt_ids):
            offsets.append(_common_prefix(tok.decode(ids[:i]), echo_text))
        else:
            offsets.append(len(echo_text) + _common_prefix(tok.decode(out_ids[:i - len(prompt_ids)]), text))
    top_dicts = [None]
    for (v, t, _), top in zip(rows[1:], tops[1:], strict=True):
        d = {}
        for tv, tid, _ in top:
            d.setdefault(_name(tok, tid), tv)
        d.setdefault(_name(tok, t), v)
        top_dicts.append(d)
    assert offsets[-1] <= len(full)
    return {"tokens": [_name(tok, t) for t in ids],
            "token_logprobs": [r[0] for r in rows], "top_logprobs": top_dicts, "text_offset": offsets}


def _approx(got: dict, want: dict) -> None:
    assert got["tokens"] == want["tokens"]
    assert got["text_offset"] == want["text_offset"]
    assert got["token_logprobs"][0] is None and got["top_logprobs"][0] is None
    assert got["token_logprobs"][1:] == pytest.approx(want["token_logprobs"][1:], abs=1e-5)
    for g, w in zip(got["top_logprobs"][1:], want["top_logprobs"][1:], strict=True):
        assert list(g) == list(w)
        assert list(g.values()) == pytest.approx(list(w.values()), abs=1e-5)


# -- /v1/completions logprobs --------------------------------------------------------------------------------------

@pytest.mark.parametrize("as_ids", [False, True], ids=["text", "token-ids"])
def test_scoring_request_echo_logprobs_equal_generate(server, tok, as_ids):
    """lm-evaluation-harness's loglikelihood request: echo, logprobs=1, max_tokens=1, greedy. The prompt's rows
    come first (the first token's null), then the one generated; all equal /generate's rows for the same input."""
    text = "Sphinx of black quartz, judge my vow: 5€ naïve"  # multi-byte characters split across byte tokens
    ids = tok.encode(text)
    assert len(ids) > len(text.split())
    prompt = ids if as_ids else text
    res = _post(server, "/v1/completions", {"model": MODEL, "prompt": prompt, "echo": True, "logprobs": 1,
                                            "max_tokens": 1, "temperature": 0})
    choice = res["choices"][0]
    meta = _generate_rows(server, {"input_ids": ids, "sampling_params": {"max_new_tokens": 1, "temperature": 0}},
                          top=1, start=0)
    out_ids = [r[1] for r in meta["output_token_logprobs"]]
    gen_text = tok.decode(out_ids)
    assert choice["text"] == text + gen_text
    want = _expected_completion(tok, ids, text, meta, out_ids, gen_text)
    _approx(choice["logprobs"], want)
    assert len(choice["logprobs"]["tokens"]) == len(ids) + 1 == res["usage"]["prompt_tokens"] + 1
    euro = choice["logprobs"]["tokens"].index("bytes:\\xe2")  # one token a byte: named by its byte
    assert choice["logprobs"]["tokens"][euro:euro + 3] == ["bytes:\\xe2", "bytes:\\x82", "bytes:\\xac"]
    # logprobs=1: the top token, plus the prompt's own where it is not the top.
    assert all(1 <= len(t) <= 2 for t in choice["logprobs"]["top_logprobs"][1:])


def _stop_inside(tok, text: str) -> str:
    """A two-character stop string from the middle of ``text`` (no replacement characters)."""
    start = next(i for i in range(3, len(text) - 2) if "\ufffd" not in text[i:i + 2] and text[i:i + 2].strip())
    return text[start:start + 2]


def test_stream_logprobs_concatenate_to_the_nonstreaming_ones(server, tok):
    """echo + logprobs=2 + n=2 + a stop string, streamed: per choice, the chunks' token lists (all four) concatenate
    to the non-streaming lists, and no chunk carries a token whose text it has not shown (text held back for a
    stop string holds its tokens back)."""
    base = {"model": MODEL, "prompt": "Judge my vow", "max_tokens": 24, "temperature": 0}
    plain = _post(server, "/v1/completions", base)["choices"][0]["text"]
    stop = _stop_inside(tok, plain)
    # A long stop string that never matches holds the text's last 11 characters back on every step.
    body = {**base, "echo": True, "logprobs": 2, "n": 2, "stop": [stop, "zzzzzzzzzzzz"]}
    full = _post(server, "/v1/completions", body)
    assert [c["index"] for c in full["choices"]] == [0, 1]
    first = full["choices"][0]
    assert first["finish_reason"] == "stop" and first["text"] == "Judge my vow" + plain[:plain.index(stop)]
    lp = first["logprobs"]
    # The tokens cut by the stop string stay in, as /generate's output_ids (and completion_tokens) hold them; those
    # past the text's end are placed at its end.
    prompt_ids = tok.encode("Judge my vow")
    out = _post(server, "/generate", {"input_ids": prompt_ids, "sampling_params": {
        "max_new_tokens": 24, "temperature": 0, "stop": [stop]}})["output_ids"]
    assert len(out) == full["usage"]["completion_tokens"] // 2 < 24
    assert tok.decode(out) != tok.decode(out[:-1]) and stop in tok.decode(out)  # the last one completes the stop
    assert lp["tokens"] == [_name(tok, t) for t in prompt_ids + out]
    assert lp["text_offset"][-1] == len(first["text"])
    chunks = _stream(server, "/v1/completions", body)
    for k in (0, 1):
        mine = [c["choices"][0] for c in chunks if c["choices"] and c["choices"][0]["index"] == k]
        text, got = "", {key: [] for key in lp}
        for j, c in enumerate(mine):
            text += c["text"]
            for key in got:
                got[key] += c["logprobs"][key]
            if j < len(mine) - 2:  # before the finish's flush (the tokens the stop string cut go out with it)
                assert all(off + len(t) <= len(text) for off, t in zip(got["text_offset"], got["tokens"],
                                                                       strict=True) if not t.startswith("bytes:")), (
                    text, got)
                assert all(off < len(text) for off in got["text_offset"]), (text, got)
        assert text == full["choices"][k]["text"]
        assert got == full["choices"][k]["logprobs"]


def test_logprobs_zero_and_top_list_order(server, tok):
    """logprobs=0: each top entry is the chosen token alone; logprobs=3: the row's top 3 (highest first) then the
    chosen token where it is not among them, so greedy tokens head their own lists."""
    body = {"model": MODEL, "prompt": "Pack my box", "max_tokens": 6, "temperature": 0}
    zero = _post(server, "/v1/completions", {**body, "logprobs": 0})["choices"][0]["logprobs"]
    assert [list(t) for t in zero["top_logprobs"]] == [[t] for t in zero["tokens"]]
    assert [list(t.values()) for t in zero["top_logprobs"]] == [[v] for v in zero["token_logprobs"]]
    three = _post(server, "/v1/completions", {**body, "logprobs": 3})["choices"][0]["logprobs"]
    assert three["tokens"] == zero["tokens"] and three["text_offset"][0] == 0
    for token, top in zip(three["tokens"], three["top_logprobs"], strict=True):
        values = list(top.values())
        assert len(top) == 3 and values == sorted(values, reverse=True), top
        assert next(iter(top)) == token  # greedy: the chosen token is the top one


# -- /v1/chat/completions logprobs --------------------------------------------------------------------------------

def test_chat_logprobs_equal_generate_and_stream(server, tok):
    body = {"model": MODEL, "messages": CHAT, "max_tokens": 12, "temperature": 0, "logprobs": True,
            "top_logprobs": 2}
    res = _post(server, "/v1/chat/completions", body)
    content = res["choices"][0]["logprobs"]["content"]
    ids = tok.encode_chat(CHAT)
    meta = _generate_rows(server, {"input_ids": ids, "sampling_params": {"max_new_tokens": 12, "temperature": 0}},
                          top=2, start=-1)
    out_ids = [r[1] for r in meta["output_token_logprobs"]]
    assert len(content) == res["usage"]["completion_tokens"] == len(out_ids)
    assert [c["logprob"] for c in content] == pytest.approx([r[0] for r in meta["output_token_logprobs"]], abs=1e-5)
    for c, tid, top in zip(content, out_ids, meta["output_top_logprobs"], strict=True):
        assert c["token"] == tok.decode([tid])
        assert [t["token"] for t in c["top_logprobs"]] == [tok.decode([i]) for _, i, _ in top]
        assert [t["logprob"] for t in c["top_logprobs"]] == pytest.approx([v for v, _, _ in top], abs=1e-5)
        assert all(bytes(t["bytes"]).decode("utf-8", "replace") == t["token"] for t in c["top_logprobs"])
    # The bytes fields, joined, are the answer's UTF-8 (a partial character's token shows U+FFFD alone).
    assert b"".join(bytes(c["bytes"]) for c in content).decode("utf-8", "replace") == res["choices"][0]["message"][
        "content"] == tok.decode(out_ids)
    # Without top_logprobs: the chosen tokens, each with an empty top list.
    bare = _post(server, "/v1/chat/completions", {**body, "top_logprobs": None})["choices"][0]["logprobs"]["content"]
    assert [c["token"] for c in bare] == [c["token"] for c in content]
    assert all(c["top_logprobs"] == [] for c in bare)
    # Streamed with n=2: each choice opens with the role, and its chunks' content lists join to the full list.
    # (Compared with the same n=2 request unstreamed: a batch of two sums in another order than one request.)
    two = {**body, "n": 2, "stop": "zzzzzzzz"}
    full = _post(server, "/v1/chat/completions", two)["choices"]
    chunks = _stream(server, "/v1/chat/completions", two)
    for k in (0, 1):
        mine = [c["choices"][0] for c in chunks if c["choices"] and c["choices"][0]["index"] == k]
        assert mine[0]["delta"]["role"] == "assistant" and mine[-1]["finish_reason"] == "length"
        joined = [e for c in mine if c["logprobs"] for e in c["logprobs"]["content"]]
        assert joined == full[k]["logprobs"]["content"]
        assert [e["token"] for e in joined] == [e["token"] for e in content]
        assert "".join(c["delta"].get("content") or "" for c in mine) == full[k]["message"]["content"]


# -- n ----------------------------------------------------------------------------------------------------------

def test_n_choices_seeds_order_and_usage(server):
    sampled = {"model": MODEL, "prompt": "Five dozen", "max_tokens": 12, "temperature": 1.0, "seed": 77}
    res = _post(server, "/v1/completions", {**sampled, "n": 3})
    texts = [c["text"] for c in res["choices"]]
    assert [c["index"] for c in res["choices"]] == [0, 1, 2]
    assert len(set(texts)) > 1  # distinct seeds: the samples differ
    # Choice j samples with seed + j (docs/SERVER.md): each equals the n=1 request with that seed; reruns repeat.
    singles = [_post(server, "/v1/completions", {**sampled, "seed": 77 + j})["choices"][0]["text"] for j in range(3)]
    assert texts == singles
    assert [c["text"] for c in _post(server, "/v1/completions", {**sampled, "n": 3})["choices"]] == texts
    assert res["usage"]["completion_tokens"] == 36 and res["usage"]["prompt_tokens"] == _post(
        server, "/v1/completions", sampled)["usage"]["prompt_tokens"]
    # A batch of prompts: index = prompt index x n + j; greedy choices of a prompt are equal; best_of = n is fine.
    greedy = {"model": MODEL, "prompt": ["Pack my box", "How vexingly"], "max_tokens": 8, "temperature": 0}
    one = [c["text"] for c in _post(server, "/v1/completions", greedy)["choices"]]
    res = _post(server, "/v1/completions", {**greedy, "n": 2, "best_of": 2})
    assert [c["index"] for c in res["choices"]] == [0, 1, 2, 3]
    assert [c["text"] for c in res["choices"]] == [one[0], one[0], one[1], one[1]]
    assert res["usage"]["completion_tokens"] == 32
    assert res["usage"]["prompt_tokens"] == _post(server, "/v1/completions", greedy)["usage"]["prompt_tokens"]
    # Chat: the same rule, the prompt counted once.
    chat = {"model": MODEL, "messages": CHAT, "max_tokens": 10, "temperature": 1.0, "seed": 5}
    res = _post(server, "/v1/chat/completions", {**chat, "n": 2})
    single = _post(server, "/v1/chat/completions", {**chat, "seed": 6})
    assert res["choices"][1]["message"]["content"] == single["choices"][0]["message"]["content"]
    assert res["usage"]["prompt_tokens"] == single["usage"]["prompt_tokens"]
    assert res["usage"]["completion_tokens"] == 20


def test_n_streams_interleave_by_index(server):
    body = {"model": MODEL, "prompt": ["Judge my vow", "Black quartz"], "max_tokens": 10, "temperature": 1.0,
            "seed": 3, "n": 2, "stream_options": {"include_usage": True}}
    full = _post(server, "/v1/completions", {k: v for k, v in body.items() if k != "stream_options"})
    chunks = _stream(server, "/v1/completions", body)
    texts = ["", "", "", ""]
    for c in chunks[:-1]:
        texts[c["choices"][0]["index"]] += c["choices"][0]["text"]
    assert texts == [c["text"] for c in full["choices"]]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == full["usage"]


# -- bad values -------------------------------------------------------------------------------------------------

_CMPL = {"model": MODEL, "prompt": "a", "max_tokens": 2}
_CHAT = {"model": MODEL, "messages": CHAT, "max_tokens": 2}
BAD = [
    # (path, body, param, words the message must hold)
    ("/v1/completions", {**_CMPL, "logprobs": -1}, "logprobs", ["logprobs=-1", "[0, 20]"]),
    ("/v1/completions", {**_CMPL, "logprobs": 21}, "logprobs", ["logprobs=21", "[0, 20]", "OpenAI's is 5"]),
    ("/v1/completions", {**_CMPL, "logprobs": "1"}, "logprobs", ["'1'"]),
    ("/v1/completions", {**_CMPL, "logprobs": 1.5}, "logprobs", ["1.5"]),
    ("/v1/completions", {**_CMPL, "logprobs": True}, "logprobs", ["True"]),
    ("/v1/chat/completions", {**_CHAT, "top_logprobs": 2}, "top_logprobs", ["top_logprobs=2", "logprobs=true"]),
    ("/v1/chat/completions", {**_CHAT, "logprobs": False, "top_logprobs": 0}, "top_logprobs", ["logprobs=true"]),
    ("/v1/chat/completions", {**_CHAT, "logprobs": True, "top_logprobs": 21}, "top_logprobs",
     ["top_logprobs=21", "[0, 20]"]),
    ("/v1/chat/completions", {**_CHAT, "logprobs": True, "top_logprobs": -2}, "top_logprobs", ["top_logprobs=-2"]),
    ("/v1/chat/completions", {**_CHAT, "logprobs": 1}, "logprobs", ["1"]),
    ("/v1/completions", {**_CMPL, "n": 0}, "n", ["n=0", "[1, 128]"]),
    ("/v1/completions", {**_CMPL, "n": 129}, "n", ["n=129"]),
    ("/v1/completions", {**_CMPL, "n": "2"}, "n", ["'2'"]),
    ("/v1/chat/completions", {**_CHAT, "n": -1}, "n", ["n=-1"]),
    ("/v1/chat/completions", {**_CHAT, "n": 2.0}, "n", ["2.0"]),
    ("/v1/completions", {**_CMPL, "best_of": 3}, "best_of", ["best_of=3", "n=1"]),
    ("/v1/completions", {**_CMPL, "n": 3, "best_of": 2}, "best_of", ["best_of=2", "n=3"]),
]


def _bad_id(path: str, body: dict) -> str:
    extra = {k: v for k, v in body.items() if k not in ("model", "messages", "prompt", "max_tokens")}
    return ("chat" if "chat" in path else "cmpl") + "-" + "-".join(f"{k}={v!r}" for k, v in extra.items())


@pytest.mark.parametrize("path,body,param,words", BAD, ids=[_bad_id(p, b) for p, b, _, _ in BAD])
def test_bad_logprobs_and_n_are_400_naming_field_and_value(server, path, body, param, words):
    err = _error(server, path, body)
    assert err["param"] == param, err
    assert all(w in err["message"] for w in words), err


# -- token bytes and offsets (the tokenizer side) ---------------------------------------------------------------

_TEXTS = ["fox €uro — naïve 狐狸 🦊 done", "".join(chr(c) for c in range(1, 0x250)), "tab\there\r\nnew ÿ\x7f\xad"]


def test_byte_level_token_bytes_join_to_the_text(tmp_path):
    write_tokenizer(str(tmp_path))
    tok = load_tokenizer(str(tmp_path))
    for text in _TEXTS:
        ids = tok.encode(text)
        assert b"".join(tok.token_bytes(i) for i in ids) == text.encode(), text
    assert tok.token_bytes(tok.encode("<|bos|>")[0]) == b"<|bos|>"


def test_tiktoken_token_bytes(tmp_path):
    pytest.importorskip("tiktoken")
    ranks = [bytes([b]) for b in range(256)] + [b"fo", b"fox", "€".encode()[:2]]
    with open(tmp_path / "tiktoken.model", "w") as f:
        for rank, token in enumerate(ranks):
            f.write(f"{base64.b64encode(token).decode()} {rank}\n")
    with open(tmp_path / "tokenizer_config.json", "w") as f:
        json.dump({"added_tokens_decoder": {str(len(ranks)): {"content": "[EOS]"}}}, f)
    tok = load_tokenizer(str(tmp_path))
    for text in [*_TEXTS, "fox 5€[EOS]"]:
        ids = tok.encode(text)
        assert b"".join(tok.token_bytes(i) for i in ids) == text.encode(), text
    assert tok.token_bytes(len(ranks) + 256 + 7) == b""  # past the vocabulary (and Kimi's 256 reserved ids): nothing


def test_sentencepiece_byte_fallback_token_bytes(tmp_path):
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

    vocab = {f"<0x{b:02X}>": b for b in range(256)}
    for piece in ("\u2581", "f", "o", "x", "\u2581f", "\u2581fo", "\u2581fox"):
        vocab[piece] = len(vocab)
    tk = Tokenizer(models.BPE(vocab=vocab, merges=[("\u2581", "f"), ("\u2581f", "o"), ("\u2581fo", "x")],
                              byte_fallback=True))
    tk.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    tk.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="never")
    tk.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                    decoders.Strip(" ", 1, 0)])
    tk.save(str(tmp_path / "tokenizer.json"))
    tok = load_tokenizer(str(tmp_path))
    ids = tok.encode("fox fox é€")
    assert any(tk.id_to_token(i).startswith("<0x") for i in ids)  # byte fallback in use
    assert b"".join(tok.token_bytes(i) for i in ids) == " fox fox é€".encode()  # the prepended space included


def test_offsets_skip_special_tokens_as_the_text_does(tmp_path):
    """ChoiceTokens counts characters as decode(skip_special_tokens) shows them: a special token is zero-width; a
    character split over byte tokens starts where its first byte's token does, and its tokens wait until the whole
    character is shown."""
    write_tokenizer(str(tmp_path))
    tok = load_tokenizer(str(tmp_path))
    ids, euro = tok.encode("fox <|bos|> €x"), tok.encode("€")
    k = next(i for i in range(len(ids)) if ids[i:i + 3] == euro)
    shown = tok.decode(ids)
    assert shown == "fox  €x" and len(euro) == 3
    tokens = ChoiceTokens(TokenTable(tok), base=3)
    tokens.add(tokens_of([[-1.0, i, None] for i in ids], None))
    out = tokens.release(len("fox  "), False)
    assert [t.id for t in out] == ids[:k]  # the euro's bytes wait for the euro
    out += tokens.release(len("fox  €"), False)
    assert [t.id for t in out] == ids[:k + 3]
    out += tokens.release(len(shown), True)
    assert [t.id for t in out] == ids
    assert [t.offset - 3 for t in out] == [_common_prefix(tok.decode(ids[:i]), shown) for i in range(len(ids))]


# -- the embedded pair, speculation on: logprobs are the target's -------------------------------------------------

def test_embedded_pair_openai_logprobs_are_the_targets(torch_one_thread):
    from sglang_eagle3.engine import EMBEDDED_DIR, Engine
    from sglang_eagle3.server import EngineDriver, ServerConfig, create_app

    if not os.path.exists(os.path.join(EMBEDDED_DIR, "target", "config.json")):
        pytest.skip("embedded weights not present")
    engine = Engine(device="cpu", speculative_num_steps=3, log_level="warning")  # the embedded pair, EAGLE-3 on
    driver = EngineDriver(engine, max_inflight=8)
    app = create_app(engine, driver, ServerConfig(served_model_name="m"))
    driver.start()
    prompt = "And God said, Let there be light: and there was"
    ids = engine.tokenizer.encode(prompt)

    async def ask():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t", timeout=60) as c:
            cmpl = await c.post("/v1/completions", json={"model": "m", "prompt": prompt, "echo": True, "logprobs": 3,
                                                         "max_tokens": 24, "temperature": 0})
            gen = await c.post("/generate", json={"input_ids": ids, "return_logprob": True, "logprob_start_len": 0,
                                                  "top_logprobs_num": 3,
                                                  "sampling_params": {"max_new_tokens": 24, "temperature": 0}})
            return cmpl.json(), gen.json()

    try:
        cmpl, gen = asyncio.run(ask())
    finally:
        driver.stop()
    meta = gen["meta_info"]
    assert meta["completion_tokens"] / meta["spec_verify_ct"] > 1.5  # drafts were accepted: speculation ran
    out = gen["output_ids"]
    lp = cmpl["choices"][0]["logprobs"]
    assert lp["tokens"] == [_name(engine.tokenizer, t) for t in ids + out]
    got = torch.tensor(lp["token_logprobs"][1:], dtype=torch.float64)
    rows = meta["input_token_logprobs"][1:] + meta["output_token_logprobs"]
    assert torch.equal(got, torch.tensor([r[0] for r in rows], dtype=torch.float64))  # /generate's, exactly
    # A dense causal forward of the target over prompt + output: row i predicts token i + 1.
    with torch.inference_mode():
        logits, _ = engine.runner.target.forward_dense(torch.tensor([ids + out]))
    dense = torch.log_softmax(logits[0].double(), -1)
    seq = torch.tensor(ids + out)
    want = dense[torch.arange(len(seq) - 1), seq[1:]]
    assert (got - want).abs().max().item() < 1e-4
    for i, top in enumerate(lp["top_logprobs"][1:]):
        values, top_ids = dense[i].topk(3)
        assert list(top)[:3] == [_name(engine.tokenizer, t) for t in top_ids.tolist()], i
        assert list(top.values())[:3] == pytest.approx(values.tolist(), abs=1e-4)


def test_generate_n_samples_as_sglang(server):
    """SGLang's sampling_params.n on /generate: a list, prompt-major, sample j with seed + j (each equal to the
    n = 1 request with that seed), rids <rid>_<j>; one n a batch; bad values are 400s naming the field."""
    sp = {"max_new_tokens": 10, "temperature": 1.0, "seed": 40}
    res = _post(server, "/generate", {"text": "Five dozen", "sampling_params": {**sp, "n": 3}, "rid": "job"})
    assert isinstance(res, list) and len(res) == 3
    singles = [_post(server, "/generate", {"text": "Five dozen", "sampling_params": {**sp, "seed": 40 + j}})
               for j in range(3)]
    assert [o["output_ids"] for o in res] == [o["output_ids"] for o in singles]
    assert len({tuple(o["output_ids"]) for o in res}) > 1
    assert [o["meta_info"]["id"] for o in res] == ["job_0", "job_1", "job_2"]
    greedy = {"max_new_tokens": 6, "temperature": 0, "n": 2}
    batch = _post(server, "/generate", {"text": ["Pack my box", "How vexingly"], "sampling_params": greedy})
    one = _post(server, "/generate", {"text": ["Pack my box", "How vexingly"],
                                      "sampling_params": {"max_new_tokens": 6, "temperature": 0}})
    assert [o["text"] for o in batch] == [one[0]["text"]] * 2 + [one[1]["text"]] * 2
    for body, needles in (({"text": "a", "sampling_params": {"n": 0}}, ["sampling_params.n=0", "[1, 128]"]),
                          ({"text": "a", "sampling_params": {"n": "2"}}, ["sampling_params.n='2'"]),
                          ({"text": ["a", "b"], "sampling_params": [{"n": 2}, {"n": 3}]}, ["differs", "[2, 3]"])):
        err = _error(server, "/generate", body)
        assert err["param"] == "sampling_params.n" and all(s in err["message"] for s in needles), err


def test_prompt_logprobs_are_computed_a_few_rows_at_a_time(tiny_model, torch_one_thread):
    """An echoed prompt's logprobs (logprob_start_len 0) took the logits of every prompt row at once: an echoed
    32k-token prompt at Kimi's vocabulary is 21 GB of logits (and as much for their log_softmax), an OOM that
    fails every request of the step. Now input_logprob_rows at a time, with the same values."""
    from sglang_eagle3.engine import Engine

    engine = Engine(model_path=tiny_model.target, speculative_algorithm="EAGLE3", device="cpu",
                    speculative_draft_model_path=tiny_model.draft, speculative_num_steps=3, log_level="warning")
    scheduler, runner = engine.backend.scheduler, engine.runner
    ids = [(7 * i) % tiny_model.vocab_size for i in range(40)]
    ask = dict(input_ids=ids, return_logprob=True, logprob_start_len=0, top_logprobs_num=3,
               sampling_params={"max_new_tokens": 2, "temperature": 0})
    whole = engine.generate(**ask)["meta_info"]
    rows, logits_of = [], runner.logits_of
    runner.logits_of = lambda hidden: rows.append(hidden.shape[0]) or logits_of(hidden)
    scheduler.input_logprob_rows = 7
    parts = engine.generate(**ask)["meta_info"]
    assert rows and max(rows) <= 7 and sum(rows) == len(ids) - 1, rows
    assert [r[1] for r in parts["input_token_logprobs"]] == ids
    assert [r[0] for r in parts["input_token_logprobs"][1:]] == pytest.approx(
        [r[0] for r in whole["input_token_logprobs"][1:]], abs=1e-5)
    assert [[t[1] for t in top] for top in parts["input_top_logprobs"][1:]] == \
        [[t[1] for t in top] for top in whole["input_top_logprobs"][1:]]
