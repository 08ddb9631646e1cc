"""DeepSeek-V3 / Kimi-K2.5 target model, top-down in the paper's order.

Parameter names are Hugging Face's (``model.layers.{i}.self_attn.kv_b_proj.weight`` ...), except the routed
experts, which are stacked per layer (``mlp.experts.w13_weight``); the loader maps the checkpoint's
per-expert names onto them.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from sglang_eagle3.config import ModelConfig
from sglang_eagle3.core import ForwardBatch
from sglang_eagle3.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from sglang_eagle3.layers.linear import LinearBase
from sglang_eagle3.layers.mla import MLAAttention
from sglang_eagle3.layers.mlp import GatedMLP
from sglang_eagle3.layers.moe import DeepseekMoE
from sglang_eagle3.layers.norm import RMSNorm
from sglang_eagle3.layers.overlap import Overlaps, SideStream, WeightPrefetcher
from sglang_eagle3.layers.rotary import RotaryEmbedding


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int, rotary: RotaryEmbedding, dtype=None,
                 int4_experts: bool = False):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)
        self.self_attn = MLAAttention(cfg, layer_id, rotary, dtype)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)
        if cfg.is_moe_layer(layer_id):
            self.mlp = DeepseekMoE(cfg, dtype, int4_experts)
        else:
            self.mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size, dtype)

    def forward(self, h: torch.Tensor, residual: torch.Tensor | None, positions: torch.Tensor,
                fb: ForwardBatch | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Residual-fused form (as vLLM/SGLang): the residual stream entering the layer is h + residual
        (just h when residual is None, i.e. the first layer). Returns (mlp out, residual) whose sum is the
        stream leaving the layer. Each residual add rides in the following norm's launch; the sum is rounded
        to the model dtype before it is normalised, so the numbers equal the unfused h = h + attn path.
        At inference the input norm may ride in the attention's q_a + kv_a launch instead
        (MLAAttention.folds_input_norm): the stream is the same, the projections equal within rounding (the
        kernel rounds x * weight before scaling by rstd)."""
        if fb is not None and self.self_attn.folds_input_norm():
            attn, residual = self.self_attn(h, positions, fb, input_norm=self.input_layernorm, residual=residual)
        else:
            if residual is None:
                x, residual = self.input_layernorm(h), h
            else:
                x, residual = self.input_layernorm(h, residual)
            attn = self.self_attn.forward_dense(x, positions) if fb is None else self.self_attn(x, positions, fb)
        x, residual = self.post_attention_layernorm(attn, residual)
        return self.mlp(x), residual


class DeepseekV3Model(nn.Module):
    def __init__(self, cfg: ModelConfig, dtype=None, int4_experts: bool = False):
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size, dtype)
        # One rope table shared by all layers (a buffer, so it follows .to(device)).
        self.rotary = RotaryEmbedding(cfg.qk_rope_head_dim, cfg.max_position_embeddings, cfg.rope,
                                      interleaved=True)
        self.layers = nn.ModuleList(
            DecoderLayer(cfg, i, self.rotary, dtype, int4_experts) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)
        # One side stream for the whole model: the MoE blocks' shared-expert overlap, MLA's k path or its rotary
        # launch, and the layer-start weight prefetch (the later prefetch plans use the prefetcher's own stream).
        self.side_stream = SideStream()
        self.prefetcher = WeightPrefetcher(self.side_stream)
        self.set_overlaps(Overlaps.from_env())

    def set_overlaps(self, overlaps: Overlaps) -> None:
        """Which side-stream overlaps the inference forward uses (layers/overlap.py). Graphs captured before
        keep what they captured."""
        self.overlaps = overlaps
        for i, layer in enumerate(self.layers):
            layer.self_attn.side_stream = self.side_stream if overlaps.mla_k_path else None
            layer.self_attn.rope_stream = self.side_stream if overlaps.rope_side else None
            layer.self_attn.after_kv_a = self.prefetcher.hook(self.layers, i, overlaps.prefetch)
            if isinstance(layer.mlp, DeepseekMoE):
                layer.mlp.side_stream = self.side_stream if overlaps.shared_down else None
                layer.mlp.after_router = self.prefetcher.moe_hook(self.layers, i, overlaps.prefetch_next_moe)

    def forward(self, input_ids, positions, fb: ForwardBatch | None, aux_layer_ids: tuple[int, ...] = ()):
        """Returns (final normed hidden, aux list). Aux id i is the residual stream entering layer i
        (i == num_layers: the pre-norm output of the last layer)."""
        h = self.embed_tokens(input_ids)
        residual = None  # the stream is h + residual; materialised (one add) only where an aux state wants it
        aux = {}
        prefetch = self.overlaps.prefetch if fb is not None and not torch.is_grad_enabled() else None
        for i, layer in enumerate(self.layers):
            if i in aux_layer_ids:
                aux[i] = h if residual is None else h + residual
            self.prefetcher.before_layer(self.layers, i, prefetch, h)
            h, residual = layer(h, residual, positions, fb)
        self.prefetcher.finish(h)
        if len(self.layers) in aux_layer_ids:
            aux[len(self.layers)] = h if residual is None else h + residual
        out = self.norm(h) if residual is None else self.norm(h, residual)[0]
        return out, [aux[i] for i in aux_layer_ids]


class DeepseekV3ForCausalLM(nn.Module):
    def __init__(self, cfg: ModelConfig, dtype=None, int4_experts: bool = False):
        super().__init__()
        self.config = cfg
        self.model = DeepseekV3Model(cfg, dtype, int4_experts)
        self.lm_head = ParallelLMHead(cfg.vocab_size, cfg.hidden_size, dtype)

    def moe_blocks(self) -> list[DeepseekMoE]:
        """The MoE blocks of the layers, in layer order (the first_k_dense_replace dense layers have none)."""
        return [layer.mlp for layer in self.model.layers if isinstance(layer.mlp, DeepseekMoE)]

    def set_kernel_backends(self, attention: str = "auto", moe: str = "auto") -> None:
        """'triton' | 'torch' | 'auto' (Triton on CUDA tensors, the torch reference elsewhere). The attention
        choice also covers the norms, the rotary and the decode-size GEMV of the dense projections (the
        layer's non-MoE kernels); the MoE choice covers the router GEMV, routing and experts."""
        choice = {"auto": None, "triton": True, "torch": False}
        for module in self.modules():
            if isinstance(module, (RMSNorm, RotaryEmbedding, LinearBase)):
                module.use_triton = choice[attention]
        for layer in self.model.layers:
            layer.self_attn.use_triton = choice[attention]
            if isinstance(layer.mlp, DeepseekMoE):
                layer.mlp.use_triton = choice[moe]

    def set_gemv_fma(self, allowed: bool) -> None:
        """Whether the dense projections' GEMV may take its CUDA-core form (kernels/gemv.py fma_for_engine says
        when an engine allows it; fma_form and fma_pair_form which matrices take it: MLA's q_b, its W_UV through
        kv_b_proj, and the MoE layers' router + shared gate/up pair through the shared expert's gate_proj).
        Graphs captured before keep what they captured."""
        for module in self.modules():
            if isinstance(module, LinearBase):
                module.gemv_fma = allowed

    def mha_scratch_width(self, tokens: int) -> int:
        """Elements a KV cache slot takes in the non-absorbed prefill's scratch with set_mha_prefill(tokens) (0 for
        tokens 0: no scratch)."""
        return self.model.layers[0].self_attn.mha_scratch_width() if tokens > 0 else 0

    def set_mha_prefill(self, tokens: int) -> int:
        """Prefill forwards of at least ``tokens`` new tokens a request compute attention in the non-absorbed form
        (layers/mla.py; 0: never). Returns the scratch width the KV pool must then hold (mha_scratch_width)."""
        for layer in self.model.layers:
            layer.self_attn.mha_prefill_tokens = tokens
        return self.mha_scratch_width(tokens)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, fb: ForwardBatch,
                aux_layer_ids: tuple[int, ...] = ()):
        """Flat batch: input_ids/positions [N] -> (logits float32 [N, V], hidden [N, H], aux list [N, H])."""
        h, aux = self.model(input_ids, positions, fb, aux_layer_ids)
        return self.lm_head(h), h, aux

    def forward_dense(self, input_ids: torch.Tensor, aux_layer_ids: tuple[int, ...] = ()):
        """Full causal forward over input_ids [B, S] without a KV cache (training, references).
        Returns (logits float32 [B, S, V], aux list of [B, S, H])."""
        B, S = input_ids.shape
        positions = torch.arange(S, device=input_ids.device).expand(B, S)
        h, aux = self.model(input_ids, positions, None, aux_layer_ids)
        return self.lm_head(h), aux
