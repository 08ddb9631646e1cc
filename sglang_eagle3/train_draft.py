"""Train an EAGLE-3 draft for a target the engine loads.

    python -m sglang_eagle3.train_draft --target-model-path TARGET_DIR --data FILE_OR_DIR --output DRAFT_DIR

What it does: tokenizes the text with the target's ``tokenizer.json``; by default regenerates it, taking
random ``--prompt-tokens`` windows as prompts and letting the target continue each greedily for
``--gen-tokens`` tokens (so the draft learns what the target says, not what the corpus says); picks the
draft vocabulary as the ``--draft-vocab-size`` most frequent tokens of that data; then trains the draft with
training-time test (``--ttt-steps`` unrolled steps), labels being the target's own distribution and aux
hidden states read from the target at ``--aux-layer-ids``. It writes ``config.json``
(``LlamaForCausalLMEagle3``) and ``model.safetensors`` (fc, midlayer.*, norm, lm_head, d2t, t2d) that
``models.loader.load_draft`` and SGLang read. With ``--eval-data`` it also reports the greedy accept length
for k = 1..5 draft tokens on prompts cut from that text.

What it does not do (SpecForge is the tool for those): data or tensor parallelism, offline hidden-state
dumps, chat-formatted datasets with loss masks on assistant turns, targets that do not fit on one device.
The target runs a dense forward without a KV cache for generation, so regeneration suits small targets;
pass ``--gen-tokens 0`` to train on the text as it is.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time

import numpy as np
import torch

from sglang_eagle3.config import DraftConfig, ModelConfig, resolve_aux_layer_ids
from sglang_eagle3.train.data import TextCodec, contiguous_windows, heldout_prompts, read_documents
from sglang_eagle3.train.draft import (
    DraftTrainConfig,
    accept_lengths,
    build_draft_vocab,
    generate_greedy,
    init_draft_weights,
    train_draft,
    vocab_coverage,
)
from sglang_eagle3.train.io import save_draft

logger = logging.getLogger("sglang_eagle3.train_draft")

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m sglang_eagle3.train_draft",
                                 description="Train an EAGLE-3 draft for a target the engine loads.")
    ap.add_argument("--target-model-path", required=True)
    ap.add_argument("--data", required=True, help=".txt (one document per line) / .jsonl (text) file or folder")
    ap.add_argument("--output", required=True, help="draft directory to write")
    g = ap.add_argument_group("training")
    g.add_argument("--steps", type=int, default=2000)
    g.add_argument("--batch-size", type=int, default=64)
    g.add_argument("--lr", type=float, default=1e-3)
    g.add_argument("--warmup-steps", type=int, default=100)
    g.add_argument("--ttt-steps", type=int, default=5, help="unrolled training-time-test steps")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--time-limit", type=float, default=None, help="stop training after this many seconds")
    g.add_argument("--device", default="auto", help="cuda, cpu or auto")
    g.add_argument("--dtype", default="auto", choices=["auto", *DTYPES],
                   help="target weights and autocast dtype (auto: bfloat16 on CUDA, float32 on CPU)")
    g = ap.add_argument_group("data")
    g.add_argument("--gen-tokens", type=int, default=192,
                   help="greedy tokens the target appends to each prompt (0: train on the text as is)")
    g.add_argument("--prompt-tokens", type=int, default=64)
    g.add_argument("--seq-len", type=int, default=256, help="window length when --gen-tokens 0")
    g.add_argument("--num-sequences", type=int, default=2048, help="prompts to regenerate")
    g.add_argument("--gen-batch-size", type=int, default=256)
    g = ap.add_argument_group("draft architecture")
    g.add_argument("--draft-vocab-size", type=int, default=32000, help="clamped to the target vocab")
    g.add_argument("--aux-layer-ids", default=None,
                   help="comma-separated target layers whose input feeds fc (default: SGLang's [2, L//2, L-3])")
    g.add_argument("--num-heads", type=int, default=None)
    g.add_argument("--num-kv-heads", type=int, default=None)
    g.add_argument("--head-dim", type=int, default=None)
    g.add_argument("--intermediate-size", type=int, default=None)
    g = ap.add_argument_group("evaluation")
    g.add_argument("--eval-data", default=None, help="held-out text: report accept lengths on prompts from it")
    g.add_argument("--eval-prompts", type=int, default=64)
    g.add_argument("--eval-new-tokens", type=int, default=128)
    g.add_argument("--report", default=None, help="write a JSON report here")
    return ap


def draft_config_for(target: ModelConfig, draft_vocab_size: int, aux_ids: tuple[int, ...], num_heads=None,
                     num_kv_heads=None, head_dim=None, intermediate_size=None) -> DraftConfig:
    """One Llama layer at the target's width (the draft shares the target's embedding)."""
    H = target.hidden_size
    head_dim = head_dim or (64 if H <= 1024 else 128)
    num_heads = num_heads or max(1, H // head_dim)
    return DraftConfig(
        hidden_size=H,
        intermediate_size=intermediate_size or target.intermediate_size or 4 * H,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads or num_heads,
        head_dim=head_dim,
        vocab_size=target.vocab_size,
        draft_vocab_size=min(draft_vocab_size, target.vocab_size),
        rms_norm_eps=target.rms_norm_eps,
        rope_theta=target.rope.theta,
        max_position_embeddings=target.max_position_embeddings,
        aux_layer_ids=aux_ids,
        target_hidden_size=H,
    )


def pick_aux_ids(spec: str | None, num_layers: int) -> tuple[int, ...]:
    override = tuple(int(x) for x in spec.split(",")) if spec else None
    probe = DraftConfig(hidden_size=1, intermediate_size=1, num_attention_heads=1, num_key_value_heads=1,
                        head_dim=1, vocab_size=1, draft_vocab_size=1, rms_norm_eps=1e-6, rope_theta=1.0,
                        max_position_embeddings=1)
    ids = resolve_aux_layer_ids(probe, num_layers, override)
    if ids[0] == 1:
        # The engine (like SGLang's deepseek_v2) reads a first id of 1 as SpecForge's 1-based counting.
        raise SystemExit(f"aux layer ids {list(ids)}: a first id of 1 would be read as 1-based; use 0 or >= 2")
    if len(set(ids)) < 3:
        logger.warning("aux layer ids %s repeat a layer (target has %d layers); consider --aux-layer-ids",
                       list(ids), num_layers)
    return ids


def _pick_device(spec: str) -> torch.device:
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(spec)


def make_sequences(target, codec: TextCodec, args, device, amp_dtype) -> torch.Tensor:
    """[N, S] training sequences: regenerated by the target, or windows of the text itself."""
    stream = codec.encode_stream(read_documents(args.data))
    print(f"data: {len(stream):,} tokens from {args.data}", flush=True)
    if args.gen_tokens <= 0:
        seqs = contiguous_windows(stream, args.seq_len)
        if args.num_sequences and len(seqs) > args.num_sequences:
            keep = torch.randperm(len(seqs), generator=torch.Generator().manual_seed(args.seed))
            seqs = seqs[keep[:args.num_sequences]]
        return seqs
    if len(stream) <= args.prompt_tokens:
        raise SystemExit(f"--data has {len(stream)} tokens, fewer than --prompt-tokens={args.prompt_tokens}")
    rng = np.random.default_rng(args.seed)
    starts = rng.integers(0, len(stream) - args.prompt_tokens, size=args.num_sequences)
    prompts = [stream[s:s + args.prompt_tokens].tolist() for s in starts]
    t0 = time.perf_counter()

    def progress(done, total):
        print(f"generate: {done}/{total} sequences ({time.perf_counter() - t0:.0f} s)", flush=True)

    seqs = generate_greedy(target, prompts, args.gen_tokens, args.gen_batch_size, device, amp_dtype,
                           progress=progress)
    return torch.tensor(seqs, dtype=torch.long)


def evaluate(target, draft, codec: TextCodec, aux_ids, args, device, amp_dtype) -> dict:
    prompts_text = heldout_prompts(read_documents(args.eval_data), args.eval_prompts, seed=args.seed + 1)
    # No BOS: the engine encodes prompts without special tokens (the model saw BOS-less windows in training).
    prompts = [codec.encode(p, bos=False) for p in prompts_text]
    seqs = generate_greedy(target, prompts, args.eval_new_tokens, 32, device, amp_dtype, eos_id=codec.eos_id)
    ks = (1, 2, 3, 4, 5)
    acc = accept_lengths(target, draft, seqs, [len(p) for p in prompts], ks, aux_ids, device, amp_dtype)
    samples = [{"prompt": prompts_text[i], "continuation": codec.decode(seqs[i][len(prompts[i]):])}
               for i in range(min(3, len(seqs)))]
    return {"accept_length": {str(k): v for k, v in acc.items()}, "prompts": len(prompts),
            "new_tokens": args.eval_new_tokens, "samples": samples}


def run(args: argparse.Namespace) -> dict:
    from sglang_eagle3.models.eagle3 import Eagle3Draft
    from sglang_eagle3.models.loader import load_target

    device = _pick_device(args.device)
    dtype = DTYPES[args.dtype] if args.dtype != "auto" else (torch.bfloat16 if device.type == "cuda"
                                                              else torch.float32)
    amp_dtype = dtype if dtype != torch.float32 else None
    torch.manual_seed(args.seed)
    t_start = time.perf_counter()
    target = load_target(args.target_model_path, device=device, dtype=dtype)
    target.eval()
    tcfg = target.config
    codec = TextCodec.from_dir(args.target_model_path)
    aux_ids = pick_aux_ids(args.aux_layer_ids, tcfg.num_hidden_layers)
    print(f"target: {tcfg.num_hidden_layers} layers, hidden {tcfg.hidden_size}, vocab {tcfg.vocab_size}; "
          f"aux layers {list(aux_ids)}; device {device}, dtype {dtype}", flush=True)

    t0 = time.perf_counter()
    sequences = make_sequences(target, codec, args, device, amp_dtype)
    gen_s = time.perf_counter() - t0
    print(f"data: {tuple(sequences.shape)} sequences ready in {gen_s:.1f} s", flush=True)

    counts = torch.bincount(sequences[:, 1:].reshape(-1), minlength=tcfg.vocab_size)
    dcfg = draft_config_for(tcfg, args.draft_vocab_size, aux_ids, args.num_heads, args.num_kv_heads,
                            args.head_dim, args.intermediate_size)
    draft_ids, d2t, t2d = build_draft_vocab(counts, dcfg.draft_vocab_size)
    coverage = vocab_coverage(counts, draft_ids)
    print(f"draft vocab: {dcfg.draft_vocab_size} of {tcfg.vocab_size} tokens cover {coverage:.2%} of the data",
          flush=True)

    draft = Eagle3Draft(dcfg, dtype=torch.float32).to(device)
    init_draft_weights(draft, target, draft_ids, d2t.to(device), t2d.to(device), seed=args.seed)
    cfg = DraftTrainConfig(steps=args.steps, batch_size=args.batch_size, lr=args.lr,
                           warmup_steps=min(args.warmup_steps, args.steps - 1), ttt_steps=args.ttt_steps,
                           seed=args.seed, time_limit_s=args.time_limit,
                           log_every=max(1, min(100, args.steps // 10)))

    def progress(step, rec):
        accs = " ".join(f"{a:.3f}" for a in rec["acc"])
        print(f"draft step {step}/{cfg.steps}: loss {rec['loss']:.4f} acc/step [{accs}] lr {rec['lr']:.2e} "
              f"{rec['elapsed_s']:.0f} s", flush=True)

    result = train_draft(target, draft, sequences, draft_ids, aux_ids, cfg, device, amp_dtype, progress=progress)
    saved = save_draft(draft, args.output, dtype=dtype if dtype != torch.float32 else torch.bfloat16)
    if amp_dtype is not None:
        draft = saved  # evaluate the weights as written (on CPU in float32 the fp32 master weights are used)
    report = {
        "target": args.target_model_path, "output": args.output, "aux_layer_ids": list(aux_ids),
        "draft_config": dcfg.to_hf(), "train_config": {k: getattr(cfg, k) for k in cfg.__dataclass_fields__},
        "sequences": list(sequences.shape), "generation_s": gen_s, "draft_vocab_coverage": coverage,
        "steps_done": result.steps_done, "steps_planned": result.steps_planned, "train_s": result.wall_s,
        "final_loss": result.final_loss,
        "final_step_accs": result.final_step_accs, "history": result.history,
    }
    if args.eval_data:
        t0 = time.perf_counter()
        report["eval"] = evaluate(target, draft, codec, aux_ids, args, device, amp_dtype)
        report["eval"]["seconds"] = time.perf_counter() - t0
        acc = report["eval"]["accept_length"]
        print("accept length (greedy, k draft tokens): "
              + ", ".join(f"k={k}: {v:.3f}" for k, v in acc.items()), flush=True)
    report["total_s"] = time.perf_counter() - t_start
    if args.report:
        with open(args.report, "w") as f:
            json.dump(report, f, indent=2)
    print(f"draft written to {args.output} ({report['total_s']:.0f} s in all)", flush=True)
    return report


def main(argv: list[str] | None = None) -> dict:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    args = build_parser().parse_args(argv)
    os.makedirs(args.output, exist_ok=True)
    return run(args)


if __name__ == "__main__":
    main(sys.argv[1:])
