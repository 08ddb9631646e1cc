"""The shipped embedded pair (sglang_eagle3/assets/embedded), read through the public loaders: sizes, wiring,
readable greedy text and a real accept length on held-out prompts (World English Bible verses; the models
were trained on the Bible in Basic English)."""

from __future__ import annotations

import os

import pytest
import torch

from sglang_eagle3.models.loader import load_draft, load_target
from sglang_eagle3.train.data import TextCodec
from sglang_eagle3.train.draft import accept_lengths, generate_greedy

ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "sglang_eagle3", "assets", "embedded")
TARGET, DRAFT = os.path.join(ROOT, "target"), os.path.join(ROOT, "draft")
PROMPTS = [
    "Therefore let your words be few. For as a dream comes with a multitude of cares, so a fool's speech with a "
    "multitude of words. When you vow a vow to God, don't defer to pay it; for he has no pleasure",
    "It happened in a little while, that the sky grew black with clouds and wind, and there was a great rain. "
    "Ahab rode, and went to Jezreel: and the hand of Yahweh was on Elijah; and he girded up his",
    "They shall cast their silver in the streets, and their gold shall be as an unclean thing; their silver and "
    "their gold shall not be able to deliver them in the day of the wrath of Yahweh: they shall",
    "Moses said, This is the thing which Yahweh commanded that you should do: and the glory of Yahweh shall "
    "appear to you. Moses said to Aaron, Draw near to the altar, and offer your sin-offering, and",
]

pytestmark = pytest.mark.skipif(not os.path.exists(os.path.join(TARGET, "model.safetensors")),
                                reason="embedded weights not present")


def test_size_budget():
    total = sum(os.path.getsize(os.path.join(d, f)) for d in (TARGET, DRAFT) for f in os.listdir(d))
    assert total <= 20_000_000, f"embedded pair is {total / 1e6:.2f} MB, budget 20 MB"


def test_pair_loads_and_speculates():
    target = load_target(TARGET, device="cpu", dtype=torch.float32).eval()
    draft = load_draft(DRAFT, target.config, device="cpu", dtype=torch.float32).eval()
    cfg = target.config
    assert cfg.rope.kind == "yarn" and cfg.n_group == 2 and cfg.q_lora_rank and cfg.first_k_dense_replace == 1
    assert draft.config.aux_layer_ids == (2, 3, 5)
    assert draft.config.draft_vocab_size < cfg.vocab_size and int(draft.t2d.sum()) == draft.config.draft_vocab_size
    codec = TextCodec.from_dir(TARGET)
    prompts = [codec.encode(p, bos=False) for p in PROMPTS]
    seqs = generate_greedy(target, prompts, 48, 4, torch.device("cpu"), eos_id=codec.eos_id)
    text = codec.decode(seqs[0][len(prompts[0]):])
    assert sum(w.isalpha() for w in text.split()) > 20, text  # words, not byte soup
    acc = accept_lengths(target, draft, seqs, [len(p) for p in prompts], (1, 3), draft.config.aux_layer_ids,
                         torch.device("cpu"))
    assert acc[1] > 1.5 and acc[3] > 2.2, acc  # measured on the H200 over 64 prompts: 1.79 and 2.89
