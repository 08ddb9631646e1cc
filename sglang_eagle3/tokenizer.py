"""Tokenizers from a model directory: ``tokenizer.json`` (the ``tokenizers`` library) or a tiktoken-style
``tiktoken.model`` (Kimi ships one), plus the chat template found as Hugging Face finds it (a
``chat_template.jinja`` file first, else ``tokenizer_config.json``'s), else ``DEFAULT_CHAT_TEMPLATE``; templates
render in Hugging Face's Jinja environment (its ``tojson``, ``strftime_now``, ``{% generation %}``).

``encode(text)`` adds no special tokens by default (the embedded model is trained and evaluated on BOS-less
prompts); ``add_special_tokens=True`` adds them as Hugging Face does (the post-processor's BOS, or
``add_bos_token`` for tiktoken files). Special-token strings written in the text (chat templates write them)
always become their ids. ``token_bytes(id)`` is one token's own bytes (logprob responses name each token, and a
byte-level token need not be valid UTF-8 alone).
"""

from __future__ import annotations

import base64
import datetime
import functools
import json
import logging
import os
import re
from collections.abc import Callable

logger = logging.getLogger(__name__)

# Used when the model directory has no chat template: one line per message, then the assistant tag.
DEFAULT_CHAT_TEMPLATE = (
    "{% if tools %}<|tools|>\n{{ tools | tojson }}\n{% endif %}"
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


class ChatTemplateError(ValueError):
    """The chat template could not render these messages (a client error: bad roles, order or content)."""


# Turn-final tokens some checkpoints ship without naming them EOS (Llama-3's tool-use <|eom_id|>, ...): where a
# tokenizer has one among its added tokens, a request ends at it, as in SGLang (its additional_stop_token_ids).
ADDITIONAL_STOP_TOKENS = ("<|eom_id|>", "<|content_model_end_sampling|>", "<|ifm|im_end|>")


def _additional_stop_ids(added: dict[str, int]) -> tuple[int, ...]:
    """``ADDITIONAL_STOP_TOKENS``' ids among ``added`` (an added token's text -> its id)."""
    return tuple(added[t] for t in ADDITIONAL_STOP_TOKENS if t in added)


class Tokenizer:
    """``encode(text, add_special_tokens)`` and ``decode(ids, skip_special_tokens)`` callables plus the
    special-token names."""

    def __init__(self, encode, decode, vocab_size: int, eos_token_id: int | None, bos_token_id: int | None,
                 chat_template: str | None, special_tokens: dict[str, int] | None = None,
                 bos_token: str | None = None, eos_token: str | None = None,
                 token_bytes: Callable[[int], bytes] | None = None, special_ids: frozenset[int] | None = None,
                 named_chat_templates: dict[str, str] | None = None, additional_stop_ids: tuple[int, ...] = ()):
        """``named_chat_templates``: the checkpoint's other templates by name (``additional_chat_templates/``,
        or a tokenizer_config list); "tool_use" renders requests that carry tools. ``additional_stop_ids``:
        ADDITIONAL_STOP_TOKENS' ids in this tokenizer (a request ends at them besides its EOS)."""
        self._encode, self._decode = encode, decode
        self._token_bytes = token_bytes
        self.vocab_size = vocab_size
        self.eos_token_id, self.bos_token_id = eos_token_id, bos_token_id
        self.bos_token, self.eos_token = bos_token, eos_token
        self.chat_template = chat_template or DEFAULT_CHAT_TEMPLATE
        self.has_own_chat_template = chat_template is not None
        self.special_tokens = special_tokens or {}
        # Ids of the special (control) tokens: never text, so a grammar never allows one (runtime/grammar.py).
        self.special_ids = frozenset(self.special_tokens.values()) if special_ids is None else special_ids
        self.named_chat_templates = dict(named_chat_templates or {})
        self.additional_stop_ids = tuple(additional_stop_ids)
        self._compiled_template: tuple[str, object] | None = None  # (source, compiled)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(self._encode(text, add_special_tokens))

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._decode(list(ids), skip_special_tokens)

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes token ``token_id`` adds to a decoded text (a special token: its name's UTF-8). Part of a
        multi-byte character for some byte-level tokens, so not always valid UTF-8 alone. A tokenizer whose
        pieces this module cannot read as bytes gives the UTF-8 of ``decode([token_id])`` instead."""
        if self._token_bytes is not None:
            return self._token_bytes(token_id)
        return self.decode([token_id], skip_special_tokens=False).encode()

    def set_chat_template(self, template: str) -> None:
        """A template given by the user (``--chat-template``): used for every request, tools or not."""
        self.chat_template, self.has_own_chat_template, self._compiled_template = template, True, None
        self.named_chat_templates = {}

    # Variables the renderer sets itself: a client's chat_template_kwargs may not name them.
    TEMPLATE_VARIABLES = ("messages", "add_generation_prompt", "bos_token", "eos_token", "tools", "raise_exception")

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True,
                            tools: list[dict] | None = None, extra: dict | None = None) -> str:
        """Renders messages as Hugging Face does (trim_blocks, lstrip_blocks, ``raise_exception``; ``tools``, the
        OpenAI tool list, as the template's ``tools``; ``extra``: more variables, e.g. a template's ``thinking``
        switch, as SGLang's chat_template_kwargs). A message's content may be a list of OpenAI text parts: the
        template gets them in the form it reads (chat_content_format), as SGLang hands them to it."""
        import jinja2

        # As Hugging Face picks among named templates: "tool_use" for a request with tools, where there is one.
        source = self.chat_template
        if tools is not None and "tool_use" in self.named_chat_templates:
            source = self.named_chat_templates["tool_use"]
        if self._compiled_template is None or self._compiled_template[0] != source:
            self._compiled_template = (source, _template_environment().from_string(source))
        messages = _content_for_template(messages, chat_content_format(source))
        try:
            return self._compiled_template[1].render(**(extra or {}), messages=messages,
                                                     add_generation_prompt=add_generation_prompt,
                                                     bos_token=self.bos_token or "", eos_token=self.eos_token or "",
                                                     tools=tools)
        except jinja2.TemplateError as e:
            raise ChatTemplateError(f"the chat template cannot render these messages: {e}") from e

    def encode_chat(self, messages: list[dict], add_generation_prompt: bool = True,
                    tools: list[dict] | None = None, extra: dict | None = None) -> list[int]:
        """Token ids of a rendered chat prompt. As with Hugging Face's ``apply_chat_template(tokenize=True)``,
        only what the template writes is encoded (a template that wants a BOS writes ``{{ bos_token }}``)."""
        return self.encode(self.apply_chat_template(messages, add_generation_prompt, tools, extra),
                           add_special_tokens=False)


# Words whose presence anywhere in a template make SGLang take it for one that reads content parts (a multimodal
# template's), whatever its loops.
_MEDIA_TEMPLATE_WORDS = ("image", "audio", "video", "vision")
_CONTENT_HOLDERS = ("message", "msg", "m")  # the loop variables SGLang's detection looks for


def _reads_content(node, jinja2) -> bool:
    """Whether ``node`` is ``message.content`` / ``message['content']`` (or msg's, m's), through filters, tests and
    slices."""
    n = jinja2.nodes
    while True:
        if isinstance(node, (n.Filter, n.Test)) and node.node is not None:
            node = node.node
        elif isinstance(node, n.Getitem) and isinstance(node.arg, n.Slice):
            node = node.node
        else:
            break
    if isinstance(node, n.Getattr):
        key = node.attr
    elif isinstance(node, n.Getitem) and isinstance(node.arg, n.Const):
        key = node.arg.value
    else:
        return False
    return key == "content" and isinstance(node.node, n.Name) and node.node.name in _CONTENT_HOLDERS


@functools.lru_cache(maxsize=16)
def chat_content_format(template: str) -> str:
    """The content form a chat template reads, as SGLang 0.5.23 decides it (and vLLM before it): "openai" (a list of
    content parts) for a template that loops over a message's content, or that names images, audio, video or vision
    anywhere; else "string" (a template that fails to parse: "string")."""
    import jinja2

    if any(word in template for word in _MEDIA_TEMPLATE_WORDS):
        return "openai"
    try:
        ast = _template_environment().parse(template)
    except jinja2.TemplateError:
        return "string"
    loops = ast.find_all(jinja2.nodes.For)
    return "openai" if any(_reads_content(loop.iter, jinja2) for loop in loops) else "string"


def _content_for_template(messages: list[dict], content_format: str) -> list[dict]:
    """``messages`` with each list content (OpenAI text parts) in the form the template reads: the parts themselves
    (``{"type": "text", "text"}``) for an "openai" template, their texts joined by a space for a "string" one; a tool
    message's always joined (most templates write a tool result as text). As SGLang's Jinja path does."""
    out = []
    for m in messages:
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, list):
            texts = []
            for part in content:
                if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                    raise ChatTemplateError(f"a content part must be a text part ({{\"type\": \"text\", "
                                            f"\"text\": ...}}), got {str(part)[:80]}")
                texts.append(part["text"])
            joined = content_format == "string" or m.get("role") == "tool"
            m = {**m, "content": " ".join(texts) if joined else [{"type": "text", "text": t} for t in texts]}
        out.append(m)
    return out


@functools.lru_cache(maxsize=1)
def _template_environment():
    """The Jinja environment Hugging Face's ``apply_chat_template`` renders in, so that a checkpoint's template
    writes here what it writes there: sandboxed, trim_blocks and lstrip_blocks, loop controls, ``raise_exception``,
    ``strftime_now``, a ``{% generation %}`` block (transformers marks the assistant's tokens with it; here it only
    renders its body) and transformers' ``tojson``. Jinja's own ``tojson`` sorts keys, writes ``<``, ``>``, ``&``,
    ``'`` and non-ASCII as ``\\u`` escapes and takes no ``separators``: Kimi-K2.5's template writes
    ``tools | tojson(separators=(',', ':'))``, which it refused, and other templates' tool lists came out reordered
    and escaped."""
    import jinja2
    from jinja2.ext import Extension
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationBlock(Extension):
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

        def _render(self, caller):
            return caller()

    def raise_exception(message):
        raise ChatTemplateError(message)

    def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationBlock, "jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    return env


def _read_json(path: str) -> dict:
    """A model directory's JSON file, {} when absent; a malformed one names itself (json's error does not)."""
    if not os.path.exists(path):
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            cfg = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from e
    if not isinstance(cfg, dict):
        raise ValueError(f"{path} must hold a JSON object, got {type(cfg).__name__}")
    return cfg


def _chat_templates(path: str, cfg: dict) -> tuple[str | None, dict[str, str]]:
    """(default template, other named templates) of a model directory, found as Hugging Face finds them: the
    ``chat_template.jinja`` and ``additional_chat_templates/*.jinja`` files take priority over tokenizer_config's
    ``chat_template`` (a string, or a list of {name, template}); a newer template shipped as a file is the one that
    counts, not the stale copy left in the config."""
    named: dict[str, str] = {}
    jinja_file = os.path.join(path, "chat_template.jinja")
    extra_dir = os.path.join(path, "additional_chat_templates")
    if os.path.exists(jinja_file):
        with open(jinja_file, encoding="utf-8") as f:
            named["default"] = f.read()
    if os.path.isdir(extra_dir):
        for name in sorted(os.listdir(extra_dir)):
            if name.endswith(".jinja"):
                with open(os.path.join(extra_dir, name), encoding="utf-8") as f:
                    named[name.removesuffix(".jinja")] = f.read()
    if not named:
        template = cfg.get("chat_template")
        if isinstance(template, list):  # named templates
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        elif template is not None:
            named["default"] = template
    bad = [k for k, v in named.items() if not isinstance(k, str) or not isinstance(v, str)]
    if bad:
        raise ValueError(f"{path}: chat template {bad[0]!r} is not a name with a template string")
    if named and "default" not in named:
        logger.warning("%s: the chat templates %s name none 'default' (Hugging Face refuses to pick one): chat "
                       "prompts use the generic template unless one is given (--chat-template)", path, sorted(named))
    default = named.pop("default", None)
    return default, named


def _token_str(v) -> str | None:
    if isinstance(v, dict):
        return v.get("content")
    return v


def load_tokenizer(path: str) -> Tokenizer | None:
    """The tokenizer of a model directory, or None (logged) when it has none."""
    cfg = _read_json(os.path.join(path, "tokenizer_config.json"))
    template, named = _chat_templates(path, cfg)
    # Special tokens named in tokenizer_config, else in special_tokens_map.json (older repositories keep them
    # only there; Hugging Face reads both).
    special_map = _read_json(os.path.join(path, "special_tokens_map.json"))
    bos_token = _token_str(cfg.get("bos_token", special_map.get("bos_token")))
    eos_token = _token_str(cfg.get("eos_token", special_map.get("eos_token")))
    tj = os.path.join(path, "tokenizer.json")
    if os.path.exists(tj):
        from tokenizers import Tokenizer as HFTokenizer

        tok = HFTokenizer.from_file(tj)

        def tid(s):
            return tok.token_to_id(s) if s else None

        # encode_batch releases the GIL while it works (encode holds it for the whole call: a megabyte of
        # prompt froze the server's event loop for a second, though tokenized in a worker thread).
        return Tokenizer(lambda t, special: tok.encode_batch([t], add_special_tokens=special)[0].ids,
                         lambda ids, skip: tok.decode(ids, skip_special_tokens=skip), tok.get_vocab_size(),
                         tid(eos_token), tid(bos_token), template, bos_token=bos_token, eos_token=eos_token,
                         token_bytes=_hf_token_bytes(tok, _read_json(tj).get("decoder")),
                         special_ids=frozenset(i for i, t in tok.get_added_tokens_decoder().items() if t.special),
                         named_chat_templates=named, additional_stop_ids=_additional_stop_ids(
                             {t.content: i for i, t in tok.get_added_tokens_decoder().items()}))
    tm = os.path.join(path, "tiktoken.model")
    if os.path.exists(tm):
        return _load_tiktoken(tm, cfg, template, bos_token, eos_token, named)
    logger.warning("no tokenizer.json or tiktoken.model in %s: text prompts are unavailable, use input_ids", path)
    return None


def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-level alphabet, inverted: the character a ``tokenizer.json`` ByteLevel piece writes for each
    byte -> that byte. Printable Latin-1 bytes stand for themselves; the other 68 (controls, space, 0x7F-0xA0,
    0xAD) are written as chr(256 + k), k counting them in byte order."""
    printable = {*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)}
    table = {chr(b): b for b in printable}
    shifted = (b for b in range(256) if b not in printable)
    table.update((chr(256 + k), b) for k, b in enumerate(shifted))
    return table


_BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _decoder_types(cfg) -> set[str]:
    """Every decoder type named in a tokenizer.json ``decoder`` (Sequence decoders nest), plus "Replace▁" for a
    Replace decoder that turns SentencePiece's U+2581 into a space."""
    if not isinstance(cfg, dict):
        return set()
    types = {cfg.get("type")}
    if cfg.get("type") == "Replace" and (cfg.get("pattern") or {}).get("String") == "\u2581":
        types.add("Replace▁")
    for sub in cfg.get("decoders") or []:
        types |= _decoder_types(sub)
    return types


def _hf_token_bytes(tok, decoder_cfg) -> Callable[[int], bytes]:
    """token_bytes for a tokenizer.json: added tokens are their content; ByteLevel pieces map back through GPT-2's
    alphabet; SentencePiece-style pieces (Metaspace, or Replace U+2581) read ``<0xNN>`` byte-fallback tokens as
    that byte and U+2581 as a space; any other decoder: the token's decoded text (partial characters lost)."""
    added = {i: t.content for i, t in tok.get_added_tokens_decoder().items()}
    types = _decoder_types(decoder_cfg)
    alphabet = _byte_level_alphabet() if "ByteLevel" in types else None
    sentencepiece = bool(types & {"Metaspace", "Replace▁", "ByteFallback"})

    def token_bytes(token_id: int) -> bytes:
        if token_id in added:
            return added[token_id].encode()
        piece = tok.id_to_token(token_id)
        if piece is None:  # outside the vocabulary (the model's may be padded past the tokenizer's)
            return b""
        if alphabet is not None and all(c in alphabet for c in piece):
            return bytes(alphabet[c] for c in piece)
        if sentencepiece:
            m = _BYTE_FALLBACK.fullmatch(piece)
            return bytes([int(m.group(1), 16)]) if m else piece.replace("\u2581", " ").encode()
        return tok.decode([token_id], skip_special_tokens=False).encode()

    return token_bytes


# Kimi's pre-tokenisation pattern (the cl100k family's, with Han characters split out), as tokenization_kimi.py
# gives it to tiktoken. NOTE: the ``&&[^\p{Han}]`` class intersections are what keep Han characters out of the
# letter runs (tiktoken's regex engine reads them): without them "a漢" or " 漢字" became one pre-token, so mixed
# Latin/Chinese text tokenised differently from Kimi's own tokenizer.
_TIKTOKEN_PATTERN = (
    r"[\p{Han}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+"
    r"[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


# Special-token ids Kimi's tokenizer reserves after the BPE ranks (tokenization_kimi.py's num_reserved_special_tokens).
NUM_RESERVED_SPECIAL_TOKENS = 256


def _load_tiktoken(path: str, cfg: dict, template: str | None, bos_token: str | None,
                   eos_token: str | None, named_chat_templates: dict[str, str] | None = None) -> Tokenizer:
    """A tiktoken BPE file (base64 token + rank per line); special tokens as Kimi's tokenizer has them: the
    ``NUM_RESERVED_SPECIAL_TOKENS`` ids after the ranks, named by tokenizer_config's added_tokens_decoder, the ones it
    leaves unnamed ``<|reserved_token_{id}|>``."""
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
    # NOTE: the unnamed reserved ids are tokens like the named ones (a model can emit them): their name is their text
    # in decode (skip_special_tokens=False) and token_bytes, and that text encodes to the id, as with Kimi's own
    # tokenizer. Without them such an id decoded to nothing and its name encoded as ordinary BPE pieces.
    names = {i: f"<|reserved_token_{i}|>" for i in range(len(ranks), len(ranks) + NUM_RESERVED_SPECIAL_TOKENS)}
    names.update((int(k), v["content"]) for k, v in (cfg.get("added_tokens_decoder") or {}).items())
    special = {name: i for i, name in names.items()}
    enc = tiktoken.Encoding(name=os.path.basename(os.path.dirname(path)) or "model", pat_str=_TIKTOKEN_PATTERN,
                            mergeable_ranks=ranks, special_tokens=special)
    special_ids = set(special.values())
    # A model's vocabulary may be padded past the tokenizer's (ids no token owns, past the reserved special slots), and
    # a model can emit them. tiktoken raises KeyError on such an id, which failed the whole engine step (every
    # request in flight) when a stop string was checked; Hugging Face tokenizers drop them, and so does this.
    known = frozenset(ranks.values()) | special_ids

    def decode(ids, skip_special):
        return enc.decode([i for i in ids if i in known and not (skip_special and i in special_ids)])

    bos_id = special.get(bos_token) if bos_token else None
    eos_id = special.get(eos_token) if eos_token else None
    prepend_bos = bool(cfg.get("add_bos_token")) and bos_id is not None

    def encode(text, add_special_tokens):
        # Special-token strings in the text (chat templates write them) become their ids, as with
        # Hugging Face tokenizers' added tokens.
        ids = enc.encode(text, allowed_special="all")
        return [bos_id] + ids if add_special_tokens and prepend_bos else ids

    def token_bytes(token_id):
        try:
            return enc.decode_single_token_bytes(token_id)
        except KeyError:  # outside the vocabulary (the model's may be padded past the tokenizer's)
            return b""

    return Tokenizer(encode, decode, enc.n_vocab, eos_id, bos_id, template, special,
                     bos_token=bos_token, eos_token=eos_token, token_bytes=token_bytes,
                     named_chat_templates=named_chat_templates, additional_stop_ids=_additional_stop_ids(special))
