"""Checkpoint loading for the targets and drafts users have.

Layouts: single or sharded safetensors (``model.safetensors.index.json``), read shard by shard with lazy
slices so that each TP rank reads only its bytes; Hugging Face DeepseekV3 names (per-expert
``mlp.experts.{e}.gate_proj.weight`` or transformers-5 stacked ``mlp.experts.gate_up_proj``), Kimi-K2.5's
``language_model.`` prefix (vision tower and projector skipped), compressed-tensors INT4 experts kept packed,
DeepSeek-V3 block FP8 dequantised per tensor at load, EAGLE-3 drafts in ``midlayer.*`` or ``layers.0.*``
naming. All checkpoint renames live in ``_map_target_name`` / ``_map_draft_name``.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn as nn

from sglang_eagle3.config import ConfigError, DraftConfig, ModelConfig
from sglang_eagle3.kernels.quant import dequant_fp8_block
from sglang_eagle3.models.deepseek_v3 import DeepseekV3ForCausalLM
from sglang_eagle3.models.eagle3 import Eagle3Draft

logger = logging.getLogger(__name__)


class CheckpointError(ValueError):
    """A checkpoint does not match the model: names the tensors, files and shapes involved."""


# ------------------------------------------------------------------------------------------------------
# Reading safetensors lazily
# ------------------------------------------------------------------------------------------------------
class LazyTensor:
    """A checkpoint tensor not yet read: ``.shape``, ``.dtype``, ``.narrow(dim, start, n)`` and ``.load()``
    read only the requested bytes (safetensors slices)."""

    def __init__(self, handle, name: str, file: str):
        self._h, self.name, self.file = handle, name, file
        self._slice = handle.get_slice(name)
        self.shape = tuple(self._slice.get_shape())
        self.dtype_str = self._slice.get_dtype()

    def load(self) -> torch.Tensor:
        return self._h.get_tensor(self.name)

    def narrow(self, dim: int, start: int, length: int) -> torch.Tensor:
        if dim == 0 and start == 0 and length == self.shape[0]:
            return self.load()
        idx = [slice(None)] * len(self.shape)
        idx[dim] = slice(start, start + length)
        return self._slice[tuple(idx)]


def checkpoint_files(path: str) -> list[str]:
    """The safetensors files of a model directory, in index order when sharded."""
    if not os.path.isdir(path):
        raise CheckpointError(f"model path {path!r} is not a directory")
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.exists(index):
        try:
            with open(index) as f:
                weight_map = json.load(f)["weight_map"]
        except (json.JSONDecodeError, KeyError) as e:
            raise CheckpointError(f"{index} is not a valid safetensors index: {e}") from e
        files = sorted(set(weight_map.values()))
        missing = [f for f in files if not os.path.exists(os.path.join(path, f))]
        if missing:
            raise CheckpointError(f"{len(missing)} shard(s) named in {index} are missing: {missing[:5]}")
        return [os.path.join(path, f) for f in files]
    files = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
    if not files:
        raise CheckpointError(f"no .safetensors files in {path}")
    return [os.path.join(path, f) for f in files]


def iter_tensors(files: list[str], desc: str = "loading") -> Iterator[LazyTensor]:
    from safetensors import safe_open
    from tqdm import tqdm

    show = len(files) > 1 and logger.isEnabledFor(logging.INFO)
    for file in tqdm(files, desc=desc, unit="shard", disable=not show):
        try:
            handle = safe_open(file, framework="pt")
            names = list(handle.keys())
        except Exception as e:  # safetensors raises its own error types for truncated/corrupt headers
            raise CheckpointError(f"cannot read safetensors file {file}: {e}") from e
        for name in names:
            try:
                yield LazyTensor(handle, name, file)
            except Exception as e:
                raise CheckpointError(f"tensor {name!r} in {file} is unreadable: {e}") from e


def _format_names(names: list[str], limit: int = 8) -> str:
    head = ", ".join(sorted(names)[:limit])
    return head + (f" ... and {len(names) - limit} more" if len(names) > limit else "")


# ------------------------------------------------------------------------------------------------------
# Name mapping
# ------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Target:
    """Where a checkpoint tensor goes: a parameter name plus loader kwargs (expert/shard) and a transform."""

    param: str
    expert: int | None = None
    shard: str | None = None
    kind: str = "plain"  # plain | fp8 (needs its weight_scale_inv) | stacked_w13 | stacked_w2


_EXPERT = re.compile(r"^(model\.layers\.\d+\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\."
                     r"(weight|weight_packed|weight_scale)$")
_SKIP_PREFIXES = ("vision_tower.", "mm_projector.", "multi_modal_projector.", "vision_model.")


def _map_target_name(name: str, cfg: ModelConfig) -> Target | None:
    """Checkpoint name (prefix already stripped) -> Target, or None to skip (logged by the caller)."""
    m = re.match(r"^model\.layers\.(\d+)\.", name)
    if m and int(m.group(1)) >= cfg.num_hidden_layers:
        return None  # multi-token-prediction layers (DeepSeek-V3's layer 61) are not used here
    if name.endswith(".weight_shape"):
        return None  # compressed-tensors metadata; shapes are validated from the packed tensors
    m = _EXPERT.match(name)
    if m:
        base, e, proj, what = m.groups()
        stacked = "w2" if proj == "down_proj" else "w13"
        suffix = {"weight": "weight", "weight_packed": "weight_packed", "weight_scale": "weight_scale"}[what]
        return Target(f"{base}.{stacked}_{suffix}", expert=int(e), shard=proj.split("_")[0])
    if name.endswith(".mlp.experts.gate_up_proj"):
        return Target(name.replace("gate_up_proj", "w13_weight"), kind="stacked_w13")
    if name.endswith(".mlp.experts.down_proj"):
        return Target(name.replace("down_proj", "w2_weight"), kind="stacked_w2")
    return Target(name)


def _map_draft_name(name: str) -> str | None:
    if name.startswith("layers.0."):
        return "midlayer." + name[len("layers.0."):]
    if name.startswith("model."):  # some exports keep a model. prefix
        return _map_draft_name(name[len("model."):])
    if name in ("embed_tokens.weight",):
        return None  # the draft shares the target's embedding
    return name


# ------------------------------------------------------------------------------------------------------
# Loading
# ------------------------------------------------------------------------------------------------------
def _int4_experts(cfg: ModelConfig) -> bool:
    q = cfg.quantization
    if not q:
        return False
    method = q.get("quant_method")
    if method == "fp8":
        return False
    if method != "compressed-tensors":
        raise CheckpointError(f"quantization method {method!r} is not supported "
                              "(supported: compressed-tensors pack-quantized INT4, fp8 block)")
    fmt = q.get("format")
    groups = q.get("config_groups") or {}
    for gname, g in groups.items():
        w = g.get("weights") or {}
        gfmt = g.get("format", fmt)
        if gfmt != "pack-quantized" or w.get("num_bits") != 4 or w.get("type", "int") != "int" \
                or not w.get("symmetric", True) or w.get("group_size") != 32:
            raise CheckpointError(
                f"compressed-tensors scheme {gname!r} is not supported: format={gfmt!r} num_bits={w.get('num_bits')} "
                f"type={w.get('type')} symmetric={w.get('symmetric')} group_size={w.get('group_size')} "
                "(supported: pack-quantized, 4-bit symmetric int, group 32)")
    return True


def _check_ignore(cfg: ModelConfig, quantized_names: set[str]) -> None:
    """Our INT4 path covers routed experts only; the checkpoint's ignore list must not leave any other
    layer quantized (that would silently mean a layer we read as plain bf16)."""
    q = cfg.quantization or {}
    ignore = q.get("ignore") or []

    def ignored(module: str) -> bool:
        for pat in ignore:
            if pat.startswith("re:"):
                if re.match(pat[3:], module):
                    return True
            elif module == pat:
                return True
        return False

    bad = [n for n in quantized_names if not _EXPERT.match(n)]
    if bad:
        raise CheckpointError(f"quantized tensors outside the routed experts are not supported: {_format_names(bad)}")
    for n in quantized_names:
        module = cfg.weight_prefix + n.rsplit(".", 1)[0]
        if ignored(module):
            raise CheckpointError(f"{module} is in the quantization ignore list but is stored packed")


def load_weights(model: nn.Module, tensors: Iterator[LazyTensor], map_name, *, what: str,
                 allow_missing: tuple[str, ...] = ()) -> dict:
    """Feeds checkpoint tensors through each parameter's weight_loader; validates completeness.

    Raises CheckpointError listing missing and unexpected names; nothing is left half-loaded silently
    (the caller discards the model on error)."""
    params = dict(model.named_parameters())
    params.update({n: b for n, b in model.named_buffers() if hasattr(b, "weight_loader")})
    # Expert tensors are filled per expert and per shard: count what each stacked parameter received.
    expected_parts: dict[str, int] = {}
    for n, p in params.items():
        if re.search(r"\.w13_weight(_packed|_scale)?$", n):
            expected_parts[n] = p.shape[0] * 2
        elif re.search(r"\.w2_weight(_packed|_scale)?$", n):
            expected_parts[n] = p.shape[0]
        else:
            expected_parts[n] = 1
    received: dict[str, int] = {}
    unexpected, skipped = [], []
    fp8_pending: dict[str, LazyTensor] = {}
    fp8_scales: dict[str, LazyTensor] = {}
    n_bytes = n_tensors = 0

    def feed(t: Target, value, src_name: str):
        p = params[t.param]
        if t.kind == "stacked_w13":
            E = p.shape[0]
            full = value.load() if isinstance(value, LazyTensor) else value
            half = full.shape[1] // 2
            for e in range(E):
                p.weight_loader(p, full[e, :half], expert=e, shard="gate", name=src_name)
                p.weight_loader(p, full[e, half:], expert=e, shard="up", name=src_name)
            received[t.param] = received.get(t.param, 0) + 2 * E
            return
        if t.kind == "stacked_w2":
            full = value.load() if isinstance(value, LazyTensor) else value
            for e in range(p.shape[0]):
                p.weight_loader(p, full[e], expert=e, shard="down", name=src_name)
            received[t.param] = received.get(t.param, 0) + p.shape[0]
            return
        if t.expert is not None:
            if t.expert >= p.shape[0]:
                raise CheckpointError(f"{src_name}: expert {t.expert} >= n_routed_experts={p.shape[0]}")
            p.weight_loader(p, value, expert=t.expert, shard=t.shard, name=src_name)
        else:
            p.weight_loader(p, value, name=src_name)
        received[t.param] = received.get(t.param, 0) + 1

    t0 = time.perf_counter()
    for lt in tensors:
        name = lt.name
        t = map_name(name)
        if t is None:
            skipped.append(name)
            continue
        if isinstance(t, str):
            t = Target(t)
        n_tensors += 1
        n_bytes += _nbytes(lt)
        if name.endswith(".weight_scale_inv"):
            fp8_scales[name[: -len("_scale_inv")]] = lt
            _try_fp8(name[: -len("_scale_inv")], fp8_pending, fp8_scales, feed, map_name)
            continue
        if lt.dtype_str in ("F8_E4M3", "F8_E5M2"):
            fp8_pending[name] = lt
            _try_fp8(name, fp8_pending, fp8_scales, feed, map_name)
            continue
        if t.param not in params:
            unexpected.append(name)
            continue
        feed(t, lt, name)
    if fp8_pending:
        raise CheckpointError(f"FP8 tensors without weight_scale_inv: {_format_names(list(fp8_pending))}")
    missing = [n for n, want in expected_parts.items() if received.get(n, 0) < want
               and not any(n.startswith(a) for a in allow_missing)]
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"{len(missing)} missing: {_format_names(missing)}")
        if unexpected:
            parts.append(f"{len(unexpected)} unexpected: {_format_names(unexpected)}")
        raise CheckpointError(f"{what} checkpoint does not match the model: " + "; ".join(parts))
    if skipped:
        logger.info("%s: skipped %d tensors not used by the language model (%s)", what, len(skipped),
                    _format_names(skipped, 3))
    return {"tensors": n_tensors, "bytes": n_bytes, "seconds": time.perf_counter() - t0, "skipped": len(skipped)}


def _try_fp8(weight_name, pending, scales, feed, map_name):
    if weight_name in pending and weight_name in scales:
        w = pending.pop(weight_name).load()
        s = scales.pop(weight_name).load()
        t = map_name(weight_name)
        feed(t if isinstance(t, Target) else Target(t), dequant_fp8_block(w, s), weight_name)


_DTYPE_BYTES = {"F32": 4, "F16": 2, "BF16": 2, "I32": 4, "I64": 8, "F8_E4M3": 1, "F8_E5M2": 1, "BOOL": 1, "I8": 1,
                "U8": 1}


def _nbytes(lt: LazyTensor) -> int:
    n = 1
    for s in lt.shape:
        n *= s
    return n * _DTYPE_BYTES.get(lt.dtype_str, 2)


def load_target(path: str, *, device="cpu", dtype=torch.bfloat16) -> DeepseekV3ForCausalLM:
    cfg = ModelConfig.from_path(path)
    int4 = _int4_experts(cfg)
    files = checkpoint_files(path)
    model = DeepseekV3ForCausalLM(cfg, dtype=dtype, int4_experts=int4)
    prefix = cfg.weight_prefix
    quantized: set[str] = set()

    def map_name(name: str):
        if name.startswith(_SKIP_PREFIXES):
            return None
        if prefix:
            if not name.startswith(prefix):
                return Target("<outside the language model>." + name)  # reported as unexpected
            name = name[len(prefix):]
            if name.startswith("layers."):  # some Kimi exports drop the inner "model."
                name = "model." + name
        if name.endswith((".weight_packed", ".weight_scale")):
            quantized.add(name)
        return _map_target_name(name, cfg)

    info = load_weights(model, iter_tensors(files, "target"), map_name, what="target",
                        allow_missing=("lm_head.",) if cfg.tie_word_embeddings else ())
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    if int4:
        _check_ignore(cfg, quantized)
    logger.info("target loaded from %s: %d tensors, %.2f GB read in %.1f s%s", path, info["tensors"],
                info["bytes"] / 1e9, info["seconds"], " (INT4 experts kept packed)" if int4 else "")
    return model.to(device)


def load_draft(path: str, target_cfg: ModelConfig, *, device="cpu", dtype=torch.bfloat16) -> Eagle3Draft:
    dcfg = DraftConfig.from_path(path)
    if dcfg.vocab_size != target_cfg.vocab_size:
        raise ConfigError(f"draft vocab_size={dcfg.vocab_size} differs from the target's {target_cfg.vocab_size}")
    th = dcfg.target_hidden_size or dcfg.hidden_size
    if th != target_cfg.hidden_size:
        raise ConfigError(f"draft expects target hidden size {th} but the target's hidden_size is "
                          f"{target_cfg.hidden_size}")
    if dcfg.hidden_size != target_cfg.hidden_size:
        raise ConfigError(f"draft hidden_size={dcfg.hidden_size} differs from the target's "
                          f"{target_cfg.hidden_size} (the draft shares the target's embedding)")
    files = checkpoint_files(path)
    names = set()
    for f in files:
        from safetensors import safe_open
        with safe_open(f, framework="pt") as h:
            names.update(h.keys())
    has_head = "lm_head.weight" in names
    if not has_head and dcfg.draft_vocab_size != dcfg.vocab_size:
        raise ConfigError(f"draft has no lm_head.weight, so it uses the target's head over the full vocab, but "
                          f"draft_vocab_size={dcfg.draft_vocab_size} != vocab_size={dcfg.vocab_size}")
    model = Eagle3Draft(dcfg, dtype=dtype, has_lm_head=has_head)
    allow = () if "d2t" in names else ("d2t", "t2d")
    load_weights(model, iter_tensors(files, "draft"), _map_draft_name, what="draft", allow_missing=allow)
    if not has_head:
        logger.info("draft %s has no lm_head: using the target's head", path)
    return model.to(device)


# ------------------------------------------------------------------------------------------------------
# Writing (tests, the embedded model, the draft trainer)
# ------------------------------------------------------------------------------------------------------
def hf_state_dict(model: DeepseekV3ForCausalLM) -> dict[str, torch.Tensor]:
    """Our parameters in Hugging Face's on-disk names (per-expert tensors). TP=1 models only."""
    out = {}
    for name, p in model.state_dict().items():
        m = re.match(r"^(.*\.mlp\.experts)\.(w13|w2)_(weight|weight_packed|weight_scale)$", name)
        if not m:
            out[name] = p
            continue
        base, which, what = m.groups()
        for e in range(p.shape[0]):
            if which == "w13":
                half = p.shape[1] // 2
                out[f"{base}.{e}.gate_proj.{what}"] = p[e, :half]
                out[f"{base}.{e}.up_proj.{what}"] = p[e, half:]
            else:
                out[f"{base}.{e}.down_proj.{what}"] = p[e]
    if model.config.tie_word_embeddings:
        out.pop("lm_head.weight", None)
    return out


def save_hf(model: nn.Module, path: str, config: dict | None = None, max_shard_bytes: int | None = None,
            prefix: str = "") -> None:
    """Writes config.json + safetensors (sharded with an index when max_shard_bytes is given)."""
    from safetensors.torch import save_file

    os.makedirs(path, exist_ok=True)
    if isinstance(model, DeepseekV3ForCausalLM):
        sd = hf_state_dict(model)
        config = config or model.config.to_hf()
    else:
        sd = {k: v for k, v in model.state_dict().items()}
        if getattr(model, "lm_head", None) is None:
            sd.pop("lm_head.weight", None)
        config = config or model.config.to_hf()
    sd = {prefix + k: v.detach().contiguous().cpu() for k, v in sd.items()}
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    if not max_shard_bytes:
        save_file(sd, os.path.join(path, "model.safetensors"))
        return
    shards, cur, size = [], {}, 0
    for k, v in sd.items():
        b = v.numel() * v.element_size()
        if cur and size + b > max_shard_bytes:
            shards.append(cur)
            cur, size = {}, 0
        cur[k] = v
        size += b
    shards.append(cur)
    weight_map = {}
    for i, shard in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, os.path.join(path, fname))
        weight_map.update({k: fname for k in shard})
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f, indent=1)
