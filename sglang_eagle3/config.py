"""Frozen model configs built from Hugging Face ``config.json`` files.

``ModelConfig`` covers the DeepSeek-V3 architecture family (DeepSeek-V2-Lite, V3, R1, Kimi-K2/K2.5);
``DraftConfig`` covers EAGLE-3 heads in SGLang's ``llama_eagle3`` format. Every check raises
``ConfigError`` naming the field and the value, so a bad checkpoint fails before any weight is read.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field, fields
from typing import Any


class ConfigError(ValueError):
    """A config field is missing or inconsistent; the message names the field and its value."""


def _require(cfg: dict, key: str, where: str) -> Any:
    if key not in cfg or cfg[key] is None:
        raise ConfigError(f"{where}: required field {key!r} is missing (keys present: {sorted(cfg)[:12]}...)")
    return cfg[key]


def _positive_int(value: Any, name: str, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"{where}: {name} must be a positive integer, got {value!r}")
    return value


def load_json(path: str) -> dict:
    if os.path.isdir(path):
        path = os.path.join(path, "config.json")
    if not os.path.exists(path):
        raise ConfigError(f"config file not found: {path}")
    try:
        with open(path) as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path} is not valid JSON: {e}") from e


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
    def from_hf(cfg: dict) -> RopeConfig:
        # Older configs: rope_theta + rope_scaling; transformers >= 5 writes rope_parameters (holding theta).
        params = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
        theta = params.get("rope_theta", cfg.get("rope_theta", 10000.0))
        kind = params.get("rope_type", params.get("type", "default")) or "default"
        if kind == "default" or not params:
            return RopeConfig(theta=float(theta))
        return RopeConfig(
            theta=float(theta),
            kind=kind,
            factor=float(params.get("factor", 1.0)),
            original_max_position_embeddings=int(params.get("original_max_position_embeddings", 4096)),
            beta_fast=float(params.get("beta_fast", 32.0)),
            beta_slow=float(params.get("beta_slow", 1.0)),
            mscale=float(params.get("mscale", 1.0)),
            mscale_all_dim=float(params.get("mscale_all_dim", 0.0)),
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
        """Builds from a DeepseekV3/V2 config, or a Kimi-K2.5 one (language model under ``text_config``)."""
        prefix = ""
        archs = cfg.get("architectures") or ["DeepseekV3ForCausalLM"]
        outer = cfg
        if "text_config" in cfg:
            cfg = dict(cfg["text_config"])
            prefix = "language_model."
            # Kimi-K2.5 keeps quantization_config at the top level.
            if "quantization_config" not in cfg and "quantization_config" in outer:
                cfg["quantization_config"] = outer["quantization_config"]
        w = "config.text_config" if prefix else "config"
        g = lambda k: _require(cfg, k, w)
        eos = cfg.get("eos_token_id", outer.get("eos_token_id"))
        eos_t = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
        n_routed = g("n_routed_experts")
        return ModelConfig(
            vocab_size=g("vocab_size"),
            hidden_size=g("hidden_size"),
            intermediate_size=cfg.get("intermediate_size") or 0,
            moe_intermediate_size=g("moe_intermediate_size"),
            num_hidden_layers=g("num_hidden_layers"),
            num_attention_heads=g("num_attention_heads"),
            q_lora_rank=cfg.get("q_lora_rank"),
            kv_lora_rank=g("kv_lora_rank"),
            qk_nope_head_dim=g("qk_nope_head_dim"),
            qk_rope_head_dim=g("qk_rope_head_dim"),
            v_head_dim=g("v_head_dim"),
            n_routed_experts=n_routed,
            num_experts_per_tok=g("num_experts_per_tok"),
            n_shared_experts=cfg.get("n_shared_experts") or 0,
            first_k_dense_replace=cfg.get("first_k_dense_replace", 0),
            n_group=cfg.get("n_group") or 1,
            topk_group=cfg.get("topk_group") or 1,
            norm_topk_prob=bool(cfg.get("norm_topk_prob", True)),
            routed_scaling_factor=float(cfg.get("routed_scaling_factor", 1.0)),
            scoring_func=cfg.get("scoring_func", "sigmoid"),
            topk_method=cfg.get("topk_method", "noaux_tc"),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            max_position_embeddings=g("max_position_embeddings"),
            rope=RopeConfig.from_hf(cfg),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            moe_layer_freq=cfg.get("moe_layer_freq", 1),
            bos_token_id=cfg.get("bos_token_id", outer.get("bos_token_id")),
            eos_token_id=eos_t,
            architecture=archs[0],
            weight_prefix=prefix,
            quantization=cfg.get("quantization_config"),
        )

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
                  "head_dim", "vocab_size", "draft_vocab_size"):
            _positive_int(getattr(self, f), f, w)
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(f"{w}: num_attention_heads={self.num_attention_heads} is not a multiple of "
                              f"num_key_value_heads={self.num_key_value_heads}")
        if self.draft_vocab_size > self.vocab_size:
            raise ConfigError(f"{w}: draft_vocab_size={self.draft_vocab_size} > vocab_size={self.vocab_size}")
        if self.aux_layer_ids is not None and len(self.aux_layer_ids) != 3:
            raise ConfigError(f"{w}: eagle_aux_hidden_state_layer_ids must hold 3 ids, "
                              f"got {list(self.aux_layer_ids)}")

    @staticmethod
    def from_hf(cfg: dict) -> DraftConfig:
        w = "draft config"
        g = lambda k: _require(cfg, k, w)
        archs = cfg.get("architectures") or []
        if archs and not any("Eagle3" in a or "eagle3" in a.lower() for a in archs):
            raise ConfigError(f"{w}: architectures={archs} is not an EAGLE-3 draft "
                              "(expected LlamaForCausalLMEagle3)")
        heads = g("num_attention_heads")
        hidden = g("hidden_size")
        eagle = cfg.get("eagle_config") or {}
        ids = eagle.get("eagle_aux_hidden_state_layer_ids")
        vocab = g("vocab_size")
        return DraftConfig(
            hidden_size=hidden,
            intermediate_size=g("intermediate_size"),
            num_attention_heads=heads,
            num_key_value_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or hidden // heads,
            vocab_size=vocab,
            draft_vocab_size=cfg.get("draft_vocab_size") or vocab,
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-5)),
            rope_theta=float((cfg.get("rope_parameters") or {}).get("rope_theta", cfg.get("rope_theta", 10000.0))),
            max_position_embeddings=cfg.get("max_position_embeddings", 2048),
            aux_layer_ids=tuple(int(i) for i in ids) if ids is not None else None,
            target_hidden_size=cfg.get("target_hidden_size"),
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
    stream entering layer i; i == num_target_layers means the final pre-norm output. Default
    [2, L//2, L-3] as SGLang computes it.
    """
    L = num_target_layers
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
            raise ConfigError(f"aux layer id {i} out of range for a target with {L} layers "
                              f"(ids {list(ids)}; valid 0..{L})")
    return ids
