"""The trainers on a tiny target and a tiny repetitive corpus: the target learns it, the draft learns the
target, ``python -m sglang_eagle3.train_draft`` writes a draft the engine's loader reads, and that draft is
accepted far more often than chance."""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors import safe_open

from sglang_eagle3.models.deepseek_v3 import DeepseekV3ForCausalLM
from sglang_eagle3.models.loader import load_draft, load_target
from sglang_eagle3.testing import tiny_config
from sglang_eagle3.train.data import TextCodec, contiguous_windows, read_documents
from sglang_eagle3.train.io import save_target
from sglang_eagle3.train.target import TargetTrainConfig, init_target_weights, train_target
from sglang_eagle3.train_draft import main as train_draft_main

WORDS = ["the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "to", "red", "big", "house", "in", "sun"]


def _corpus(path: str, n_docs: int, seed: int) -> None:
    # Documents that cycle through a few fixed sentences: easy to learn, so a few dozen CPU steps suffice.
    g = torch.Generator().manual_seed(seed)
    sentences = [" ".join(WORDS[int(i)] for i in torch.randint(0, len(WORDS), (8,), generator=g)) + "."
                 for _ in range(6)]
    with open(path, "w") as f:
        for _ in range(n_docs):
            order = torch.randperm(6, generator=g).tolist()
            f.write(" ".join(sentences[i] for i in order * 2) + "\n")


def _tokenizer(out_dir: str, corpus: str) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train([corpus], trainers.BpeTrainer(vocab_size=300, special_tokens=["<|bos|>", "<|eos|>"],
                                            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                            show_progress=False))
    os.makedirs(out_dir, exist_ok=True)
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": "<|bos|>", "eos_token": "<|eos|>"}, f)


@pytest.fixture(scope="module")
def trained_target(tmp_path_factory):
    root = tmp_path_factory.mktemp("train")
    corpus, heldout = str(root / "train.txt"), str(root / "heldout.txt")
    _corpus(corpus, 40, seed=0)
    _corpus(heldout, 8, seed=0)  # same sentences, other orders
    tok_dir = str(root / "tok")
    _tokenizer(tok_dir, corpus)
    codec = TextCodec.from_dir(tok_dir)
    cfg = tiny_config(vocab=320, hidden=64, layers=4, eos=codec.eos_id, yarn=True)
    torch.manual_seed(0)
    model = DeepseekV3ForCausalLM(cfg, dtype=torch.float32)
    init_target_weights(model, seed=0)
    stream = codec.encode_stream(read_documents(corpus))
    val = {"heldout": contiguous_windows(codec.encode_stream(read_documents(heldout)), 49, 4)}
    tcfg = TargetTrainConfig(steps=40, batch_size=8, seq_len=48, lr=3e-3, warmup_steps=5, eval_every=20,
                             dropout=0.0, seed=0)
    result = train_target(model, stream, val, tcfg, torch.device("cpu"), amp_dtype=None)
    path = str(root / "target")
    save_target(model, path, tok_dir)
    return {"root": root, "path": path, "corpus": corpus, "heldout": heldout, "result": result}


def test_target_learns_and_round_trips(trained_target):
    result = trained_target["result"]
    assert result.history[0]["train_loss"] > result.history[-1]["train_loss"] + 1.0, result.history
    assert result.best_val["heldout"] < 3.0, result.best_val
    target = load_target(trained_target["path"], device="cpu", dtype=torch.float32)
    assert target.config.rope.kind == "yarn"
    biases = [layer.mlp.gate.e_score_correction_bias for layer in target.model.layers[1:]]
    assert any(b.abs().sum() > 0 for b in biases), "the balancing rule never moved the routing bias"
    with safe_open(os.path.join(trained_target["path"], "model.safetensors"), "pt") as f:
        assert f.get_tensor("model.layers.1.mlp.gate.e_score_correction_bias").dtype == torch.float32
        assert f.get_tensor("model.layers.1.mlp.experts.0.gate_proj.weight").dtype == torch.bfloat16


def test_train_draft_cli(trained_target):
    out = str(trained_target["root"] / "draft")
    report_path = str(trained_target["root"] / "report.json")
    report = train_draft_main([
        "--target-model-path", trained_target["path"], "--data", trained_target["corpus"], "--output", out,
        "--device", "cpu", "--steps", "40", "--batch-size", "8", "--ttt-steps", "3", "--lr", "3e-3",
        "--warmup-steps", "5", "--num-sequences", "32", "--prompt-tokens", "16", "--gen-tokens", "24",
        "--draft-vocab-size", "200", "--aux-layer-ids", "0,2,3", "--intermediate-size", "96",
        "--eval-data", trained_target["heldout"], "--eval-prompts", "4", "--eval-new-tokens", "24",
        "--report", report_path])
    with open(os.path.join(out, "config.json")) as f:
        cfg = json.load(f)
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"]
    assert cfg["draft_vocab_size"] == 200
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 2, 3]
    with safe_open(os.path.join(out, "model.safetensors"), "pt") as f:
        names = set(f.keys())
        d2t, t2d = f.get_tensor("d2t"), f.get_tensor("t2d")
    assert {"fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d"} <= names
    assert any(n.startswith("midlayer.self_attn.") for n in names)
    assert d2t.dtype == torch.int64 and t2d.dtype == torch.bool and int(t2d.sum()) == 200
    assert t2d[torch.arange(200) + d2t].all()  # every draft id maps onto a marked target id
    target = load_target(trained_target["path"], device="cpu", dtype=torch.float32)
    draft = load_draft(out, target.config, device="cpu", dtype=torch.float32)
    assert torch.equal(draft.d2t, d2t)
    accs = report["final_step_accs"]
    assert accs[0] > 0.4, report["history"][-1]
    accept = report["eval"]["accept_length"]
    assert accept["3"] > 1.3, accept  # a draft that is never right gives 1.0
    assert os.path.exists(report_path)
