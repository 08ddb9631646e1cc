"""docs/CHECKPOINTS.md, docs/EMBEDDED_MODEL.md and docs/SGLANG_OVERLAY.md against the code: the defaults, numbers,
names and commands they state are read from the files and compared with what the code does, plus the loader fixes a
user following them would otherwise trip over (a dangling or unreadable config.json, weights written mode 0600)."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import inspect
import json
import math
import os
import re
import shlex
import stat
from pathlib import Path

import pytest
import torch

from sglang_eagle3 import config as config_mod
from sglang_eagle3.config import ConfigError, ModelConfig, load_json

ROOT = Path(__file__).resolve().parents[1]
DOCS = ("docs/CHECKPOINTS.md", "docs/EMBEDDED_MODEL.md", "docs/SGLANG_OVERLAY.md")
EMBEDDED = ROOT / "sglang_eagle3" / "assets" / "embedded"


def _doc(path: str) -> str:
    return (ROOT / path).read_text()


def _prose(path: str) -> str:
    """The doc with its line breaks and runs of spaces as single spaces: a sentence checked here may be rewrapped."""
    return " ".join(_doc(path).split())


def _section(text: str, heading: str) -> str:
    """The text under ``## heading`` up to the next heading of the same or a higher level."""
    m = re.search(rf"^(#+) {re.escape(heading)}\n(.*?)(?=^#{{1,{2}}} |\Z)", text, re.M | re.S)
    assert m, f"no section {heading!r}"
    return m.group(2)


def _table(text: str) -> list[list[str]]:
    """Rows of the first markdown table in ``text`` (header and separator left out), cells stripped."""
    rows = [line for line in text.splitlines() if line.startswith("|")]
    return [[c.strip() for c in r.strip("|").split("|")] for r in rows[2:]]


# -- CHECKPOINTS.md ---------------------------------------------------------------------------------------------------

def _doc_value(cell: str):
    """A table cell's leading value: 18432, 1e-6, true, `sigmoid`."""
    word = cell.split(" (")[0].strip().strip("`")
    if word in ("true", "false"):
        return word == "true"
    try:
        return int(word)
    except ValueError:
        pass
    try:
        return float(word)
    except ValueError:
        return word


def test_checkpoints_left_out_defaults_are_the_loaders():
    """Every field of the "Fields a config.json leaves out" table takes the stated default in ModelConfig.from_hf."""
    rows = _table(_section(_doc("docs/CHECKPOINTS.md"), "Fields a `config.json` leaves out"))
    stated = {}
    for field_cell, value_cell in rows:
        fields = re.findall(r"`(\w+)`", field_cell)
        values = [v.strip() for v in value_cell.split(" (")[0].split(",")]
        if field_cell.startswith("YaRN") or field_cell.startswith("`rope_theta`"):
            continue  # rope fields: checked below through RopeConfig
        assert len(fields) == len(values), (field_cell, value_cell)
        stated.update({f: _doc_value(v) for f, v in zip(fields, values, strict=True)})
    code = {k: v for k, (_, v) in config_mod._DEEPSEEK_V3_DEFAULTS.items()}
    assert stated == code, f"doc table {stated} != config._DEEPSEEK_V3_DEFAULTS {code}"


def test_checkpoints_rope_defaults_are_the_loaders():
    rope = config_mod.RopeConfig.from_hf({"rope_scaling": {"type": "yarn", "factor": 4.0,
                                                           "original_max_position_embeddings": 512}}, "config")
    text = _section(_doc("docs/CHECKPOINTS.md"), "Fields a `config.json` leaves out")
    assert "| `rope_theta` | 10000 |" in text and rope.theta == 10000
    assert "| YaRN `beta_fast`, `beta_slow` | 32, 1 |" in text and (rope.beta_fast, rope.beta_slow) == (32, 1)
    assert "| YaRN `mscale`, `mscale_all_dim` | 1, 0" in text and (rope.mscale, rope.mscale_all_dim) == (1, 0)


def test_checkpoints_draft_defaults_are_the_loaders():
    text = _doc("docs/CHECKPOINTS.md")
    assert "`rms_norm_eps` 1e-6, `rope_theta` 10000" in text and "`max_position_embeddings` 2048" in text
    d = config_mod.DraftConfig.from_hf({"hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 4,
                                        "vocab_size": 256, "num_hidden_layers": 1})
    assert (d.num_key_value_heads, d.head_dim, d.rms_norm_eps, d.rope_theta, d.max_position_embeddings,
            d.draft_vocab_size) == (4, 16, 1e-6, 10000, 2048, 256)


def test_checkpoints_aux_id_rules_are_the_loaders():
    """The Drafts section: ids used as given unless the first is 1; past L, repeated or descending ids refused; the
    override is used as given (no shift) under the same checks; without ids [2, L//2, L-3]."""
    text = _prose("docs/CHECKPOINTS.md")
    assert "Without ids: `[2, L//2, L-3]`" in text and "repeat a layer or are not ascending" in text
    d = config_mod.DraftConfig.from_hf({"hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 4,
                                        "vocab_size": 256, "num_hidden_layers": 1})
    resolve = config_mod.resolve_aux_layer_ids
    assert resolve(d, 61) == (2, 30, 58)
    shifted = config_mod.DraftConfig.from_hf({**d.to_hf(), "eagle_config": {
        "eagle_aux_hidden_state_layer_ids": [1, 29, 57]}})
    assert resolve(shifted, 61) == (2, 30, 58)
    assert resolve(d, 61, (1, 29, 57)) == (1, 29, 57)  # an override is used as given
    for bad in ((2, 2, 3), (30, 2, 58), (2, 30, 62)):
        with pytest.raises(ConfigError):
            resolve(d, 61, bad)


def _dangling_config(tmp_path: Path) -> Path:
    snap = tmp_path / "snapshots" / "abc"
    snap.mkdir(parents=True)
    (snap / "config.json").symlink_to("../../blobs/0123abcd")  # a snapshot copied without `cp -L`
    return snap


def test_config_json_linked_to_nothing_names_the_link(tmp_path):
    """A cache snapshot copied without `cp -L`: `ls` shows config.json, so "not found" alone misleads."""
    with pytest.raises(ConfigError, match=r"symbolic link to '\.\./\.\./blobs/0123abcd', which does not exist.*cp -L"):
        ModelConfig.from_path(str(_dangling_config(tmp_path)))


def test_config_json_that_cannot_be_read_is_a_config_error(tmp_path):
    (tmp_path / "config.json").mkdir()  # open() fails (IsADirectoryError) even as root, as permissions would
    with pytest.raises(ConfigError, match=r"cannot read .*config\.json"):
        load_json(str(tmp_path))


def test_checkpoints_error_table_names_the_config_link_case():
    text = _doc("docs/CHECKPOINTS.md")
    assert "`config.json` linked to nothing: `ConfigError`" in text


def test_written_weights_get_the_umask_mode(tmp_path):
    """safetensors >= 0.6 writes 0600 files; a draft trained as one user must be readable by a server running as
    another, as config.json beside it is."""
    from sglang_eagle3.models.loader import write_safetensors

    old = os.umask(0o022)
    try:
        write_safetensors({"a": torch.zeros(4)}, str(tmp_path / "one"), {"x": 1})
        write_safetensors({"a": torch.zeros(4), "b": torch.ones(4)}, str(tmp_path / "two"), {"x": 1},
                          max_shard_bytes=16)
    finally:
        os.umask(old)
    files = sorted((tmp_path / "one").iterdir()) + sorted((tmp_path / "two").iterdir())
    assert len(files) == 6  # config.json + model.safetensors; config.json + 2 shards + the index
    modes = {f.name: stat.S_IMODE(f.stat().st_mode) for f in files}
    assert set(modes.values()) == {0o644}, modes


# -- EMBEDDED_MODEL.md ------------------------------------------------------------------------------------------------

def _mb(n: int) -> str:
    return f"{n / 1e6:.2f} MB"


def _param_count(path: Path) -> int:
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:  # d2t / t2d are buffers (int64, bool), not parameters
        return sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys()
                   if f.get_slice(k).get_dtype() in ("BF16", "F16", "F32"))


def test_embedded_summary_table_is_the_assets():
    rows = {r[0]: r[1] for r in _table(_doc("docs/EMBEDDED_MODEL.md").split("## Architecture")[0])}
    target, draft = EMBEDDED / "target", EMBEDDED / "draft"
    t_params = _param_count(target / "model.safetensors")
    d_params = _param_count(draft / "model.safetensors")
    assert f"{t_params / 1e6:.2f} M parameters" in rows["target"]
    assert _mb((target / "model.safetensors").stat().st_size) in rows["target"]
    assert f"{d_params / 1e6:.2f} M parameters" in rows["draft"]
    assert _mb((draft / "model.safetensors").stat().st_size) in rows["draft"]
    tok = json.loads((target / "tokenizer.json").read_text())
    assert f"{len(tok['model']['vocab'])} tokens" in rows["tokenizer"]
    assert _mb((target / "tokenizer.json").stat().st_size) in rows["tokenizer"]
    total = sum(f.stat().st_size for f in EMBEDDED.rglob("*") if f.is_file())
    assert _mb(total) in rows["committed in all"]


def test_embedded_architecture_table_is_the_configs():
    t = json.loads((EMBEDDED / "target" / "config.json").read_text())
    d = json.loads((EMBEDDED / "draft" / "config.json").read_text())
    rows = {r[0]: r[1] for r in _table(_section(_doc("docs/EMBEDDED_MODEL.md"), "Architecture"))}
    assert rows["layers / hidden / heads"] == f"{t['num_hidden_layers']} / {t['hidden_size']} / " \
                                              f"{t['num_attention_heads']}"
    assert rows["MLA"] == (f"q_lora_rank {t['q_lora_rank']}, kv_lora_rank {t['kv_lora_rank']}, qk_nope "
                           f"{t['qk_nope_head_dim']}, qk_rope {t['qk_rope_head_dim']}, v_head {t['v_head_dim']}")
    y = t["rope_scaling"]
    assert rows["rope"].startswith(
        f"theta {t['rope_theta']:g}, **YaRN on**: factor {y['factor']:g}, original_max_position_embeddings "
        f"{y['original_max_position_embeddings']}, beta {y['beta_fast']:g}/{y['beta_slow']:g}, mscale "
        f"{y['mscale']:g}, mscale_all_dim {y['mscale_all_dim']:g}; max_position_embeddings "
        f"{t['max_position_embeddings']}")
    cfg = ModelConfig.from_hf(t)
    plain = 1 / math.sqrt(t["qk_nope_head_dim"] + t["qk_rope_head_dim"])
    assert f"({cfg.softmax_scale:.3f} instead of {plain:.3f})" in _prose("docs/EMBEDDED_MODEL.md")
    assert rows["MoE"].startswith(
        f"{t['n_routed_experts']} routed experts (moe_intermediate {t['moe_intermediate_size']}), "
        f"top-{t['num_experts_per_tok']}, {t['n_shared_experts']} shared expert, `{t['topk_method']}` with "
        f"{t['scoring_func']} scores, **n_group {t['n_group']}, topk_group {t['topk_group']}**")
    assert rows["dense layers"] == (f"first_k_dense_replace {t['first_k_dense_replace']} "
                                    f"(intermediate {t['intermediate_size']})")
    text = _doc("docs/EMBEDDED_MODEL.md")
    assert (f"{d['num_attention_heads']} heads of {d['head_dim']} with {d['num_key_value_heads']} KV heads"
            in text)
    assert f"intermediate {d['intermediate_size']}, rope theta {d['rope_theta']:g}" in text
    assert f"`draft_vocab_size` {d['draft_vocab_size']}" in text
    ids = d["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    assert f"`eagle_config.eagle_aux_hidden_state_layer_ids` is **{ids}**" in text


def test_embedded_aux_ids_are_train_drafts_default_for_six_layers():
    from sglang_eagle3.train_draft import pick_aux_ids

    assert pick_aux_ids(None, 6) == (2, 3, 5)
    assert "[2, 3, 5] for 6 layers" in _prose("docs/EMBEDDED_MODEL.md")


def _train_embedded():
    spec = importlib.util.spec_from_file_location("train_embedded", ROOT / "scripts" / "train_embedded.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_embedded_draft_stage_command_is_the_scripts(monkeypatch):
    """The train_draft command the doc prints is what train_embedded.py runs for the draft stage by default."""
    mod = _train_embedded()
    from sglang_eagle3 import train_draft

    seen = {}
    monkeypatch.setattr(train_draft, "main", lambda argv: seen.setdefault("argv", argv) and {})
    src = inspect.getsource(mod.main)
    defaults = {k: int(v) for k, v in re.findall(r'"--(draft-steps|draft-sequences|draft-gen-batch|eval-prompts)", '
                                                 r'type=int, default=(\d+)', src)}
    args = argparse.Namespace(out="OUT", data="data", tiny=False, draft_time_limit=None,
                              draft_steps=defaults["draft-steps"], draft_sequences=defaults["draft-sequences"],
                              draft_gen_batch=defaults["draft-gen-batch"], eval_prompts=defaults["eval-prompts"])
    mod.stage_draft(args, torch.device("cuda"), {})
    block = re.search(r"python -m sglang_eagle3\.train_draft (--target-model-path.*?)\n```",
                      _doc("docs/EMBEDDED_MODEL.md"), re.S).group(1)
    assert shlex.split(block.replace("\\\n", " ")) == seen["argv"]
    text = _doc("docs/EMBEDDED_MODEL.md")
    assert re.search(r'"--target-steps", type=int, default=997\b', src) and "**997** steps" in text
    assert defaults["draft-steps"] == 1350 and "draft on\n**1350**" in text


# -- SGLANG_OVERLAY.md ------------------------------------------------------------------------------------------------

def test_overlay_apply_options_and_defaults_are_applys():
    from sglang_eagle3.integration import sglang_overlay

    text = _doc("docs/SGLANG_OVERLAY.md")
    para = re.search(r"Options of `apply\(\.\.\.\)`: (.*?)\. Same options", text, re.S).group(1)
    stated = {n: d for n, _, d in re.findall(r"`(\w+)` \((default )?([\w.]+)", para)}
    sig = inspect.signature(sglang_overlay.apply).parameters
    words = {True: "on", False: "off"}
    code = {n: (words[p.default] if isinstance(p.default, bool) else str(p.default)) for n, p in sig.items()}
    assert stated == code


def test_overlay_supported_versions_are_the_pinned_ones():
    from sglang_eagle3.integration import sglang_overlay

    assert sglang_overlay.SUPPORTED_SGLANG_VERSIONS == ("0.5.23",)
    assert "SGLang **0.5.23** only (`SUPPORTED_SGLANG_VERSIONS`)" in _prose("docs/SGLANG_OVERLAY.md")


def test_overlay_baseline_is_what_the_doc_says():
    """selfcheck's baseline keeps only the behaviour-neutral features: the verify counter and the worker reports."""
    from sglang_eagle3.integration.sglang_overlay import OverlayConfig
    from sglang_eagle3.selfcheck import BASELINE_OVERLAY

    cfg = OverlayConfig(**BASELINE_OVERLAY)
    assert (cfg.verify_guard, cfg.strict_verify, cfg.worker_env, cfg.moe_routing, cfg.draft_wiring) == (
        True, False, True, False, False)


# -- names the three docs give ----------------------------------------------------------------------------------------

# Modules the docs run or import for their effect: checked to exist, not imported (``patch`` applies the overlay).
_NOT_IMPORTED = {"sglang_eagle3.patch", "sglang_eagle3.launch_server", "sglang_eagle3.engine"}


def _find_spec(module: str):
    try:
        return importlib.util.find_spec(module)
    except ModuleNotFoundError:  # a parent that is not a package: the name is an attribute, not a module
        return None


def _resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        module = ".".join(parts[:i])
        if _find_spec(module) is None:
            continue
        if module in _NOT_IMPORTED:
            return i == len(parts)
        obj = importlib.import_module(module)
        for attr in parts[i:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def test_every_dotted_package_name_the_docs_give_resolves():
    names = {n.rstrip(".") for d in DOCS for n in re.findall(r"\bsglang_eagle3(?:\.\w+)+", _doc(d))}
    assert names
    missing = sorted(n for n in names if not _resolves(n))
    assert not missing, f"named in {DOCS} but not in the package: {missing}"


@pytest.mark.parametrize("module, names", [
    ("sglang_eagle3.models.loader", ("load_target", "load_draft", "CheckpointError")),
    ("sglang_eagle3.env_report", ("collect_env_report", "compare_reports", "sglang_forced_env",
                                  "warn_sglang_overrides")),
    ("sglang_eagle3.integration.sglang_overlay", ("PATCHES", "PatchSpec", "UnsupportedSGLangVersion",
                                                  "PatchTargetError", "status", "verify_stats")),
    ("sglang_eagle3.integration.verify_guard", ("VerifyFallbackError",)),
    ("sglang_eagle3.integration.draft_wiring", ("DraftWiringError",)),
    ("sglang_eagle3.selfcheck", ("BASELINE_OVERLAY",)),
    ("sglang_eagle3.train.draft", ("accept_lengths",)),
    ("sglang_eagle3.train.data", ("heldout_prompts",)),
])
def test_functions_and_classes_the_docs_name_exist(module, names):
    mod = importlib.import_module(module)
    missing = [n for n in names if not hasattr(mod, n)]
    assert not missing, f"{module} lacks {missing}"
    docs = "\n".join(_doc(d) for d in DOCS)
    assert all(n in docs for n in names)
