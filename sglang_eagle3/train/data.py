"""Text -> token streams for training, random windows over them, and held-out prompts.

A corpus is a file or a folder of files: ``.txt`` (each non-empty line is one document) or ``.jsonl``
(one object per line with a ``text`` field, or ``prompt`` + ``completion``). Documents are encoded with
the model's ``tokenizer.json`` and joined into one stream as ``<bos> doc <eos> <bos> doc <eos> ...``, so a
window taken anywhere in it looks like what the model sees at serving time.
"""

from __future__ import annotations

import json
import logging
import os
import random
from dataclasses import dataclass

import numpy as np
import torch

logger = logging.getLogger(__name__)

TEXT_SUFFIXES = (".txt", ".jsonl")


def list_files(path: str) -> list[str]:
    if os.path.isdir(path):
        files = sorted(os.path.join(root, f) for root, _, names in os.walk(path) for f in names
                       if f.endswith(TEXT_SUFFIXES))
    elif not path.endswith(TEXT_SUFFIXES):
        # NOTE: read as text, a .json file (a ShareGPT dump, say) became one "document" per line of JSON.
        raise ValueError(f"{path} is not a {' or '.join(TEXT_SUFFIXES)} file (each line of a .txt is a document; "
                         "each line of a .jsonl an object with 'text' or 'prompt' + 'completion')")
    else:
        files = [path]
    if not files:
        raise FileNotFoundError(f"no {'/'.join(TEXT_SUFFIXES)} files under {path}")
    return files


def read_documents(path: str) -> list[str]:
    """Documents of a file or folder (see the module docstring for the formats). A malformed row or text
    that is not UTF-8 is a ValueError naming the file (and for JSONL, the line)."""
    docs: list[str] = []
    for file in list_files(path):
        try:
            with open(file, encoding="utf-8") as f:
                if file.endswith(".jsonl"):
                    docs.extend(_jsonl_documents(file, f))
                else:
                    docs.extend(line.strip() for line in f if line.strip())
        except UnicodeDecodeError as e:
            raise ValueError(f"{file}: not UTF-8 text ({e})") from None
    logger.info("read %d documents from %s", len(docs), path)
    return docs


def _jsonl_documents(file: str, lines) -> list[str]:
    docs = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{file}:{n}: not JSON ({e.msg} at column {e.colno})") from None
        if not isinstance(row, dict):
            raise ValueError(f"{file}:{n}: not a JSON object but {type(row).__name__} {line.strip()[:40]!r}")
        keys = ("text",) if "text" in row else ("prompt", "completion")
        if not all(k in row for k in keys):
            raise ValueError(f"{file}:{n}: a JSONL row needs 'text' or 'prompt'+'completion', got keys {sorted(row)}")
        for k in keys:
            if not isinstance(row[k], str):
                raise ValueError(f"{file}:{n}: {k!r} must be a string, got {type(row[k]).__name__} {row[k]!r:.40}")
        docs.append("".join(row[k] for k in keys))
    return docs


@dataclass(frozen=True)
class TextCodec:
    """A ``tokenizers`` tokenizer plus the special ids the stream format needs."""

    tokenizer: object  # tokenizers.Tokenizer
    bos_id: int | None
    eos_id: int | None

    @staticmethod
    def from_dir(model_dir: str) -> TextCodec:
        from tokenizers import Tokenizer  # optional dependency of the package; needed only here

        path = os.path.join(model_dir, "tokenizer.json")
        if not os.path.exists(path):
            raise FileNotFoundError(f"{path} not found: the trainer tokenizes with the target's tokenizer.json")
        tok = Tokenizer.from_file(path)
        cfg_path = os.path.join(model_dir, "tokenizer_config.json")
        names = {}
        if os.path.exists(cfg_path):
            with open(cfg_path) as f:
                cfg = json.load(f)
            for key in ("bos_token", "eos_token"):
                value = cfg.get(key)
                names[key] = value.get("content") if isinstance(value, dict) else value
        bos = tok.token_to_id(names["bos_token"]) if names.get("bos_token") else None
        eos = tok.token_to_id(names["eos_token"]) if names.get("eos_token") else None
        return TextCodec(tok, bos, eos)

    def encode(self, text: str, bos: bool = True) -> list[int]:
        # add_special_tokens=False: the BOS is placed here, whatever the tokenizer's post-processor does.
        ids = self.tokenizer.encode(text, add_special_tokens=False).ids
        return ([self.bos_id] if bos and self.bos_id is not None else []) + ids

    def decode(self, ids) -> str:
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=True)

    def encode_stream(self, docs: list[str]) -> np.ndarray:
        """``<bos> doc <eos>`` for every document, concatenated: int32 [N]."""
        encoded = self.tokenizer.encode_batch(docs, add_special_tokens=False)
        parts = []
        for enc in encoded:
            ids = enc.ids
            if self.bos_id is not None:
                ids = [self.bos_id] + ids
            if self.eos_id is not None:
                ids = ids + [self.eos_id]
            parts.append(np.asarray(ids, dtype=np.int32))
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)


def split_documents(docs: list[str], val_fraction: float, seed: int) -> tuple[list[str], list[str]]:
    """Random document-level split (whole chapters go to validation, so no window straddles both)."""
    order = list(range(len(docs)))
    random.Random(seed).shuffle(order)
    n_val = max(1, int(round(len(docs) * val_fraction))) if val_fraction > 0 else 0
    val = sorted(order[:n_val])
    train = sorted(order[n_val:])
    return [docs[i] for i in train], [docs[i] for i in val]


class WindowSampler:
    """Random [batch, seq_len] windows of a token stream, reproducible from the seed."""

    def __init__(self, stream: np.ndarray, seq_len: int, batch_size: int, seed: int):
        if len(stream) <= seq_len:
            raise ValueError(f"token stream of {len(stream)} tokens is too short for {seq_len=}")
        self.stream = torch.from_numpy(stream.astype(np.int64))
        self.seq_len, self.batch_size = seq_len, batch_size
        self.gen = torch.Generator().manual_seed(seed)

    def sample(self, device: torch.device | str = "cpu") -> torch.Tensor:
        starts = torch.randint(0, len(self.stream) - self.seq_len, (self.batch_size,), generator=self.gen)
        idx = starts[:, None] + torch.arange(self.seq_len)[None, :]  # [B, S]
        return self.stream[idx].to(device, non_blocking=True)


def contiguous_windows(stream: np.ndarray, seq_len: int, max_windows: int | None = None) -> torch.Tensor:
    """Non-overlapping windows from the start of the stream: [N, seq_len] (for validation losses)."""
    n = len(stream) // seq_len
    if max_windows is not None:
        n = min(n, max_windows)
    return torch.from_numpy(stream[: n * seq_len].astype(np.int64)).view(n, seq_len)


def heldout_prompts(docs: list[str], n: int, seed: int, max_chars: int = 200) -> list[str]:
    """``n`` prompts cut from distinct random documents at a sentence start, at most ``max_chars`` long and
    ending at a word boundary (so the model is asked to continue mid-sentence, as a user prompt would)."""
    rng = random.Random(seed)
    candidates = [d for d in docs if len(d) >= max_chars // 2 and " " in d]
    if not candidates:
        raise ValueError(f"no document of at least {max_chars // 2} characters to cut prompts from")
    prompts = []
    for doc in rng.sample(candidates, min(n, len(candidates))):
        # Sentence starts that leave at least half a prompt of text after them.
        starts = [0] + [i + 2 for i in range(len(doc) - max_chars // 2) if doc.startswith(". ", i)]
        s = rng.choice(starts)
        cut = doc[s:s + max_chars]
        prompts.append(cut[: cut.rfind(" ")] if len(cut) == max_chars else cut.rstrip())
    return prompts
