"""Checkpoint loading for the targets and drafts users download from the Hub.

What loads (docs/CHECKPOINTS.md has the user-facing page):
  * single or sharded safetensors (``model.safetensors.index.json``);
  * DeepSeek-V3-family targets in Hugging Face names: per-expert ``mlp.experts.{e}.gate_proj.weight`` or
    transformers-5 stacked ``mlp.experts.gate_up_proj`` / ``down_proj``; multi-token-prediction layers skipped;
  * Kimi-K2.5 (``KimiK25ForConditionalGeneration``): language tensors under ``language_model.model.*`` or
    ``language_model.*``; vision tower and projector skipped with a log line;
  * compressed-tensors ``pack-quantized`` INT4 routed experts (Kimi-K2.5), kept packed in memory;
  * DeepSeek-V3 block FP8 (``weight_scale_inv`` per 128x128 block), dequantised per tensor at load;
  * EAGLE-3 drafts (``LlamaForCausalLMEagle3``) in ``midlayer.*`` or ``layers.0.*`` naming, with or without
    their own ``lm_head`` and ``d2t``/``t2d``.

How: (1) every shard's header is read and checked (truncation, corruption, index consistency) without
reading tensor data; (2) every checkpoint name is mapped onto a parameter and checked against the model at
full (TP=1) size (under TP, a skeleton on the meta device): missing, unexpected, shape, dtype and quantization
problems are reported before any weight is read; (3) shards are streamed one at a time: each tensor goes
through its parameter's ``weight_loader`` as a lazy slice of the shard's memory map, so a TP rank touches only
its bytes and the copy into the parameter is the only copy, and each shard's map is closed before the next is
opened. Memory beyond the model itself therefore stays near one shard (the pages of the open shard's map).

All checkpoint renames live in ``_TargetNames`` and ``_draft_name``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import re
import shutil
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
import torch.nn as nn

from sglang_eagle3.config import ConfigError, DraftConfig, ModelConfig, load_json, resolve_aux_layer_ids
from sglang_eagle3.distributed import parallel_state
from sglang_eagle3.distributed.parallel_state import TPInfo, get_tp
from sglang_eagle3.kernels.quant import FP8_BLOCK, PACK_FACTOR
from sglang_eagle3.layers.moe import INT4_GROUP
from sglang_eagle3.models.deepseek_v3 import DeepseekV3ForCausalLM
from sglang_eagle3.models.eagle3 import Eagle3Draft
from sglang_eagle3.progress import beat, duration

logger = logging.getLogger(__name__)

__all__ = [
    "CheckpointError",
    "CheckpointIndex",
    "LazyTensor",
    "checkpoint_files",
    "hf_state_dict",
    "load_draft",
    "load_target",
    "save_hf",
]


class CheckpointError(ValueError):
    """A checkpoint does not match its config or the model: names the tensors, files and shapes involved."""


# ------------------------------------------------------------------------------------------------------
# Shard headers
# ------------------------------------------------------------------------------------------------------
# safetensors dtype -> bytes per element, for the dtypes this engine reads.
_DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
                "F8_E4M3": 1, "F8_E5M2": 1}
_FLOAT_DTYPES = ("F32", "BF16", "F16", "F64")
# safetensors refuses headers above 100 MB; a larger length field means the file is not safetensors at all.
_MAX_HEADER = 100 * 1024 * 1024


@dataclass(frozen=True)
class TensorInfo:
    """One tensor as a shard header describes it (no data read)."""

    name: str
    file: str
    dtype: str  # safetensors dtype string: "BF16", "I32", "F8_E4M3", ...
    shape: tuple[int, ...]
    offset: int  # start of its bytes within the shard's data section (reads go in file order)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * _DTYPE_BYTES[self.dtype]


def read_header(file: str) -> dict[str, TensorInfo]:
    """Parses one safetensors header (8-byte little-endian length + JSON) and checks that the file holds
    every byte it promises. Raises CheckpointError naming the file when it is truncated or corrupt, or cannot
    be read at all (permissions, a dangling symbolic link)."""
    try:
        size = os.path.getsize(file)
        with open(file, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise CheckpointError(f"{file} is truncated: {size} bytes, not even a safetensors header length")
            n = int.from_bytes(head, "little")
            if n > min(size - 8, _MAX_HEADER):
                start = head + f.read(56)
                raise CheckpointError(f"{file} is truncated or not a safetensors file: its header claims {n} bytes "
                                      f"but the file has {size}{_not_safetensors_hint(start)}")
            raw = f.read(n)
    except OSError as e:
        raise _unreadable(file, e) from e
    try:
        header = json.loads(raw)
        if not isinstance(header, dict):
            raise ValueError(f"header is a {type(header).__name__}, not an object")
    except (UnicodeDecodeError, ValueError) as e:
        raise CheckpointError(f"{file} has a corrupt safetensors header: {e}") from e
    meta = header.get("__metadata__")
    if meta is not None and not (isinstance(meta, dict) and all(isinstance(v, str) for v in meta.values())):
        # safetensors refuses it when the shard is opened to stream, after the model was allocated.
        raise CheckpointError(f"{file} has a corrupt safetensors header: __metadata__ must map names to strings, "
                              f"got {meta!r}")
    data_size = size - 8 - n
    infos: dict[str, TensorInfo] = {}
    end_max = 0
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        # Exactly what safetensors accepts: sizes and offsets are non-negative JSON integers (int() would take
        # -1, 2.5, "2" and true, which safe_open refuses only once the weights stream).
        try:
            dtype, shape, offsets = entry["dtype"], list(entry["shape"]), list(entry["data_offsets"])
            if not isinstance(dtype, str) or len(offsets) != 2 or not all(_is_size(v) for v in [*shape, *offsets]):
                raise ValueError("sizes and offsets must be non-negative integers")
        except (TypeError, KeyError, ValueError) as e:
            raise CheckpointError(f"{file} has a corrupt header entry for {name!r}: {entry!r}") from e
        shape, (begin, end) = tuple(shape), offsets
        if dtype not in _DTYPE_BYTES:
            raise CheckpointError(f"{file}: tensor {name!r} has dtype {dtype!r}, which this engine does not read "
                                  f"(readable: {', '.join(_DTYPE_BYTES)})")
        info = TensorInfo(name, file, dtype, shape, begin)
        if end - begin != info.nbytes:
            raise CheckpointError(f"{file} has a corrupt header entry for {name!r}: offsets {begin}..{end} do not "
                                  f"hold {dtype} {list(shape)} ({info.nbytes} bytes)")
        end_max = max(end_max, end)
        infos[name] = info
    if end_max > data_size:
        raise CheckpointError(f"{file} is truncated: its header describes {end_max} bytes of tensor data but only "
                              f"{data_size} are present (an interrupted download? fetch this file again)")
    if end_max < data_size:
        raise CheckpointError(f"{file} is corrupt: {data_size - end_max} bytes after the last tensor its header "
                              "describes")
    # safetensors itself refuses tensors that overlap or leave holes, but only when the shard is opened, which
    # for the weights is after the model was allocated and some shards were read: check it with the rest.
    pos = 0
    for info in sorted(infos.values(), key=lambda i: (i.offset, i.nbytes)):
        if info.offset != pos:
            what = "overlaps the tensor before it" if info.offset < pos else f"leaves a {info.offset - pos}-byte hole"
            raise CheckpointError(f"{file} has a corrupt header: tensor {info.name!r} at bytes {info.offset}.."
                                  f"{info.offset + info.nbytes} {what} (tensors must tile the data section)")
        pos += info.nbytes
    return infos


def _is_size(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _unreadable(file: str, e: OSError) -> CheckpointError:
    """A file of the checkpoint that the OS will not give us: what it is and what to do."""
    if os.path.islink(file) and not os.path.exists(file):
        return CheckpointError(f"{file} is a symbolic link to {os.readlink(file)!r}, which does not exist (a Hugging "
                               "Face cache snapshot copied or moved without its blobs/? copy it with `cp -L`, or "
                               "download with `huggingface-cli download --local-dir`)")
    if isinstance(e, PermissionError):
        return CheckpointError(f"cannot read {file}: permission denied (this process runs as uid {os.getuid()}; "
                               "make the checkpoint readable to it, and its directories searchable)")
    return CheckpointError(f"cannot read {file}: {e.strerror or e}")


def _not_safetensors_hint(start: bytes) -> str:
    """What a shard that is not safetensors most often is instead, from its first bytes."""
    # `git clone` without git-lfs leaves ~130-byte pointer files under the shards' names; a download of a gated
    # repository without a token saves the error page. Both are text where the header length belongs.
    if start.startswith(b"version https://git-lfs"):
        return (" (it is a Git LFS pointer, not the weights: run `git lfs pull` in the clone, or download with "
                "`huggingface-cli download`)")
    if start.lstrip()[:1] == b"<":
        return (f" (it starts like an HTML page, {start[:40]!r}: download the file again, logged in if the "
                "repository is gated)")
    return ""


# How the Hub names the shards of a checkpoint: model-00002-of-00064.safetensors.
_SHARD_NAME = re.compile(r"^(?P<stem>.+)-(?P<i>\d+)-of-(?P<n>\d+)\.safetensors$")


def checkpoint_files(path: str) -> list[str]:
    """The safetensors files of a model directory: those the index names when sharded, else all of them."""
    if not os.path.isdir(path):
        hint = (f"; pass the directory that holds it, {os.path.dirname(os.path.abspath(path))!r}"
                if os.path.isfile(path) else "")
        raise CheckpointError(f"model path {path!r} is not a directory{hint}")
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.exists(index) or os.path.islink(index):
        files = sorted(set(_read_index(index).values()))
        if not files:
            raise CheckpointError(f"{index} names no tensors (its weight_map is empty): download it again, or delete "
                                  "it to read every .safetensors file of the directory")
        absent = [f for f in files if not os.path.exists(os.path.join(path, f))]
        dangling = [f for f in absent if os.path.islink(os.path.join(path, f))]
        if dangling:
            raise _unreadable(os.path.join(path, dangling[0]), FileNotFoundError()) from None
        if absent:
            raise CheckpointError(f"{len(absent)} of {len(files)} shard(s) named in {index} are missing: "
                                  f"{_format_names(absent, 5)}")
        return [os.path.join(path, f) for f in files]
    try:
        names = os.listdir(path)
    except OSError as e:
        raise _unreadable(path, e) from e
    files = sorted(f for f in names if f.endswith(".safetensors"))
    if not files:
        other = sorted(f for f in names if f.endswith((".bin", ".pt", ".pth", ".gguf")))
        hint = (f" (found {_format_names(other, 3)}: only safetensors checkpoints are read; convert them with "
                "safetensors' save_file)") if other else ""
        raise CheckpointError(f"no .safetensors files in {path}{hint}")
    # Without an index, a shard that did not download is otherwise only a list of missing tensors: the Hub's
    # names say how many there should be.
    sets: dict[tuple[str, str], set[int]] = {}
    for f in files:
        if m := _SHARD_NAME.match(f):
            sets.setdefault((m["stem"], m["n"]), set()).add(int(m["i"]))
    for (stem, n), have in sets.items():
        if len(have) >= int(n):
            continue
        absent = [f"{stem}-{i:0{len(n)}d}-of-{n}.safetensors" for i in range(1, int(n) + 1) if i not in have]
        if absent:
            raise CheckpointError(f"{path} holds {len(have)} of the {int(n)} shards {stem}-*-of-{n}.safetensors and "
                                  f"has no model.safetensors.index.json; missing: {_format_names(absent, 5)} "
                                  "(an interrupted download? fetch them again)")
    return [os.path.join(path, f) for f in files]


def _read_index(index: str) -> dict[str, str]:
    try:
        with open(index) as f:
            weight_map = json.load(f)["weight_map"]
        if not isinstance(weight_map, dict):
            raise ValueError("weight_map is not an object")
        bad = next(((n, f) for n, f in weight_map.items() if not isinstance(f, str)), None)
        if bad:
            raise ValueError(f"weight_map[{bad[0]!r}] is {bad[1]!r}, not a shard file name")
    except OSError as e:
        raise _unreadable(index, e) from e
    except (ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"{index} is not a valid safetensors index: {e!r}") from e
    return weight_map


@dataclass
class CheckpointIndex:
    """Every tensor of a checkpoint directory by name, from the shard headers alone."""

    path: str
    files: list[str]
    tensors: dict[str, TensorInfo]

    @staticmethod
    def scan(path: str) -> CheckpointIndex:
        files = checkpoint_files(path)
        tensors: dict[str, TensorInfo] = {}
        for file in files:
            for name, info in read_header(file).items():
                if name in tensors:
                    raise CheckpointError(f"tensor {name!r} appears in two shards: {tensors[name].file} and {file}")
                tensors[name] = info
        index = os.path.join(path, "model.safetensors.index.json")
        if os.path.exists(index):
            weight_map = _read_index(index)

            def rel(file: str) -> str:  # as the index names it (a shard may sit in a subfolder)
                return os.path.relpath(file, path)

            unlisted = [n for n in tensors if n not in weight_map]
            if unlisted:
                raise CheckpointError(f"{index} does not match the shards: {len(unlisted)} tensor(s) stored but not "
                                      f"listed, e.g. {unlisted[0]!r} in {rel(tensors[unlisted[0]].file)}")
            wrong = [(n, f) for n, f in weight_map.items()
                     if n not in tensors or rel(tensors[n].file) != os.path.normpath(f)]
            if wrong:
                n, f = wrong[0]
                where = f"is in {rel(tensors[n].file)}" if n in tensors else "is in no shard"
                raise CheckpointError(f"{index} does not match the shards: {len(wrong)} tensor(s) misplaced, e.g. "
                                      f"{n!r} is listed under {f} but {where}")
        return CheckpointIndex(path, files, tensors)

    def by_file(self) -> dict[str, list[TensorInfo]]:
        """Tensors grouped per shard, in on-disk order (sequential reads)."""
        out: dict[str, list[TensorInfo]] = {f: [] for f in self.files}
        for info in self.tensors.values():
            out[info.file].append(info)
        for infos in out.values():
            infos.sort(key=lambda i: i.offset)
        return out

    @property
    def nbytes(self) -> int:
        return sum(i.nbytes for i in self.tensors.values())


def _format_names(names, limit: int = 8) -> str:
    names = sorted(names)
    head = ", ".join(names[:limit])
    return head + (f" ... and {len(names) - limit} more" if len(names) > limit else "")


# ------------------------------------------------------------------------------------------------------
# Lazy tensors: what weight_loaders receive
# ------------------------------------------------------------------------------------------------------
@dataclass
class ReadStats:
    """Bytes of the slices handed to weight_loaders: what this rank reads (a TP rank reads only its slices)."""

    bytes_read: int = 0


class LazyTensor:
    """A rectangular view of a checkpoint tensor that is not read yet.

    ``shape``/``narrow(dim, start, length)``/``load()`` is the interface the layers' weight_loaders use
    (``layers.linear.load_slice``). Reading goes through the shard's memory map: safetensors' ``get_tensor``
    returns a zero-copy view of the map, indexing selects the slice, and the weight_loader's copy into the
    parameter is the only copy; only the slice's pages are ever touched. ``view(dim, start, length)`` and
    ``select(index)`` narrow lazily, which is how one expert's half of a stacked ``gate_up_proj`` is handed over.

    NOTE: what ``load``/``narrow`` return aliases the shard's map: copy it, never keep it (a kept view would
    keep the whole shard mapped). The loader drops every LazyTensor before it closes the shard.
    """

    def __init__(self, handle, info: TensorInfo, stats: ReadStats | None = None,
                 ranges: tuple | None = None):
        self._h, self.info, self._stats = handle, info, stats
        # Per dim of the underlying tensor: (start, length), or an int when the dim is selected away.
        self._ranges = ranges if ranges is not None else tuple((0, s) for s in info.shape)

    @property
    def name(self) -> str:
        return self.info.name

    @property
    def file(self) -> str:
        return self.info.file

    @property
    def dtype_str(self) -> str:
        return self.info.dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(r[1] for r in self._ranges if not isinstance(r, int))

    def _kept_dims(self) -> list[int]:
        return [i for i, r in enumerate(self._ranges) if not isinstance(r, int)]

    def view(self, dim: int, start: int, length: int) -> LazyTensor:
        shape = self.shape
        if not (0 <= start and length >= 0 and start + length <= shape[dim]):
            raise IndexError(f"{self.name}: slice {start}:{start + length} of dim {dim} outside {shape}")
        under = self._kept_dims()[dim]
        base, _ = self._ranges[under]
        ranges = list(self._ranges)
        ranges[under] = (base + start, length)
        return LazyTensor(self._h, self.info, self._stats, tuple(ranges))

    def select(self, index: int) -> LazyTensor:
        """Drops the first remaining dim, keeping entry ``index``."""
        under = self._kept_dims()[0]
        base, n = self._ranges[under]
        if not 0 <= index < n:
            raise IndexError(f"{self.name}: index {index} outside dim of size {n}")
        ranges = list(self._ranges)
        ranges[under] = base + index
        return LazyTensor(self._h, self.info, self._stats, tuple(ranges))

    def load(self) -> torch.Tensor:
        t = self._h.get_tensor(self.info.name)  # a view of the memory map: nothing read yet
        if self._ranges:
            t = t[tuple(r if isinstance(r, int) else slice(r[0], r[0] + r[1]) for r in self._ranges)]
        if self._stats is not None:
            self._stats.bytes_read += t.numel() * t.element_size()
        return t

    def narrow(self, dim: int, start: int, length: int) -> torch.Tensor:
        return self.view(dim, start, length).load()


class Fp8BlockTensor:
    """A DeepSeek-V3 FP8 weight (float8_e4m3fn [N, K]) with ``weight_scale_inv`` [ceil(N/128), ceil(K/128)],
    presented as its dequantised float32 value.

    ``narrow`` reads only the weight slice and the scale blocks covering it, so TP slices need not be
    block-aligned: rows start..start+n use scale rows start//128 .. (start+n-1)//128.
    """

    dtype_str = "F32"

    def __init__(self, weight: LazyTensor, scale_inv: torch.Tensor, block: int = FP8_BLOCK):
        self.weight, self.scale_inv, self.block = weight, scale_inv.float(), block
        self.name, self.file = weight.name, weight.file

    @property
    def shape(self) -> tuple[int, ...]:
        return self.weight.shape

    def _dequant(self, w: torch.Tensor, row0: int, col0: int) -> torch.Tensor:
        """w is the weight block [row0:row0+n, col0:col0+k] -> float32 w * scale."""
        b = self.block
        n, k = w.shape
        s = self.scale_inv[row0 // b: (row0 + n - 1) // b + 1, col0 // b: (col0 + k - 1) // b + 1]
        s = s.repeat_interleave(b, 0).repeat_interleave(b, 1)  # covering blocks at element resolution
        r, c = row0 - (row0 // b) * b, col0 - (col0 // b) * b
        return w.float() * s[r: r + n, c: c + k]

    def load(self) -> torch.Tensor:
        return self._dequant(self.weight.load(), 0, 0)

    def narrow(self, dim: int, start: int, length: int) -> torch.Tensor:
        w = self.weight.narrow(dim, start, length)
        return self._dequant(w, start if dim == 0 else 0, start if dim == 1 else 0)


# ------------------------------------------------------------------------------------------------------
# Name mapping
# ------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Target:
    """Where one checkpoint tensor goes.

    kind: ``plain`` (whole parameter), ``expert`` (one expert's gate/up/down of a stacked expert parameter),
    ``stacked_w13``/``stacked_w2`` (transformers-5 [E, ...] expert tensors), ``fp8_scale`` (consumed with its
    FP8 weight), ``int4_shape`` (compressed-tensors ``weight_shape`` metadata, validated, not stored).
    """

    param: str
    kind: str = "plain"
    expert: int | None = None
    shard: str | None = None  # gate | up | down


_EXPERT = re.compile(r"^(model\.layers\.\d+\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\."
                     r"(weight|weight_packed|weight_scale|weight_shape)$")
_VISION_PREFIXES = ("vision_tower.", "mm_projector.", "multi_modal_projector.", "vision_model.")
# Modules that are nn.Linear in the Hugging Face model: what a compressed-tensors "Linear" target matches.
# (The MoE router mlp.gate is not an nn.Linear there.)
_LINEAR_MODULE = re.compile(r"(^|\.)(q_a_proj|q_b_proj|q_proj|kv_a_proj_with_mqa|kv_b_proj|o_proj|gate_proj|up_proj|"
                            r"down_proj|lm_head)$")


@dataclass
class _Mapping:
    """Every checkpoint name, sorted into targets, skips (with a reason) and unexpected names."""

    targets: dict[str, Target] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    unexpected: list[str] = field(default_factory=list)
    duplicates: list[str] = field(default_factory=list)  # two checkpoint names for one tensor (prefix variants)


class _TargetNames:
    """Checkpoint name <-> our parameter names for DeepSeek-V3-family targets (Kimi prefix variants)."""

    def __init__(self, cfg: ModelConfig):
        self.cfg = cfg
        self.prefix = cfg.weight_prefix

    def canonical(self, name: str) -> tuple[str | None, str]:
        """(name relative to the language model as ``model.*``/``lm_head.*``, or None; skip reason or "")."""
        if name.startswith(_VISION_PREFIXES):
            return None, "vision tower / projector"
        if self.prefix:
            if not name.startswith(self.prefix):
                return None, ""
            name = name[len(self.prefix):]
            if name.startswith(("layers.", "embed_tokens.", "norm.")):
                name = "model." + name  # the language_model.layers.* export drops the inner "model."
        m = re.match(r"^model\.layers\.(\d+)\.", name)
        if m and int(m.group(1)) >= self.cfg.num_hidden_layers:
            # Only the layers the config declares as MTP: any other layer past the last one means config.json
            # and the tensors disagree on the depth, and loading would silently drop real layers.
            if int(m.group(1)) < self.cfg.num_hidden_layers + self.cfg.num_nextn_predict_layers:
                return None, "multi-token-prediction layer"
            return None, ""
        if name.endswith("rotary_emb.inv_freq"):
            return None, "rotary table (recomputed)"
        return name, ""

    def target(self, canon: str) -> Target:
        if canon.endswith(".weight_scale_inv"):
            weight = self.target(canon[: -len("_scale_inv")])
            return Target(weight.param, kind="fp8_scale", expert=weight.expert, shard=weight.shard)
        m = _EXPERT.match(canon)
        if m:
            base, e, proj, what = m.groups()
            which = "w2" if proj == "down_proj" else "w13"
            if what == "weight_shape":
                return Target(f"{base}.{which}_weight_packed", kind="int4_shape", expert=int(e),
                              shard=proj.split("_")[0])
            return Target(f"{base}.{which}_{what}", kind="expert", expert=int(e), shard=proj.split("_")[0])
        if canon.endswith(".mlp.experts.gate_up_proj"):
            return Target(canon.replace("gate_up_proj", "w13_weight"), kind="stacked_w13")
        if canon.endswith(".mlp.experts.down_proj"):
            return Target(canon.replace("down_proj", "w2_weight"), kind="stacked_w2")
        return Target(canon)

    def display(self, param: str, part: tuple | None) -> str:
        """The checkpoint name a missing (parameter, part) would have, for error messages."""
        if part is None:
            return self.prefix + param
        e, shard = part
        m = re.match(r"^(.*\.mlp\.experts)\.(w13|w2)_(weight|weight_packed|weight_scale)$", param)
        base, _, what = m.groups()
        return f"{self.prefix}{base}.{e}.{shard}_proj.{what}"


def _draft_name(name: str) -> tuple[str | None, str]:
    if name.startswith("model."):  # some exports keep a model. prefix
        name = name[len("model."):]
    if name.startswith("layers.0."):
        return "midlayer." + name[len("layers.0."):], ""
    if name == "embed_tokens.weight":
        return None, "draft embedding (the target's embedding is used, as SGLang does)"
    return name, ""


def _map_checkpoint(index: CheckpointIndex, canonical: Callable[[str], tuple[str | None, str]],
                    target: Callable[[str], Target], params: dict[str, torch.Tensor]) -> _Mapping:
    mp = _Mapping()
    seen: dict[str, str] = {}
    for name in index.tensors:
        canon, reason = canonical(name)
        if canon is None:
            if reason:
                mp.skipped[name] = reason
            else:
                mp.unexpected.append(name)
            continue
        if canon in seen:
            mp.duplicates.append(f"{seen[canon]} and {name}")
            continue
        seen[canon] = name
        t = target(canon)
        if t.param not in params:
            mp.unexpected.append(name)
        else:
            mp.targets[name] = t
    return mp


# ------------------------------------------------------------------------------------------------------
# Quantization schemes
# ------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class QuantPlan:
    int4_experts: bool = False  # routed experts stored (and kept) as pack-quantized INT4
    fp8_block: bool = False  # some weights are DeepSeek-V3 block FP8 (dequantised at load)

    def describe(self) -> str:
        if self.int4_experts:
            return "routed experts INT4 (kept packed, W4A16)"
        if self.fp8_block:
            return "block FP8 dequantised at load"
        return "unquantized"


_SUPPORTED = ("supported: compressed-tensors pack-quantized INT4 (4-bit symmetric int, group strategy, group_size "
              f"{INT4_GROUP}, weights only) on routed experts; DeepSeek-V3 block FP8 (e4m3, 128x128 blocks, dynamic "
              "activations)")


def _pattern_matches(pattern: str, names: tuple[str, ...]) -> bool:
    """compressed-tensors' rule: "re:<regex>" is re.match (anchored at the start, not a full match); anything
    else must equal the name exactly. Never a substring test."""
    if pattern.startswith("re:"):
        return any(re.match(pattern[3:], n) is not None for n in names)
    return pattern in names


def _check_compressed_tensors(q: dict) -> list[dict]:
    """Validates every config group's scheme; returns the groups (each with its targets)."""
    groups = q.get("config_groups") or {}
    if not groups:
        raise CheckpointError("compressed-tensors quantization_config has no config_groups; " + _SUPPORTED)
    # Types first: a hand-edited or foreign config must fail here, naming the field, not as an AttributeError
    # (or, for a string ignore, as a list of its characters) further down.
    if not isinstance(groups, dict):
        raise CheckpointError(f"compressed-tensors config_groups must be an object of named schemes, got "
                              f"{groups!r}")
    ignore = q.get("ignore")
    if ignore is not None and not (isinstance(ignore, list) and all(isinstance(x, str) for x in ignore)):
        raise CheckpointError(f"compressed-tensors ignore={ignore!r} must be a list of module names / 're:' patterns")
    for gname, g in groups.items():
        if not isinstance(g, dict):
            raise CheckpointError(f"compressed-tensors scheme {gname!r} must be an object (targets, weights, "
                                  f"input_activations), got {g!r}")
        targets, weights = g.get("targets"), g.get("weights")
        if targets is not None and not (isinstance(targets, list) and all(isinstance(x, str) for x in targets)):
            raise CheckpointError(f"compressed-tensors scheme {gname!r}: targets={targets!r} must be a list of "
                                  "module types / names / 're:' patterns")
        if weights is not None and not isinstance(weights, dict):
            raise CheckpointError(f"compressed-tensors scheme {gname!r}: weights={weights!r} must be an object "
                                  "(num_bits, type, symmetric, strategy, group_size)")
    # Published checkpoints write both as {} (or a "dense" sparsity format): only a real one changes the weights.
    sparsity, transform = q.get("sparsity_config") or {}, q.get("transform_config") or {}
    for key, active in (("sparsity_config", sparsity and (not isinstance(sparsity, dict)
                                                          or sparsity.get("format", "dense") != "dense")),
                        ("transform_config", transform and (not isinstance(transform, dict)
                                                            or transform.get("config_groups")))):
        if active:
            raise CheckpointError(f"compressed-tensors {key}={q[key]!r} is not supported (the weights would need it "
                                  f"applied); " + _SUPPORTED)
    if q.get("kv_cache_scheme"):
        raise CheckpointError(f"compressed-tensors kv_cache_scheme={q['kv_cache_scheme']!r} is not supported; "
                              + _SUPPORTED)
    out = []
    for gname, g in groups.items():
        w = g.get("weights") or {}
        fmt = g.get("format") or q.get("format")
        scheme = dict(format=fmt, num_bits=w.get("num_bits"), type=w.get("type"), symmetric=w.get("symmetric"),
                      strategy=w.get("strategy"), group_size=w.get("group_size"), actorder=w.get("actorder"),
                      input_activations=g.get("input_activations"))
        # actorder "group" (alias "dynamic", or true) permutes the input columns among groups and stores the
        # permutation as weight_g_idx: run as contiguous groups of 32 it would be wrong. "weight" (alias
        # "static") only changes the order the quantizer visited columns; groups stay contiguous.
        ok = (fmt == "pack-quantized" and w.get("num_bits") == 4 and w.get("type", "int") == "int"
              and w.get("symmetric", True) and w.get("strategy", "group") == "group"
              and w.get("group_size") == INT4_GROUP and w.get("actorder") in (None, False, "weight", "static")
              and not g.get("input_activations") and not g.get("output_activations"))
        if not ok:
            desc = ", ".join(f"{k}={v!r}" for k, v in scheme.items())
            raise CheckpointError(f"compressed-tensors scheme {gname!r} ({desc}) is not supported; {_SUPPORTED}")
        out.append(g)
    return out


def plan_quantization(cfg: ModelConfig, index: CheckpointIndex, names: _TargetNames) -> QuantPlan:
    """Reads quantization_config, checks the scheme is one we run, and checks that the checkpoint stores
    exactly the modules the config says are quantized (its ``ignore`` list honoured as compressed-tensors
    defines it). Raises CheckpointError before any weight is read."""
    q = cfg.quantization or {}
    method = q.get("quant_method")
    stored_packed: dict[str, str] = {}  # checkpoint module name -> canonical module name
    stored_plain: dict[str, str] = {}
    fp8 = []
    for name, info in index.tensors.items():
        canon, _ = names.canonical(name)
        if canon is None:
            continue
        if info.dtype.startswith("F8_"):
            fp8.append(name)
        for suffix, where in ((".weight_packed", stored_packed), (".weight", stored_plain)):
            if canon.endswith(suffix) and _LINEAR_MODULE.search(canon[: -len(suffix)]):
                where[name[: -len(suffix)]] = canon[: -len(suffix)]
    if method is None and q:
        # transformers refuses such a config too: without quant_method nothing says how the tensors are encoded.
        raise CheckpointError(f"config.json has a quantization_config without quant_method (keys: {sorted(q)}); "
                              + _SUPPORTED)
    if method is None:
        if stored_packed:
            raise CheckpointError(f"{len(stored_packed)} module(s) are stored pack-quantized "
                                  f"({_format_names(stored_packed, 3)}) but config.json has no quantization_config")
        return QuantPlan(fp8_block=bool(fp8))
    if method == "fp8":
        block = q.get("weight_block_size")
        fmt = q.get("fmt", "e4m3")
        act = q.get("activation_scheme", "dynamic")
        if list(block or []) != [FP8_BLOCK, FP8_BLOCK] or fmt != "e4m3" or act != "dynamic":
            raise CheckpointError(f"fp8 quantization with weight_block_size={block!r}, fmt={fmt!r}, "
                                  f"activation_scheme={act!r} is not supported; {_SUPPORTED}")
        if stored_packed:
            raise CheckpointError(f"quant_method 'fp8' but {len(stored_packed)} module(s) are stored "
                                  f"pack-quantized: {_format_names(stored_packed, 3)}")
        bad = [n for n in fp8 if index.tensors[n].dtype != "F8_E4M3"]
        if bad:
            raise CheckpointError(f"fp8 tensors must be float8_e4m3fn; {_format_names(bad, 3)} are "
                                  f"{index.tensors[bad[0]].dtype}")
        return QuantPlan(fp8_block=bool(fp8))
    if method != "compressed-tensors":
        raise CheckpointError(f"quantization method {method!r} is not supported; {_SUPPORTED}")
    groups = _check_compressed_tensors(q)
    if fp8:
        raise CheckpointError(f"compressed-tensors checkpoint also holds FP8 tensors ({_format_names(fp8, 3)}); "
                              + _SUPPORTED)
    ignore = list(q.get("ignore") or [])

    # The quantizer saw module names of whichever model it was applied to: the wrapper
    # (language_model.model.layers...) or the text model alone (model.layers...), so a pattern counts when it
    # matches either form. The matching itself is compressed-tensors' (see _pattern_matches).
    def forms(module: str, canon: str) -> tuple[str, ...]:
        return (module, canon) if module != canon else (module,)

    def expected_quantized(module: str, canon: str) -> tuple[bool, str]:
        f = forms(module, canon)
        for pat in ignore:
            if _pattern_matches(pat, f):
                return False, f"matches ignore entry {pat!r}"
        for g in groups:
            for t in g.get("targets") or []:
                if t == "Linear" or _pattern_matches(t, f):
                    return True, f"targeted by {t!r} and matched by no ignore entry"
        return False, "matched by no config_groups target"

    plain_but_quantized, packed_but_not = [], []
    for module, canon in stored_plain.items():
        want, why = expected_quantized(module, canon)
        if want:
            plain_but_quantized.append(f"{module} ({why})")
    for module, canon in stored_packed.items():
        want, why = expected_quantized(module, canon)
        if not want:
            packed_but_not.append(f"{module} ({why})")
    problems = []
    if plain_but_quantized:
        problems.append(f"{len(plain_but_quantized)} module(s) the quantization_config says are quantized are "
                        f"stored unquantized (.weight): {_format_names(plain_but_quantized, 4)}")
    if packed_but_not:
        problems.append(f"{len(packed_but_not)} module(s) are stored packed (.weight_packed) but the "
                        f"quantization_config leaves them unquantized: {_format_names(packed_but_not, 4)}")
    if problems:
        raise CheckpointError(f"checkpoint {index.path} disagrees with its quantization_config (ignore={ignore}): "
                              + "; ".join(problems))
    outside = [m for m, c in stored_packed.items() if not _EXPERT.match(c + ".weight")]
    if outside:
        raise CheckpointError(f"INT4 is supported on routed experts only; {len(outside)} other module(s) are "
                              f"stored packed: {_format_names(outside, 4)}")
    plain_experts = [m for m, c in stored_plain.items() if _EXPERT.match(c + ".weight")]
    if stored_packed and plain_experts:
        raise CheckpointError(f"routed experts must be all INT4 or all unquantized; {len(plain_experts)} are "
                              f"stored unquantized: {_format_names(plain_experts, 4)}")
    return QuantPlan(int4_experts=bool(stored_packed))


# ------------------------------------------------------------------------------------------------------
# Validation against the full-size model
# ------------------------------------------------------------------------------------------------------
def _build(make: Callable[[], nn.Module], device) -> tuple[nn.Module, nn.Module]:
    """(model for this rank on ``device``, a model with every parameter at full checkpoint size).

    At TP=1 the model is its own full-size reference. Under TP the reference is built on the meta device with
    TP=1 shapes (no memory). Either way the model is only allocated, never written, until validation passed.

    NOTE: the reference swaps the process-wide TP coordinates while it is built; loading is single-threaded.
    Building at TP=1 on the meta device is avoided because its first use costs a one-time import of torch's
    reference ops (about 3 s on a CPU host).
    """
    with torch.device(device):
        model = make()
    if get_tp().size == 1:
        return model, model
    saved = parallel_state._TP
    parallel_state._TP = TPInfo()
    try:
        with torch.device("meta"):
            full = make()
    finally:
        parallel_state._TP = saved
    return model, full


def release_storage(*models: nn.Module) -> None:
    """Frees the storage of every parameter and buffer of ``models``, whoever still refers to the tensors.

    For a model that failed to become usable: the frames of a kept traceback (a notebook's
    ``sys.last_traceback``, a caller that stores the exception) still name it, and without this a failed
    Kimi-K2.5 load pins tens of GB of GPU memory so that the corrected retry runs out of memory.

    Each parameter and buffer is left empty (shape [0]) rather than a view of freed memory: reading one (a
    debugger, a traceback printer that shows locals as pytest, rich or IPython's verbose mode do, an error
    reporter such as Sentry) would otherwise crash the process, or on a GPU poison its CUDA context. Called
    while an exception is handled (as its callers do), it also clears the frames of that exception's traceback
    that hold other views of the freed tensors (a weight_loader's destination slice when Ctrl-C lands in a copy).
    """
    for model in models:
        for t in [*model.parameters(), *model.buffers()]:
            # NOTE: a storage that cannot be resized (not one the model allocated) is left to the garbage
            # collector; the error being raised matters more than this cleanup.
            with contextlib.suppress(RuntimeError):
                t.untyped_storage().resize_(0)
            t.data = torch.empty(0, dtype=t.dtype, device=t.device)
    if (exc := sys.exc_info()[1]) is not None:
        _clear_frames_holding_freed_tensors(exc)


def _clear_frames_holding_freed_tensors(exc: BaseException) -> None:
    """Clears the locals of every finished frame in ``exc``'s traceback (and those of its cause and context) that
    holds a tensor whose storage was freed: nothing can read those tensors without crashing."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        tb = exc.__traceback__
        while tb is not None:
            frame = tb.tb_frame
            values = list(frame.f_locals.values())
            values += [x for v in values if isinstance(v, (list, tuple)) for x in v]
            values += [x for v in values if isinstance(v, dict) for x in v.values()]
            if any(_is_freed(v) for v in values):
                with contextlib.suppress(RuntimeError):  # a frame still running (the caller's) cannot be cleared
                    frame.clear()
            tb = tb.tb_next
        exc = exc.__cause__ or exc.__context__


def _is_freed(v) -> bool:
    if not isinstance(v, torch.Tensor) or v.is_meta or not v.numel():
        return False
    try:
        return v.untyped_storage().nbytes() == 0
    except (RuntimeError, NotImplementedError):
        return False


@contextlib.contextmanager
def _released_on_failure(model: nn.Module) -> Iterator[None]:
    """``release_storage(model)`` when the block raises (a checkpoint error, Ctrl-C, a read error), then
    re-raises as it is: the model is allocated before the checkpoint is checked against it, and never returned
    after a failure."""
    try:
        yield
    except BaseException:
        release_storage(model)
        raise


def _loadable(model: nn.Module) -> dict[str, torch.Tensor]:
    params = dict(model.named_parameters())
    params.update({n: b for n, b in model.named_buffers() if hasattr(b, "weight_loader")})
    return params


def _parts(param: str, shape: tuple[int, ...]) -> set:
    """What a parameter needs from the checkpoint: {None}, or (expert, gate|up|down) per stacked expert."""
    if re.search(r"\.w13_weight(_packed|_scale)?$", param):
        return {(e, s) for e in range(shape[0]) for s in ("gate", "up")}
    if re.search(r"\.w2_weight(_packed|_scale)?$", param):
        return {(e, "down") for e in range(shape[0])}
    return {None}


def _expected_shape(t: Target, full: tuple[int, ...]) -> tuple[int, ...]:
    if t.kind in ("expert", "int4_shape"):
        if t.kind == "int4_shape":
            return (2,)
        return (full[1] // 2, *full[2:]) if t.shard in ("gate", "up") else tuple(full[1:])
    return tuple(full)


def _dtype_problem(info: TensorInfo, t: Target, param_dtype: torch.dtype, has_scale: bool) -> str | None:
    dt = info.dtype
    if t.kind == "int4_shape":
        ok, want = dt in ("I64", "I32"), "an integer weight_shape"
    elif t.kind == "fp8_scale":
        ok, want = dt in _FLOAT_DTYPES, "a floating-point scale"
    elif param_dtype == torch.int32:
        ok, want = dt == "I32", "int32 packed INT4 words"
    elif param_dtype == torch.int64:
        ok, want = dt in ("I64", "I32"), "integer ids"
    elif param_dtype == torch.bool:
        ok, want = dt in ("BOOL", "U8"), "a boolean mask"
    elif dt.startswith("F8_") and not has_scale:
        return f"{info.name}: {dt} weight without its {info.name}_scale_inv"
    elif dt.startswith("F8_"):
        ok, want = dt == "F8_E4M3", "float8_e4m3fn (DeepSeek-V3 block FP8)"
    else:
        ok, want = dt in _FLOAT_DTYPES, "a floating-point tensor"
    return None if ok else f"{info.name}: dtype {dt} but the model expects {want}"


def _group_hint(name: str, got: tuple[int, ...], want: tuple[int, ...]) -> str:
    """An INT4 weight_scale of another group size has the right rows and another number of groups per row."""
    if not name.endswith(".weight_scale") or len(got) != len(want) or got[:-1] != want[:-1] or not got[-1]:
        return ""
    columns = want[-1] * INT4_GROUP
    if columns % got[-1]:
        return ""
    return (f"; {got[-1]} scales per row of {columns} inputs are groups of {columns // got[-1]}, but the "
            f"quantization_config and this engine use groups of {INT4_GROUP}")


def _validate(index: CheckpointIndex, mp: _Mapping, full: dict[str, torch.Tensor], display,
              allow_missing: tuple[str, ...], what: str) -> dict[str, str]:
    """Collects every mismatch into one CheckpointError. Returns FP8 weight name -> its scale's name."""
    problems: list[str] = []
    received: dict[str, set] = {}
    fp8_scales: dict[str, str] = {}
    scale_of = {n[: -len("_scale_inv")]: n for n, t in mp.targets.items() if t.kind == "fp8_scale"}
    shape_bad, dtype_bad, orphan_scales = [], [], []
    for name, t in mp.targets.items():
        info = index.tensors[name]
        p = full[t.param]
        if t.kind == "fp8_scale":
            w = name[: -len("_scale_inv")]
            if w not in mp.targets or not index.tensors[w].dtype.startswith("F8_"):
                orphan_scales.append(name)
            elif d := _dtype_problem(info, t, p.dtype, False):
                dtype_bad.append(d)  # an integer scale would zero its weight's blocks
            continue
        has_scale = name in scale_of
        file = os.path.basename(info.file)
        d = _dtype_problem(info, t, p.dtype, has_scale)
        if d:
            dtype_bad.append(f"{d} (in {file})")
        want = _expected_shape(t, tuple(p.shape))
        if info.shape != want:
            shape_bad.append(f"{name}: checkpoint shape {list(info.shape)} but the model expects {list(want)} "
                             f"(in {file}{_group_hint(name, info.shape, want)})")
        if has_scale and info.dtype.startswith("F8_"):
            s = index.tensors[scale_of[name]]
            blocks = [math.ceil(x / FP8_BLOCK) for x in info.shape]
            if len(info.shape) != 2:
                shape_bad.append(f"{name}: FP8 block scales need a 2-D weight, got shape {list(info.shape)}")
            elif list(s.shape) != blocks:
                shape_bad.append(f"{s.name}: shape {list(s.shape)} but weight {list(info.shape)} in "
                                 f"{FP8_BLOCK}x{FP8_BLOCK} blocks needs {blocks}")
            fp8_scales[name] = scale_of[name]
        if t.kind == "int4_shape":
            continue
        got = received.setdefault(t.param, set())
        if t.kind == "expert":
            got.add((t.expert, t.shard))
        elif t.kind in ("stacked_w13", "stacked_w2"):
            got.update(_parts(t.param, tuple(p.shape)))
        else:
            got.add(None)
    missing = []
    for param, p in full.items():
        if param.startswith(allow_missing):
            continue
        need = _parts(param, tuple(p.shape)) - received.get(param, set())
        missing.extend(display(param, part) for part in sorted(need, key=str))
    if missing:
        problems.append(f"{len(missing)} missing: {_format_names(missing)}")
    if mp.unexpected:
        problems.append(f"{len(mp.unexpected)} unexpected: {_format_names(mp.unexpected)}")
    if mp.duplicates:
        problems.append(f"{len(mp.duplicates)} tensor(s) stored twice under different names: "
                        f"{_format_names(mp.duplicates, 4)}")
    if orphan_scales:
        problems.append(f"{len(orphan_scales)} weight_scale_inv without an FP8 weight: {_format_names(orphan_scales)}")
    if shape_bad:
        problems.append(f"{len(shape_bad)} shape mismatch(es): " + "; ".join(shape_bad[:6])
                        + (f" ... and {len(shape_bad) - 6} more" if len(shape_bad) > 6 else ""))
    if dtype_bad:
        problems.append(f"{len(dtype_bad)} dtype mismatch(es): " + "; ".join(dtype_bad[:6])
                        + (f" ... and {len(dtype_bad) - 6} more" if len(dtype_bad) > 6 else ""))
    if problems:
        raise CheckpointError(f"{what} checkpoint {index.path} does not match the model: " + " | ".join(problems))
    return fp8_scales


def _check_weight_shapes(index: CheckpointIndex, mp: _Mapping, full: dict[str, torch.Tensor]) -> None:
    """compressed-tensors' weight_shape holds the unpacked [out, in]: it must agree with the model and with
    the packed tensor beside it. The values are tiny, so they are read up front (one open per shard)."""
    by_file: dict[str, list[str]] = {}
    for name, t in mp.targets.items():
        if t.kind == "int4_shape":
            by_file.setdefault(index.tensors[name].file, []).append(name)
    bad = []
    for file, names in by_file.items():
        with _open_shard(file) as h:
            for name in names:
                t = mp.targets[name]
                got = [int(v) for v in h.get_tensor(name).tolist()]
                packed = tuple(full[t.param].shape)  # [E, out, in/8] at full size
                want = [packed[1] // 2 if t.shard in ("gate", "up") else packed[1], packed[2] * PACK_FACTOR]
                packed_name = name[: -len("weight_shape")] + "weight_packed"
                on_disk = index.tensors.get(packed_name)
                if got != want or (on_disk and list(on_disk.shape) != [got[0], got[1] // PACK_FACTOR]):
                    bad.append(f"{name}={got} but the model expects {want}"
                               + (f" and {packed_name} is {list(on_disk.shape)}" if on_disk else ""))
    if bad:
        raise CheckpointError(f"{len(bad)} weight_shape mismatch(es): " + "; ".join(bad[:5])
                              + (f" ... and {len(bad) - 5} more" if len(bad) > 5 else ""))


# ------------------------------------------------------------------------------------------------------
# Streaming
# ------------------------------------------------------------------------------------------------------
@contextlib.contextmanager
def _open_shard(file: str) -> Iterator:
    from safetensors import safe_open

    try:
        handle = safe_open(file, framework="pt")
    except Exception as e:  # safetensors raises its own error types for bad files
        raise CheckpointError(f"cannot read safetensors file {file}: {e}") from e
    # Leaving the handle's context unmaps the shard at once (even while a name still refers to the handle):
    # its pages stop counting against this process before the next shard is opened.
    with handle:
        yield handle


def _feed(params: dict[str, torch.Tensor], t: Target, value, name: str) -> None:
    p = params[t.param]
    if t.kind == "stacked_w13":
        half = value.shape[1] // 2
        for e in range(value.shape[0]):
            ev = value.select(e)
            p.weight_loader(p, ev.view(0, 0, half), expert=e, shard="gate", name=name)
            p.weight_loader(p, ev.view(0, half, half), expert=e, shard="up", name=name)
    elif t.kind == "stacked_w2":
        for e in range(value.shape[0]):
            p.weight_loader(p, value.select(e), expert=e, shard="down", name=name)
    elif t.kind == "expert":
        p.weight_loader(p, value, expert=t.expert, shard=t.shard, name=name)
    else:
        p.weight_loader(p, value, name=name)


def _logical_params(info: TensorInfo, t: Target) -> int:
    """Parameter count as a user counts it: packed INT4 words hold 8, scales and metadata none."""
    if t.kind in ("fp8_scale", "int4_shape") or info.name.endswith(".weight_scale"):
        return 0
    return info.numel * (PACK_FACTOR if info.name.endswith(".weight_packed") else 1)


PROGRESS_MIN_BYTES = 1 << 30


def _shows_progress(index: CheckpointIndex) -> bool:
    """A bar for loads that take a while: several shards, or one large file (a draft's single model.safetensors
    is several GB for Kimi-K2.5)."""
    return len(index.files) > 1 or index.nbytes >= PROGRESS_MIN_BYTES


def _stream(params: dict[str, torch.Tensor], index: CheckpointIndex, mp: _Mapping, fp8_scales: dict[str, str],
            what: str) -> dict:
    from tqdm import tqdm

    stats = ReadStats()
    n_tensors = n_params = 0
    tp = get_tp()
    show = _shows_progress(index) and tp.rank == 0 and logger.isEnabledFor(logging.INFO)
    t0 = time.perf_counter()
    shards = index.by_file()
    done = 0  # checkpoint bytes walked so far (what the bar and the per-shard lines count)
    with tqdm(total=index.nbytes, unit="B", unit_scale=True, desc=f"loading {what}", disable=not show) as bar:
        for i, (file, infos) in enumerate(shards.items()):
            t_shard = time.perf_counter()
            with _open_shard(file) as h:
                for info in infos:
                    beat("loading %s: shard %d/%d", what, i + 1, len(shards))  # (a TP worker's start-up bound)
                    t = mp.targets.get(info.name)
                    if t is not None and t.kind not in ("fp8_scale", "int4_shape"):
                        value = LazyTensor(h, info, stats)
                        if info.name in fp8_scales:
                            scale = _read_small(index, fp8_scales[info.name], file, h, stats)
                            value = Fp8BlockTensor(value, scale)
                        try:
                            _feed(params, t, value, info.name)
                        except (ValueError, RuntimeError, IndexError) as e:
                            raise CheckpointError(f"{what}: loading {info.name} from {file} failed: {e}") from e
                        del value
                        n_tensors += 1
                    if t is not None:
                        n_params += _logical_params(info, t)
                    bar.update(info.nbytes)
            shard_bytes = sum(info.nbytes for info in infos)
            done += shard_bytes
            if show:
                # The bar lives on a terminal; a server's log file only sees these lines (one per shard: about
                # 60 for Kimi-K2.5, cheap).
                now = time.perf_counter()
                rate = done / max(now - t0, 1e-9)
                logger.info("loading %s: shard %d/%d %s done (%s in %.1f s); %s of %s (%.0f%%), %s/s, about %s "
                            "left", what, i + 1, len(shards), os.path.basename(file), _human(shard_bytes, "B"),
                            now - t_shard, _human(done, "B"), _human(index.nbytes, "B"),
                            100.0 * done / max(index.nbytes, 1), _human(rate, "B"),
                            duration((index.nbytes - done) / max(rate, 1e-9)))
    return {"tensors": n_tensors, "parameters": n_params, "bytes_read": stats.bytes_read,
            "stream_seconds": time.perf_counter() - t0, "shards": len(index.files)}


@torch.no_grad()
def _check_finite(params: dict[str, torch.Tensor], index: CheckpointIndex, mp: _Mapping,
                  fp8_scales: dict[str, str], what: str) -> None:
    """Refuses a model whose loaded weights hold NaN or infinity: a corrupt shard, a NaN FP8 or INT4 scale, or
    bf16 values beyond the range of a float16 model would otherwise serve garbage without an error.

    One read of each floating-point parameter (aminmax carries a NaN through and shows an infinity as an end)
    and one host sync for all of them; only on failure is the checkpoint read again to say which tensors hold
    the values and whether they are stored so or overflow the model's dtype."""
    fed = sorted({t.param for t in mp.targets.values() if t.kind not in ("fp8_scale", "int4_shape")})
    floats = [(n, params[n]) for n in fed if params[n].is_floating_point() and params[n].numel()]
    if not floats:
        return
    ends = torch.stack([torch.stack(torch.aminmax(p.detach().reshape(-1))).float() for _, p in floats])  # [P, 2]
    ok = torch.isfinite(ends).all(dim=1).tolist()
    bad = [(n, p) for (n, p), good in zip(floats, ok, strict=True) if not good]
    if not bad:
        return
    lines, overflow, stored_bad = [], False, False
    for param, p in bad[:4]:
        count = int((~torch.isfinite(p)).sum())
        sources = []
        for name, t in mp.targets.items():
            if t.param != param or t.kind in ("fp8_scale", "int4_shape"):
                continue
            region = p
            if t.kind == "expert":
                region = p[t.expert]
                if t.shard in ("gate", "up"):
                    half = p.shape[1] // 2
                    region = region[:half] if t.shard == "gate" else region[half:]
            if not bool(torch.isfinite(region).all()):
                sources.append(name)
        described = []
        for name in sources[:3]:
            stored, scale_bad = _stored_nonfinite(index, name), 0
            if name in fp8_scales:
                scale_bad = _stored_nonfinite(index, fp8_scales[name])
            file = os.path.basename(index.tensors[name].file)
            stored_bad |= bool(scale_bad or stored)
            if scale_bad:
                scale_file = os.path.basename(index.tensors[fp8_scales[name]].file)
                described.append(f"{fp8_scales[name]} in {scale_file} holds {scale_bad} NaN/inf scale(s)")
            elif stored:
                described.append(f"{name} in {file} stores {stored} NaN/inf value(s)")
            else:
                overflow = True
                described.append(f"{name} in {file} is finite as stored but overflows {p.dtype}")
        more = f" and {len(sources) - 3} more" if len(sources) > 3 else ""
        lines.append(f"{param}: {count} of {p.numel()} values ({'; '.join(described)}{more})")
    hints = [h for h, on in (("fetch the shards named again, or ask the publisher for a checkpoint without them",
                              stored_bad or not overflow),
                             ("load in a dtype with their range (bfloat16)", overflow)) if on]
    raise CheckpointError(f"{what} checkpoint {index.path}: {len(bad)} parameter(s) hold NaN or infinite values after "
                          f"loading, so every output would be garbage: {' | '.join(lines)}"
                          + (f" ... and {len(bad) - 4} more" if len(bad) > 4 else "") + f"; {'; '.join(hints)}")


def _stored_nonfinite(index: CheckpointIndex, name: str, chunk: int = 1 << 24) -> int:
    """How many NaN / inf values a checkpoint tensor stores (read in chunks of rows: no full float32 copy)."""
    info = index.tensors[name]
    if info.dtype not in _FLOAT_DTYPES and not info.dtype.startswith("F8_"):
        return 0
    with _open_shard(info.file) as h:
        t = h.get_tensor(name).reshape(-1)
        return sum(int((~torch.isfinite(t[i: i + chunk].float())).sum()) for i in range(0, t.numel(), chunk))


def _read_small(index: CheckpointIndex, name: str, open_file: str, open_handle, stats: ReadStats) -> torch.Tensor:
    """A small tensor (an FP8 scale) from the open shard, or from its own shard opened briefly; copied out so
    that nothing keeps a shard mapped after the loader closes it."""
    info = index.tensors[name]
    if info.file == open_file:
        t = open_handle.get_tensor(name).clone()
    else:
        with _open_shard(info.file) as h:
            t = h.get_tensor(name).clone()
    stats.bytes_read += info.nbytes
    return t


def _log_skipped(mp: _Mapping, what: str) -> None:
    if not mp.skipped:
        return
    by_reason = Counter(mp.skipped.values())
    for reason, n in by_reason.items():
        examples = [k for k, v in mp.skipped.items() if v == reason]
        logger.info("%s: skipped %d tensor(s): %s (%s)", what, n, reason, _format_names(examples, 2))


def _human(n: float, unit: str = "") -> str:
    for scale, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "K")):
        if n >= scale:
            return f"{n / scale:.2f} {suffix}{unit}"
    return f"{n:.0f} {unit}".rstrip()


def _summary(what: str, path: str, info: dict, extra: str) -> None:
    tp = get_tp()
    rank = f" as TP rank {tp.rank} of {tp.size}" if tp.size > 1 else ""
    secs = max(info["seconds"], 1e-9)
    logger.info("%s loaded from %s%s: %d tensors, %s parameters, %s read from %d shard(s) in %.2f s (%s/s); %s",
                what, path, rank, info["tensors"], _human(info["parameters"]), _human(info["bytes_read"], "B"),
                info["shards"], info["seconds"], _human(info["bytes_read"] / secs, "B"), extra)


# ------------------------------------------------------------------------------------------------------
# Entry points
# ------------------------------------------------------------------------------------------------------
def load_target(path: str, *, device="cpu", dtype=torch.bfloat16, report: dict | None = None
                ) -> DeepseekV3ForCausalLM:
    """Loads a DeepSeek-V3-family target (DeepSeek-V3/R1, Kimi-K2/K2.5) as this process's TP rank.

    Raises ConfigError (config.json) or CheckpointError (tensors, files, quantization) naming what is wrong;
    nothing is returned half-loaded. The model is built directly on ``device``. ``report``, when given, is
    filled with tensors / parameters / bytes_read / seconds / stream_seconds / shards / quantization.
    """
    t0 = time.perf_counter()
    cfg = ModelConfig.from_path(path)
    index = CheckpointIndex.scan(path)
    names = _TargetNames(cfg)
    if names.prefix and not any(n.startswith(names.prefix) for n in index.tensors):
        raise CheckpointError(f"{path}: config.json nests the language model under text_config (Kimi-K2.5 layout), "
                              f"so its tensors should be named {names.prefix!r}..., but none of the "
                              f"{len(index.tensors)} are (e.g. {_format_names(index.tensors, 2)})")
    plan = plan_quantization(cfg, index, names)
    model, skeleton = _build(lambda: DeepseekV3ForCausalLM(cfg, dtype=dtype, int4_experts=plan.int4_experts),
                             device)
    with _released_on_failure(model):
        full = _loadable(skeleton)
        mp = _map_checkpoint(index, names.canonical, names.target, full)
        allow = ("lm_head.",) if cfg.tie_word_embeddings else ()
        fp8_scales = _validate(index, mp, full, names.display, allow, "target")
        if plan.int4_experts:
            _check_weight_shapes(index, mp, full)
        del skeleton, full
        info = _stream(_loadable(model), index, mp, fp8_scales, "target")
        _check_finite(_loadable(model), index, mp, fp8_scales, "target")
    if cfg.tie_word_embeddings:
        if any(t.param == "lm_head.weight" for t in mp.targets.values()):
            logger.warning("%s: tie_word_embeddings is true, so the stored lm_head.weight is not used (the head is "
                           "the embedding, as transformers ties it); set it false in config.json to use it", path)
        model.lm_head.weight = model.model.embed_tokens.weight
    info["seconds"] = time.perf_counter() - t0
    _log_skipped(mp, "target")
    _summary("target", path, info, plan.describe())
    if report is not None:
        report.update(info, quantization=plan.describe(), skipped=len(mp.skipped))
    return model


@dataclass
class DraftCheck:
    """What ``check_draft`` found: the draft's config, its tensors by name, and which optional ones it ships."""

    config: DraftConfig
    index: CheckpointIndex
    has_head: bool
    has_d2t: bool
    has_t2d: bool


def check_draft(path: str, target_cfg: ModelConfig) -> DraftCheck:
    """Everything about an EAGLE-3 draft that config.json and the shard headers can tell, against its target.

    The engine runs this before it loads the target: a draft that cannot fit must not cost a full target load
    (minutes for Kimi-K2.5) before it says so. Reads no weight.
    """
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
    raw_cfg = load_json(path)
    if raw_cfg.get("quantization_config"):
        q = raw_cfg["quantization_config"]
        method = q.get("quant_method") if isinstance(q, dict) else q
        raise CheckpointError(f"draft quantization {method!r} is not supported; {_SUPPORTED} (targets only)")
    index = CheckpointIndex.scan(path)
    canon = {n: _draft_name(n)[0] for n in index.tensors}
    has_head = "lm_head.weight" in canon.values()
    has_d2t, has_t2d = "d2t" in canon.values(), "t2d" in canon.values()
    if not has_head and dcfg.draft_vocab_size != dcfg.vocab_size:
        raise ConfigError(f"draft has no lm_head.weight, so it uses the target's head over the full vocab, but "
                          f"draft_vocab_size={dcfg.draft_vocab_size} != vocab_size={dcfg.vocab_size}")
    if not has_d2t and dcfg.draft_vocab_size != dcfg.vocab_size:
        raise CheckpointError(f"draft {path} has draft_vocab_size={dcfg.draft_vocab_size} < vocab_size="
                              f"{dcfg.vocab_size} but no d2t tensor mapping draft ids to target ids")
    return DraftCheck(dcfg, index, has_head, has_d2t, has_t2d)


def load_draft(path: str, target_cfg: ModelConfig, *, device="cpu", dtype=torch.bfloat16,
               report: dict | None = None) -> Eagle3Draft:
    """Loads an EAGLE-3 draft head for ``target_cfg`` as this process's TP rank.

    A draft without ``lm_head.weight`` uses the target's head (its draft vocab must then be the full vocab);
    a draft without ``d2t`` must have draft_vocab_size == vocab_size; a missing ``t2d`` is rebuilt from d2t.
    """
    t0 = time.perf_counter()
    chk = check_draft(path, target_cfg)
    dcfg, index = chk.config, chk.index
    model, skeleton = _build(lambda: Eagle3Draft(dcfg, dtype=dtype, has_lm_head=chk.has_head), device)
    with _released_on_failure(model):
        full = _loadable(skeleton)
        mp = _map_checkpoint(index, _draft_name, Target, full)
        allow = tuple(n for n, present in (("d2t", chk.has_d2t), ("t2d", chk.has_t2d)) if not present)
        _validate(index, mp, full, lambda p, part: p, allow, "draft")
        del skeleton, full
        # The vocabulary map is checked before the weights stream in, as every other check (the two tensors
        # are a few hundred KB).
        t2d_mask = _check_vocab_map(index, mp, dcfg, path)
        info = _stream(_loadable(model), index, mp, {}, "draft")
        _check_finite(_loadable(model), index, mp, {}, "draft")
    if not chk.has_t2d:
        model.t2d.copy_(t2d_mask)
    info["seconds"] = time.perf_counter() - t0
    _log_skipped(mp, "draft")
    written = list(dcfg.aux_layer_ids) if dcfg.aux_layer_ids is not None else "absent"
    try:
        aux = resolve_aux_layer_ids(dcfg, target_cfg.num_hidden_layers)
        wiring = f"aux ids as written {written} -> residual streams entering target layers {list(aux)} (DeepSeek rule)"
    except ConfigError as e:
        # Not fatal here: the engine applies an explicit speculative_aux_layer_ids override, or raises this.
        aux, wiring = None, f"aux ids as written {written} do not fit this target ({e})"
    _summary("draft", path, info,
             f"{'own lm_head' if chk.has_head else 'no lm_head: uses the target head'}, draft vocab "
             f"{dcfg.draft_vocab_size}/{dcfg.vocab_size}; {wiring}")
    if report is not None:
        report.update(info, has_lm_head=chk.has_head, aux_layer_ids=aux, skipped=len(mp.skipped))
    return model


def _absolute_d2t_hint(d2t: torch.Tensor, cfg: DraftConfig) -> str:
    """Some exports store d2t as the target ids themselves; EAGLE-3 (and SGLang) store offsets."""
    if int(d2t.min()) >= 0 and int(d2t.max()) < cfg.vocab_size and len(torch.unique(d2t)) == len(d2t):
        return ("; read as target ids themselves, d2t would be a valid one-to-one map: if it was exported so, store "
                "offsets instead (d2t[i] = target_id - i), as EAGLE-3 and SGLang read it")
    return ""


@torch.no_grad()
def _check_vocab_map(index: CheckpointIndex, mp: _Mapping, cfg: DraftConfig, path: str) -> torch.Tensor:
    """d2t must map the draft vocab one to one into the target vocab; t2d (unused at run time, but shipped)
    must mark exactly those target ids. Returns that mask (the t2d to use when the checkpoint has none)."""
    stored = {t.param: n for n, t in mp.targets.items() if t.param in ("d2t", "t2d")}
    read: dict[str, torch.Tensor] = {}
    for param, name in stored.items():
        with _open_shard(index.tensors[name].file) as h:
            read[param] = h.get_tensor(name)
    where = {p: f"{p} ({os.path.basename(index.tensors[n].file)})" for p, n in stored.items()}
    d2t = read.get("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.int64)).long()
    target_ids = torch.arange(cfg.draft_vocab_size) + d2t
    outside = ((target_ids < 0) | (target_ids >= cfg.vocab_size)).nonzero().flatten()
    if len(outside):
        i = int(outside[0])
        raise CheckpointError(f"draft {path}: {where.get('d2t', 'd2t')} maps draft ids to target ids "
                              f"{int(target_ids.min())}..{int(target_ids.max())}, outside the target vocab "
                              f"[0, {cfg.vocab_size}): {len(outside)} draft id(s), e.g. draft id {i} (d2t[{i}] = "
                              f"{int(d2t[i])}) -> target id {int(target_ids[i])}{_absolute_d2t_hint(d2t, cfg)}")
    mask = torch.zeros(cfg.vocab_size, dtype=torch.bool)
    mask[target_ids] = True
    if int(mask.sum()) != cfg.draft_vocab_size:
        ids, counts = torch.unique(target_ids, return_counts=True)
        dup = int(ids[counts > 1][0])
        drafts = (target_ids == dup).nonzero().flatten().tolist()
        raise CheckpointError(f"draft {path}: {where.get('d2t', 'd2t')} maps the {cfg.draft_vocab_size} draft ids onto "
                              f"only {int(mask.sum())} distinct target ids (e.g. target id {dup} "
                              f"{int(counts[counts > 1][0])} times, from draft ids {drafts[:4]}); a draft id's token "
                              "would be ambiguous")
    if "t2d" in read and not torch.equal(mask, read["t2d"].bool()):
        t2d = read["t2d"].bool()
        only_t2d = (t2d & ~mask).nonzero().flatten()
        only_d2t = (mask & ~t2d).nonzero().flatten()
        example = (f"target id {int(only_t2d[0])} is marked in t2d but no draft id maps to it" if len(only_t2d) else
                   f"draft id {int((target_ids == only_d2t[0]).nonzero()[0])} maps to target id {int(only_d2t[0])}, "
                   "which t2d does not mark")
        raise CheckpointError(f"draft {path}: t2d marks {int(t2d.sum())} target ids but d2t maps to {int(mask.sum())}, "
                              f"and {len(only_t2d) + len(only_d2t)} target id(s) are in one but not the other (e.g. "
                              f"{example}; {where['t2d']}, {where.get('d2t', 'd2t')}); the two tensors come from "
                              "different vocabularies")
    return mask


# ------------------------------------------------------------------------------------------------------
# Writing (tests, the embedded model, the draft trainer)
# ------------------------------------------------------------------------------------------------------
def hf_state_dict(model: DeepseekV3ForCausalLM) -> dict[str, torch.Tensor]:
    """Our parameters in Hugging Face's on-disk names (per-expert tensors; packed INT4 experts with their
    compressed-tensors ``weight_shape``). TP=1 models only."""
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
                parts = {"gate_proj": p[e, :half], "up_proj": p[e, half:]}
            else:
                parts = {"down_proj": p[e]}
            for proj, v in parts.items():
                out[f"{base}.{e}.{proj}.{what}"] = v
                if what == "weight_packed":
                    out[f"{base}.{e}.{proj}.weight_shape"] = torch.tensor([v.shape[0], v.shape[1] * PACK_FACTOR])
    if model.config.tie_word_embeddings:
        out.pop("lm_head.weight", None)
    return out


def save_hf(model: nn.Module, path: str, config: dict | None = None, max_shard_bytes: int | None = None,
            prefix: str = "") -> None:
    """Writes config.json + safetensors (sharded with an index when max_shard_bytes is given)."""
    if isinstance(model, DeepseekV3ForCausalLM):
        sd = hf_state_dict(model)
        config = config or model.config.to_hf()
    else:
        sd = dict(model.state_dict())
        if getattr(model, "lm_head", None) is None:
            sd.pop("lm_head.weight", None)
        config = config or model.config.to_hf()
    sd = {prefix + k: v.detach().contiguous().cpu() for k, v in sd.items()}
    write_safetensors(sd, path, config, max_shard_bytes)


def write_safetensors(sd: dict[str, torch.Tensor], path: str, config: dict,
                      max_shard_bytes: int | None = None) -> None:
    """config.json + one model.safetensors, or shards of at most max_shard_bytes with an index."""
    from safetensors.torch import save_file

    os.makedirs(path, exist_ok=True)
    config_file = os.path.join(path, "config.json")
    with open(config_file, "w") as f:
        json.dump(config, f, indent=2)

    def save(tensors: dict[str, torch.Tensor], name: str) -> None:
        file = os.path.join(path, name)
        save_file(tensors, file)
        # NOTE: safetensors (0.8) writes through a private temporary file, mode 0600; give the weights the mode
        # config.json got from the umask, so a server running as another user can read what a trainer wrote.
        shutil.copymode(config_file, file)

    if not max_shard_bytes:
        save(sd, "model.safetensors")
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
        save(shard, fname)
        weight_map.update({k: fname for k in shard})
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f, indent=1)
