"""Frozen model configs built from Hugging Face ``config.json`` files.

``ModelConfig`` covers the DeepSeek-V3 architecture family (DeepSeek-V2-Lite, V3, R1, Kimi-K2/K2.5);
``DraftConfig`` covers EAGLE-3 heads in SGLang's ``llama_eagle3`` format. Every check raises
``ConfigError`` naming the field and the value, so a bad checkpoint fails before any weight is read.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field, fields
from typing import Any


class ConfigError(ValueError):
    """A config field is missing or inconsistent; the message names the field and its value."""


def _require(cfg: dict, key: str, where: str) -> Any:
    if key not in cfg or cfg[key] is None:
        what = "is null" if key in cfg else "is missing"
        raise ConfigError(f"{where}: required field {key!r} {what} (keys present: {sorted(cfg)[:12]}...)")
    return cfg[key]


def _positive_int(value: Any, name: str, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"{where}: {name} must be a positive integer, got {value!r}")
    return value


_MISSING = object()
_KINDS = {
    # bool is a subclass of int in Python: a config's `true` must not pass for 1.
    "int": (lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer"),
    "float": (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v),
              "a finite number"),
    "bool": (lambda v: isinstance(v, bool), "true or false"),
    "str": (lambda v: isinstance(v, str), "a string"),
    "dict": (lambda v: isinstance(v, dict), "an object"),
    "list": (lambda v: isinstance(v, list), "a list"),
}


# Target architectures with DeepSeek-V3's layers (MLA, noaux_tc MoE). Kimi-K2 writes DeepseekV3ForCausalLM; a
# DeepseekV2ForCausalLM has the same blocks and is refused field by field where it differs (its softmax routing).
# DeepSeek-V3.2's sparse-attention indexer is not built, so its DeepseekV32ForCausalLM is not listed.
TARGET_ARCHITECTURES = frozenset({"DeepseekV3ForCausalLM", "DeepseekV2ForCausalLM", "KimiK25ForConditionalGeneration"})


def _get(cfg: dict, key: str, where: str, kind: str, default: Any = _MISSING) -> Any:
    """``cfg[key]`` checked to be of ``kind``; absent or null gives ``default`` (required when there is none).

    Without it a string where a number belongs fails later as a bare ``ValueError`` / ``TypeError`` that names
    neither the file's field nor its value, and ``bool("false")`` is True.
    """
    value = cfg.get(key)
    if value is None:
        if default is _MISSING:
            return _require(cfg, key, where)
        return default
    ok, what = _KINDS[kind]
    if not ok(value):
        raise ConfigError(f"{where}: {key} must be {what}, got {value!r}")
    return float(value) if kind == "float" else value


def _rope_fields(cfg: dict, where: str) -> tuple[str, dict, str, float]:
    """(where its fields are, the rope dict, its type, theta). Older configs: rope_theta + rope_scaling;
    transformers >= 5 writes rope_parameters (holding theta)."""
    key = "rope_parameters" if cfg.get("rope_parameters") is not None else "rope_scaling"
    params = _get(cfg, key, where, "dict", {})
    w = f"{where}.{key}"
    theta = _get(params, "rope_theta", w, "float", None)
    if theta is None:
        theta = _get(cfg, "rope_theta", where, "float", 10000.0)
    kind = _get(params, "rope_type", w, "str", None) or _get(params, "type", w, "str", "default")
    return w, params, kind, theta


def _check_fixed(cfg: dict, where: str, fixed: dict[str, tuple[str, Any]], why: str) -> None:
    """Fields whose other values would change the maths of what we build: refused, not ignored."""
    for key, (kind, want) in fixed.items():
        got = _get(cfg, key, where, kind, want)
        if got != want:
            raise ConfigError(f"{where}: {key}={got!r} is not supported ({why} {key}={want!r})")


# Fields a DeepSeek-V3 config.json may leave out, and what they then are: transformers' DeepseekV3Config defaults,
# which SGLang builds its model from (AutoConfig; Kimi-K2.5's text_config is read as deepseek_v3, and DeepSeek-V3's
# own configuration_deepseek.py, which DeepSeek-V3 / R1 and Kimi-K2 ship, has the same). The last three are not fields
# of transformers' class: its model builds them in (noaux_tc routing over sigmoid scores, an MoE layer at every layer
# from first_k_dense_replace on), and DeepSeek's class defaults them so. The fields without a default here (the sizes)
# are required instead: transformers would take DeepSeek-V3's, which no other checkpoint's weights fit.
_DEEPSEEK_V3_DEFAULTS: dict[str, tuple[str, Any]] = {
    "intermediate_size": ("int", 18432),
    "q_lora_rank": ("int", 1536),
    "n_shared_experts": ("int", 1),
    "first_k_dense_replace": ("int", 3),
    "n_group": ("int", 8),
    "topk_group": ("int", 4),
    "norm_topk_prob": ("bool", True),
    "routed_scaling_factor": ("float", 2.5),
    "rms_norm_eps": ("float", 1e-6),
    "tie_word_embeddings": ("bool", False),
    "num_nextn_predict_layers": ("int", 1),
    "scoring_func": ("str", "sigmoid"),
    "topk_method": ("str", "noaux_tc"),
    "moe_layer_freq": ("int", 1),
}
# What a JSON null means where it means something built here: no q LoRA (a plain q_proj, as transformers reads it),
# no dense MLP (refused when first_k_dense_replace > 0). Any other null is refused: transformers keeps None or refuses
# it, and neither is the default.
_NULL_MEANS = {"q_lora_rank": None, "intermediate_size": 0}
# model_type values whose transformers class is DeepseekV3Config (kimi_k2: Kimi-K2's config and Kimi-K2.5's
# text_config, which transformers reads as deepseek_v3; None: a hand-written config without one). Another type's
# class has other defaults (deepseek_v2's: greedy softmax routing, no groups, 2 shared experts...).
_DEEPSEEK_V3_TYPES = (None, "deepseek_v3", "kimi_k2")


def _v3_field(cfg: dict, key: str, where: str, model_type: str | None, left_out: dict[str, Any]) -> Any:
    """``cfg[key]``, or transformers' default when the field is left out (recorded in ``left_out``)."""
    kind, default = _DEEPSEEK_V3_DEFAULTS[key]
    if key not in cfg:
        if model_type not in _DEEPSEEK_V3_TYPES:
            raise ConfigError(f"{where}: {key} is missing and model_type={model_type!r} is not DeepSeek-V3's: SGLang "
                              "would build that type's transformers default, which need not be DeepSeek-V3's "
                              f"{default!r}; write it")
        left_out[key] = default
        return default
    if cfg[key] is None:
        if key in _NULL_MEANS:
            return _NULL_MEANS[key]
        raise ConfigError(f"{where}: {key} is null, which transformers keeps as None or refuses (it is not the "
                          f"default {default!r}); write a value, or leave the field out for the default")
    return _get(cfg, key, where, kind)


def _token_ids(value, key: str, where: str) -> tuple[int, ...]:
    """A config's token id or list of them (``eos_token_id``) as a tuple; null or absent: ()."""
    if isinstance(value, list) and all(_KINDS["int"][0](e) for e in value):
        return tuple(value)
    if value is None or _KINDS["int"][0](value):
        return () if value is None else (value,)
    raise ConfigError(f"{where}: {key} must be a token id or a list of them, got {value!r}")


def load_json(path: str) -> dict:
    if os.path.isdir(path):
        path = os.path.join(path, "config.json")
    if os.path.islink(path) and not os.path.exists(path):
        # NOTE: `ls` lists it, so "not found" alone would send the user looking in the wrong place.
        raise ConfigError(f"{path} is a symbolic link to {os.readlink(path)!r}, which does not exist (a Hugging Face "
                          "cache snapshot copied or moved without its blobs/ folder? Copy it with `cp -L`, or "
                          "download with `huggingface-cli download --local-dir`)")
    if not os.path.exists(path):
        raise ConfigError(f"config file not found: {path}")
    try:
        with open(path, encoding="utf-8") as f:
            cfg = json.load(f)
    except OSError as e:  # permissions, a directory named config.json: a ConfigError naming the file, not a traceback
        raise ConfigError(f"cannot read {path}: {e.strerror or e}") from e
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path} is not valid JSON: {e}") from e
    except UnicodeDecodeError as e:
        # Typically model_path pointing at a .safetensors / .bin file instead of its directory.
        raise ConfigError(f"{path} is not a UTF-8 JSON file ({e.reason} at byte {e.start}); model paths name the "
                          "checkpoint's directory, which holds config.json") from e
    if not isinstance(cfg, dict):
        raise ConfigError(f"{path} must hold a JSON object, got {type(cfg).__name__}")
    return cfg


@dataclass(frozen=True)
class RopeConfig:
    """Rotary embedding of the MLA rope dims. ``kind`` is "default" or "yarn" (DeepSeek's variant)."""

    theta: float
    kind: str = "default"
    factor: float = 1.0
    original_max_position_embeddings: int = 4096
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float = 1.0
    mscale_all_dim: float = 0.0

    def __post_init__(self):
        if self.kind not in ("default", "yarn"):
            raise ConfigError(f"rope_scaling type {self.kind!r} is not supported (supported: default, yarn)")
        if self.theta <= 0:
            raise ConfigError(f"rope_theta must be > 0, got {self.theta}")
        if self.kind == "yarn" and self.factor <= 0:
            raise ConfigError(f"rope_scaling.factor must be > 0, got {self.factor}")

    @staticmethod
    def from_hf(cfg: dict, where: str = "config") -> RopeConfig:
        w, params, kind, theta = _rope_fields(cfg, where)
        if kind == "default" or not params:
            return RopeConfig(theta=theta)
        if kind != "yarn":
            raise ConfigError(f"{w}: type {kind!r} is not supported (supported: default, yarn)")
        # Knobs of other implementations' YaRN that DeepSeek's (the one built here) fixes: transformers'
        # attention_factor (replaces the mscale ratio) and truncate (false: unrounded ramp bounds), SGLang's
        # attn_factor and extrapolation_factor (scale the cos/sin and the kept frequencies).
        _check_fixed(params, w, {"truncate": ("bool", True), "attn_factor": ("float", 1.0),
                                 "extrapolation_factor": ("float", 1.0)},
                     "DeepSeek's YaRN, built here, has")
        attention_factor = _get(params, "attention_factor", w, "float", None)
        if attention_factor is not None:
            raise ConfigError(f"{w}: attention_factor={attention_factor!r} is not supported (DeepSeek's YaRN, built "
                              "here, scales by the mscale / mscale_all_dim ratio)")
        # Required, not defaulted: without them the references disagree (a missing factor means no scaling at
        # all; the original length defaults to 4096 in DeepSeek's code, to max_position_embeddings in
        # transformers', and is an error in SGLang's).
        factor = _get(params, "factor", w, "float")
        if not factor > 0:
            raise ConfigError(f"{w}: factor must be > 0, got {factor}")
        mscale = _get(params, "mscale", w, "float", None)
        mscale_all_dim = _get(params, "mscale_all_dim", w, "float", None)
        # The cos/sin magnitude: DeepSeek's YaRN (and SGLang's, which the defaults here follow) divides
        # yarn_get_mscale(factor, mscale) by yarn_get_mscale(factor, mscale_all_dim), taking 1 and 0 for one left out;
        # transformers' takes that ratio only when both are set and non-zero, else yarn_get_mscale(factor). Where the
        # two differ, the references disagree on the model: refused, not guessed.
        ours = (yarn_get_mscale(factor, 1.0 if mscale is None else mscale)
                / yarn_get_mscale(factor, 0.0 if mscale_all_dim is None else mscale_all_dim))
        theirs = (yarn_get_mscale(factor, mscale) / yarn_get_mscale(factor, mscale_all_dim)
                  if mscale and mscale_all_dim else yarn_get_mscale(factor, 1.0))
        if not math.isclose(ours, theirs, rel_tol=1e-12):
            raise ConfigError(f"{w}: mscale={mscale!r} with mscale_all_dim={mscale_all_dim!r} scales cos/sin by "
                              f"{ours:.6g} in DeepSeek's YaRN (as SGLang builds it) but by {theirs:.6g} in "
                              "transformers'; write both, non-zero (or neither)")
        return RopeConfig(
            theta=theta,
            kind=kind,
            factor=factor,
            original_max_position_embeddings=_positive_int(
                _get(params, "original_max_position_embeddings", w, "int"), "original_max_position_embeddings", w),
            beta_fast=_get(params, "beta_fast", w, "float", 32.0),
            beta_slow=_get(params, "beta_slow", w, "float", 1.0),
            mscale=1.0 if mscale is None else mscale,
            mscale_all_dim=0.0 if mscale_all_dim is None else mscale_all_dim,
        )


def yarn_get_mscale(scale: float, mscale: float) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


@dataclass(frozen=True)
class ModelConfig:
    """DeepSeek-V3-architecture target. Field names follow the Hugging Face config."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int  # dense MLP (layers < first_k_dense_replace)
    moe_intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    q_lora_rank: int | None  # None: q_proj is a plain linear (DeepSeek-V2-Lite)
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    n_routed_experts: int
    num_experts_per_tok: int
    n_shared_experts: int
    first_k_dense_replace: int
    n_group: int
    topk_group: int
    norm_topk_prob: bool
    routed_scaling_factor: float
    scoring_func: str
    topk_method: str
    rms_norm_eps: float
    max_position_embeddings: int
    rope: RopeConfig
    tie_word_embeddings: bool = False
    moe_layer_freq: int = 1
    # DeepSeek-V3's multi-token-prediction layers, stored after the last decoder layer and not run here.
    num_nextn_predict_layers: int = 0
    bos_token_id: int | None = None
    eos_token_id: tuple[int, ...] = ()
    architecture: str = "DeepseekV3ForCausalLM"
    # Set when the checkpoint nests the language model (Kimi-K2.5): tensors live under this prefix.
    weight_prefix: str = ""
    quantization: dict | None = field(default=None, compare=False, hash=False)

    def __post_init__(self):
        w = "config"
        for f in ("vocab_size", "hidden_size", "moe_intermediate_size", "num_hidden_layers",
                  "num_attention_heads", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
                  "v_head_dim", "n_routed_experts", "num_experts_per_tok", "n_group", "topk_group",
                  "max_position_embeddings"):
            _positive_int(getattr(self, f), f, w)
        if self.q_lora_rank is not None:
            _positive_int(self.q_lora_rank, "q_lora_rank", w)
        if self.qk_rope_head_dim % 2:
            raise ConfigError(f"{w}: qk_rope_head_dim must be even, got {self.qk_rope_head_dim}")
        if self.num_experts_per_tok > self.n_routed_experts:
            raise ConfigError(f"{w}: num_experts_per_tok={self.num_experts_per_tok} > "
                              f"n_routed_experts={self.n_routed_experts}")
        if self.n_routed_experts % self.n_group:
            raise ConfigError(f"{w}: n_routed_experts={self.n_routed_experts} is not divisible by "
                              f"n_group={self.n_group}")
        if self.topk_group > self.n_group:
            raise ConfigError(f"{w}: topk_group={self.topk_group} > n_group={self.n_group}")
        per_group = self.n_routed_experts // self.n_group
        if self.n_group > 1 and per_group < 2:
            raise ConfigError(f"{w}: grouped routing needs >= 2 experts per group, got {per_group}")
        if self.num_experts_per_tok > self.topk_group * per_group:
            raise ConfigError(f"{w}: num_experts_per_tok={self.num_experts_per_tok} exceeds the "
                              f"{self.topk_group} groups x {per_group} experts that selection keeps")
        if not 0 <= self.first_k_dense_replace <= self.num_hidden_layers:
            raise ConfigError(f"{w}: first_k_dense_replace={self.first_k_dense_replace} outside "
                              f"[0, num_hidden_layers={self.num_hidden_layers}]")
        if self.first_k_dense_replace > 0:
            _positive_int(self.intermediate_size, "intermediate_size", w)
        if self.scoring_func != "sigmoid":
            raise ConfigError(f"{w}: scoring_func={self.scoring_func!r} is not supported (only 'sigmoid', "
                              "as DeepSeek-V3 and Kimi use)")
        if self.topk_method != "noaux_tc":
            raise ConfigError(f"{w}: topk_method={self.topk_method!r} is not supported (only 'noaux_tc')")
        if self.n_shared_experts < 0:
            raise ConfigError(f"{w}: n_shared_experts must be >= 0, got {self.n_shared_experts}")
        if not self.rms_norm_eps > 0:
            raise ConfigError(f"{w}: rms_norm_eps must be > 0, got {self.rms_norm_eps}")
        if not self.routed_scaling_factor > 0:
            raise ConfigError(f"{w}: routed_scaling_factor must be > 0, got {self.routed_scaling_factor}")
        if self.num_nextn_predict_layers < 0:
            raise ConfigError(f"{w}: num_nextn_predict_layers must be >= 0, got {self.num_nextn_predict_layers}")
        if self.moe_layer_freq != 1:
            raise ConfigError(f"{w}: moe_layer_freq={self.moe_layer_freq} is not supported (only 1)")

    # Derived sizes -------------------------------------------------------------------------
    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def kv_cache_dim(self) -> int:
        """Latent KV cache width per token: compressed kv + the shared rope key."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def softmax_scale(self) -> float:
        scale = self.qk_head_dim ** -0.5
        if self.rope.kind == "yarn" and self.rope.mscale_all_dim:
            m = yarn_get_mscale(self.rope.factor, self.rope.mscale_all_dim)
            scale = scale * m * m
        return scale

    def is_moe_layer(self, layer_id: int) -> bool:
        return layer_id >= self.first_k_dense_replace and layer_id % self.moe_layer_freq == 0

    # Construction ---------------------------------------------------------------------------
    @staticmethod
    def from_hf(cfg: dict) -> ModelConfig:
        """Builds from a DeepseekV3/V2 config, or a Kimi-K2.5 one (language model under ``text_config``).

        A field the config leaves out takes transformers' DeepseekV3Config default (``_DEEPSEEK_V3_DEFAULTS``), as
        SGLang's model does; one whose default cannot be built here is refused, the message naming it."""
        prefix = ""
        archs = _get(cfg, "architectures", "config", "list", []) or ["DeepseekV3ForCausalLM"]
        if any("Eagle3" in str(a) or "eagle3" in str(a).lower() for a in archs):
            raise ConfigError(f"config: architectures={archs} is an EAGLE-3 draft, not a target: pass it as "
                              "speculative_draft_model_path and the DeepSeek-V3 / Kimi-K2.5 model as model_path")
        if not any(str(a) in TARGET_ARCHITECTURES for a in archs):
            # Otherwise a Llama or Qwen checkpoint fails on the first DeepSeek field it lacks, a message that reads
            # as a damaged DeepSeek config rather than the wrong model.
            raise ConfigError(f"config: architectures={archs} is not a model this runtime builds: the target must be "
                              f"one of {sorted(TARGET_ARCHITECTURES)} (MLA attention + DeepSeek-V3 MoE)")
        outer = cfg
        if "text_config" in cfg:
            cfg = dict(_get(cfg, "text_config", "config", "dict"))
            prefix = "language_model."
            # Kimi-K2.5 keeps quantization_config at the top level.
            if "quantization_config" not in cfg and "quantization_config" in outer:
                cfg["quantization_config"] = outer["quantization_config"]
        w = "config.text_config" if prefix else "config"
        i = lambda k, *d: _get(cfg, k, w, "int", *d)
        # rope_interleave (transformers' DeepseekV3Config, default true): false means the checkpoint's q/k rope
        # columns were permuted to rotate as halves, which the interleaved rope built here would scramble.
        _check_fixed(cfg, w, {"hidden_act": ("str", "silu"), "attention_bias": ("bool", False),
                              "rope_interleave": ("bool", True)},
                     "DeepSeek-V3 and Kimi have")
        eos_t = _token_ids(cfg.get("eos_token_id", outer.get("eos_token_id")), "eos_token_id", w)
        bos = cfg.get("bos_token_id", outer.get("bos_token_id"))
        if bos is not None and not _KINDS["int"][0](bos):
            raise ConfigError(f"{w}: bos_token_id must be a token id, got {bos!r}")
        # NOTE: bos / eos left out stay unset, not transformers' 0 / 1 (DeepSeek-V3's ids): they build nothing, and the
        # engine stops at the tokenizer's EOS when the config names none, where 1 would stop at an ordinary token.
        model_type = _get(cfg, "model_type", w, "str", None)
        left_out: dict[str, Any] = {}  # field -> the default it took

        def d(key):
            return _v3_field(cfg, key, w, model_type, left_out)

        kwargs = dict(
            vocab_size=i("vocab_size"),
            hidden_size=i("hidden_size"),
            intermediate_size=d("intermediate_size"),
            moe_intermediate_size=i("moe_intermediate_size"),
            num_hidden_layers=i("num_hidden_layers"),
            num_attention_heads=i("num_attention_heads"),
            q_lora_rank=d("q_lora_rank"),
            kv_lora_rank=i("kv_lora_rank"),
            qk_nope_head_dim=i("qk_nope_head_dim"),
            qk_rope_head_dim=i("qk_rope_head_dim"),
            v_head_dim=i("v_head_dim"),
            n_routed_experts=i("n_routed_experts"),
            num_experts_per_tok=i("num_experts_per_tok"),
            n_shared_experts=d("n_shared_experts"),
            first_k_dense_replace=d("first_k_dense_replace"),
            n_group=d("n_group"),
            topk_group=d("topk_group"),
            norm_topk_prob=d("norm_topk_prob"),
            routed_scaling_factor=d("routed_scaling_factor"),
            scoring_func=d("scoring_func"),
            topk_method=d("topk_method"),
            rms_norm_eps=d("rms_norm_eps"),
            max_position_embeddings=i("max_position_embeddings"),
            rope=RopeConfig.from_hf(cfg, w),
            tie_word_embeddings=d("tie_word_embeddings"),
            moe_layer_freq=d("moe_layer_freq"),
            num_nextn_predict_layers=d("num_nextn_predict_layers"),
            bos_token_id=bos,
            eos_token_id=eos_t,
            architecture=str(archs[0]),
            weight_prefix=prefix,
            quantization=_get(cfg, "quantization_config", w, "dict", None),
        )
        try:
            return ModelConfig(**kwargs)
        except ConfigError as e:
            # A default that cannot be built (transformers' topk_group=4 beside a written n_group=1, its
            # first_k_dense_replace=3 in a 2-layer model): say where the value came from.
            named = [f"{k}={v!r}" for k, v in left_out.items() if re.search(rf"(?<!\w){k}(?!\w)", str(e))]
            if not named:
                raise
            raise ConfigError(f"{e} ({', '.join(named)}: left out of the config, so transformers' DeepseekV3Config "
                              "default, which SGLang reads too)") from None

    @staticmethod
    def from_path(path: str) -> ModelConfig:
        return ModelConfig.from_hf(load_json(path))

    def to_hf(self) -> dict:
        """A plain DeepseekV3 config dict (used by tests and by the embedded model's writer)."""
        d = {f.name: getattr(self, f.name) for f in fields(self)
             if f.name not in ("rope", "weight_prefix", "quantization", "architecture", "eos_token_id")}
        d["architectures"] = ["DeepseekV3ForCausalLM"]
        d["model_type"] = "deepseek_v3"
        d["rope_theta"] = self.rope.theta
        if self.rope.kind == "yarn":
            d["rope_scaling"] = {
                "type": "yarn", "rope_type": "yarn", "factor": self.rope.factor,
                "original_max_position_embeddings": self.rope.original_max_position_embeddings,
                "beta_fast": self.rope.beta_fast, "beta_slow": self.rope.beta_slow,
                "mscale": self.rope.mscale, "mscale_all_dim": self.rope.mscale_all_dim,
            }
        d["eos_token_id"] = list(self.eos_token_id) if len(self.eos_token_id) != 1 else self.eos_token_id[0]
        if not self.eos_token_id:
            d["eos_token_id"] = None
        return d


@dataclass(frozen=True)
class DraftConfig:
    """EAGLE-3 draft head in SGLang's ``llama_eagle3`` format (one Llama decoder layer)."""

    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int  # target vocab (embedding)
    draft_vocab_size: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    # Ids as written in the checkpoint (eagle_config.eagle_aux_hidden_state_layer_ids); None = default.
    aux_layer_ids: tuple[int, ...] | None = None
    target_hidden_size: int | None = None  # fc input is 3 * this

    def __post_init__(self):
        w = "draft config"
        for f in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
                  "head_dim", "vocab_size", "draft_vocab_size", "max_position_embeddings"):
            _positive_int(getattr(self, f), f, w)
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(f"{w}: num_attention_heads={self.num_attention_heads} is not a multiple of "
                              f"num_key_value_heads={self.num_key_value_heads}")
        if self.draft_vocab_size > self.vocab_size:
            raise ConfigError(f"{w}: draft_vocab_size={self.draft_vocab_size} > vocab_size={self.vocab_size}")
        if self.target_hidden_size is not None:
            _positive_int(self.target_hidden_size, "target_hidden_size", w)
        if not self.rope_theta > 0:
            raise ConfigError(f"{w}: rope_theta must be > 0, got {self.rope_theta}")
        if self.aux_layer_ids is not None and len(self.aux_layer_ids) != 3:
            raise ConfigError(f"{w}: eagle_aux_hidden_state_layer_ids must hold 3 ids, "
                              f"got {list(self.aux_layer_ids)}")

    @staticmethod
    def from_hf(cfg: dict) -> DraftConfig:
        w = "draft config"
        i = lambda k, *d: _get(cfg, k, w, "int", *d)
        archs = _get(cfg, "architectures", w, "list", [])
        # SGLang renames a draft's plain LlamaForCausalLM to LlamaForCausalLMEagle3 (EAGLE's own yuhuili/EAGLE3-*
        # drafts are published so); any other architecture is not a Llama-layer EAGLE-3 head.
        if archs and not any("Eagle3" in str(a) or "eagle3" in str(a).lower() or a == "LlamaForCausalLM"
                             for a in archs):
            raise ConfigError(f"{w}: architectures={archs} is not an EAGLE-3 draft "
                              "(expected LlamaForCausalLMEagle3, or LlamaForCausalLM as SGLang reads a draft's)")
        if any("deepseek" in str(a).lower() for a in archs) or "kv_lora_rank" in cfg:
            # vLLM's Eagle3DeepseekV2ForCausalLM: an MLA decoder layer, not the Llama layer built here.
            raise ConfigError(f"{w}: architectures={archs} with kv_lora_rank={cfg.get('kv_lora_rank')!r} is an EAGLE-3 "
                              "draft with an MLA (DeepSeek) layer; only Llama-layer drafts (LlamaForCausalLMEagle3) "
                              "are supported")
        # Left out, transformers' LlamaConfig (what SGLang reads a draft's config.json as) takes 32 layers, which
        # llama_eagle3 refuses: not read as the one layer built here.
        if cfg.get("num_hidden_layers") is None:
            what = "null" if "num_hidden_layers" in cfg else "missing"
            raise ConfigError(f"{w}: num_hidden_layers is {what}: transformers' LlamaConfig would take its default of "
                              "32 decoder layers (SGLang's llama_eagle3 refuses any but 1); an EAGLE-3 draft here is "
                              "one layer: write num_hidden_layers: 1")
        # What llama_eagle3 fixes and our draft layer builds in (a head that computes something else must not load).
        _check_fixed(cfg, w, {"hidden_act": ("str", "silu"), "attention_bias": ("bool", False),
                              "mlp_bias": ("bool", False), "num_hidden_layers": ("int", 1)},
                     "an EAGLE-3 draft here is one Llama decoder layer with")
        # Variants other runtimes build and we do not: SGLang's tied head (lm_head = the embedding) and fc bias
        # ("bias"); vLLM / speculators' norm_before_residual (the residual is hidden_norm(h), not h) and
        # norm_before_fc (an RMSNorm on the concatenated aux states).
        _check_fixed(cfg, w, {"tie_word_embeddings": ("bool", False), "bias": ("bool", False),
                              "norm_before_residual": ("bool", False), "norm_before_fc": ("bool", False)},
                     "the EAGLE-3 head built here (SGLang's llama_eagle3) has")
        rope_where, _, rope_kind, theta = _rope_fields(cfg, w)
        if rope_kind != "default":
            raise ConfigError(f"{rope_where}: type {rope_kind!r} is not supported (the draft applies plain RoPE "
                              "with rope_theta)")
        heads = i("num_attention_heads")
        hidden = i("hidden_size")
        eagle = _get(cfg, "eagle_config", w, "dict", {})
        # use_aux_hidden_state false (SGLang reads it): the draft takes the target's last hidden state, no fc.
        _check_fixed(eagle, f"{w}.eagle_config", {"use_aux_hidden_state": ("bool", True)},
                     "EAGLE-3 (three aux hidden states through fc) has")
        ids = _get(eagle, "eagle_aux_hidden_state_layer_ids", f"{w}.eagle_config", "list", None)
        if ids is not None and not all(_KINDS["int"][0](x) for x in ids):
            raise ConfigError(f"{w}: eagle_config.eagle_aux_hidden_state_layer_ids must hold integers, got {ids!r}")
        vocab = i("vocab_size")
        eps = _get(cfg, "rms_norm_eps", w, "float", 1e-6)  # transformers' LlamaConfig default
        if not eps > 0:
            raise ConfigError(f"{w}: rms_norm_eps must be > 0, got {eps}")
        return DraftConfig(
            hidden_size=hidden,
            intermediate_size=i("intermediate_size"),
            num_attention_heads=heads,
            num_key_value_heads=i("num_key_value_heads", heads),
            head_dim=i("head_dim", hidden // heads if isinstance(hidden, int) and isinstance(heads, int)
                       and heads > 0 else 0),
            vocab_size=vocab,
            draft_vocab_size=i("draft_vocab_size", vocab),
            rms_norm_eps=eps,
            rope_theta=theta,
            max_position_embeddings=i("max_position_embeddings", 2048),
            aux_layer_ids=tuple(ids) if ids is not None else None,
            target_hidden_size=i("target_hidden_size", None),
        )

    @staticmethod
    def from_path(path: str) -> DraftConfig:
        return DraftConfig.from_hf(load_json(path))

    def to_hf(self) -> dict:
        d = {
            "architectures": ["LlamaForCausalLMEagle3"],
            "model_type": "llama",
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "vocab_size": self.vocab_size,
            "draft_vocab_size": self.draft_vocab_size,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "max_position_embeddings": self.max_position_embeddings,
            "num_hidden_layers": 1,
            "hidden_act": "silu",
        }
        if self.aux_layer_ids is not None:
            d["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(self.aux_layer_ids)}
        if self.target_hidden_size is not None:
            d["target_hidden_size"] = self.target_hidden_size
        return d


def resolve_aux_layer_ids(draft: DraftConfig, num_target_layers: int,
                          override: tuple[int, ...] | None = None) -> tuple[int, ...]:
    """Target layers whose *input* residual stream feeds the draft's fc.

    Follows SGLang's deepseek_v2 rule for DeepSeek-family targets: ids are used as given, unless the
    first id is 1 (SpecForge-style counting from 1), then 1 is added to all. Captured at id i is the residual
    stream entering layer i. Default [2, L//2, L-3] as SGLang computes it.

    Given ids (the draft's config or ``override``) that SGLang 0.5.23 would run otherwise than written are refused,
    naming them: its DeepSeek model captures the stream entering each layer it lists, once, in layer order, into a
    buffer of one slot an id (layers/aux_hidden_states.py), so a repeated id fails its first forward ("captured 2 of
    3 aux hidden states") and ids out of ascending order reach fc in another order. (SGLang's own default repeats a
    layer below 7 layers; only tiny test targets have so few, and the default is taken as it is.)
    NOTE: i == num_target_layers, the final pre-norm output, is ours only: SGLang 0.5.23 never captures it (its
    forward fails the same way); the tests' tiny pairs wire to it.
    """
    L = num_target_layers
    given = override is not None or draft.aux_layer_ids is not None
    if override is not None:
        ids = tuple(int(i) for i in override)
    elif draft.aux_layer_ids is None:
        ids = (2, L // 2, L - 3)
    else:
        ids = draft.aux_layer_ids
        if ids[0] == 1:
            ids = tuple(i + 1 for i in ids)
    if len(ids) != 3:
        raise ConfigError(f"aux layer ids must hold 3 ids, got {list(ids)}")
    for i in ids:
        if not 0 <= i <= L:
            raise ConfigError(f"aux layer id {i} out of range for a target with {L} layers (ids {list(ids)}; valid "
                              f"0..{L})")
    if given and len(set(ids)) < len(ids):
        raise ConfigError(f"aux layer ids {list(ids)} repeat a layer: SGLang captures each layer once, and its "
                          "forward fails with fewer than 3 states for the draft's fc")
    if given and list(ids) != sorted(ids):
        raise ConfigError(f"aux layer ids {list(ids)} are not ascending: SGLang feeds the draft's fc in layer order "
                          f"({sorted(ids)}), not as written; write the order the draft was trained with, ascending")
    return ids


# generation_config.json's sampling fields that SGLang's chat endpoint takes as the defaults of a request that sets
# none (its --sampling-defaults model, the default; ModelConfig.get_default_sampling_params), with their kinds.
GENERATION_SAMPLING_FIELDS = {"temperature": "float", "top_p": "float", "top_k": "int", "min_p": "float",
                              "repetition_penalty": "float"}


@dataclass(frozen=True)
class GenerationConfig:
    """A checkpoint's ``generation_config.json`` as SGLang reads it: its ``eos_token_id`` joins the config's among
    the tokens that end a request, and the sampling fields it writes (``GENERATION_SAMPLING_FIELDS``, nulls left
    out) are the chat endpoint's defaults. Without the file, both are empty."""

    eos_token_id: tuple[int, ...] = ()
    sampling: tuple[tuple[str, float | int], ...] = ()  # (field, value) in GENERATION_SAMPLING_FIELDS' order
    path: str | None = None  # the file read, None without one

    @staticmethod
    def from_path(model_path: str) -> GenerationConfig:
        path = os.path.join(model_path, "generation_config.json")
        if not os.path.isdir(model_path) or not os.path.exists(path):
            return GenerationConfig()
        cfg = load_json(path)
        sampling = tuple((k, _get(cfg, k, path, kind)) for k, kind in GENERATION_SAMPLING_FIELDS.items()
                         if cfg.get(k) is not None)
        return GenerationConfig(_token_ids(cfg.get("eos_token_id"), "eos_token_id", path), sampling, path)

    def sampling_defaults(self) -> dict[str, float | int]:
        return dict(self.sampling)
