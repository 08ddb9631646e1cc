#!/usr/bin/env python3
"""Trains the embedded model's byte-level BPE tokenizer with the ``tokenizers`` library.

Writes ``tokenizer.json`` (the tokenizer; its post-processor prepends ``<|bos|>``, as Llama-style
tokenizers do) and ``tokenizer_config.json`` (bos/eos/pad names and a minimal chat template) to ``--out``.

    python scripts/train_tokenizer.py --data data/train.txt --vocab-size 4096 --out data/tokenizer
"""

from __future__ import annotations

import argparse
import json
import os

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

BOS, EOS, PAD = "<|bos|>", "<|eos|>", "<|pad|>"
SPECIAL_TOKENS = [BOS, EOS, PAD]  # ids 0, 1, 2
# Plain "role: content" turns; enough for the server's chat endpoint to render a prompt the model has
# seen the like of (it was trained on prose only, so chat quality is not the point).
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


def train_tokenizer(files: list[str], vocab_size: int) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        # Every byte is in the vocabulary, so any text (held-out or user input) encodes without <unk>.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train(files, trainer)
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)])
    return tok


def tokenizer_config(max_length: int) -> dict:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "add_bos_token": True,
        "add_eos_token": False,
        "model_max_length": max_length,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", nargs="+", default=["data/train.txt"], help="training text files")
    ap.add_argument("--vocab-size", type=int, default=4096)
    ap.add_argument("--max-length", type=int, default=2048, help="model_max_length in tokenizer_config")
    ap.add_argument("--out", default="data/tokenizer")
    args = ap.parse_args()
    tok = train_tokenizer(args.data, args.vocab_size)
    os.makedirs(args.out, exist_ok=True)
    tok.save(os.path.join(args.out, "tokenizer.json"))
    with open(os.path.join(args.out, "tokenizer_config.json"), "w") as f:
        json.dump(tokenizer_config(args.max_length), f, indent=2)
    sample = "And God said, Let there be light: and there was light."
    ids = tok.encode(sample).ids
    print(f"vocab {tok.get_vocab_size()} -> {args.out}; {sample!r} -> {len(ids)} tokens {ids[:12]}...")
    assert tok.decode(ids) == sample, "byte-level BPE must round-trip"


if __name__ == "__main__":
    main()
