"""Tokenizers from a model directory: ``tokenizer.json`` (the ``tokenizers`` library) or a tiktoken-style
``tiktoken.model`` (Kimi ships one), plus the chat template from ``tokenizer_config.json`` when present.
"""

from __future__ import annotations

import base64
import json
import logging
import os

logger = logging.getLogger(__name__)

# Used when the model directory has no chat template: one line per message, then the assistant tag.
DEFAULT_CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


class Tokenizer:
    def __init__(self, encode, decode, vocab_size: int, eos_token_id: int | None, bos_token_id: int | None,
                 chat_template: str | None, special_tokens: dict[str, int] | None = None):
        self._encode, self._decode = encode, decode
        self.vocab_size = vocab_size
        self.eos_token_id, self.bos_token_id = eos_token_id, bos_token_id
        self.chat_template = chat_template or DEFAULT_CHAT_TEMPLATE
        self.has_own_chat_template = chat_template is not None
        self.special_tokens = special_tokens or {}

    def encode(self, text: str) -> list[int]:
        return list(self._encode(text))

    def decode(self, ids: list[int]) -> str:
        return self._decode(list(ids))

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        import jinja2

        env = jinja2.Environment(undefined=jinja2.StrictUndefined)
        return env.from_string(self.chat_template).render(messages=messages,
                                                          add_generation_prompt=add_generation_prompt,
                                                          bos_token="", eos_token="")


def _read_json(path: str) -> dict:
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return json.load(f)


def _token_str(v) -> str | None:
    if isinstance(v, dict):
        return v.get("content")
    return v


def load_tokenizer(path: str) -> Tokenizer | None:
    """The tokenizer of a model directory, or None (logged) when it has none."""
    cfg = _read_json(os.path.join(path, "tokenizer_config.json"))
    template = cfg.get("chat_template")
    if isinstance(template, list):  # some configs hold named templates
        template = next((t.get("template") for t in template if t.get("name") == "default"), None)
    tj = os.path.join(path, "tokenizer.json")
    if os.path.exists(tj):
        from tokenizers import Tokenizer as HFTokenizer

        tok = HFTokenizer.from_file(tj)

        def tid(key):
            s = _token_str(cfg.get(key))
            return tok.token_to_id(s) if s else None

        return Tokenizer(lambda t: tok.encode(t, add_special_tokens=False).ids,
                         lambda ids: tok.decode(ids, skip_special_tokens=True), tok.get_vocab_size(),
                         tid("eos_token"), tid("bos_token"), template)
    tm = os.path.join(path, "tiktoken.model")
    if os.path.exists(tm):
        return _load_tiktoken(tm, cfg, template)
    logger.warning("no tokenizer.json or tiktoken.model in %s: text prompts are unavailable, use input_ids", path)
    return None


# Kimi's pre-tokenisation pattern (the cl100k family's, with Han characters split out).
_TIKTOKEN_PATTERN = (
    r"[\p{Han}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+"
    r"[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _load_tiktoken(path: str, cfg: dict, template: str | None) -> Tokenizer:
    """A tiktoken BPE file (base64 token + rank per line); special tokens from tokenizer_config's
    added_tokens_decoder."""
    try:
        import tiktoken
    except ImportError as e:
        raise RuntimeError(f"{path} needs the 'tiktoken' package (pip install tiktoken)") from e
    ranks = {}
    with open(path, "rb") as f:
        for line in f:
            if line.strip():
                tok, rank = line.split()
                ranks[base64.b64decode(tok)] = int(rank)
    special = {v["content"]: int(k) for k, v in (cfg.get("added_tokens_decoder") or {}).items()}
    pattern = _TIKTOKEN_PATTERN.replace("&&[^\\p{Han}]", "")  # tiktoken's regex engine has no set intersection
    enc = tiktoken.Encoding(name=os.path.basename(os.path.dirname(path)) or "model", pat_str=pattern,
                            mergeable_ranks=ranks, special_tokens=special)
    special_ids = set(special.values())

    def decode(ids):
        return enc.decode([i for i in ids if i not in special_ids])

    def tid(key):
        s = _token_str(cfg.get(key))
        return special.get(s) if s else None

    return Tokenizer(lambda t: enc.encode(t, disallowed_special=()), decode, len(ranks) + len(special),
                     tid("eos_token"), tid("bos_token"), template, special)
