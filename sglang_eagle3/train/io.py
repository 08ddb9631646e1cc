"""Writing trained models in the layouts the engine's loaders read (``models.loader``)."""

from __future__ import annotations

import copy
import logging
import os
import shutil

import torch
import torch.nn as nn

from sglang_eagle3.models.loader import save_hf

logger = logging.getLogger(__name__)

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
# Kept in float32 in the release, as DeepSeek-V3's own checkpoints keep it: a bf16 routing bias would
# flip near-tie expert choices relative to what the model was trained with.
FP32_PARAMS = ("e_score_correction_bias",)


@torch.no_grad()
def cast_parameters(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """Parameters to ``dtype`` in place, except the routing bias; buffers (rope tables, d2t/t2d) untouched,
    which ``model.to(dtype)`` would not do."""
    for name, p in model.named_parameters():
        if not name.endswith(FP32_PARAMS) and p.is_floating_point():
            p.data = p.data.to(dtype)
    return model


def copy_tokenizer(src_dir: str, dst_dir: str) -> None:
    os.makedirs(dst_dir, exist_ok=True)
    for name in TOKENIZER_FILES:
        src = os.path.join(src_dir, name)
        if os.path.exists(src):
            shutil.copyfile(src, os.path.join(dst_dir, name))


def save_target(model: nn.Module, out_dir: str, tokenizer_dir: str | None, dtype=torch.bfloat16) -> nn.Module:
    """config.json + model.safetensors (Hugging Face DeepseekV3 names, per-expert tensors) + tokenizer.
    Returns the saved copy (parameters in ``dtype``); ``model`` itself is not changed."""
    model = cast_parameters(copy.deepcopy(model), dtype)
    config = model.config.to_hf()
    config["torch_dtype"] = str(dtype).removeprefix("torch.")
    save_hf(model, out_dir, config=config)
    if tokenizer_dir:
        copy_tokenizer(tokenizer_dir, out_dir)
    logger.info("target written to %s", out_dir)
    return model


def save_draft(draft: nn.Module, out_dir: str, dtype=torch.bfloat16, extra_config: dict | None = None) -> nn.Module:
    """config.json (LlamaForCausalLMEagle3) + model.safetensors with fc, midlayer.*, norm, lm_head, d2t, t2d.
    Returns the saved copy (parameters in ``dtype``); ``draft`` itself is not changed."""
    draft = cast_parameters(copy.deepcopy(draft), dtype)
    config = draft.config.to_hf()
    config["torch_dtype"] = str(dtype).removeprefix("torch.")
    config.update(extra_config or {})
    save_hf(draft, out_dir, config=config)
    logger.info("draft written to %s", out_dir)
    return draft
