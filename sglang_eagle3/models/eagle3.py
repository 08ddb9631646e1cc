"""EAGLE-3 draft head with the semantics of SGLang's ``llama_eagle3``.

One Llama decoder layer whose attention input is cat(input_layernorm(embed(token)), hidden_norm(h)) (2H wide)
with the un-normed h as residual; h is fc(cat of three target hidden states) on the first step after the
target and the draft's own pre-norm output on later steps. Logits are over the draft vocabulary and map to
target ids through d2t (target = draft + d2t[draft]).
"""

from __future__ import annotations

import torch
import torch.nn as nn

from sglang_eagle3 import kernels
from sglang_eagle3.config import DraftConfig, RopeConfig
from sglang_eagle3.core import ForwardBatch
from sglang_eagle3.distributed.parallel_state import get_tp
from sglang_eagle3.layers.embedding import ParallelLMHead
from sglang_eagle3.layers.linear import (
    ColumnParallelLinear,
    LinearBase,
    ReplicatedLinear,
    RowParallelLinear,
    sharded_loader,
)
from sglang_eagle3.layers.mlp import GatedMLP
from sglang_eagle3.layers.norm import RMSNorm
from sglang_eagle3.layers.rotary import RotaryEmbedding


class DraftAttention(nn.Module):
    def __init__(self, cfg: DraftConfig, dtype=None):
        super().__init__()
        tp = get_tp().size
        if cfg.num_key_value_heads % tp:
            raise ValueError(f"draft num_key_value_heads={cfg.num_key_value_heads} must be divisible by {tp=}")
        self.num_heads = cfg.num_attention_heads // tp
        self.num_kv_heads = cfg.num_key_value_heads // tp
        self.head_dim = cfg.head_dim
        self.scale = cfg.head_dim ** -0.5
        H2 = 2 * cfg.hidden_size
        self.q_proj = ColumnParallelLinear(H2, cfg.num_attention_heads * cfg.head_dim, dtype=dtype)
        self.k_proj = ColumnParallelLinear(H2, cfg.num_key_value_heads * cfg.head_dim, dtype=dtype)
        self.v_proj = ColumnParallelLinear(H2, cfg.num_key_value_heads * cfg.head_dim, dtype=dtype)
        self.o_proj = RowParallelLinear(cfg.num_attention_heads * cfg.head_dim, cfg.hidden_size, dtype=dtype)
        self.rotary = RotaryEmbedding(cfg.head_dim, cfg.max_position_embeddings, RopeConfig(theta=cfg.rope_theta),
                                      interleaved=False)
        self.use_triton: bool | None = None  # None: the Triton kernel on CUDA, the reference elsewhere

    def _qkv(self, x: torch.Tensor, positions: torch.Tensor):
        q = self.q_proj(x).unflatten(-1, (self.num_heads, self.head_dim))
        k = self.k_proj(x).unflatten(-1, (self.num_kv_heads, self.head_dim))
        v = self.v_proj(x).unflatten(-1, (self.num_kv_heads, self.head_dim))
        return self.rotary.rotate(q, positions), self.rotary.rotate(k, positions), v

    def forward(self, x: torch.Tensor, positions: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        """x [N, 2H] flat over the batch's new tokens."""
        q, k, v = self._qkv(x, positions)
        cache = fb.kv.layers[0]
        cache[fb.out_cache_loc] = torch.stack([k, v], dim=1).to(cache.dtype)
        attend = dict(page_size=fb.kv.page_size, sm_scale=self.scale, use_triton=self.use_triton)
        if fb.mode.is_uniform:
            o = kernels.gqa_attention(q, cache, fb.page_table, fb.seq_lens, tokens_per_req=fb.tokens_per_req,
                                      **attend)
        else:  # ragged prefill (the eager fallback): one uniform call per request
            outs, start = [], 0
            for b, n in enumerate(fb.extend_lens):
                outs.append(kernels.gqa_attention(q[start:start + n], cache, fb.page_table[b:b + 1],
                                                  fb.seq_lens[b:b + 1], tokens_per_req=n, **attend))
                start += n
            o = torch.cat(outs, dim=0)
        return self.o_proj(o.flatten(-2))

    def forward_dense(self, x: torch.Tensor, positions: torch.Tensor, attn_mask: torch.Tensor | None = None,
                      extra_kv: tuple[torch.Tensor, torch.Tensor] | None = None):
        """x [B, S, 2H]; attn_mask [B or 1, S, S_k] bool (True = may attend; default causal over S).

        extra_kv (k, v) [B, S_extra, kv_heads, D] are prepended to this call's keys (training-time test
        feeds earlier unrolled steps this way). Returns (out [B, S, H], (k, v) of this call)."""
        q, k, v = self._qkv(x, positions)
        kk, vv = (k, v) if extra_kv is None else (torch.cat([extra_kv[0], k], 1), torch.cat([extra_kv[1], v], 1))
        rep = self.num_heads // self.num_kv_heads
        kk, vv = kk.repeat_interleave(rep, dim=2), vv.repeat_interleave(rep, dim=2)
        scores = torch.einsum("bshd,bkhd->bhsk", q.float(), kk.float()) * self.scale
        if attn_mask is None:
            S, Sk = q.shape[1], kk.shape[1]
            attn_mask = torch.ones(S, Sk, dtype=torch.bool, device=x.device).tril(Sk - S)[None]
        scores = scores.masked_fill(~attn_mask[:, None], float("-inf"))
        o = torch.einsum("bhsk,bkhd->bshd", scores.softmax(-1), vv.float()).to(x.dtype)
        return self.o_proj(o.flatten(-2)), (k, v)


class DraftDecoderLayer(nn.Module):
    def __init__(self, cfg: DraftConfig, dtype=None):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)
        self.self_attn = DraftAttention(cfg, dtype)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)
        self.mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size, dtype)


class Eagle3Draft(nn.Module):
    def __init__(self, cfg: DraftConfig, dtype=None, has_lm_head: bool = True):
        super().__init__()
        self.config = cfg
        fc_in = 3 * (cfg.target_hidden_size or cfg.hidden_size)
        self.fc = ReplicatedLinear(fc_in, cfg.hidden_size, dtype=dtype)
        self.midlayer = DraftDecoderLayer(cfg, dtype)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)
        # Without its own head the draft uses the target's (set by the engine), over the full vocab.
        self.lm_head = ParallelLMHead(cfg.draft_vocab_size, cfg.hidden_size, dtype) if has_lm_head else None
        self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.int64))
        self.register_buffer("t2d", torch.ones(cfg.vocab_size, dtype=torch.bool))
        self.d2t.weight_loader = sharded_loader(None)
        self.t2d.weight_loader = sharded_loader(None)

    def set_kernel_backends(self, attention: str = "auto") -> None:
        """'triton' | 'torch' | 'auto' (Triton on CUDA tensors, the torch reference elsewhere) for the draft's
        attention, norms, rotary and decode-size GEMVs, as the target's attention choice covers its layers."""
        choice = {"auto": None, "triton": True, "torch": False}[attention]
        for module in self.modules():
            if isinstance(module, (RMSNorm, RotaryEmbedding, LinearBase, DraftAttention)):
                module.use_triton = choice

    def _layer(self, input_ids, hidden, embed_weight, attend):
        # embed_weight: the target's full [V, H] table, or its (vocab-parallel) embedding module under TP.
        if isinstance(embed_weight, nn.Module):
            embeds = embed_weight(input_ids)
        else:
            embeds = torch.nn.functional.embedding(input_ids, embed_weight)
        if hidden.shape[-1] != self.config.hidden_size:
            hidden = self.fc(hidden)  # first step after the target: 3 aux states -> H
        layer = self.midlayer
        residual = hidden
        x = torch.cat([layer.input_layernorm(embeds), layer.hidden_norm(hidden)], dim=-1)  # [..., 2H]
        h, kv = attend(layer.self_attn, x)
        h = h + residual
        out = h + layer.mlp(layer.post_attention_layernorm(h))  # pre-norm sum: next step's hidden
        return out, kv

    def forward(self, input_ids: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor, fb: ForwardBatch,
                embed_weight: torch.Tensor, lm_head: nn.Module):
        """Flat batch [N]: returns (draft logits float32 [N, Vd], next hidden [N, H])."""
        out, _ = self._layer(input_ids, hidden, embed_weight, lambda attn, x: (attn(x, positions, fb), None))
        return lm_head(self.norm(out)), out

    def forward_dense(self, input_ids: torch.Tensor, hidden: torch.Tensor, embed_weight: torch.Tensor,
                      positions: torch.Tensor | None = None, attn_mask: torch.Tensor | None = None,
                      extra_kv=None, lm_head: nn.Module | None = None):
        """[B, S] without a cache (training): returns (draft logits [B, S, Vd], hidden_out [B, S, H], (k, v))."""
        B, S = input_ids.shape
        if positions is None:
            positions = torch.arange(S, device=input_ids.device).expand(B, S)
        out, kv = self._layer(input_ids, hidden, embed_weight,
                              lambda attn, x: attn.forward_dense(x, positions, attn_mask, extra_kv))
        head = lm_head if lm_head is not None else self.lm_head
        return head(self.norm(out)), out, kv

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids + self.d2t[draft_ids]
