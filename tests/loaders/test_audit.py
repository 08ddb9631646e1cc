"""What a user with real checkpoints meets beyond the happy path: a failed or interrupted load gives its memory
back (a kept traceback must not pin a half-built model: the retry would run out of GPU memory), long loads
report progress per shard to the log, and malformed compressed-tensors configs fail with a message naming the
field instead of an AttributeError deep inside the loader."""

from __future__ import annotations

import logging
import os
import re
import shutil

import pytest
import torch

from sglang_eagle3.models import loader
from sglang_eagle3.models.loader import CheckpointError, hf_state_dict, load_draft, load_target
from sglang_eagle3.testing import tiny_draft_config
from tests.loaders.ckpt import (
    edit_checkpoint,
    edit_config,
    int4_config,
    plain_model,
    write_kimi_int4,
    write_sharded,
)
from tests.loaders.test_drafts import write_draft
from tests.loaders.test_layouts import assert_same_logits


@pytest.fixture(scope="module")
def kimi(tmp_path_factory):
    cfg = int4_config()
    path, ref = write_kimi_int4(str(tmp_path_factory.mktemp("audit")), cfg, seed=5, n_shards=4)
    return cfg, path, ref


@pytest.fixture
def built(monkeypatch):
    """Records every model the loader allocates (the rank's model, not the meta skeleton)."""
    models = []
    real = loader._build

    def spy(make, device):
        model, full = real(make, device)
        models.append(model)
        return model, full

    monkeypatch.setattr(loader, "_build", spy)
    return models


def held_bytes(model: torch.nn.Module) -> int:
    """Bytes of storage the model's tensors still pin."""
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                for t in [*model.parameters(), *model.buffers()]}
    return sum(storages.values())


# --- a failed load gives its memory back ------------------------------------------------------------------
def test_validation_failure_releases_the_allocated_model(kimi, tmp_path, built):
    """The model is allocated before the checkpoint is checked against it; an error found then must not leave
    it pinned by the traceback a notebook keeps (sys.last_traceback), or the corrected retry runs out of memory."""
    _, path, _ = kimi
    bad = str(tmp_path / "bad")
    shutil.copytree(path, bad)
    name = "language_model.model.layers.2.self_attn.kv_b_proj.weight"
    edit_checkpoint(bad, lambda sd, f: {k: v for k, v in sd.items() if k != name})
    with pytest.raises(CheckpointError, match=re.escape(name)) as kept:
        load_target(bad, dtype=torch.float32)
    assert kept.value.__traceback__ is not None  # the traceback (and its frames) are still alive here
    assert len(built) == 1 and held_bytes(built[0]) == 0


def fail_feed_at(monkeypatch, n: int, exc: BaseException) -> list[str]:
    """Replaces loader._feed by one that raises ``exc`` on its n-th tensor (those before it are fed); the names it
    was called with."""
    real_feed, calls = loader._feed, []

    def feed_then_fail(params, t, value, name):
        calls.append(name)
        if len(calls) == n:
            raise exc
        real_feed(params, t, value, name)

    monkeypatch.setattr(loader, "_feed", feed_then_fail)
    return calls


@pytest.mark.parametrize("exc", [KeyboardInterrupt, OSError])
def test_interrupted_stream_releases_memory_and_retry_loads(kimi, built, monkeypatch, exc):
    """Ctrl-C (or a read error) halfway through the shards: the exception propagates as it is, the half-filled
    model holds no memory, and the next attempt loads the right weights."""
    cfg, path, ref = kimi
    real_feed = loader._feed
    fail_feed_at(monkeypatch, 10, exc("stop"))
    with pytest.raises(exc):
        load_target(path, dtype=torch.float32)
    assert held_bytes(built[0]) == 0
    monkeypatch.setattr(loader, "_feed", real_feed)
    assert_same_logits(load_target(path, dtype=torch.float32), ref, cfg.vocab_size)


def test_draft_failure_releases_memory(tmp_path, built):
    cfg = int4_config()
    path = str(tmp_path / "draft")
    write_draft(path, tiny_draft_config(cfg, heads=4, kv_heads=2, inter=96), seed=1)
    edit_checkpoint(path, lambda sd, f: {k: v for k, v in sd.items() if k != "fc.weight"})
    with pytest.raises(CheckpointError, match="fc.weight"):
        load_draft(path, cfg, dtype=torch.float32)
    assert held_bytes(built[0]) == 0


# --- progress per shard -----------------------------------------------------------------------------------------
def test_progress_is_logged_per_shard(kimi, caplog):
    """A 60-shard load logs each shard as it finishes (the bar alone never reaches a log file): its name, n/N
    and how much of the checkpoint is done."""
    _, path, _ = kimi
    caplog.set_level(logging.INFO, logger=loader.__name__)
    load_target(path, dtype=torch.float32)
    shards = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
    lines = [r.getMessage() for r in caplog.records if "shard " in r.getMessage() and " done" in r.getMessage()]
    assert len(lines) == len(shards) == 4, lines
    for i, (line, shard) in enumerate(zip(lines, shards, strict=True)):
        assert f"shard {i + 1}/{len(shards)}" in line and shard in line, line
    assert "100%" in lines[-1]


def test_single_small_file_logs_no_per_shard_lines(tmp_path, caplog):
    cfg = int4_config()
    write_sharded(hf_state_dict(plain_model(cfg, seed=0)), str(tmp_path), cfg.to_hf(), 1)
    caplog.set_level(logging.INFO, logger=loader.__name__)
    load_target(str(tmp_path), dtype=torch.float32)
    assert not [r for r in caplog.records if "shard 1/1" in r.getMessage()]


# --- malformed compressed-tensors configs -------------------------------------------------------------------------
def _group(c):
    return c["quantization_config"]["config_groups"]["group_0"]


@pytest.mark.parametrize("edit,fragment", [
    (lambda c: c["quantization_config"].update(config_groups=[{"targets": ["Linear"]}]), "config_groups"),
    (lambda c: c["quantization_config"]["config_groups"].update(group_0="W4A16"), "'group_0'"),
    (lambda c: _group(c).update(weights="int4"), "weights"),
    (lambda c: c["quantization_config"].update(ignore="lm_head"), "ignore='lm_head'"),
    (lambda c: _group(c).update(targets="Linear"), "targets='Linear'"),
    # GPTQ-style activation ordering permutes the groups (weight_g_idx): running it as contiguous groups of 32
    # would be silently wrong.
    (lambda c: _group(c)["weights"].update(actorder="group"), "actorder='group'"),
    (lambda c: _group(c)["weights"].update(actorder="dynamic"), "actorder='dynamic'"),
])
def test_malformed_compressed_tensors_config_is_named(kimi, tmp_path, monkeypatch, edit, fragment):
    _, path, _ = kimi
    bad = str(tmp_path / "bad")
    shutil.copytree(path, bad)
    edit_config(bad, edit)
    monkeypatch.setattr(loader, "_stream", lambda *a, **k: pytest.fail("weights read before validation"))
    with pytest.raises(CheckpointError) as info:
        load_target(bad, dtype=torch.float32)
    assert fragment in str(info.value), str(info.value)


def test_quantization_config_without_quant_method(kimi, tmp_path):
    """The config has a quantization_config, only without quant_method: the message must not say it has none."""
    _, path, _ = kimi
    bad = str(tmp_path / "bad")
    shutil.copytree(path, bad)
    edit_config(bad, lambda c: c["quantization_config"].pop("quant_method"))
    with pytest.raises(CheckpointError) as info:
        load_target(bad, dtype=torch.float32)
    msg = str(info.value)
    assert "without quant_method" in msg and "has no quantization_config" not in msg, msg


@pytest.mark.parametrize("actorder", [None, "weight", "static"])
def test_contiguous_group_orders_still_load(kimi, tmp_path, actorder):
    """actorder 'weight' / 'static' quantize in activation order but keep groups contiguous (no g_idx stored):
    the packed tensors mean the same as with no actorder, so they load."""
    cfg, path, ref = kimi
    ok = str(tmp_path / "ok")
    shutil.copytree(path, ok)
    edit_config(ok, lambda c: _group(c)["weights"].update(actorder=actorder))
    assert_same_logits(load_target(ok, dtype=torch.float32), ref, cfg.vocab_size)


# --- shards that are not safetensors at all ------------------------------------------------------------------------
@pytest.mark.parametrize("content,fragment", [
    # What `git clone` of a Hub repository leaves without git-lfs installed.
    (b"version https://git-lfs.github.com/spec/v1\noid sha256:" + b"ab" * 32 + b"\nsize 4987445760\n",
     "Git LFS pointer"),
    (b"<!DOCTYPE html>\n<html><head><title>401 Unauthorized</title></head></html>\n", "HTML page"),
])
def test_shard_that_is_not_safetensors_says_what_it_is(kimi, tmp_path, content, fragment):
    _, path, _ = kimi
    bad = str(tmp_path / "bad")
    shutil.copytree(path, bad)
    shard = sorted(f for f in os.listdir(bad) if f.endswith(".safetensors"))[1]
    with open(os.path.join(bad, shard), "wb") as f:
        f.write(content)
    with pytest.raises(CheckpointError) as info:
        load_target(bad, dtype=torch.float32)
    msg = str(info.value)
    assert shard in msg and "not a safetensors file" in msg and fragment in msg, msg


# --- a draft for another target ------------------------------------------------------------------------------------
@pytest.mark.parametrize("target_hidden,fragment", [
    (None, "draft expects target hidden size 64 but the target's hidden_size is 128"),  # a draft for another model
    (96, "draft expects target hidden size 96 but the target's hidden_size is 128"),  # fc built for another width
    (128, "draft hidden_size=64 differs from the target's 128"),  # fc fits, but the shared embedding would not
])
def test_draft_for_another_hidden_size_is_refused_before_reading(tmp_path, monkeypatch, target_hidden, fragment):
    from sglang_eagle3.config import ConfigError

    cfg = int4_config()
    path = str(tmp_path / "draft")
    write_draft(path, tiny_draft_config(cfg, heads=4, kv_heads=2, inter=96), seed=1)
    if target_hidden is not None:
        edit_config(path, lambda c: c.update(target_hidden_size=target_hidden))
    monkeypatch.setattr(loader, "_stream", lambda *a, **k: pytest.fail("weights read before validation"))
    with pytest.raises(ConfigError) as info:
        load_draft(path, int4_config(hidden=128), dtype=torch.float32)
    assert fragment in str(info.value), str(info.value)



def _write_raw(file: str, header: dict, data_size: int) -> None:
    import json

    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(file, "wb") as f:
        f.write(len(raw).to_bytes(8, "little") + raw + bytes(data_size))


@pytest.mark.parametrize("seed", range(12))
def test_header_tiling_agrees_with_safetensors(tmp_path, seed):
    """Random headers whose every entry holds the right byte count and whose last byte ends the file, with
    tensors tiled, overlapping or leaving holes: read_header refuses exactly those that safetensors' own
    safe_open refuses (it would refuse them only when the shard is opened to stream, after the model was
    allocated and earlier shards were read)."""
    from safetensors import safe_open

    g = torch.Generator().manual_seed(seed)
    sizes = [int(x) for x in torch.randint(1, 6, (int(torch.randint(2, 6, (), generator=g)),), generator=g)]
    starts, pos = [], 0
    for n in sizes:
        shift = int(torch.randint(-1, 2, (), generator=g)) * 4 if starts else 0  # -4: overlap, +4: hole
        pos = max(pos + shift, 0)
        starts.append(pos)
        pos += 4 * n
    header = {f"t{i}": {"dtype": "F32", "shape": [n], "data_offsets": [b, b + 4 * n]}
              for i, (n, b) in enumerate(zip(sizes, starts, strict=True))}
    data_size = max(b + 4 * n for n, b in zip(sizes, starts, strict=True))
    f = str(tmp_path / "x.safetensors")
    _write_raw(f, header, data_size)
    try:
        with safe_open(f, framework="pt"):
            pass
        refused_by_safetensors = False
    except Exception:
        refused_by_safetensors = True
    try:
        loader.read_header(f)
        refused = False
    except CheckpointError as e:
        refused = True
        assert "x.safetensors" in str(e)
    assert refused == refused_by_safetensors, (header, data_size)
