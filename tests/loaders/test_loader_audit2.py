"""A second user's audit of the loaders with real, imperfect checkpoint directories: headers that safetensors
itself would refuse only once the weights stream, shards that did not download (no index to say so), Hugging Face
cache snapshots copied without their blobs, files the process may not read, indexes that name shards in a
subfolder or nothing at all, NaN / infinite weights (a corrupt shard, a NaN FP8 or INT4 scale, bf16 values beyond
a float16 model's range), INT4 scales of another group size, and drafts whose d2t / t2d disagree. Each must give
one error naming the file, the tensor and the value, before the weights are read where the headers can tell,
and give the model's memory back where they cannot."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import tempfile
import time

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from sglang_eagle3.kernels.quant import FP8_BLOCK
from sglang_eagle3.models import loader
from sglang_eagle3.models.loader import CheckpointError, hf_state_dict, load_draft, load_target
from sglang_eagle3.testing import tiny_draft_config
from tests.loaders import test_audit
from tests.loaders.ckpt import (
    edit_checkpoint,
    fp8_config,
    int4_config,
    plain_model,
    write_deepseek_fp8,
    write_kimi_int4,
    write_sharded,
)
from tests.loaders.test_audit import held_bytes
from tests.loaders.test_drafts import write_draft
from tests.loaders.test_layouts import assert_same_logits

built = test_audit.built  # the fixture: every model the loader allocates


@pytest.fixture(scope="module")
def bases(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("bases2"))
    cfg = int4_config()
    ref = plain_model(cfg, seed=0)
    plain = os.path.join(root, "plain")
    write_sharded(hf_state_dict(ref), plain, cfg.to_hf(), 3)
    kimi, kimi_ref = write_kimi_int4(root, cfg, seed=1)
    fp8, fp8_ref = write_deepseek_fp8(root, fp8_config(), seed=2)
    return {"plain": (plain, cfg, ref), "kimi": (kimi, cfg, kimi_ref), "fp8": (fp8, fp8_config(), fp8_ref)}


@pytest.fixture
def copy(bases, tmp_path):
    def make(kind: str) -> str:
        dst = str(tmp_path / kind)
        shutil.copytree(bases[kind][0], dst, symlinks=True)
        return dst

    return make


@pytest.fixture
def no_stream(monkeypatch):
    def stream_must_not_run(*a, **k):
        raise AssertionError("the loader started reading weights before validating the checkpoint")

    monkeypatch.setattr(loader, "_stream", stream_must_not_run)


def shards(path: str) -> list[str]:
    return sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))


def shard_of(path: str, name: str) -> str:
    return next(f for f in shards(path) if name in load_file(os.path.join(path, f)))


def stored(path: str, name: str) -> torch.Tensor:
    return load_file(os.path.join(path, shard_of(path, name)))[name]


def refused(fn, exc=CheckpointError) -> str:
    with pytest.raises(exc) as info:
        fn()
    return str(info.value)


# --- headers: exactly what safetensors accepts, checked before any weight is read -------------------------------
def _write_raw(file: str, header: dict, data_size: int) -> None:
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(file, "wb") as f:
        f.write(len(raw).to_bytes(8, "little") + raw + bytes(data_size))


_ONE = {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}


@pytest.mark.parametrize("header", [
    {"a": {**_ONE, "shape": [-2, -2]}},  # a product that holds the right bytes, from negative sizes
    {"a": {**_ONE, "shape": [2.0, 2]}},
    {"a": {**_ONE, "shape": ["2", 2]}},
    {"a": {**_ONE, "shape": [True, 4]}},
    {"a": {**_ONE, "data_offsets": [0.0, 16.0]}},
    {"a": {**_ONE, "data_offsets": [0, 16, 16]}},
    {"__metadata__": {"format": 1}, "a": _ONE},
    {"__metadata__": ["pt"], "a": _ONE},
    # accepted by both
    {"__metadata__": None, "a": _ONE},
    {"__metadata__": {"format": "pt"}, "a": _ONE},
    {"a": {**_ONE, "extra": 1}},
    {"a": {"dtype": "F32", "shape": [], "data_offsets": [0, 4]}, "b": {"dtype": "F32", "shape": [3],
                                                                       "data_offsets": [4, 16]}},
    {"a": {"dtype": "F32", "shape": [0, 4], "data_offsets": [0, 0]}, "b": _ONE},
], ids=lambda h: json.dumps(h)[:60])
def test_header_types_agree_with_safetensors(tmp_path, header):
    """read_header refuses exactly the headers safetensors' own reader refuses (which it would do only when the
    shard is opened to stream, after the model was allocated and the shards before it were read)."""
    f = str(tmp_path / "x.safetensors")
    data_size = max(e["data_offsets"][-1] for k, e in header.items() if k != "__metadata__")
    _write_raw(f, header, int(data_size))
    try:
        with safe_open(f, framework="pt") as h:
            for k in h.keys():
                h.get_tensor(k)
        refused_by_safetensors = False
    except Exception:
        refused_by_safetensors = True
    try:
        loader.read_header(f)
        refused_here = False
    except CheckpointError as e:
        refused_here = True
        assert "x.safetensors" in str(e)
    assert refused_here == refused_by_safetensors, header


def _rewrite_header(file: str, edit) -> None:
    """Edits a real shard's JSON header in place (data section untouched)."""
    with open(file, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        data = f.read()
    edit(header)
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(file, "wb") as f:
        f.write(len(raw).to_bytes(8, "little") + raw + data)


def test_float_size_in_a_real_shard_is_refused_before_reading(copy, no_stream):
    path = copy("plain")
    name = "model.layers.1.self_attn.o_proj.weight"
    shard = shard_of(path, name)

    def lie(h):
        h[name]["shape"] = [float(d) for d in h[name]["shape"]]

    _rewrite_header(os.path.join(path, shard), lie)
    msg = refused(lambda: load_target(path, dtype=torch.float32))
    assert shard in msg and repr(name) in msg and "corrupt header entry" in msg, msg


# --- shards that are not there -------------------------------------------------------------------------------------
def test_missing_shard_without_index_is_named(copy, no_stream):
    """Without model.safetensors.index.json a shard that never downloaded was only a list of missing tensors;
    the Hub's shard names say which file it is."""
    path = copy("plain")
    os.remove(os.path.join(path, "model.safetensors.index.json"))
    os.remove(os.path.join(path, "model-00002-of-00003.safetensors"))
    msg = refused(lambda: load_target(path, dtype=torch.float32))
    assert "2 of the 3 shards" in msg and "missing: model-00002-of-00003.safetensors" in msg, msg


def test_complete_shard_sets_without_index_load(bases, tmp_path):
    """The shard-count check sees only what is missing: shards numbered from 0 (all present) still load."""
    _, cfg, ref = bases["plain"]
    sd = hf_state_dict(ref)
    keys = list(sd)
    path = str(tmp_path / "zero_based")
    os.makedirs(path)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg.to_hf(), f)
    for i in range(2):
        part = {k: sd[k].contiguous() for k in keys[i::2]}
        save_file(part, os.path.join(path, f"model-{i:05d}-of-00002.safetensors"))
    assert_same_logits(load_target(path, dtype=torch.float32), ref, cfg.vocab_size)


@pytest.mark.parametrize("with_index", [True, False])
def test_dangling_symlink_names_its_target(copy, no_stream, with_index):
    """A Hugging Face cache snapshot holds symlinks into ../../blobs; copied without -L (or with a blob deleted)
    they point nowhere: `ls` shows the shard, the loader said it was missing or raised FileNotFoundError."""
    path = copy("plain")
    if not with_index:
        os.remove(os.path.join(path, "model.safetensors.index.json"))
    shard = os.path.join(path, "model-00002-of-00003.safetensors")
    os.remove(shard)
    os.symlink("../../blobs/0123abcd", shard)
    msg = refused(lambda: load_target(path, dtype=torch.float32))
    assert shard in msg and "symbolic link to '../../blobs/0123abcd', which does not exist" in msg, msg


def test_hub_cache_snapshot_of_symlinks_loads(bases, tmp_path):
    """Every file a relative symlink into a blobs/ folder, as huggingface_hub's cache lays a snapshot out."""
    src, cfg, ref = bases["plain"]
    blobs, snap = tmp_path / "blobs", tmp_path / "snapshots" / "abc123"
    blobs.mkdir()
    snap.mkdir(parents=True)
    for i, f in enumerate(sorted(os.listdir(src))):
        shutil.copy(os.path.join(src, f), blobs / f"blob{i}")
        os.symlink(os.path.relpath(blobs / f"blob{i}", snap), snap / f)
    assert_same_logits(load_target(str(snap), dtype=torch.float32), ref, cfg.vocab_size)


# --- forked children ------------------------------------------------------------------------------------------------
CHILD_TIMEOUT_S = 120.0


def _fork() -> int:
    """os.fork(), with the child on one intra-op thread: GNU OpenMP's thread pool does not survive a fork, so a child
    of a process that already ran a parallel region (any earlier test with a big enough tensor) hangs in its first
    parallel op (CI's full run hung here for 600 s twice); one thread runs inline, as DataLoader's workers do."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        torch.set_num_threads(1)
    return pid


def _wait(pid: int) -> int:
    """The child's wait status; a child still running after CHILD_TIMEOUT_S is killed and the test fails saying so."""
    deadline = time.monotonic() + CHILD_TIMEOUT_S
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail(f"forked child {pid} still ran after {CHILD_TIMEOUT_S:.0f} s: killed (a hang, not a result)")
        time.sleep(0.05)


# --- files the process may not read ----------------------------------------------------------------------------------
def _as_unprivileged(fn) -> tuple[str, str]:
    """(exception type, message) of fn() run as a user without root's override of file permissions: in this
    process when it is not root, else in a forked child that switches to nobody (65534)."""
    if os.geteuid() != 0:
        try:
            fn()
            return "", ""
        except Exception as e:
            return type(e).__name__, str(e)
    r, w = os.pipe()
    pid = _fork()
    if pid == 0:  # pragma: no cover - the child's result travels through the pipe
        os.close(r)
        try:
            os.setgid(65534)
            os.setuid(65534)
        except OSError as e:
            os.write(w, json.dumps(["skip", str(e)]).encode())
            os._exit(0)
        try:
            fn()
            out = ["", ""]
        except BaseException as e:
            out = [type(e).__name__, str(e)]
        os.write(w, json.dumps(out).encode())
        os._exit(0)
    os.close(w)
    chunks = []
    while chunk := os.read(r, 65536):
        chunks.append(chunk)
    os.close(r)
    _wait(pid)
    kind, msg = json.loads(b"".join(chunks))
    if kind == "skip":
        pytest.skip(f"cannot drop root to test permissions: {msg}")
    return kind, msg


@pytest.fixture
def shared_copy(bases):
    """A copy of the plain checkpoint in a folder every user may enter (pytest's tmp_path is root's alone)."""
    root = tempfile.mkdtemp(prefix="loader_audit2_")
    os.chmod(root, 0o755)
    path = os.path.join(root, "plain")
    shutil.copytree(bases["plain"][0], path)
    for dirpath, _, files in os.walk(root):
        os.chmod(dirpath, 0o755)
        for f in files:
            os.chmod(os.path.join(dirpath, f), 0o644)
    load_target(path, dtype=torch.float32)  # every module the load imports lazily, imported before dropping root
    yield path
    for dirpath, _, _ in os.walk(root):
        os.chmod(dirpath, 0o755)
    shutil.rmtree(root)


@pytest.mark.parametrize("what", ["shard", "index", "directory listing"])
def test_unreadable_files_are_named(shared_copy, no_stream, what):
    path = shared_copy
    # Modes no one but root may read through (the owner included, for a run that is not root).
    if what == "shard":
        target = os.path.join(path, "model-00002-of-00003.safetensors")
        os.chmod(target, 0o000)
    elif what == "index":
        target = os.path.join(path, "model.safetensors.index.json")
        os.chmod(target, 0o000)
    else:  # searchable (config.json opens) but not listable, and no index to name the shards
        target = path
        os.remove(os.path.join(path, "model.safetensors.index.json"))
        os.chmod(path, 0o311)
    kind, msg = _as_unprivileged(lambda: load_target(path, dtype=torch.float32))
    assert kind == "CheckpointError" and f"cannot read {target}: permission denied" in msg, (kind, msg)


# --- indexes ------------------------------------------------------------------------------------------------------
def test_index_naming_shards_in_a_subfolder_loads(bases, copy):
    """transformers joins the folder with each weight_map entry, so an index may name 'weights/model-...'; the
    index check compared bare file names and refused every tensor as misplaced."""
    _, cfg, ref = bases["plain"]
    path = copy("plain")
    os.makedirs(os.path.join(path, "weights"))
    index = os.path.join(path, "model.safetensors.index.json")
    data = json.load(open(index))
    for f in shards(path):
        shutil.move(os.path.join(path, f), os.path.join(path, "weights", f))
    data["weight_map"] = {k: f"weights/{v}" for k, v in data["weight_map"].items()}
    json.dump(data, open(index, "w"))
    assert_same_logits(load_target(path, dtype=torch.float32), ref, cfg.vocab_size)
    # ... and a tensor listed under the wrong one is still refused, named as the index names it
    data["weight_map"]["model.norm.weight"] = "weights/model-00001-of-00003.safetensors"
    json.dump(data, open(index, "w"))
    msg = refused(lambda: load_target(path, dtype=torch.float32))
    assert "'model.norm.weight' is listed under weights/model-00001-of-00003.safetensors but is in weights/" in msg


def test_empty_index_is_named(copy, no_stream):
    path = copy("plain")
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": {}}, f)
    msg = refused(lambda: load_target(path, dtype=torch.float32))
    assert "model.safetensors.index.json names no tensors" in msg and "missing" not in msg, msg


def test_path_to_config_json_names_its_directory(bases, draft):
    path, cfg, _ = bases["plain"]
    msg = refused(lambda: load_target(os.path.join(path, "config.json")))
    assert f"is not a directory; pass the directory that holds it, {path!r}" in msg, msg
    _, draft_path, _ = draft
    msg = refused(lambda: load_draft(os.path.join(draft_path, "config.json"), cfg))
    assert f"is not a directory; pass the directory that holds it, {draft_path!r}" in msg, msg


# --- NaN and infinity: refused, named, and the model's memory given back ----------------------------------------------
def _set_value(name: str, index: tuple, value: float):
    def edit(sd, f):
        if name in sd:
            t = sd[name].clone()
            t[index] = value
            sd[name] = t
        return sd

    return edit


def test_nan_fp8_scale_is_named_and_releases_memory(copy, built):
    """A NaN weight_scale_inv turns its 128x128 block of the dequantised weight into NaN."""
    path = copy("fp8")
    weight = "model.layers.0.mlp.gate_proj.weight"
    edit_checkpoint(path, _set_value(weight + "_scale_inv", (0, 0), float("nan")))
    shape = stored(path, weight).shape
    block = min(FP8_BLOCK, shape[0]) * min(FP8_BLOCK, shape[1])  # the scale's block, cut by the weight's edges
    scale_shard = shard_of(path, weight + "_scale_inv")
    msg = refused(lambda: load_target(path, dtype=torch.float32))
    assert f"{weight}: {block} of {math.prod(shape)} values" in msg, msg
    assert f"{weight}_scale_inv in {scale_shard} holds 1 NaN/inf scale(s)" in msg, msg
    assert len(built) == 1 and held_bytes(built[0]) == 0


def test_nan_int4_scale_is_named(copy):
    path = copy("kimi")
    name = "language_model.model.layers.1.mlp.experts.2.up_proj.weight_scale"
    edit_checkpoint(path, _set_value(name, (3, 1), float("nan")))
    shard = shard_of(path, name)
    msg = refused(lambda: load_target(path, dtype=torch.float32))
    assert "model.layers.1.mlp.experts.w13_weight_scale: 1 of" in msg and f"{name} in {shard} stores 1" in msg, msg


def test_inf_in_a_bf16_weight_is_named(copy):
    path = copy("plain")
    name = "model.layers.2.self_attn.kv_b_proj.weight"
    edit_checkpoint(path, _set_value(name, (0, 0), float("inf")))
    msg = refused(lambda: load_target(path, dtype=torch.float32))
    assert f"{name}: 1 of" in msg and f"{name} in " in msg and "stores 1 NaN/inf value(s)" in msg, msg
    assert "fetch the shards named again" in msg


def test_bf16_values_beyond_float16_are_named(copy):
    """Finite as stored (bf16 reaches 3e38), infinite in a float16 model: the message says which, and what to do."""
    path = copy("plain")
    name = "model.embed_tokens.weight"
    big = 1e5
    assert not math.isfinite(torch.tensor(big).half().item()) and math.isfinite(torch.tensor(big).bfloat16().item())
    edit_checkpoint(path, _set_value(name, (5, 7), big))
    msg = refused(lambda: load_target(path, dtype=torch.float16))
    assert f"{name}: 1 of" in msg and "is finite as stored but overflows torch.float16" in msg, msg
    assert "load in a dtype with their range (bfloat16)" in msg
    assert load_target(path, dtype=torch.bfloat16).model.embed_tokens.weight[5, 7].item() == pytest.approx(big, 0.01)


# --- messages that name the file and the value ------------------------------------------------------------------------
def test_int4_scales_of_another_group_size_say_so(copy, no_stream):
    """Scales of groups of 64 under a config that says 32: the shape mismatch says which group size they are."""
    path = copy("kimi")
    name = "language_model.model.layers.1.mlp.experts.0.down_proj.weight_scale"

    def regroup(sd, f):
        if name in sd:
            sd[name] = sd[name][:, ::2].contiguous()
        return sd

    edit_checkpoint(path, regroup)
    shard = shard_of(path, name)
    rows, in_features = stored(path, name.replace("weight_scale", "weight_shape")).tolist()
    got = in_features // 32 // 2
    msg = refused(lambda: load_target(path, dtype=torch.float32))
    assert (f"{name}: checkpoint shape [{rows}, {got}] but the model expects [{rows}, {in_features // 32}] "
            f"(in {shard}; {got} scales per row of {in_features} inputs are groups of {in_features // got}") in msg, msg


def test_shape_and_dtype_mismatches_name_the_shard(copy, no_stream):
    path = copy("plain")
    shape_bad, dtype_bad = "model.layers.1.self_attn.o_proj.weight", "model.norm.weight"

    def edit(sd, f):
        if shape_bad in sd:
            sd[shape_bad] = torch.zeros(64, 8)
        if dtype_bad in sd:
            sd[dtype_bad] = torch.ones(64, dtype=torch.int32)
        return sd

    edit_checkpoint(path, edit)
    where = {n: shard_of(path, n) for n in (shape_bad, dtype_bad)}
    msg = refused(lambda: load_target(path, dtype=torch.float32))
    assert f"{shape_bad}: checkpoint shape [64, 8] but the model expects [64, 16] (in {where[shape_bad]})" in msg, msg
    assert f"{dtype_bad}: dtype I32 but the model expects a floating-point tensor (in {where[dtype_bad]})" in msg, msg


@pytest.fixture
def draft(tmp_path, monkeypatch):
    monkeypatch.setattr(loader, "_stream", lambda *a, **k: pytest.fail("weights read before validation"))
    cfg = int4_config()
    path = str(tmp_path / "draft")
    src = write_draft(path, tiny_draft_config(cfg, draft_vocab=48, heads=4, kv_heads=2, inter=96), seed=1)
    return cfg, path, src


def test_d2t_of_absolute_ids_is_named(draft):
    """An export that stored the target ids themselves in d2t (EAGLE-3 stores offsets): the first draft id that
    lands outside the vocab, its d2t value, and what the tensor looks like."""
    cfg, path, src = draft
    absolute = (torch.arange(48) + src.d2t).long()
    edit_checkpoint(path, lambda sd, f: {**sd, "d2t": absolute.clone()})
    as_offsets = torch.arange(48) + absolute
    first = int(((as_offsets < 0) | (as_offsets >= cfg.vocab_size)).nonzero()[0])
    msg = refused(lambda: load_draft(path, cfg, dtype=torch.float32))
    assert (f"e.g. draft id {first} (d2t[{first}] = {int(absolute[first])}) -> target id {int(as_offsets[first])}"
            in msg), msg
    assert "d2t (model.safetensors)" in msg and "read as target ids themselves, d2t would be a valid" in msg, msg


@pytest.mark.parametrize("swap", [True, False])
def test_t2d_disagreement_names_an_id(draft, swap):
    """t2d with one target id moved (same count) or one dropped: the message names an id in one but not the other."""
    cfg, path, src = draft
    t2d = src.t2d.clone()
    on = int(t2d.nonzero()[5])
    off = int((~t2d).nonzero()[0])
    t2d[on] = False
    if swap:
        t2d[off] = True
    edit_checkpoint(path, lambda sd, f: {**sd, "t2d": t2d})
    msg = refused(lambda: load_draft(path, cfg, dtype=torch.float32))
    marked = 48 if swap else 47
    assert (f"t2d marks {marked} target ids but d2t maps to 48, and {2 if swap else 1} target id(s) are in one but not "
            "the other") in msg, msg
    if swap:
        assert f"target id {off} is marked in t2d but no draft id maps to it" in msg, msg
    else:
        draft_id = int((torch.arange(48) + src.d2t == on).nonzero()[0])
        assert f"draft id {draft_id} maps to target id {on}, which t2d does not mark" in msg, msg


def test_duplicate_d2t_names_the_draft_ids(draft):
    cfg, path, src = draft
    d2t = src.d2t.clone().long()
    d2t[7] = int(src.d2t[3]) + 3 - 7  # draft id 7 lands on draft id 3's target token
    edit_checkpoint(path, lambda sd, f: {**sd, "d2t": d2t})
    msg = refused(lambda: load_draft(path, cfg, dtype=torch.float32))
    assert f"target id {3 + int(src.d2t[3])} 2 times, from draft ids [3, 7]" in msg, msg


def test_progress_lines_still_name_each_shard(bases, caplog):
    """The finite check runs after the stream: one line per shard, the last at 100%, then the summary."""
    import logging

    path, cfg, ref = bases["kimi"]
    caplog.set_level(logging.INFO, logger=loader.__name__)
    load_target(path, dtype=torch.float32)
    lines = [r.getMessage() for r in caplog.records if re.search(r"shard \d+/\d+ .* done", r.getMessage())]
    assert [re.search(r"shard (\d+)/", ln).group(1) for ln in lines] == ["1", "2", "3"], lines
    assert "100%" in lines[-1]


# --- a failed load's leftovers are safe to look at -----------------------------------------------------------------
def _in_child(fn) -> int:
    """Runs fn in a forked child; its exit status, or minus the signal that killed it (a segfault: -11)."""
    pid = _fork()
    if pid == 0:  # pragma: no cover - reported through the exit status
        code = 1
        try:
            fn()
            code = 0
        except BaseException:
            import traceback

            traceback.print_exc()
        finally:
            os._exit(code)
    status = _wait(pid)
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def _read_every_local(exc: BaseException) -> int:
    """What a traceback printer that shows locals (pytest, rich, IPython's verbose mode) or an error reporter
    (Sentry) does with a kept exception: repr every local of every frame, and read every tensor among them."""
    import traceback

    n, seen = 0, set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        for frame, _ in traceback.walk_tb(exc.__traceback__):
            for v in frame.f_locals.values():
                repr(v)
                items = v.values() if isinstance(v, dict) else v if isinstance(v, (list, tuple)) else [v]
                for x in items:
                    if isinstance(x, torch.Tensor) and not x.is_meta:
                        float(x.detach().float().sum())
                        n += 1
        exc = exc.__cause__ or exc.__context__
    return n


@pytest.mark.parametrize("where", ["between tensors", "inside an expert's copy"])
def test_a_failed_load_leaves_nothing_that_crashes_when_read(bases, built, monkeypatch, where):
    """A load interrupted after the model was allocated frees its memory; what the kept traceback still names (the
    model, the parameter dicts, a weight_loader's destination slice) must read as empty tensors, not as views of
    freed memory: reading those segfaulted the process (on a GPU: an illegal address that poisons the context)."""
    from sglang_eagle3.layers import moe

    path, cfg, _ = bases["kimi"]
    calls = []
    if where == "between tensors":
        calls = test_audit.fail_feed_at(monkeypatch, 40, OSError("read error"))
    else:
        real_copy = moe.copy_checked

        def copy_then_interrupt(dst, rows, name=""):
            real_copy(dst, rows, name)
            calls.append(name)
            if len(calls) == 5:
                raise KeyboardInterrupt  # Ctrl-C lands between the copy and the next bytecode

        monkeypatch.setattr(moe, "copy_checked", copy_then_interrupt)

    def fail_then_read():
        try:
            load_target(path, dtype=torch.float32)
        except (OSError, KeyboardInterrupt) as e:
            kept = e
        assert held_bytes(built[0]) == 0
        for p in built[0].parameters():
            repr(p)
            float(p.detach().float().sum())
        assert _read_every_local(kept) > 0

    assert _in_child(fail_then_read) == 0
