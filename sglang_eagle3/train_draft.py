"""Train an EAGLE-3 draft for a target the engine loads.

    python -m sglang_eagle3.train_draft --target-model-path TARGET_DIR --data FILE_OR_DIR --output DRAFT_DIR

What it does: tokenizes the text with the target's ``tokenizer.json``; by default regenerates it, taking
random ``--prompt-tokens`` windows as prompts and letting the target continue each greedily for
``--gen-tokens`` tokens (so the draft learns what the target says, not what the corpus says); picks the
draft vocabulary as the ``--draft-vocab-size`` most frequent tokens of that data; then trains the draft with
training-time test (``--ttt-steps`` unrolled steps), labels being the target's own distribution and aux
hidden states read from the target at ``--aux-layer-ids``. It writes ``config.json``
(``LlamaForCausalLMEagle3``) and ``model.safetensors`` (fc, midlayer.*, norm, lm_head, d2t, t2d) that
``models.loader.load_draft`` and SGLang read; config.json's ``sglang_eagle3_training`` entry records the command,
the commit, the seed, the data's sha256 and whether training ran all its steps. With ``--eval-data`` it also
reports the greedy accept length for k = 1..5 draft tokens on prompts cut from that text.

Every flag, the target's config and tokenizer, the texts (``--data``, ``--eval-data``) and the draft's shape
are checked before the target's weights load, including what SGLang 0.5.23 needs to run the draft as trained
(aux layer ids distinct, ascending and below the target's layer count; a draft vocabulary no larger than the
target's); a problem is one line naming the flag (after the usage), with exit code 2. ``--output`` is created
only when the draft is written, and whole: the files go to a hidden sibling directory that is then renamed into
place (a failed write leaves nothing). An existing ``--output`` must be empty or hold only a previous draft's
files (config.json, model.safetensors, the --report file), which are replaced.

What it does not do (SpecForge is the tool for those): data or tensor parallelism, offline hidden-state
dumps, chat-formatted datasets with loss masks on assistant turns, targets that do not fit on one device.
The target runs a dense forward without a KV cache for generation, so regeneration suits small targets;
pass ``--gen-tokens 0`` to train on the text as it is.

Progress (generation and training: tokens/s and ETA, at least every 30 s; the evaluation's stages) goes to
stderr; stdout gets the results (accept lengths, where the draft went). Ctrl-C during training stops after the
step that is running and writes the draft trained so far (config.json and the report say ``"interrupted": true``
and how many steps were done; evaluation is skipped; exit code 130); a second Ctrl-C, or one before training
starts, stops at once and writes nothing. The --report is written with the draft and completed after the
evaluation (``"eval": "pending"`` until then). There is no resume: a rerun starts again from the beginning.
The same command with the same seed writes the same draft on a CPU (GPU kernels are not bit-deterministic).
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import logging
import os
import shlex
import shutil
import signal
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch

import sglang_eagle3
from sglang_eagle3.argtypes import finite_float, int_at_least
from sglang_eagle3.config import ConfigError, DraftConfig, ModelConfig
from sglang_eagle3.env_report import collect_env_report, git_commit
from sglang_eagle3.progress import duration
from sglang_eagle3.train.data import TextCodec, contiguous_windows, heldout_prompts, list_files, read_documents
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
PROG = "python -m sglang_eagle3.train_draft"
DRAFT_FILES = ("config.json", "model.safetensors")  # what save_draft writes
EVAL_KS = (1, 2, 3, 4, 5)  # draft lengths the evaluation reports
SEED_MAX = 2**63 - 2  # torch seeds are int64 and the held-out prompts use seed + 1
LOG_INTERVAL_S = 30.0  # a progress line at least this often, however slow the steps or generation batches
DEFAULT_DRAFT_VOCAB = 32000  # or the target's vocabulary when smaller
# Flags of one data mode only (regeneration, or --gen-tokens 0), with their defaults: given in the other mode
# they would be ignored, so they are refused there.
REGEN_ONLY = {"prompt_tokens": 64, "gen_batch_size": 256}
AS_IS_ONLY = {"seq_len": 256}
PROVENANCE_KEY = "sglang_eagle3_training"  # config.json's record of the run that made the draft


def log(msg: str) -> None:
    """A progress line: stderr, so that stdout holds only results."""
    print(msg, file=sys.stderr, flush=True)


# -- argparse types: a bad value is a one-line error naming the flag ----------------------------------------
def _layer_ids(text: str) -> tuple[int, ...]:
    try:
        ids = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers") from None
    if len(ids) != 3 or min(ids) < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be 3 layer ids >= 0, e.g. 2,3,5")
    return ids


def _even_positive(text: str) -> int:
    value = _positive(text)
    if value % 2:
        raise argparse.ArgumentTypeError(f"{value} must be even (rotary embedding turns pairs of dimensions)")
    return value


_positive = int_at_least(1)
_positive_float = finite_float(0.0, strict=True)
_non_negative = int_at_least(0)


def _seed(text: str) -> int:
    value = _non_negative(text)
    if value > SEED_MAX:
        raise argparse.ArgumentTypeError(f"{value} must be in [0, {SEED_MAX}]")
    return value


def positions_needed(seq_len: int, steps: int) -> int:
    """Rope positions a [B, seq_len] batch uses: the target reads positions 0..seq_len-1; draft step k at index
    i (of seq_len - 1) sits at position i + k, so ``steps`` unrolled (or chained) steps reach seq_len + steps - 3."""
    return max(seq_len, seq_len + steps - 2)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target-model-path", required=True,
                    help="target checkpoint directory (config.json, weights, tokenizer.json)")
    ap.add_argument("--data", required=True, help=".txt (one document per line) / .jsonl (text) file or folder")
    ap.add_argument("--output", required=True, help="draft directory to write (new, empty, or a previous draft's)")
    g = ap.add_argument_group("training")
    g.add_argument("--steps", type=_positive, default=2000, help="optimizer steps (default 2000)")
    g.add_argument("--batch-size", type=_positive, default=64, help="sequences a step (default 64)")
    g.add_argument("--lr", type=_positive_float, default=1e-3, help="peak learning rate, cosine to 5%% (default 1e-3)")
    g.add_argument("--warmup-steps", type=_non_negative, default=100,
                   help="learning-rate warm-up steps, cut to --steps - 1 (default 100)")
    g.add_argument("--ttt-steps", type=_positive, default=5, help="unrolled training-time-test steps (default 5)")
    g.add_argument("--seed", type=_seed, default=0, help="seeds data sampling, init and batches (default 0)")
    g.add_argument("--time-limit", type=_positive_float, default=None,
                   help="fit training into this many seconds: after a few timed steps the step count is cut (with "
                        "the learning-rate schedule) to end in time; past it training stops")
    g.add_argument("--device", default="auto", help="cuda, cuda:N, cpu or auto (default auto)")
    g.add_argument("--dtype", default="auto", choices=["auto", *DTYPES],
                   help="target weights and autocast dtype (auto: bfloat16 on CUDA, float32 on CPU); the draft is "
                        "trained in float32 and written in bfloat16 (float16 with --dtype float16, whose losses "
                        "are scaled so that small gradients do not flush to zero)")
    g = ap.add_argument_group("data")
    g.add_argument("--gen-tokens", type=_non_negative, default=192,
                   help="greedy tokens the target appends to each prompt (default 192; 0: train on the text as is)")
    g.add_argument("--prompt-tokens", type=_positive, default=None,
                   help=f"prompt window length for regeneration (default {REGEN_ONLY['prompt_tokens']}; refused "
                        "with --gen-tokens 0)")
    g.add_argument("--seq-len", type=int_at_least(2), default=None,
                   help=f"window length with --gen-tokens 0 (default {AS_IS_ONLY['seq_len']}; refused otherwise: "
                        "regenerated sequences are --prompt-tokens + --gen-tokens long)")
    g.add_argument("--num-sequences", type=_non_negative, default=2048,
                   help="prompts to regenerate; with --gen-tokens 0, windows to keep (default 2048; 0: all)")
    g.add_argument("--gen-batch-size", type=_positive, default=None,
                   help=f"prompts regenerated at once (default {REGEN_ONLY['gen_batch_size']}; refused with "
                        "--gen-tokens 0)")
    g = ap.add_argument_group("draft architecture")
    g.add_argument("--draft-vocab-size", type=_positive, default=None,
                   help=f"draft vocabulary: the most frequent tokens of the data (default {DEFAULT_DRAFT_VOCAB}, or "
                        "the target's vocabulary if smaller; a larger value than the target's is refused)")
    g.add_argument("--aux-layer-ids", type=_layer_ids, default=None,
                   help="3 target layers whose input feeds fc, comma-separated: distinct, ascending, below the "
                        "target's layer count L (SGLang captures only those, in layer order), the first not 1 "
                        "(read as 1-based). Default: SGLang's [2, L//2, L-3] where that qualifies, else the first "
                        "that does of [2, L//2, L-1], [L-3, L-2, L-1], [0, L-2, L-1]")
    g.add_argument("--num-heads", type=_positive, default=None, help="default: hidden size / head dim")
    g.add_argument("--num-kv-heads", type=_positive, default=None, help="default: --num-heads (no GQA)")
    g.add_argument("--head-dim", type=_even_positive, default=None,
                   help="even; default: 64 up to hidden 1024, else 128")
    g.add_argument("--intermediate-size", type=_positive, default=None, help="default: the target's")
    g = ap.add_argument_group("evaluation")
    g.add_argument("--eval-data", default=None, help="held-out text: report accept lengths on prompts from it")
    g.add_argument("--eval-prompts", type=_positive, default=None, help="prompts cut from --eval-data (default 64)")
    g.add_argument("--eval-new-tokens", type=_positive, default=None,
                   help="greedy tokens per evaluation prompt (default 128)")
    g.add_argument("--report", default=None,
                   help="write a JSON report here (provenance: command, commit, input checksums, environment; "
                        "settings, loss history, evaluation); written with the draft, completed after evaluation")
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
        draft_vocab_size=draft_vocab_size,
        rms_norm_eps=target.rms_norm_eps,
        rope_theta=target.rope.theta,
        max_position_embeddings=target.max_position_embeddings,
        aux_layer_ids=aux_ids,
        target_hidden_size=H,
    )


def aux_ids_problem(ids: tuple[int, ...], num_layers: int) -> str | None:
    """Why a draft wired to target layers ``ids`` would not run under SGLang 0.5.23 as trained, or None.

    SGLang's DeepSeek model captures, once per layer and in layer order, the residual stream entering each layer i
    of 0..L-1 listed in ``layers_to_capture``, and concatenates what it captured for fc: an id of L or more is never
    captured, a repeated id is captured once (fc would get fewer than 3 states), and ids out of ascending order
    would reach fc in another order than training fed them (our engine follows the written order, SGLang does
    not). A first id of 1 is read as 1-based counting (SpecForge's) by SGLang and by our engine, which add 1."""
    L = num_layers
    for i in ids:
        if not 0 <= i < L:
            return (f"aux layer id {i} out of range for a target with {L} layers (ids {list(ids)}; SGLang captures "
                    f"the residual stream entering layers 0..{L - 1})")
    if len(set(ids)) < len(ids):
        return (f"aux layer ids {list(ids)} repeat a layer: SGLang captures each layer once, so the draft's fc "
                "would get fewer than 3 states")
    if list(ids) != sorted(ids):
        return (f"aux layer ids {list(ids)} are not ascending: SGLang concatenates the captured states in layer "
                f"order, so write them as {sorted(ids)}")
    if ids[0] == 1:
        return f"aux layer ids {list(ids)}: a first id of 1 would be read as 1-based; use 0 or >= 2"
    return None


def pick_aux_ids(override: tuple[int, ...] | None, num_layers: int) -> tuple[int, ...]:
    """The target layers feeding the draft: ``override`` when it qualifies (ValueError naming why not), else
    SGLang's default [2, L//2, L-3] where it qualifies (below 7 layers it repeats or misorders one), else the first of
    a few fallbacks that does. The ids are always written into the draft's config, so any choice that
    qualifies is read back the same by SGLang and by our engine."""
    L = num_layers
    if override is not None:
        problem = aux_ids_problem(tuple(override), L)
        if problem:
            raise ValueError(problem)
        return tuple(override)
    for ids in ((2, L // 2, L - 3), (2, L // 2, L - 1), (L - 3, L - 2, L - 1), (0, L - 2, L - 1)):
        if aux_ids_problem(ids, L) is None:
            return ids
    raise ValueError(f"a target with {L} layers has no 3 distinct layers to feed an EAGLE-3 draft")


def _pick_device(spec: str) -> torch.device:
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(spec)


# -- the output directory: written whole or not at all ------------------------------------------------------
def output_problem(output: str, report: str | None) -> str | None:
    """Why ``output`` cannot take a new draft, or None. It may be missing (its parent is created when the
    draft is written), empty, or hold only a previous draft's files, which are replaced."""
    if os.path.exists(output) and not os.path.isdir(output):
        return f"--output {output!r} is a file"
    if os.path.isdir(output):
        ours = set(DRAFT_FILES)
        if report is not None and os.path.dirname(os.path.abspath(report)) == os.path.abspath(output):
            ours.add(os.path.basename(report))
        others = sorted(set(os.listdir(output)) - ours)
        if others:
            return (f"--output {output!r} holds files a draft does not write ({', '.join(others[:5])}"
                    f"{', ...' if len(others) > 5 else ''}): pass a new or empty directory")
    ancestor = os.path.dirname(os.path.abspath(output))
    while not os.path.exists(ancestor):
        ancestor = os.path.dirname(ancestor)
    if not os.path.isdir(ancestor):
        return f"--output {output!r}: cannot create it under {ancestor!r} (not a directory)"
    problem = cannot_create_in(ancestor)
    if problem:
        return f"--output {output!r}: cannot create it under {ancestor!r} ({problem})"
    return None


def cannot_create_in(directory: str) -> str | None:
    """Why a file cannot be created in ``directory``, or None. A real probe file, not os.access: as root access()
    says yes to every directory, and it knows nothing of read-only mounts."""
    try:
        fd, probe = tempfile.mkstemp(dir=directory, prefix=".train_draft-probe-")
    except OSError as e:
        return e.strerror or str(e)
    os.close(fd)
    os.unlink(probe)
    return None


def write_draft(draft: torch.nn.Module, output: str, dtype: torch.dtype,
                extra_config: dict | None = None) -> torch.nn.Module:
    """save_draft into a hidden sibling of ``output``, then renamed into place (a previous draft there is
    replaced only once the new one is complete); ``extra_config`` goes into its config.json. Returns the saved
    copy."""
    output = os.path.abspath(output)
    parent = os.path.dirname(output)
    os.makedirs(parent, exist_ok=True)
    tag = uuid.uuid4().hex[:8]
    partial = os.path.join(parent, f".{os.path.basename(output)}.partial-{tag}")
    previous = os.path.join(parent, f".{os.path.basename(output)}.previous-{tag}")
    os.mkdir(partial)
    moved = False
    try:
        saved = (save_draft(draft, partial, dtype=dtype) if extra_config is None
                 else save_draft(draft, partial, dtype=dtype, extra_config=extra_config))
        if os.path.isdir(output):
            os.rename(output, previous)
            moved = True
        os.rename(partial, output)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        if moved and not os.path.exists(output):
            os.rename(previous, output)
        raise
    if moved:
        shutil.rmtree(previous)
    return saved


# -- everything checked before the target loads ----------------------------------------------------------
@dataclass(frozen=True)
class Plan:
    """What ``prepare`` resolved from the flags: all of it checked, none of it needing the target's weights."""

    device: torch.device
    dtype: torch.dtype
    target_config: ModelConfig
    codec: TextCodec
    stream: np.ndarray  # int32 [N]: the --data documents as one <bos> doc <eos> ... stream
    aux_ids: tuple[int, ...]
    draft_config: DraftConfig
    train_config: DraftTrainConfig
    eval_prompts: list[str] | None  # cut from --eval-data


def prepare(ap: argparse.ArgumentParser, args: argparse.Namespace) -> Plan:
    """Checks every flag, path and text; a problem is ``ap.error`` (one line naming the flag, exit code 2).
    Fills in the defaults that depend on other flags (``args`` then holds the settings the run uses)."""
    try:
        device = _pick_device(args.device)
    except RuntimeError:
        ap.error(f"--device {args.device!r} is not cpu, cuda, cuda:N or auto")
    if device.type not in ("cpu", "cuda"):
        ap.error(f"--device {args.device!r} is not cpu, cuda, cuda:N or auto")
    if device.type == "cuda" and not torch.cuda.is_available():
        ap.error(f"--device {args.device!r} but CUDA is not available")
    dtype = DTYPES[args.dtype] if args.dtype != "auto" else (torch.bfloat16 if device.type == "cuda"
                                                              else torch.float32)
    args.device, args.dtype = str(device), str(dtype).removeprefix("torch.")  # as resolved, for the provenance
    if args.num_sequences == 0 and args.gen_tokens > 0:
        ap.error("--num-sequences 0 (all windows) needs --gen-tokens 0; regeneration needs a prompt count")
    # Flags of the other data mode: refused below, once the values themselves are checked.
    ignored = [name for name in (AS_IS_ONLY if args.gen_tokens > 0 else REGEN_ONLY) if getattr(args, name) is not None]
    for name, default in {**REGEN_ONLY, **AS_IS_ONLY}.items():
        if getattr(args, name) is None:
            setattr(args, name, default)

    problem = output_problem(args.output, args.report)
    if problem:
        ap.error(problem)
    if args.report is not None:
        report_dir = os.path.dirname(os.path.abspath(args.report))
        if os.path.isdir(args.report):
            ap.error(f"--report {args.report!r} is a directory")
        if report_dir != os.path.abspath(args.output) and not os.path.isdir(report_dir):
            ap.error(f"--report {args.report!r}: directory {report_dir!r} does not exist")
        if report_dir == os.path.abspath(args.output) and os.path.basename(args.report) in DRAFT_FILES:
            ap.error(f"--report {args.report!r} would overwrite the draft's {os.path.basename(args.report)}")
        problem = report_problem(args.report, report_dir)
        if problem and report_dir != os.path.abspath(args.output):  # --output's own check covers its directory
            ap.error(f"--report {args.report!r}: {problem}")
    for flag in ("--eval-prompts", "--eval-new-tokens"):
        if getattr(args, flag[2:].replace("-", "_")) is not None and args.eval_data is None:
            ap.error(f"{flag} given without --eval-data: there is nothing to evaluate on")
    args.eval_prompts = args.eval_prompts or 64
    args.eval_new_tokens = args.eval_new_tokens or 128

    path = args.target_model_path
    if not os.path.isdir(path):
        ap.error(f"--target-model-path {path!r} is not a directory")
    try:
        tcfg = ModelConfig.from_path(path)
        codec = TextCodec.from_dir(path)
    except (OSError, ValueError) as e:  # ConfigError is a ValueError
        ap.error(f"--target-model-path {path!r}: {e}")

    # The rope tables end at max_position_embeddings: a longer batch is an IndexError after the target has loaded
    # (and, with regeneration, after generating).
    max_pos = tcfg.max_position_embeddings
    seq_len = args.prompt_tokens + args.gen_tokens if args.gen_tokens > 0 else args.seq_len
    if positions_needed(seq_len, args.ttt_steps) > max_pos:
        what = (f"--prompt-tokens {args.prompt_tokens} + --gen-tokens {args.gen_tokens}" if args.gen_tokens > 0
                else f"--seq-len {args.seq_len}")
        ap.error(f"{what}: sequences of {seq_len} tokens with --ttt-steps {args.ttt_steps} need "
                 f"{positions_needed(seq_len, args.ttt_steps)} positions; the target has "
                 f"max_position_embeddings={max_pos}")

    try:
        aux_ids = pick_aux_ids(args.aux_layer_ids, tcfg.num_hidden_layers)
    except ValueError as e:
        ap.error(f"--aux-layer-ids: {e}")
    args.aux_layer_ids = aux_ids
    vocab = tcfg.vocab_size
    if args.draft_vocab_size is None:
        args.draft_vocab_size = min(DEFAULT_DRAFT_VOCAB, vocab)
    elif args.draft_vocab_size > vocab:
        ap.error(f"--draft-vocab-size {args.draft_vocab_size} is larger than the target's vocabulary "
                 f"(vocab_size={vocab} in {os.path.join(path, 'config.json')})")
    try:
        dcfg = draft_config_for(tcfg, args.draft_vocab_size, aux_ids, args.num_heads, args.num_kv_heads,
                                args.head_dim, args.intermediate_size)
    except ConfigError as e:
        ap.error(f"draft architecture (--num-heads, --num-kv-heads, --head-dim, --intermediate-size): {e}")
    try:
        train_config = DraftTrainConfig(
            steps=args.steps, batch_size=args.batch_size, lr=args.lr,
            warmup_steps=min(args.warmup_steps, args.steps - 1), ttt_steps=args.ttt_steps, seed=args.seed,
            time_limit_s=args.time_limit, log_every=max(1, min(100, args.steps // 10)),
            log_interval_s=LOG_INTERVAL_S)
    except ValueError as e:  # the argparse types cover these fields; kept for a field added without one
        ap.error(str(e))

    stream = _read_stream(ap, "--data", args.data, codec)
    if args.gen_tokens > 0 and len(stream) <= args.prompt_tokens:
        ap.error(f"--data {args.data!r} has {len(stream)} tokens, not more than --prompt-tokens={args.prompt_tokens}")
    if args.gen_tokens == 0 and len(stream) < args.seq_len:
        ap.error(f"--data {args.data!r} has {len(stream)} tokens, fewer than one --seq-len={args.seq_len} window")
    _check_token_ids(ap, "--data", args.data, stream, tcfg, path)
    eval_prompts = None
    if args.eval_data is not None:
        if not os.path.exists(args.eval_data):
            ap.error(f"--eval-data {args.eval_data!r} does not exist")
        try:
            eval_prompts = heldout_prompts(read_documents(args.eval_data), args.eval_prompts, seed=args.seed + 1)
        except (OSError, ValueError) as e:
            ap.error(f"--eval-data {args.eval_data!r}: {e}")
        encoded = [codec.encode(p, bos=False) for p in eval_prompts]
        _check_token_ids(ap, "--eval-data", args.eval_data, np.asarray([i for e in encoded for i in e]), tcfg, path)
        longest = max(len(e) for e in encoded) + args.eval_new_tokens
        if positions_needed(longest, max(EVAL_KS)) > max_pos:
            ap.error(f"--eval-new-tokens {args.eval_new_tokens}: the longest --eval-data prompt and its continuation "
                     f"need {positions_needed(longest, max(EVAL_KS))} positions; the target has "
                     f"max_position_embeddings={max_pos}")
    if args.report is not None:
        inputs = _input_files(args)
        if os.path.realpath(args.report) in inputs:
            ap.error(f"--report {args.report!r} is {inputs[os.path.realpath(args.report)]}: it would be overwritten")
    if ignored:
        given = f"--{ignored[0].replace('_', '-')} {getattr(args, ignored[0])}"
        if args.gen_tokens > 0:
            ap.error(f"{given} applies only with --gen-tokens 0 (windows of the text as it is); regenerated "
                     f"sequences are --prompt-tokens + --gen-tokens = {seq_len} tokens long")
        ap.error(f"{given} applies only to regeneration; --gen-tokens 0 trains on the text as it is")
    if eval_prompts is not None and len(eval_prompts) < args.eval_prompts:
        log(f"eval: --eval-data {args.eval_data!r} has {len(eval_prompts)} documents long enough to cut a prompt from: "
            f"{len(eval_prompts)} prompts, not --eval-prompts {args.eval_prompts}")
    if eval_prompts is not None and _same_text(args.data, args.eval_data):
        log(f"eval: --eval-data {args.eval_data!r} is --data's text: the accept lengths will not be on held-out text")
    return Plan(device=device, dtype=dtype, target_config=tcfg, codec=codec, stream=stream, aux_ids=aux_ids,
                draft_config=dcfg, train_config=train_config, eval_prompts=eval_prompts)


def report_problem(report: str, report_dir: str) -> str | None:
    """Why --report cannot be written (checked now: it is written only after training), or None."""
    if os.path.exists(report):
        try:
            with open(report, "a"):  # append mode: probes without truncating
                pass
        except OSError as e:
            return f"cannot write it ({e.strerror or e})"
        return None
    problem = cannot_create_in(report_dir) if os.path.isdir(report_dir) else None
    return f"cannot create it in {report_dir!r} ({problem})" if problem else None


def _input_files(args: argparse.Namespace) -> dict[str, str]:
    """realpath -> what it is, for every file the run reads (so that --report cannot overwrite one)."""
    files = {os.path.realpath(f): "a --data file" for f in list_files(args.data)}
    if args.eval_data is not None:
        files.update({os.path.realpath(f): "an --eval-data file" for f in list_files(args.eval_data)})
    target = args.target_model_path
    files.update({os.path.realpath(os.path.join(target, f)): "a file of --target-model-path"
                  for f in os.listdir(target)})
    return files


def _same_text(data: str, eval_data: str) -> bool:
    return bool({os.path.realpath(f) for f in list_files(data)} & {os.path.realpath(f) for f in list_files(eval_data)})


def _check_token_ids(ap: argparse.ArgumentParser, flag: str, path: str, ids: np.ndarray, tcfg: ModelConfig,
                     target: str) -> None:
    """The target's embedding has vocab_size rows: a larger id from its tokenizer.json is an IndexError after the
    target has loaded (a tokenizer.json of another model beside the config)."""
    if len(ids) and int(ids.max()) >= tcfg.vocab_size:
        ap.error(f"--target-model-path {target!r}: its tokenizer.json gives token id {int(ids.max())} (in {flag} "
                 f"{path!r}), outside the target's vocab_size={tcfg.vocab_size}: tokenizer and config.json do not "
                 "belong together")


def _read_stream(ap: argparse.ArgumentParser, flag: str, path: str, codec: TextCodec) -> np.ndarray:
    if not os.path.exists(path):
        ap.error(f"{flag} {path!r} does not exist")
    try:
        docs = read_documents(path)
    except (OSError, ValueError) as e:  # ValueError: a bad JSONL row, text that is not UTF-8
        ap.error(f"{flag} {path!r}: {e}")
    if not docs:
        ap.error(f"{flag} {path!r} holds no documents")
    return codec.encode_stream(docs)


# -- provenance: what made this draft ---------------------------------------------------------------------------
def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def text_record(path: str) -> dict:
    """The files of a --data / --eval-data argument with their sizes and sha256, and one sha256 over them all
    (over each file's path relative to ``path`` and its sha256, so a moved copy of the same corpus hashes alike)."""
    files = []
    for f in list_files(path):
        rel = os.path.relpath(f, path) if os.path.isdir(path) else os.path.basename(f)
        files.append({"file": rel, "bytes": os.path.getsize(f), "sha256": sha256_file(f)})
    combined = hashlib.sha256("".join(f"{r['file']}\t{r['sha256']}\n" for r in files).encode()).hexdigest()
    return {"path": os.path.abspath(path), "sha256": combined, "files": files}


def training_provenance(argv: list[str], args: argparse.Namespace, plan: Plan) -> dict:
    """The command, the code, the inputs and the machine of this run (the --report's ``provenance``)."""
    target = args.target_model_path
    weights = [f for f in sorted(os.listdir(target)) if f.endswith((".safetensors", ".bin", ".pt"))]
    hashed = {name: sha256_file(os.path.join(target, name)) for name in ("config.json", "tokenizer.json",
                                                                           "tokenizer_config.json")
              if os.path.isfile(os.path.join(target, name))}
    return {
        "command": f"{PROG} {shlex.join(argv)}",
        "cwd": os.getcwd(),
        "started_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "sglang_eagle3_version": sglang_eagle3.__version__,
        "git_commit": git_commit(),
        "settings": {k: list(v) if isinstance(v, tuple) else v for k, v in sorted(vars(args).items())},
        "target": {"path": os.path.abspath(target), "sha256": hashed,
                   "weight_files": len(weights),
                   "weight_bytes": sum(os.path.getsize(os.path.join(target, f)) for f in weights)},
        "data": {**text_record(args.data), "tokens": len(plan.stream)},
        "eval_data": text_record(args.eval_data) if args.eval_data is not None else None,
        "environment": collect_env_report(include_device=plan.device.type == "cuda"),
    }


def config_record(prov: dict, result) -> dict:
    """What config.json keeps of the run (its ``sglang_eagle3_training`` entry): enough to tell how the draft was
    made and whether its training finished, without the --report. Nothing of the moment or the machine: two runs
    of one command write the same config.json."""
    return {
        "command": prov["command"], "git_commit": prov["git_commit"],
        "sglang_eagle3_version": prov["sglang_eagle3_version"], "seed": prov["settings"]["seed"],
        "data_sha256": prov["data"]["sha256"],
        "target_config_sha256": prov["target"]["sha256"].get("config.json"),
        "steps_done": result.steps_done, "steps_planned": result.steps_planned, "interrupted": result.interrupted,
    }


def write_json(path: str, obj: dict) -> None:
    """Whole or not at all: a sibling temporary file renamed over ``path``."""
    tmp = os.path.join(os.path.dirname(os.path.abspath(path)), f".{os.path.basename(path)}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        with open(tmp, "w") as f:
            json.dump(obj, f, indent=2)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


# -- the run ------------------------------------------------------------------------------------------------
def generation_progress(what: str, new_tokens: int) -> Callable[[int, int], None]:
    """A ``generate_greedy`` progress callback: tokens and sequences done, tok/s, elapsed, ETA."""
    t0 = time.perf_counter()

    def progress(done: int, total: int) -> None:
        elapsed = max(time.perf_counter() - t0, 1e-9)
        eta = elapsed / done * (total - done) if done else float("nan")
        per = max(new_tokens, 1)
        log(f"{what}: {done // per}/{total // per} sequences ({done:,}/{total:,} tokens), "
            f"{done / elapsed:,.0f} tok/s, {duration(elapsed)}, ETA {duration(eta) if done else '?'}")

    return progress


def make_sequences(target, plan: Plan, args, amp_dtype) -> torch.Tensor:
    """[N, S] training sequences: regenerated by the target, or windows of the text itself."""
    stream = plan.stream
    log(f"data: {len(stream):,} tokens from {args.data}")
    if args.gen_tokens == 0:
        seqs = contiguous_windows(stream, args.seq_len)
        if args.num_sequences and len(seqs) > args.num_sequences:
            keep = torch.randperm(len(seqs), generator=torch.Generator().manual_seed(args.seed))
            seqs = seqs[keep[:args.num_sequences]]
        return seqs
    rng = np.random.default_rng(args.seed)
    starts = rng.integers(0, len(stream) - args.prompt_tokens, size=args.num_sequences)
    prompts = [stream[s:s + args.prompt_tokens].tolist() for s in starts]
    seqs = generate_greedy(target, prompts, args.gen_tokens, args.gen_batch_size, plan.device, amp_dtype,
                           progress=generation_progress("generate", args.gen_tokens),
                           progress_interval_s=LOG_INTERVAL_S)
    return torch.tensor(seqs, dtype=torch.long)


def evaluate(target, draft, plan: Plan, args, amp_dtype) -> dict:
    prompts_text, codec = plan.eval_prompts, plan.codec
    # No BOS: the engine encodes prompts without special tokens (the model saw BOS-less windows in training).
    prompts = [codec.encode(p, bos=False) for p in prompts_text]
    log(f"eval: the target continues {len(prompts)} --eval-data prompts for {args.eval_new_tokens} tokens each")
    seqs = generate_greedy(target, prompts, args.eval_new_tokens, 32, plan.device, amp_dtype, eos_id=codec.eos_id,
                           progress=generation_progress("eval generate", args.eval_new_tokens),
                           progress_interval_s=LOG_INTERVAL_S)
    ks = EVAL_KS
    log(f"eval: drafting k = {ks[0]}..{ks[-1]} tokens at every position of the {len(seqs)} continuations")
    acc = accept_lengths(target, draft, seqs, [len(p) for p in prompts], ks, plan.aux_ids, plan.device, amp_dtype)
    samples = [{"prompt": prompts_text[i], "continuation": codec.decode(seqs[i][len(prompts[i]):])}
               for i in range(min(3, len(seqs)))]
    return {"accept_length": {str(k): v for k, v in acc.items()}, "prompts": len(prompts),
            "new_tokens": args.eval_new_tokens, "samples": samples}


@contextmanager
def ctrl_c_stops_training() -> Iterator[Callable[[], bool]]:
    """Inside the block the first Ctrl-C only asks training to stop after its current step (so the weights are
    never left half-updated and the draft so far can be written); a second one raises KeyboardInterrupt as
    usual. Yields ``stop_requested()``. Signal handlers can only be set from the main thread: elsewhere
    Ctrl-C keeps its usual meaning."""
    requested = []
    if threading.current_thread() is not threading.main_thread():
        yield lambda: False
        return

    def on_sigint(signum, frame):
        if requested:
            raise KeyboardInterrupt
        requested.append(True)
        log("Ctrl-C: stopping after this step and writing the draft trained so far (Ctrl-C again to abort "
            "and write nothing)")

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield lambda: bool(requested)
    finally:
        signal.signal(signal.SIGINT, previous)


def run(args: argparse.Namespace, plan: Plan, status: dict | None = None, provenance: dict | None = None) -> dict:
    """Loads the target, makes the data, trains and writes the draft (with ``provenance``, the run's record, in
    the --report and a summary of it in config.json), then evaluates. The --report is written with the draft and
    again with the evaluation, so that it always describes the draft beside it. ``status["written"]`` /
    ``status["report_written"]`` turn True once the draft / the report is on disk (for the Ctrl-C message).
    Training stopped by Ctrl-C still writes the draft, then raises SystemExit(130)."""
    status = {} if status is None else status
    status["written"] = status["report_written"] = False
    provenance = provenance or {}
    from sglang_eagle3.models.eagle3 import Eagle3Draft
    from sglang_eagle3.models.loader import load_target

    device, dtype = plan.device, plan.dtype
    amp_dtype = dtype if dtype != torch.float32 else None
    torch.manual_seed(args.seed)
    t_start = time.perf_counter()
    log(f"target: loading {args.target_model_path}")
    target = load_target(args.target_model_path, device=device, dtype=dtype)
    target.eval()
    tcfg, aux_ids, dcfg, cfg = target.config, plan.aux_ids, plan.draft_config, plan.train_config
    log(f"target: {tcfg.num_hidden_layers} layers, hidden {tcfg.hidden_size}, vocab {tcfg.vocab_size}; "
        f"aux layers {list(aux_ids)}; device {device}, dtype {dtype}")

    t0 = time.perf_counter()
    sequences = make_sequences(target, plan, args, amp_dtype)
    gen_s = time.perf_counter() - t0
    log(f"data: {tuple(sequences.shape)} sequences ready in {gen_s:.1f} s")

    counts = torch.bincount(sequences[:, 1:].reshape(-1), minlength=tcfg.vocab_size)
    draft_ids, d2t, t2d = build_draft_vocab(counts, dcfg.draft_vocab_size)
    coverage = vocab_coverage(counts, draft_ids)
    log(f"draft vocab: {dcfg.draft_vocab_size} of {tcfg.vocab_size} tokens cover {coverage:.2%} of the data")

    draft = Eagle3Draft(dcfg, dtype=torch.float32).to(device)
    init_draft_weights(draft, target, draft_ids, d2t.to(device), t2d.to(device), seed=args.seed)

    def progress(step, rec):
        accs = " ".join(f"{a:.3f}" for a in rec["acc"])
        log(f"draft step {step}/{rec['steps']}: loss {rec['loss']:.4f} acc/step [{accs}] lr {rec['lr']:.2e} "
            f"{rec['tokens_per_s']:,.0f} tok/s {duration(rec['elapsed_s'])} ETA {duration(rec['eta_s'])}")

    with ctrl_c_stops_training() as stop_requested:
        result = train_draft(target, draft, sequences, draft_ids, aux_ids, cfg, device, amp_dtype,
                             progress=progress, should_stop=stop_requested)
    record = config_record(provenance, result) if provenance else None
    saved = write_draft(draft, args.output, dtype=dtype if dtype != torch.float32 else torch.bfloat16,
                        extra_config=None if record is None else {PROVENANCE_KEY: record})
    status["written"] = True
    if amp_dtype is not None:
        draft = saved  # evaluate the weights as written (on CPU in float32 the fp32 master weights are used)
    report = {
        "provenance": provenance or None,
        "target": args.target_model_path, "output": args.output, "aux_layer_ids": list(aux_ids),
        "draft_config": dcfg.to_hf(), "train_config": {k: getattr(cfg, k) for k in cfg.__dataclass_fields__},
        "sequences": list(sequences.shape), "generation_s": gen_s, "draft_vocab_coverage": coverage,
        "steps_done": result.steps_done, "steps_planned": result.steps_planned, "train_s": result.wall_s,
        "final_loss": result.final_loss, "interrupted": result.interrupted,
        "final_step_accs": result.final_step_accs, "history": result.history,
    }
    evaluating = plan.eval_prompts is not None and not result.interrupted
    if args.report:
        # Now, not only after the evaluation: a report left from an earlier run must not sit beside this draft.
        write_json(args.report, {**report, **({"eval": "pending"} if evaluating else {}),
                                 "total_s": time.perf_counter() - t_start})
        status["report_written"] = True
    if evaluating:
        t0 = time.perf_counter()
        report["eval"] = evaluate(target, draft, plan, args, amp_dtype)
        report["eval"]["seconds"] = time.perf_counter() - t0
        acc = report["eval"]["accept_length"]
        print("accept length (greedy, k draft tokens): "
              + ", ".join(f"k={k}: {v:.3f}" for k, v in acc.items()), flush=True)
    report["total_s"] = time.perf_counter() - t_start
    if args.report and evaluating:
        write_json(args.report, report)
    if result.interrupted:
        log(f"{PROG}: interrupted at step {result.steps_done} of {result.steps_planned}: the draft trained so far "
            f"is written to {args.output}, marked \"interrupted\": true in config.json's {PROVENANCE_KEY}"
            + ("" if plan.eval_prompts is None else "; evaluation skipped"))
        raise SystemExit(130)
    print(f"draft written to {args.output} ({report['total_s']:.0f} s in all)", flush=True)
    return report


def main(argv: list[str] | None = None) -> dict:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    argv = sys.argv[1:] if argv is None else list(argv)
    ap = build_parser()
    args = ap.parse_args(argv)
    args.output = os.path.normpath(args.output)  # "draft/" and "draft" name the same sibling files
    plan = prepare(ap, args)
    provenance = training_provenance(argv, args, plan)
    status: dict = {}
    try:
        return run(args, plan, status, provenance)
    except KeyboardInterrupt:
        # 130: the shell's code for a process stopped by Ctrl-C. No traceback: the user asked for this.
        if status.get("report_written"):
            log(f"{PROG}: interrupted during the evaluation: the draft is written to {args.output}; the --report "
                f"{args.report} has no evaluation (\"eval\": \"pending\")")
        elif status.get("written"):
            log(f"{PROG}: interrupted: the draft is written to {args.output}, but the evaluation was not run")
        else:
            log(f"{PROG}: interrupted before the draft was written: nothing was written to --output {args.output}")
        raise SystemExit(130) from None


if __name__ == "__main__":
    main()
