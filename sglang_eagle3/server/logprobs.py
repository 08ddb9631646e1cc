"""OpenAI ``logprobs`` objects from the engine's logprob rows (``Engine.result``'s ``[logprob, id, None]`` and
top lists of them).

/v1/completions: ``{"tokens", "token_logprobs", "top_logprobs", "text_offset"}``, one entry a token. A
``top_logprobs`` entry maps token text -> logprob for the row's top N (N = the request's ``logprobs``) plus the
token itself, so up to N + 1 keys, as OpenAI documents; the first prompt token (with ``echo``) has no row before
it: ``null`` logprob and ``null`` top entry. ``text_offset`` is the character where the token's text starts in
the choice's returned text (echoed prompt included); a token past the end of that text (cut by a stop string)
has the text's length.

/v1/chat/completions: ``{"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob",
"bytes"}, ...]}, ...]}``, N entries in ``top_logprobs`` (N = the request's ``top_logprobs``).

A byte-level token can hold part of a UTF-8 character. Chat shows such a token's text with U+FFFD and its exact
``bytes``; completions, which key ``top_logprobs`` by token text (two partial characters would collapse into one
U+FFFD key), name it ``bytes:`` + each byte as ``\\xNN`` (``bytes:\\xe2\\x82``), as OpenAI's legacy API does; a
token that is valid UTF-8 alone is its text in both. In a stream each token goes out with the chunk whose text completes
it (``ChoiceTokens``), so the chunks' token lists concatenate to the non-streaming list.
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass

# JSON has no -Infinity; a token the model gives probability 0 (underflow) gets this, as vLLM does.
MIN_LOGPROB = -9999.0


def _value(v: float | None) -> float | None:
    return None if v is None else max(float(v), MIN_LOGPROB)


@dataclass(frozen=True)
class _Entry:
    text: str  # the token's bytes as text (U+FFFD for a partial character)
    raw: bytes
    skipped: bool  # a special token: the returned text (skip_special_tokens) leaves it out

    @property
    def name(self) -> str:
        """/v1/completions' token string: the text, or ``bytes:\\xNN...`` when the bytes are not UTF-8 alone."""
        try:
            return self.raw.decode("utf-8")
        except UnicodeDecodeError:
            return "bytes:" + "".join(f"\\x{b:02x}" for b in self.raw)


class TokenTable:
    """Token id -> its text, bytes and whether decoded text skips it; cached (at most the vocabulary's size)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._entries: dict[int, _Entry] = {}
        self._decoded: dict[int, str] = {}

    def entry(self, token_id: int) -> _Entry:
        e = self._entries.get(token_id)
        if e is None:
            raw = self.tokenizer.token_bytes(token_id)
            # Every ordinary token decodes to at least one character (U+FFFD for a lone byte): empty means the
            # tokenizer skips it as special.
            skipped = self.tokenizer.decode([token_id], skip_special_tokens=True) == ""
            e = self._entries[token_id] = _Entry(raw.decode("utf-8", errors="replace"), raw, skipped)
        return e

    def name(self, token_id: int) -> str:
        return self.entry(token_id).name

    def decoded(self, token_id: int) -> str:
        """The token's text as the tokenizer decodes it alone, special tokens kept (SGLang's
        ``return_text_in_logprobs`` text: its tokenizer's ``batch_decode`` of each id)."""
        text = self._decoded.get(token_id)
        if text is None:
            text = self._decoded[token_id] = self.tokenizer.decode([token_id], skip_special_tokens=False)
        return text


@dataclass(frozen=True)
class Token:
    """One token with its logprob row: ``logprob`` None for a prompt's first token (nothing predicts it); ``top``
    the engine's top list ``[[logprob, id, None], ...]`` (None when none was asked for or there is no row)."""

    id: int
    logprob: float | None
    top: list | None
    offset: int = 0  # characters of the returned text before the token's text starts


def tokens_of(rows: list, tops: list | None) -> list[Token]:
    """Token records from Engine.result rows (``[logprob, id, None]``) and top lists (None: none asked for)."""
    tops = tops if tops else [None] * len(rows)
    return [Token(row[1], row[0], top) for row, top in zip(rows, tops, strict=True)]


class ChoiceTokens:
    """One text's tokens and where each one's text ends, fed as they come; ``release`` hands them out once the
    text shown covers them.

    Character positions are counted from the tokens' bytes through an incremental UTF-8 decoder, skipping the
    special tokens the returned text skips (``skip_special``); for byte-level tokenizers that is exactly how the
    text decodes. A token holding part of a character starts where that character does and goes out once the
    whole character is shown."""

    def __init__(self, table: TokenTable, *, base: int = 0, skip_special: bool = True):
        self.table, self.base, self.skip_special = table, base, skip_special
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._chars = 0
        self._pending: list[tuple[Token, int, int]] = []  # (token, start, end) in characters of this text

    def add(self, tokens: list[Token]) -> None:
        for t in tokens:
            start = self._chars
            e = self.table.entry(t.id)
            if not (self.skip_special and e.skipped):
                self._chars += len(self._decoder.decode(e.raw))
            # A token that leaves a character unfinished is shown with that character: it ends one further.
            partial = bool(self._decoder.getstate()[0])
            self._pending.append((t, start, self._chars + partial))

    def release(self, shown: int, finished: bool) -> list[Token]:
        """The waiting tokens whose text lies within the first ``shown`` characters (all of them once
        ``finished``: the final text may be cut short by a stop string), in order, with their offsets."""
        k = len(self._pending)
        if not finished:
            k = next((i for i, (_, _, end) in enumerate(self._pending) if end > shown), k)
        out, self._pending = self._pending[:k], self._pending[k:]
        # start <= end <= shown for all but the last chunk's: the clip only moves tokens cut off the text's end.
        return [Token(t.id, t.logprob, t.top, self.base + min(start, shown)) for t, start, _ in out]


def completion_logprobs(table: TokenTable, tokens: list[Token]) -> dict:
    """/v1/completions' ``logprobs`` object over ``tokens`` (offsets already set)."""
    texts, values, tops = [], [], []
    for t in tokens:
        text = table.name(t.id)
        texts.append(text)
        values.append(_value(t.logprob))
        if t.logprob is None:
            tops.append(None)
            continue
        # Highest first; the token itself last unless among them. NOTE: ids with the same bytes (a tokenizer's
        # duplicates) would share one key: the higher logprob is kept.
        top: dict[str, float] = {}
        for v, i, _ in t.top or ():
            top.setdefault(table.name(i), _value(v))
        top.setdefault(text, _value(t.logprob))
        tops.append(top)
    return {"tokens": texts, "token_logprobs": values, "top_logprobs": tops, "text_offset": [t.offset for t in tokens]}


def _chat_item(table: TokenTable, token_id: int, logprob: float | None) -> dict:
    e = table.entry(token_id)
    return {"token": e.text, "logprob": _value(logprob), "bytes": list(e.raw)}


def chat_logprobs(table: TokenTable, tokens: list[Token]) -> dict:
    """/v1/chat/completions' ``logprobs`` object over ``tokens``."""
    return {"content": [{**_chat_item(table, t.id, t.logprob),
                         "top_logprobs": [_chat_item(table, i, v) for v, i, _ in t.top or ()]} for t in tokens]}


# Engine.result's logprob rows ([logprob, id, text]) and top lists (a list of rows a position, None where none).
_ROW_KEYS = ("input_token_logprobs", "output_token_logprobs")
_TOP_KEYS = ("input_top_logprobs", "output_top_logprobs")


def with_token_text(result: dict, table: TokenTable) -> dict:
    """SGLang's ``return_text_in_logprobs`` on /generate: ``result`` (Engine.result) with the third element of
    every logprob row, in the token lists and in each position's top list, the token's decoded text
    (TokenTable.decoded) instead of null. A new dict: the rows of ``result`` (which a stream's later chunks still
    extend) are left as they are."""
    meta = result.get("meta_info")
    if not meta or not any(k in meta for k in _ROW_KEYS):
        return result

    def rows(entries: list) -> list:
        return [[v, i, table.decoded(i)] for v, i, *_ in entries]

    meta = dict(meta)
    for k in _ROW_KEYS:
        if meta.get(k) is not None:
            meta[k] = rows(meta[k])
    for k in _TOP_KEYS:
        if meta.get(k) is not None:
            meta[k] = [None if top is None else rows(top) for top in meta[k]]
    return {**result, "meta_info": meta}
