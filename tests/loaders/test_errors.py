"""Every bad input raises the documented error (docs/CHECKPOINTS.md), naming what a user must fix; none
raises a bare KeyError, and validation failures happen before any weight is read."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch

from sglang_eagle3.config import ConfigError
from sglang_eagle3.models import loader
from sglang_eagle3.models.loader import CheckpointError, hf_state_dict, load_draft, load_target
from sglang_eagle3.testing import tiny_draft_config
from tests.loaders.ckpt import (
    edit_checkpoint,
    edit_config,
    fp8_config,
    int4_config,
    kimi_quant_config,
    plain_model,
    write_deepseek_fp8,
    write_kimi_int4,
    write_sharded,
)
from tests.loaders.test_drafts import write_draft

_REAL_STREAM = loader._stream


@pytest.fixture(scope="module")
def bases(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("bases"))
    cfg = int4_config()
    plain = os.path.join(root, "plain")
    write_sharded(hf_state_dict(plain_model(cfg, seed=0)), plain, cfg.to_hf(), 3)
    kimi, _ = write_kimi_int4(root, cfg, seed=1)
    fp8, _ = write_deepseek_fp8(root, fp8_config(), seed=2)
    return {"plain": plain, "kimi": kimi, "fp8": fp8}


@pytest.fixture
def ckpt(bases, tmp_path, monkeypatch):
    """copy(kind) -> a fresh copy of a base checkpoint to break. Streaming is disabled: every error these
    tests provoke must be found before a weight is read."""

    def stream_must_not_run(*a, **k):
        raise AssertionError("the loader started reading weights before validating the checkpoint")

    monkeypatch.setattr(loader, "_stream", stream_must_not_run)

    def copy(kind: str) -> str:
        dst = os.path.join(tmp_path, kind)
        shutil.copytree(bases[kind], dst)
        return dst

    return copy


def expect(exc, path, *fragments, draft_cfg=None):
    with pytest.raises(exc) as info:
        if draft_cfg is None:
            load_target(path, dtype=torch.float32)
        else:
            load_draft(path, draft_cfg, dtype=torch.float32)
    assert not isinstance(info.value, KeyError)
    msg = str(info.value)
    for f in fragments:
        assert f in msg, f"{f!r} not in: {msg}"
    return msg


def drop(names):
    return lambda sd, f: {k: v for k, v in sd.items() if k not in names}


# --- files ---------------------------------------------------------------------------------------------
def test_not_a_directory(tmp_path):
    expect(ConfigError, str(tmp_path / "nope"), "config file not found")


def test_missing_config(ckpt):
    path = ckpt("plain")
    os.remove(os.path.join(path, "config.json"))
    expect(ConfigError, path, "config file not found", "config.json")


def test_config_missing_field(ckpt):
    path = ckpt("plain")
    edit_config(path, lambda c: c.pop("kv_lora_rank"))
    expect(ConfigError, path, "kv_lora_rank")


def test_no_safetensors(ckpt):
    path = ckpt("plain")
    for f in os.listdir(path):
        if f != "config.json":
            os.remove(os.path.join(path, f))
    expect(CheckpointError, path, "no .safetensors files")
    open(os.path.join(path, "pytorch_model.bin"), "wb").write(b"\0")
    expect(CheckpointError, path, "no .safetensors files", "found pytorch_model.bin", "only safetensors")


def test_truncated_shard_is_named(ckpt):
    path = ckpt("plain")
    f = os.path.join(path, "model-00002-of-00003.safetensors")
    size = os.path.getsize(f)
    with open(f, "r+b") as fh:
        fh.truncate(size - 1000)
    expect(CheckpointError, path, "model-00002-of-00003.safetensors is truncated", "fetch this file again")


def test_truncated_inside_header(ckpt):
    path = ckpt("plain")
    f = os.path.join(path, "model-00001-of-00003.safetensors")
    with open(f, "r+b") as fh:
        fh.truncate(100)
    expect(CheckpointError, path, "model-00001-of-00003.safetensors is truncated or not a safetensors file")


def test_corrupt_header_is_named(ckpt):
    path = ckpt("plain")
    f = os.path.join(path, "model-00003-of-00003.safetensors")
    data = bytearray(open(f, "rb").read())
    data[8:12] = b"\xff\xfe{{"
    open(f, "wb").write(bytes(data))
    expect(CheckpointError, path, "model-00003-of-00003.safetensors has a corrupt safetensors header")


def test_trailing_garbage_is_named(ckpt):
    path = ckpt("plain")
    f = os.path.join(path, "model-00003-of-00003.safetensors")
    with open(f, "ab") as fh:
        fh.write(b"\0" * 64)
    expect(CheckpointError, path, "model-00003-of-00003.safetensors is corrupt", "64 bytes after the last tensor")


def test_index_names_a_missing_shard(ckpt):
    path = ckpt("plain")
    os.remove(os.path.join(path, "model-00002-of-00003.safetensors"))
    expect(CheckpointError, path, "1 of 3 shard(s)", "model-00002-of-00003.safetensors")


def test_index_not_json(ckpt):
    path = ckpt("plain")
    open(os.path.join(path, "model.safetensors.index.json"), "w").write("{not json")
    expect(CheckpointError, path, "model.safetensors.index.json is not a valid safetensors index")


def test_index_disagrees_with_shards(ckpt):
    path = ckpt("plain")
    index = os.path.join(path, "model.safetensors.index.json")
    data = json.load(open(index))
    data["weight_map"]["model.norm.weight"] = "model-00001-of-00003.safetensors"
    data["weight_map"]["model.ghost.weight"] = "model-00001-of-00003.safetensors"
    json.dump(data, open(index, "w"))
    expect(CheckpointError, path, "2 tensor(s) misplaced")


def test_index_misses_a_stored_tensor(ckpt):
    path = ckpt("plain")
    index = os.path.join(path, "model.safetensors.index.json")
    data = json.load(open(index))
    name = sorted(data["weight_map"])[torch.randint(len(data["weight_map"]), ()).item()]
    shard = data["weight_map"].pop(name)
    json.dump(data, open(index, "w"))
    expect(CheckpointError, path, "1 tensor(s) stored but not listed", repr(name), shard)
    data["weight_map"][name] = 3
    json.dump(data, open(index, "w"))
    expect(CheckpointError, path, "not a valid safetensors index", f"weight_map[{name!r}] is 3")


def test_duplicate_tensor_across_shards(ckpt):
    path = ckpt("plain")

    def dup(sd, f):
        if f == "model-00003-of-00003.safetensors":
            sd["model.embed_tokens.weight"] = torch.zeros(96, 64)
        return sd

    edit_checkpoint(path, dup)
    expect(CheckpointError, path, "'model.embed_tokens.weight' appears in two shards")


# --- names, shapes, dtypes -------------------------------------------------------------------------------
def test_missing_tensor_listed_by_name(ckpt):
    path = ckpt("plain")
    edit_checkpoint(path, drop({"model.layers.1.self_attn.kv_b_proj.weight"}))
    expect(CheckpointError, path, "1 missing: model.layers.1.self_attn.kv_b_proj.weight")


def test_many_missing_short_list_then_count(ckpt):
    path = ckpt("plain")
    edit_checkpoint(path, lambda sd, f: {k: v for k, v in sd.items() if ".layers.2." not in k})
    msg = expect(CheckpointError, path, "missing: ", "more")
    n = int(msg.split(" missing")[0].split()[-1])
    assert n > 20 and f"and {n - 8} more" in msg


def test_missing_expert_named_per_expert(ckpt):
    path = ckpt("kimi")
    edit_checkpoint(path, drop({"language_model.model.layers.2.mlp.experts.3.up_proj.weight_packed"}))
    expect(CheckpointError, path, "1 missing: language_model.model.layers.2.mlp.experts.3.up_proj.weight_packed")


def test_unexpected_tensor_listed(ckpt):
    path = ckpt("plain")

    def add(sd, f):
        if f.startswith("model-00001"):
            sd["model.layers.0.self_attn.rotary_emb.extra"] = torch.zeros(3)
            sd["model.layers.0.mlp.experts.0.gate_proj.weight"] = torch.zeros(64, 64)  # layer 0 is dense
        return sd

    edit_checkpoint(path, add)
    expect(CheckpointError, path, "2 unexpected:", "model.layers.0.mlp.experts.0.gate_proj.weight",
           "model.layers.0.self_attn.rotary_emb.extra")


def test_tensor_outside_language_model_is_unexpected(ckpt):
    path = ckpt("kimi")

    def add(sd, f):
        if f.startswith("model-00001"):
            sd["model.norm.weight"] = torch.ones(64)  # missing the language_model. prefix
        return sd

    edit_checkpoint(path, add)
    expect(CheckpointError, path, "1 unexpected: model.norm.weight")


def test_same_tensor_under_two_prefix_variants(ckpt):
    path = ckpt("kimi")

    def add(sd, f):
        if "language_model.model.norm.weight" in sd:
            sd["language_model.norm.weight"] = sd["language_model.model.norm.weight"].clone()
        return sd

    edit_checkpoint(path, add)
    expect(CheckpointError, path, "1 tensor(s) stored twice under different names: language_model.model.norm.weight "
                                  "and language_model.norm.weight")


def test_kimi_config_but_unprefixed_tensors(ckpt):
    path = ckpt("kimi")
    edit_checkpoint(path, lambda sd, f: {k.removeprefix("language_model."): v for k, v in sd.items()})
    expect(CheckpointError, path, "should be named 'language_model.'")


def test_shape_mismatch_names_tensor_and_both_shapes(ckpt):
    path = ckpt("plain")

    def shrink(sd, f):
        if "model.layers.1.self_attn.o_proj.weight" in sd:
            sd["model.layers.1.self_attn.o_proj.weight"] = torch.zeros(64, 8)
        return sd

    edit_checkpoint(path, shrink)
    expect(CheckpointError, path, "model.layers.1.self_attn.o_proj.weight: checkpoint shape [64, 8] but the model "
                                  "expects [64, 16]")


def test_dtype_mismatch_int_for_float(ckpt):
    path = ckpt("plain")

    def to_int(sd, f):
        if "model.norm.weight" in sd:
            sd["model.norm.weight"] = torch.ones(64, dtype=torch.int32)
        return sd

    edit_checkpoint(path, to_int)
    expect(CheckpointError, path, "model.norm.weight: dtype I32 but the model expects a floating-point tensor")


def test_dtype_mismatch_float_for_packed(ckpt):
    path = ckpt("kimi")
    name = "language_model.model.layers.1.mlp.experts.0.down_proj.weight_packed"

    def to_float(sd, f):
        if name in sd:
            sd[name] = sd[name].float()
        return sd

    edit_checkpoint(path, to_float)
    expect(CheckpointError, path, f"{name}: dtype F32 but the model expects int32 packed INT4 words")


def test_weight_shape_mismatch(ckpt):
    path = ckpt("kimi")
    name = "language_model.model.layers.1.mlp.experts.2.gate_proj.weight_shape"

    def lie(sd, f):
        if name in sd:
            sd[name] = torch.tensor([64, 128])
        return sd

    edit_checkpoint(path, lie)  # weight_shape values are read up front: _stream stays disabled
    expect(CheckpointError, path, f"{name}=[64, 128] but the model expects [64, 64]", "weight_packed is [64, 8]")


# --- quantization ------------------------------------------------------------------------------------------
def test_empty_sparsity_and_transform_configs_load(ckpt, monkeypatch):
    """As published compressed-tensors checkpoints write them: {} (and a "dense" sparsity format)."""
    path = ckpt("kimi")
    for extra in ({"sparsity_config": {}, "transform_config": {}},
                  {"sparsity_config": {"format": "dense"}, "transform_config": {"config_groups": {}}}):
        edit_config(path, lambda c, extra=extra: c["quantization_config"].update(extra))
        monkeypatch.setattr(loader, "_stream", _REAL_STREAM)  # the fixture forbids reading weights
        load_target(path, dtype=torch.float32)


@pytest.mark.parametrize("quant,fragment", [
    ({"quant_method": "awq", "bits": 4}, "quantization method 'awq' is not supported"),
    ({"quant_method": "gptq", "bits": 4}, "quantization method 'gptq' is not supported"),
    (kimi_quant_config(group_size=128), "group_size=128"),
    (kimi_quant_config(num_bits=8), "num_bits=8"),
    (kimi_quant_config(symmetric=False), "symmetric=False"),
    ({**kimi_quant_config(), "format": "nvfp4-pack-quantized"}, "format='nvfp4-pack-quantized'"),
    ({**kimi_quant_config(), "config_groups": {"group_0": {**kimi_quant_config()["config_groups"]["group_0"],
                                                           "input_activations": {"num_bits": 8}}}},
     "input_activations={'num_bits': 8}"),
    ({**kimi_quant_config(), "kv_cache_scheme": {"num_bits": 8}}, "kv_cache_scheme"),
    ({**kimi_quant_config(), "sparsity_config": {"format": "sparse-24-bitmask"}}, "sparsity_config"),
    ({**kimi_quant_config(), "transform_config": {"config_groups": {"u": {"type": "hadamard"}}}},
     "transform_config"),
])
def test_unsupported_scheme_is_named(ckpt, quant, fragment):
    path = ckpt("kimi")
    edit_config(path, lambda c: c.update(quantization_config=quant))
    expect(CheckpointError, path, fragment, "not supported")


def test_unsupported_fp8_block(ckpt):
    path = ckpt("fp8")
    edit_config(path, lambda c: c["quantization_config"].update(weight_block_size=[64, 64]))
    expect(CheckpointError, path, "weight_block_size=[64, 64]", "not supported")


def test_packed_without_quantization_config(ckpt):
    path = ckpt("kimi")
    edit_config(path, lambda c: c.pop("quantization_config"))
    expect(CheckpointError, path, "stored pack-quantized", "no quantization_config")


def test_ignore_list_missing_self_attn(ckpt):
    """Attention is stored bf16; a config whose ignore list does not cover it says it is quantized."""
    path = ckpt("kimi")
    edit_config(path, lambda c: c["quantization_config"]["ignore"].remove("re:.*self_attn.*"))
    expect(CheckpointError, path, "stored unquantized (.weight)",
           "language_model.model.layers.0.self_attn.kv_a_proj_with_mqa (targeted by 'Linear'")


@pytest.mark.parametrize("entry", ["self_attn", "re:self_attn", "re:model.layers.0.self_attn"])
def test_ignore_entries_match_exactly(ckpt, entry):
    """A plain entry must equal the module name, and re: is anchored at the start (re.match): neither is a
    substring search, so these entries do not cover language_model.model.layers.N.self_attn.*."""
    path = ckpt("kimi")

    def swap(c):
        ignore = c["quantization_config"]["ignore"]
        ignore[ignore.index("re:.*self_attn.*")] = entry

    edit_config(path, swap)
    # 3 layers x 5 attention projections; re:model.layers.0.self_attn does match layer 0 in the text-model
    # naming (model.layers.0.self_attn.*), so only the other two layers' 10 remain.
    n = 10 if entry.startswith("re:model") else 15
    expect(CheckpointError, path, f"{n} module(s) the quantization_config says are quantized are stored unquantized")


def test_experts_ignored_but_stored_packed(ckpt):
    path = ckpt("kimi")
    edit_config(path, lambda c: c["quantization_config"]["ignore"].append(r"re:.*mlp\.experts\..*"))
    expect(CheckpointError, path, "stored packed (.weight_packed) but the quantization_config leaves them "
                                  "unquantized", "matches ignore entry 're:.*mlp\\\\.experts\\\\..*'")


def test_int4_outside_experts_unsupported(ckpt):
    """A consistent config + checkpoint that packs attention's q_a_proj: a scheme we do not run."""
    path = ckpt("kimi")

    def pack(sd, f):
        for name in [k for k in sd if k.endswith("self_attn.q_a_proj.weight")]:
            w = sd.pop(name)
            base = name.removesuffix(".weight")
            sd[base + ".weight_packed"] = torch.zeros(w.shape[0], w.shape[1] // 8, dtype=torch.int32)
            sd[base + ".weight_scale"] = torch.ones(w.shape[0], w.shape[1] // 32, dtype=torch.bfloat16)
        return sd

    edit_checkpoint(path, pack)
    ignore = ["lm_head", r"re:.*mlp\.(gate|up|down)_proj", "re:.*shared_experts.*",
              r"re:.*self_attn\.(q_b_proj|kv_a_proj_with_mqa|kv_b_proj|o_proj)"]
    edit_config(path, lambda c: c["quantization_config"].update(ignore=ignore))
    expect(CheckpointError, path, "INT4 is supported on routed experts only", "3 other module(s)",
           "language_model.model.layers.1.self_attn.q_a_proj")


def test_fp8_weight_without_scale(ckpt):
    path = ckpt("fp8")
    edit_checkpoint(path, drop({"model.layers.1.self_attn.o_proj.weight_scale_inv"}))
    expect(CheckpointError, path, "model.layers.1.self_attn.o_proj.weight: F8_E4M3 weight without its "
                                  "model.layers.1.self_attn.o_proj.weight_scale_inv")


def test_fp8_scale_wrong_shape(ckpt):
    path = ckpt("fp8")
    name = "model.layers.0.mlp.gate_proj.weight_scale_inv"

    def bad(sd, f):
        if name in sd:
            sd[name] = torch.ones(2, 2)
        return sd

    edit_checkpoint(path, bad)
    expect(CheckpointError, path, f"{name}: shape [2, 2] but weight [272, 144] in 128x128 blocks needs [3, 2]")


@pytest.mark.parametrize("dtype", [torch.int32, torch.bool])
def test_fp8_scale_dtype(ckpt, dtype):
    """An integer scale would zero the weight's blocks: its dtype is checked like every other tensor's."""
    path = ckpt("fp8")
    name = "model.layers.1.self_attn.q_a_proj.weight_scale_inv"
    edit_checkpoint(path, lambda sd, f: {k: (v.to(dtype) if k == name else v) for k, v in sd.items()})
    expect(CheckpointError, path, f"{name}: dtype", "a floating-point scale")


def test_layer_past_the_config_is_not_dropped(ckpt):
    """Layers past num_hidden_layers are skipped only as the MTP layers the config declares."""
    path = ckpt("fp8")  # declares num_nextn_predict_layers 1 and stores layer L's MTP tensors
    layers = json.load(open(os.path.join(path, "config.json")))["num_hidden_layers"]

    def stray(sd, f):
        if "model.norm.weight" in sd:
            sd[f"model.layers.{layers + 1}.input_layernorm.weight"] = torch.ones(4)
        return sd

    edit_checkpoint(path, stray)
    expect(CheckpointError, path, "1 unexpected:", f"model.layers.{layers + 1}.input_layernorm.weight")
    # The config one layer short of its tensors (a checkpoint with its depth edited): the last layer is unexpected.
    edit_config(path, lambda c: c.update(num_hidden_layers=layers - 1, num_nextn_predict_layers=0))
    expect(CheckpointError, path, "unexpected:", f"model.layers.{layers - 1}.")


def test_fp8_scale_without_fp8_weight(ckpt):
    path = ckpt("plain")

    def add(sd, f):
        if "model.norm.weight" in sd:
            sd["model.layers.1.self_attn.o_proj.weight_scale_inv"] = torch.ones(1, 1)
        return sd

    edit_checkpoint(path, add)
    expect(CheckpointError, path, "1 weight_scale_inv without an FP8 weight")


def test_all_problems_reported_together(ckpt):
    path = ckpt("plain")

    def many(sd, f):
        sd.pop("model.layers.1.self_attn.kv_b_proj.weight", None)
        if "model.norm.weight" in sd:
            sd["model.norm.weight"] = torch.ones(32)
            sd["model.extra"] = torch.ones(1)
        return sd

    edit_checkpoint(path, many)
    expect(CheckpointError, path, "1 missing", "1 unexpected: model.extra", "model.norm.weight: checkpoint shape")


# --- drafts ---------------------------------------------------------------------------------------------------
@pytest.fixture
def draft_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(loader, "_stream", lambda *a, **k: pytest.fail("weights read before validation"))
    cfg = int4_config()
    return cfg, str(tmp_path / "draft")


def test_draft_vocab_mismatch(draft_dir):
    cfg, path = draft_dir
    write_draft(path, tiny_draft_config(int4_config(vocab=128), heads=4, kv_heads=2, inter=96), seed=1)
    expect(ConfigError, path, "draft vocab_size=128 differs from the target's 96", draft_cfg=cfg)


def test_draft_reduced_vocab_without_d2t(draft_dir):
    cfg, path = draft_dir
    write_draft(path, tiny_draft_config(cfg, draft_vocab=48, heads=4, kv_heads=2, inter=96), seed=1, d2t=False)
    expect(CheckpointError, path, "draft_vocab_size=48 < vocab_size=96 but no d2t", draft_cfg=cfg)


def test_draft_without_head_needs_full_vocab(draft_dir):
    cfg, path = draft_dir
    write_draft(path, tiny_draft_config(cfg, draft_vocab=48, heads=4, kv_heads=2, inter=96), seed=1, head=False)
    expect(ConfigError, path, "has no lm_head.weight", "draft_vocab_size=48", draft_cfg=cfg)


def test_draft_missing_and_unexpected(draft_dir):
    cfg, path = draft_dir
    write_draft(path, tiny_draft_config(cfg, heads=4, kv_heads=2, inter=96), seed=1)
    edit_checkpoint(path, lambda sd, _: {**drop({"midlayer.hidden_norm.weight"})(sd, _), "fc.bias": torch.ones(64)})
    expect(CheckpointError, path, "1 missing: midlayer.hidden_norm.weight", "1 unexpected: fc.bias", draft_cfg=cfg)


def test_draft_not_eagle3(draft_dir):
    cfg, path = draft_dir
    write_draft(path, tiny_draft_config(cfg, heads=4, kv_heads=2, inter=96), seed=1)
    edit_config(path, lambda c: c.update(architectures=["Qwen2ForCausalLM"]))
    expect(ConfigError, path, "is not an EAGLE-3 draft", draft_cfg=cfg)


def test_draft_quantized_unsupported(draft_dir):
    cfg, path = draft_dir
    write_draft(path, tiny_draft_config(cfg, heads=4, kv_heads=2, inter=96), seed=1)
    edit_config(path, lambda c: c.update(quantization_config={"quant_method": "fp8"}))
    expect(CheckpointError, path, "draft quantization 'fp8' is not supported", draft_cfg=cfg)


def test_draft_inconsistent_t2d(draft_dir):
    cfg, path = draft_dir
    write_draft(path, tiny_draft_config(cfg, draft_vocab=48, heads=4, kv_heads=2, inter=96), seed=1)
    edit_checkpoint(path, lambda sd, _: {**sd, "t2d": torch.ones(96, dtype=torch.bool)})
    expect(CheckpointError, path, "t2d marks 96 target ids but d2t maps to 48", draft_cfg=cfg)


def test_draft_d2t_out_of_range(draft_dir):
    cfg, path = draft_dir
    write_draft(path, tiny_draft_config(cfg, draft_vocab=48, heads=4, kv_heads=2, inter=96), seed=1)
    edit_checkpoint(path, lambda sd, _: {**sd, "d2t": torch.full((48,), 90, dtype=torch.int64)})
    expect(CheckpointError, path, "outside the target vocab [0, 96)", draft_cfg=cfg)


@pytest.mark.parametrize("with_t2d", [True, False])
def test_draft_d2t_not_one_to_one(draft_dir, with_t2d):
    """Two draft ids mapped to one target token: refused (with or without a t2d to rebuild), before reading."""
    cfg, path = draft_dir
    write_draft(path, tiny_draft_config(cfg, draft_vocab=48, heads=4, kv_heads=2, inter=96), seed=1,
                t2d=with_t2d)
    collide = torch.randint(1, 48, ()).item()  # a fresh draft id lands on draft id 0's target token

    def bad(sd, _):
        d2t = sd["d2t"].clone()
        d2t[collide] = int(d2t[0]) - collide
        return {**sd, "d2t": d2t}

    edit_checkpoint(path, bad)
    expect(CheckpointError, path, "onto only 47 distinct target ids", "2 times", draft_cfg=cfg)
