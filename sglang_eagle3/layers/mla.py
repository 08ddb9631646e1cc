"""Multi-head latent attention (DeepSeek-V2/V3), absorbed form, over a paged latent cache.

The cache holds per token c = kv_a_layernorm(compressed kv) [kv_lora_rank] and the shared rope key
[qk_rope_head_dim]. Queries are projected into the latent space through W_UK (absorbed), attention runs over
the latent values, and W_UV maps the result back to heads: decode and verify read only the cache.

At inference the decoder layer may hand its input RMSNorm to the attention (``folds_input_norm``): the norm
of h + residual then runs inside the q_a + kv_a launch, one launch fewer per layer.

Prefill forwards of at least ``mha_prefill_tokens`` new tokens a request (and a KV pool with the scratch for it)
compute the non-absorbed form instead: the requests' cached latents are decompressed into per-head keys and values
once, and each query head attends with 192-wide keys and 128-wide values instead of the 576-wide latent
(kernels.mla_mha_prefill): the cheaper form once a chunk's tokens share the decompression (SGLang's choice too).

At decode/verify (launch fusion ``q_rope_attn``) q's rope rotates inside the MLA kernel, so the launch that
writes the new latents (kv_a norm + k rope into the cache) needs only kv_a: it runs on the model's side stream
(overlap ``mla_k_path``) beside q_b and W_UK, or inline without one. Without that fusion the rotary launch (q's
and k's rope, the latent) may run on the side stream beside W_UK (overlap ``rope_side``), or in programs of
W_UK's own launch (fusion ``rope_wuk``: one launch fewer on the stream, no fork and join).
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn as nn

from sglang_eagle3 import env, kernels
from sglang_eagle3.config import ModelConfig
from sglang_eagle3.core import ForwardBatch, ForwardMode
from sglang_eagle3.distributed.parallel_state import get_tp
from sglang_eagle3.layers.linear import ColumnParallelLinear, ReplicatedLinear, RowParallelLinear
from sglang_eagle3.layers.norm import RMSNorm
from sglang_eagle3.layers.rotary import RotaryEmbedding


class MLAAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int, rotary: RotaryEmbedding, dtype=None):
        super().__init__()
        tp = get_tp().size
        if cfg.num_attention_heads % tp:
            raise ValueError(f"num_attention_heads={cfg.num_attention_heads} must be divisible by tp_size={tp}")
        self.layer_id = layer_id
        self.num_heads = cfg.num_attention_heads // tp  # heads on this rank
        self.nope, self.rope_dim, self.v_dim = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim
        self.kv_lora_rank = cfg.kv_lora_rank
        self.softmax_scale = cfg.softmax_scale
        self.rotary = rotary
        H, nh = cfg.hidden_size, cfg.num_attention_heads
        q_out = nh * cfg.qk_head_dim
        if cfg.q_lora_rank is None:
            self.q_proj = ColumnParallelLinear(H, q_out, dtype=dtype)
        else:
            self.q_a_proj = ReplicatedLinear(H, cfg.q_lora_rank, dtype=dtype)
            self.q_a_layernorm = RMSNorm(cfg.q_lora_rank, cfg.rms_norm_eps, dtype=dtype)
            self.q_b_proj = ColumnParallelLinear(cfg.q_lora_rank, q_out, dtype=dtype)
        self.kv_a_proj_with_mqa = ReplicatedLinear(H, cfg.kv_lora_rank + cfg.qk_rope_head_dim, dtype=dtype)
        self.kv_a_layernorm = RMSNorm(cfg.kv_lora_rank, cfg.rms_norm_eps, dtype=dtype)
        self.kv_b_proj = ColumnParallelLinear(cfg.kv_lora_rank, nh * (cfg.qk_nope_head_dim + cfg.v_head_dim),
                                              dtype=dtype)
        self.o_proj = RowParallelLinear(nh * cfg.v_head_dim, H, dtype=dtype)
        self.use_triton: bool | None = None  # None: Triton on CUDA, reference elsewhere (set by the runner)
        # Prefill of at least this many new tokens a request runs the non-absorbed form where the pool has its
        # scratch (KVPool.mha_scratch); 0: never. Set by the runner (DeepseekV3ForCausalLM.set_mha_prefill).
        self.mha_prefill_tokens = 0
        self.read_fusions()
        # With a side stream (layers/overlap.py, "mla_k_path"; set by the model) the k path of a q_rope_attn
        # forward runs there; with "rope_side" (rope_stream) the rotary launch of any other inference forward.
        self.side_stream = None
        self.rope_stream = None
        # With a mid-layer L2 prefetch plan (layers/overlap.py MID_PLANS; set by the model): called with kv_a once
        # the q_a + kv_a launch is queued, by inference forwards with the cache.
        self.after_kv_a = None

    def read_fusions(self) -> None:
        """Launch fusions at inference, from env.NO_FUSE (which switches them off to bisect a numerical
        difference); read when the layer is built, or again by a benchmark timing one setting after another
        (graphs captured before keep what they captured)."""
        self.fuse_qa_norm, self.fuse_kv_norm = env.fusion_on("qa_norm"), env.fusion_on("kv_norm")
        self.fuse_input_norm = env.fusion_on("input_norm")
        self.fuse_q_rope = env.fusion_on("q_rope_attn")
        self.fuse_rope_wuk = env.fusion_on("rope_wuk")

    def folds_input_norm(self) -> bool:
        """Whether forward takes the un-normed hidden state and the decoder layer's input norm (see forward):
        at inference with q_lora, where q_a and kv_a are one launch that can take the norm too."""
        return self.fuse_input_norm and not hasattr(self, "q_proj") and not torch.is_grad_enabled()

    # W_UK [h, nope, c] and W_UV [h, v, c] are views of kv_b_proj's weight: nothing is duplicated, and a
    # weight reload is seen at once. The per-head products below are bmm's over these strided views, which
    # cuBLAS reads in place (unit inner stride, any row and batch stride): no copies, one launch each.
    def _w_uk_uv(self) -> tuple[torch.Tensor, torch.Tensor]:
        w = self.kv_b_proj.weight.view(self.num_heads, self.nope + self.v_dim, self.kv_lora_rank)
        return w[:, : self.nope], w[:, self.nope :]

    def mha_scratch_width(self) -> int:
        """Elements a cache slot takes in the non-absorbed prefill's scratch on this rank."""
        return kernels.mha_scratch_width(self.num_heads, self.nope, self.rope_dim, self.v_dim)

    def _uses_mha(self, fb: ForwardBatch, tokens: int) -> bool:
        """Whether a request's ``tokens`` new tokens of this forward take the non-absorbed form (module doc)."""
        return (fb.mode in (ForwardMode.PREFILL, ForwardMode.EXTEND) and fb.kv.mha_scratch is not None
                and 0 < self.mha_prefill_tokens <= tokens and not torch.is_grad_enabled())

    def _rope_in_attention(self, x: torch.Tensor, fb: ForwardBatch) -> bool:
        """Whether this forward leaves q's rope to the MLA kernel (see the module doc): at inference, for a
        uniform (decode/verify) batch that the Triton kernel serves, with DeepSeek's interleaved rope."""
        return (self.fuse_q_rope and fb.mode.is_uniform and not torch.is_grad_enabled() and self.rotary.interleaved
                and kernels.mla_uses_kernel(self.rope_dim, self.kv_lora_rank, x, use_triton=self.use_triton))

    def _write_latents(self, q_rope: torch.Tensor | None, c: torch.Tensor, k_rope: torch.Tensor,
                       positions: torch.Tensor, cache: torch.Tensor, cache_loc: torch.Tensor) -> None:
        """kv_a_layernorm(c) [N, c] and rope(k_rope) [N, r] into the tokens' cache rows cache_loc [N] of cache
        [slots, c + r]; q_rope [N, h, r] rotates in place in the same launch (None: not at all)."""
        rotary = self._latent_rotary(q_rope, c, k_rope, positions, cache, cache_loc)
        kernels.apply_rotary(**rotary, use_triton=self.rotary.use_triton)

    def _latent_rotary(self, q_rope: torch.Tensor | None, c: torch.Tensor, k_rope: torch.Tensor,
                       positions: torch.Tensor, cache: torch.Tensor, cache_loc: torch.Tensor) -> dict:
        """_write_latents's rotary launch as kernels.apply_rotary's arguments, for the caller to run (or to give
        to a launch that runs it beside its own work: W_UK's with the rope_wuk fusion). Without the kv_norm
        fusion the norm of c runs here, first, as its own launch."""
        k_out = cache[:, self.kv_lora_rank :]
        if self.fuse_kv_norm:  # one launch: the norm of c and the rope
            norm = self.kv_a_layernorm
            return self.rotary.rotate_args(q_rope, k_rope, positions, k_out=k_out, k_out_rows=cache_loc,
                                           c_norm=(c, norm.weight, norm.eps, cache[:, : self.kv_lora_rank]))
        self.kv_a_layernorm(c, out=cache[:, : self.kv_lora_rank], out_rows=cache_loc)
        return self.rotary.rotate_args(q_rope, k_rope, positions, k_out=k_out, k_out_rows=cache_loc)

    def _project(self, x: torch.Tensor, positions: torch.Tensor, cache: torch.Tensor | None = None,
                 cache_loc: torch.Tensor | None = None, input_norm: RMSNorm | None = None,
                 residual: torch.Tensor | None = None, rope_in_attn: bool = False, absorb: bool = True):
        """x [N, H], positions [N] -> q_latent [N, h, c], q_rope [N, h, r], latent kv [N, c + r], stream,
        side_reads. Not ``absorb`` (inference with the cache): q_nope [N, h, nope] in q_latent's place, W_UK not
        applied.

        With ``input_norm`` x is un-normed: q_a and kv_a project input_norm(x + residual), from the same
        launch, and stream is x + residual [N, H] (x itself without a residual); else stream is None.

        For inference (autograd off) the kv_a norm and the rope write in place or straight to the cache: with
        ``cache`` [slots, c + r] and ``cache_loc`` [N] the normed c and the rotated k land in the tokens'
        cache rows (no index_put; one launch with the kv_norm fusion) and latent is None; without, into kv_a's
        own columns, which then is the latent. q's rope columns rotate in place in the same launch as k, and
        q_latent lands contiguous. With autograd on, the same numbers come from out-of-place ops training can
        differentiate.

        ``rope_in_attn`` (inference with the cache): q_rope is returned un-rotated, for the attention kernel to
        rotate, and the cache write (k only) is issued before q is projected, on the side stream if there is
        one; side_reads is then kv_a [N, c + r], which that stream reads: the caller holds it until it has
        joined the stream. So with ``rope_stream`` (overlap rope_side): the whole rotary launch there, beside
        W_UK. Otherwise side_reads is None."""
        stream = None
        assert input_norm is None or self.folds_input_norm(), "the input norm folds only into gemv_pair's launch"
        assert not rope_in_attn or (cache is not None and not torch.is_grad_enabled()), "rope_in_attn: inference"
        # kv_a first, so that the cache write of a rope_in_attn forward can start before q's projections.
        if hasattr(self, "q_proj"):
            q_a, kv_a = None, self.kv_a_proj_with_mqa(x)
        elif torch.is_grad_enabled():
            q_a, kv_a = self.q_a_proj(x), self.kv_a_proj_with_mqa(x)
        elif input_norm is not None:  # q_a and kv_a, with the input norm and its residual add, in one launch
            q_a, kv_a, stream = kernels.gemv_pair(
                x, self.q_a_proj.weight, self.kv_a_proj_with_mqa.weight, norm_weight=input_norm.weight,
                eps=input_norm.eps, residual=residual, use_triton=self.q_a_proj.use_triton, fma=self.q_a_proj.fma)
        else:  # q_a and kv_a read the same x: one launch for both at decode/verify sizes
            q_a, kv_a = kernels.gemv_pair(x, self.q_a_proj.weight, self.kv_a_proj_with_mqa.weight,
                                          use_triton=self.q_a_proj.use_triton, fma=self.q_a_proj.fma)
        if self.after_kv_a is not None and cache is not None and not torch.is_grad_enabled():
            self.after_kv_a(kv_a)
        c, k_rope = kv_a.split([self.kv_lora_rank, self.rope_dim], dim=-1)  # kv_a: [N, c + r]
        side_reads = None
        if rope_in_attn:
            side = self.side_stream if x.is_cuda else None
            with side.fork(kv_a) if side is not None else contextlib.nullcontext():
                self._write_latents(None, c, k_rope, positions, cache, cache_loc)
            side_reads = kv_a if side is not None else None
        if q_a is None:
            q = self.q_proj(x)
        elif torch.is_grad_enabled() or not self.fuse_qa_norm:
            q = self.q_b_proj(self.q_a_layernorm(q_a))
        else:  # q_a_layernorm folded into q_b's launch (each program normalises the row)
            q = kernels.gemv(q_a, self.q_b_proj.weight, norm_weight=self.q_a_layernorm.weight,
                             eps=self.q_a_layernorm.eps, use_triton=self.q_b_proj.use_triton, fma=self.q_b_proj.fma)
        N = x.shape[0]
        q = q.view(N, self.num_heads, self.nope + self.rope_dim)
        q_nope, q_rope = q.split([self.nope, self.rope_dim], dim=-1)
        w_uk, _ = self._w_uk_uv()
        if torch.is_grad_enabled():
            c = self.kv_a_layernorm(c)
            q_rope = self.rotary.rotate(q_rope, positions)
            k_rope = self.rotary.rotate(k_rope, positions)
            q_latent = torch.bmm(q_nope.transpose(0, 1), w_uk).transpose(0, 1)  # [N, h, c]
            latent = torch.cat([c, k_rope], dim=-1)
            if cache is not None:
                cache[cache_loc] = latent.to(cache.dtype)
            return q_latent, q_rope, latent, stream, None
        latent = None
        if cache is None:
            self.kv_a_layernorm(c, out=c)
            self.rotary.rotate_(q_rope, k_rope, positions)
            latent = kv_a
        rotary = None
        if cache is not None and not rope_in_attn:
            side = self.rope_stream if x.is_cuda else None
            if side is None and absorb and self.fuse_rope_wuk:  # run by W_UK's launch (q_nope: other columns)
                rotary = self._latent_rotary(q_rope, c, k_rope, positions, cache, cache_loc)
            else:  # with rope_side on the side stream, beside W_UK
                with side.fork(q) if side is not None else contextlib.nullcontext():
                    self._write_latents(q_rope, c, k_rope, positions, cache, cache_loc)
                side_reads = kv_a if side is not None else None
        if not absorb:
            return q_nope, q_rope, latent, stream, side_reads
        # q_nope [N, h, nope] @ W_UK [h, nope, c] per head: the GEMV kernel reads W_UK in place as an
        # N-contiguous [h, c, nope] view (decode/verify), a batched GEMM otherwise.
        q_latent = kernels.gemv(q_nope, w_uk.transpose(1, 2), rotary=rotary, use_triton=self.use_triton)
        return q_latent, q_rope, latent, stream, side_reads

    def _heads_out(self, attn_latent: torch.Tensor) -> torch.Tensor:
        """attn_latent [N, h, c] -> the heads' outputs attn W_UV^T [N, h, v]."""
        _, w_uv = self._w_uk_uv()
        if torch.is_grad_enabled():
            return torch.bmm(attn_latent.transpose(0, 1), w_uv.transpose(1, 2)).transpose(0, 1)
        # per head attn W_UV^T; on the CUDA cores where the engine allows it (kernels/gemv.py fma_form: W_UV is
        # K-contiguous, W_UK above is not and keeps the tensor cores)
        return kernels.gemv(attn_latent, w_uv, use_triton=self.use_triton, fma=self.kv_b_proj.fma)

    def _output(self, attn_latent: torch.Tensor) -> torch.Tensor:
        """attn_latent [N, h, c] -> o_proj(attn W_UV) [N, H]."""
        return self.o_proj(self._heads_out(attn_latent).reshape(attn_latent.shape[0], -1))

    def _mha(self, q_nope: torch.Tensor, q_rope: torch.Tensor, cache: torch.Tensor, fb: ForwardBatch,
             page_table: torch.Tensor, seq_lens: torch.Tensor, tokens: int, rope: dict) -> torch.Tensor:
        """The non-absorbed form for ``tokens`` new tokens a request -> the heads' outputs [N, h, v]."""
        return kernels.mla_mha_prefill(
            q_nope, q_rope, cache, self.kv_b_proj.weight, fb.kv.mha_scratch, page_table, seq_lens,
            tokens_per_req=tokens, page_size=fb.kv.page_size, kv_lora_rank=self.kv_lora_rank,
            sm_scale=self.softmax_scale, use_triton=self.use_triton, **rope)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, fb: ForwardBatch, *,
                input_norm: RMSNorm | None = None,
                residual: torch.Tensor | None = None) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """x [N, H] flat over the batch's new tokens -> [N, H].

        With ``input_norm`` (the decoder layer's, only where folds_input_norm()): x is the un-normed hidden
        state h, the attention reads input_norm(h + residual) (h without a residual), and returns (out, the
        stream h + residual [N, H]), as ``input_norm(h, residual)`` returns it (h itself without a residual)."""
        cache = fb.kv.layers[self.layer_id]
        rope_in_attn = self._rope_in_attention(x, fb)
        lens = [fb.tokens_per_req] if fb.mode.is_uniform else fb.extend_lens
        mha = [self._uses_mha(fb, n) for n in lens]
        q, q_rope, _, stream, side_reads = self._project(
            x, positions, cache, fb.out_cache_loc, input_norm, residual, rope_in_attn,
            absorb=not any(mha))  # writes the new latents; q is q_latent, or q_nope where any request takes MHA
        if side_reads is not None:  # the cache write on the side stream; side_reads stays referenced until here
            (self.side_stream or self.rope_stream).join(side_reads)
        rope = dict(rope=self.rotary.tables(q_rope.dtype), positions=positions) if rope_in_attn else {}
        if fb.mode.is_uniform and mha[0]:
            heads = self._mha(q, q_rope, cache, fb, fb.page_table, fb.seq_lens, fb.tokens_per_req, rope)
        elif fb.mode.is_uniform:
            heads = self._heads_out(kernels.mla_attention(
                q, q_rope, cache, fb.page_table, fb.seq_lens, tokens_per_req=fb.tokens_per_req,
                page_size=fb.kv.page_size, kv_lora_rank=self.kv_lora_rank, sm_scale=self.softmax_scale,
                use_triton=self.use_triton, **rope))
        else:
            # Ragged prefill (the eager fallback; prefill graphs run the uniform PREFILL mode above): one
            # uniform call per request, on the kernel where it serves (the reference gathers the whole page
            # table and scores every slot of it: [n, heads, capacity] float32, 17 GB for a 4k-token prompt in a
            # 128k server's table).
            w_uk = self._w_uk_uv()[0]
            outs, start = [], 0
            for b, n in enumerate(fb.extend_lens):
                rows, table, seq_len = slice(start, start + n), fb.page_table[b:b + 1], fb.seq_lens[b:b + 1]
                start += n
                if mha[b]:
                    outs.append(self._mha(q[rows], q_rope[rows], cache, fb, table, seq_len, n, {}))
                    continue
                # q holds q_nope where another request takes MHA: this request's absorbed queries
                q_latent = kernels.gemv(q[rows], w_uk.transpose(1, 2), use_triton=self.use_triton) if any(mha) \
                    else q[rows]
                outs.append(kernels.mla_attention(
                    q_latent, q_rope[rows], cache, table, seq_len, tokens_per_req=n, page_size=fb.kv.page_size,
                    kv_lora_rank=self.kv_lora_rank, sm_scale=self.softmax_scale, use_triton=self.use_triton))
            # Without MHA every out is a latent: W_UV over the whole batch at once, as one launch
            heads = self._heads_out(torch.cat(outs, dim=0)) if not any(mha) else torch.cat(
                [o if m else self._heads_out(o) for o, m in zip(outs, mha, strict=True)], dim=0)
        out = self.o_proj(heads.reshape(x.shape[0], -1))
        return out if input_norm is None else (out, stream)

    def forward_dense(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Full causal attention over x [B, S, H] without a cache (training and references)."""
        B, S, H = x.shape
        q_latent, q_rope, latent, _, _ = self._project(x.reshape(B * S, H), positions.reshape(B * S))
        # The batch itself as a paged cache: request b is page b with page_size S.
        table = torch.arange(B, dtype=torch.int32, device=x.device)[:, None]
        seq_lens = torch.full((B,), S, dtype=torch.int32, device=x.device)
        out = kernels.ref_mla_attention(
            q_latent, q_rope, latent, table, seq_lens, tokens_per_req=S, page_size=S,
            kv_lora_rank=self.kv_lora_rank, sm_scale=self.softmax_scale)
        return self._output(out).view(B, S, H)
