"""Our pack-quantized INT4 format against the compressed-tensors library itself (the writer of Kimi-K2.5's
experts), used as a peer: its pack_to_int32 / unpack_from_int32 must agree with ours word for word.

compressed-tensors is installed with ``pip install compressed-tensors --no-deps``; its package __init__ then
fails to import (it needs loguru), so the helpers module, which needs only torch, is loaded from its file.
"""

from __future__ import annotations

import importlib
import importlib.util
import os

import pytest
import torch

from sglang_eagle3.kernels.quant import pack_int4, quantize_int4, unpack_int4, unpack_int4_values

# Where the helpers live across compressed-tensors versions (newest first).
_HELPER_FILES = (("compressors", "pack_quantized", "helpers.py"),
                 ("compressors", "quantized_compressors", "pack_quantized.py"))


def compressed_tensors_helpers():
    try:
        mod = importlib.import_module("compressed_tensors.compressors.pack_quantized.helpers")
        return mod.pack_to_int32, mod.unpack_from_int32
    except ImportError:  # with --no-deps the package __init__ lacks loguru: load the helpers file directly
        pass
    spec = importlib.util.find_spec("compressed_tensors")  # locates the package without importing it
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("compressed-tensors is not installed (pip install compressed-tensors --no-deps)")
    root = spec.submodule_search_locations[0]
    for parts in _HELPER_FILES:
        path = os.path.join(root, *parts)
        if os.path.exists(path):
            file_spec = importlib.util.spec_from_file_location("_ct_pack_helpers", path)
            mod = importlib.util.module_from_spec(file_spec)
            try:
                file_spec.loader.exec_module(mod)
            except ImportError as e:
                pytest.skip(f"compressed-tensors helpers at {path} need more than torch: {e}")
            return mod.pack_to_int32, mod.unpack_from_int32
    pytest.skip(f"no pack_to_int32 found under {root}")


@pytest.fixture(scope="module")
def peer():
    return compressed_tensors_helpers()


def random_int4(shape, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(-8, 8, shape, generator=g, dtype=torch.int8)
    q.view(-1)[:2] = torch.tensor([-8, 7], dtype=torch.int8)  # both ends of the range
    return q


@pytest.mark.parametrize("shape", [(1, 8), (7, 64), (48, 256), (3, 40, 96)])
def test_pack_matches_compressed_tensors(peer, shape):
    pack_to_int32, unpack_from_int32 = peer
    q = random_int4(shape, seed=sum(shape))
    ours = pack_int4(q)
    theirs = pack_to_int32(q, 4)  # packed along the last (input) dim, as Kimi's weight_packed is
    assert ours.dtype == theirs.dtype == torch.int32
    assert torch.equal(ours, theirs)
    assert torch.equal(unpack_int4_values(theirs), q)
    assert torch.equal(unpack_from_int32(ours, 4, torch.Size(shape)), q)


def test_dequantised_weight_matches_compressed_tensors_definition(peer):
    """weight = q * scale per group of 32 along the input dim (symmetric, no zero point)."""
    _, unpack_from_int32 = peer
    w = torch.randn(16, 128, generator=torch.Generator().manual_seed(0)).bfloat16()
    packed, scale = quantize_int4(w, 32)
    q = unpack_from_int32(packed, 4, torch.Size(w.shape)).float()
    want = (q.view(16, 4, 32) * scale.float()[:, :, None]).view(16, 128)
    assert torch.equal(unpack_int4(packed, scale, 32), want)


@torch.no_grad()
def test_checkpoint_packed_by_compressed_tensors_loads(peer, tmp_path):
    """End to end with the peer as the writer: every expert's weight_packed is compressed-tensors' pack_to_int32
    of fresh random int4 values, with fresh bf16 group scales; the loaded model's logits must equal those of a
    float reference holding q * scale per group of 32 (compressed-tensors' symmetric dequantisation, written out
    here, not our unpack)."""
    import re

    from sglang_eagle3.models.loader import load_target
    from tests.loaders.ckpt import _write_reference_weights, edit_checkpoint, int4_config, write_kimi_int4
    from tests.loaders.test_layouts import assert_same_logits

    pack_to_int32, _ = peer
    cfg = int4_config()
    path, ref = write_kimi_int4(str(tmp_path), cfg, seed=11)
    g = torch.Generator().manual_seed(12)
    made, dequantised = {}, {}

    def fresh(base: str, out: int, cols: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(packed by compressed-tensors, bf16 scales) for one module, made once whichever shard asks first."""
        if base not in made:
            q = torch.randint(-8, 8, (out, cols), generator=g, dtype=torch.int8)
            scale = ((torch.rand(out, cols // 32, generator=g) + 0.5) * (3.0 / (8 * cols ** 0.5))).bfloat16()
            made[base] = pack_to_int32(q, 4), scale
            w = (q.float().view(out, -1, 32) * scale.float()[:, :, None]).view(out, cols)
            dequantised[re.sub(r"^language_model\.", "", base) + ".weight"] = w
        return made[base]

    def repack(sd, _):
        for k in list(sd):
            if k.endswith(".weight_packed"):
                sd[k] = fresh(k[: -len(".weight_packed")], sd[k].shape[0], sd[k].shape[1] * 8)[0]
            elif k.endswith(".weight_scale"):
                sd[k] = fresh(k[: -len(".weight_scale")], sd[k].shape[0], sd[k].shape[1] * 32)[1]
        return sd

    edit_checkpoint(path, repack)
    assert len(dequantised) == 3 * cfg.n_routed_experts * (cfg.num_hidden_layers - cfg.first_k_dense_replace)
    _write_reference_weights(ref, dequantised)
    assert_same_logits(load_target(path, dtype=torch.float32), ref, cfg.vocab_size)
