"""Runs the target and draft forwards: owns the KV pools, the page allocator and the graph runners.

The scheduler hands it host-side batch descriptions (tokens, positions, page tables); it builds the
device tensors, picks graph replay or eager, and returns device tensors.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from sglang_eagle3.core import ForwardBatch, ForwardMode, KVPool
from sglang_eagle3.models.deepseek_v3 import DeepseekV3ForCausalLM
from sglang_eagle3.models.eagle3 import Eagle3Draft
from sglang_eagle3.runtime.graph_runner import ForwardStats, GraphRunner, InputSpec
from sglang_eagle3.runtime.kv_cache import PageAllocator, make_pool

logger = logging.getLogger(__name__)

_UNIFORM_SPECS = {
    "input_ids": InputSpec(per_token=True),
    "positions": InputSpec(per_token=True),
    "page_table": InputSpec(per_token=False),
    "seq_lens": InputSpec(per_token=False, pad_with_tokens_per_req=True),
    "out_cache_loc": InputSpec(per_token=True),
}


@dataclass
class BatchTensors:
    """Device tensors of one forward. Per-token rows are grouped by request."""

    input_ids: torch.Tensor  # [N] int64
    positions: torch.Tensor  # [N] int64
    page_table: torch.Tensor  # [B, P] int32
    seq_lens: torch.Tensor  # [B] int32
    out_cache_loc: torch.Tensor  # [N] int64
    extend_lens: list[int]


class ModelRunner:
    def __init__(self, target: DeepseekV3ForCausalLM, draft: Eagle3Draft | None, *, aux_layer_ids: tuple[int, ...],
                 num_pages: int, page_size: int, max_context: int, device: torch.device, dtype: torch.dtype,
                 use_cuda_graph: bool, cuda_graph_max_bs: int, verify_widths: tuple[int, ...],
                 attention_backend: str, moe_backend: str = "auto", graph_disabled_reason: str = ""):
        for name, model in (("target", target), ("draft", draft)):
            # Positions index the rotary cos/sin tables, which the kernels read unchecked: past the table a
            # position reads other memory (NaN logits, or an illegal address), so refuse the pool up front.
            limit = None if model is None else model.config.max_position_embeddings
            if limit is not None and max_context > limit:
                raise ValueError(f"max_context={max_context} exceeds the {name}'s max_position_embeddings={limit} "
                                 "(its rotary table); positions past it cannot be embedded")
        self.target, self.draft = target, draft
        self.aux_layer_ids = aux_layer_ids if draft is not None else ()
        self.device, self.dtype = device, dtype
        self.page_size = page_size
        self.max_pages = (max_context + page_size - 1) // page_size
        target.set_kernel_backends(attention_backend, moe_backend)
        cfg = target.config
        self.allocator = PageAllocator(num_pages)
        self.target_kv: KVPool = make_pool(cfg.num_hidden_layers, num_pages, page_size, (cfg.kv_cache_dim,), dtype,
                                           device)
        self.draft_kv: KVPool | None = None
        if draft is not None:
            dc = draft.config
            heads = draft.midlayer.self_attn.num_kv_heads
            self.draft_kv = make_pool(1, num_pages, page_size, (2, heads, dc.head_dim), dtype, device)
        self.stats = ForwardStats(warn=device.type == "cuda")
        pool = torch.cuda.graph_pool_handle() if use_cuda_graph else None
        common = dict(stats=self.stats, enabled=use_cuda_graph, disabled_reason=graph_disabled_reason,
                      max_bs=cuda_graph_max_bs, pool=pool)
        self.target_decode = GraphRunner("target_decode", self._target_fn(ForwardMode.DECODE), _UNIFORM_SPECS,
                                         tokens_per_req=(1,), **common)
        self.target_verify = GraphRunner("target_verify", self._target_fn(ForwardMode.TARGET_VERIFY),
                                         _UNIFORM_SPECS, tokens_per_req=verify_widths, **common)
        draft_specs = dict(_UNIFORM_SPECS, hidden=InputSpec(per_token=True))
        self.draft_decode = GraphRunner("draft_decode", self._draft_fn(ForwardMode.DECODE), draft_specs,
                                        tokens_per_req=(1,), **common)
        self.draft_extend = GraphRunner("draft_extend", self._draft_fn(ForwardMode.DRAFT_EXTEND), draft_specs,
                                        tokens_per_req=verify_widths, **common)
        # The draft embeds with the target's table; under TP that is the vocab-parallel module (all-reduced).
        emb = target.model.embed_tokens
        self.embed_weight = emb.weight if emb.part == emb.vocab_size else emb

    # -- forward functions (captured as graphs; they never know it) ---------------------------------
    def _fb(self, kv, mode, page_table, seq_lens, out_cache_loc, T, extend_lens=None) -> ForwardBatch:
        return ForwardBatch(mode=mode, kv=kv, page_table=page_table, seq_lens=seq_lens, out_cache_loc=out_cache_loc,
                            tokens_per_req=T, extend_lens=extend_lens)

    def _target_fn(self, mode: ForwardMode):
        def fn(input_ids, positions, page_table, seq_lens, out_cache_loc, tokens_per_req):
            fb = self._fb(self.target_kv, mode, page_table, seq_lens, out_cache_loc, tokens_per_req)
            logits, _, aux = self.target(input_ids, positions, fb, self.aux_layer_ids)
            return (logits, torch.cat(aux, dim=-1)) if aux else (logits,)

        return fn

    def _draft_fn(self, mode: ForwardMode):
        def fn(input_ids, hidden, positions, page_table, seq_lens, out_cache_loc, tokens_per_req):
            fb = self._fb(self.draft_kv, mode, page_table, seq_lens, out_cache_loc, tokens_per_req)
            return self._draft_propose(input_ids, hidden, positions, fb)

        return fn

    def _draft_propose(self, input_ids, hidden, positions, fb):
        """Draft forward -> (proposed target token ids [N], next hidden [N, H]). Greedy proposal: the
        acceptance rule in sampling.py is exact for a deterministic draft."""
        logits, h = self.draft(input_ids, hidden, positions, fb, self.embed_weight, self.draft_head)
        return self.draft.to_target_ids(logits.argmax(-1)), h

    @property
    def draft_head(self):
        return self.draft.lm_head if self.draft.lm_head is not None else self.target.lm_head

    # -- capture -------------------------------------------------------------------------------------
    def capture_graphs(self) -> None:
        H = self.target.config.hidden_size
        aux_w = 3 * H

        def example(bs, T, with_hidden):
            n = bs * T
            d = dict(input_ids=torch.zeros(n, dtype=torch.int64, device=self.device),
                     positions=torch.arange(T, device=self.device).repeat(bs),
                     page_table=torch.zeros(bs, self.max_pages, dtype=torch.int32, device=self.device),
                     seq_lens=torch.full((bs,), T, dtype=torch.int32, device=self.device),
                     out_cache_loc=torch.zeros(n, dtype=torch.int64, device=self.device))
            if with_hidden:
                d["hidden"] = torch.zeros(n, aux_w if with_hidden == "aux" else self.draft.config.hidden_size,
                                          dtype=self.dtype, device=self.device)
            return d

        self.target_verify.capture(lambda bs, T: example(bs, T, False))
        self.target_decode.capture(lambda bs, T: example(bs, T, False))
        if self.draft is not None:
            self.draft_extend.capture(lambda bs, T: example(bs, T, "aux"))
            self.draft_decode.capture(lambda bs, T: example(bs, T, "h"))

    def graph_report(self) -> dict:
        runners = [self.target_decode, self.target_verify, self.draft_decode, self.draft_extend]
        return {r.name: {"graphs": len(r.graphs), "buckets": r.buckets, "tokens_per_req": list(r.tokens_per_req),
                         "capture_seconds": round(r.capture_seconds, 3),
                         "capture_mib": round(r.capture_bytes / 2**20, 1)} for r in runners}

    # -- batch building ------------------------------------------------------------------------------
    def build(self, rows: list[tuple[list[int], int, list[int]]], width: int | None = None) -> BatchTensors:
        """rows: per request (new token ids, first position, page list). New tokens occupy positions
        first .. first+n-1 and seq_len = first + n. ``width`` pads page tables (graphs want max_pages)."""
        return self.build_many([rows], width)[0]

    def build_many(self, batches: list[list[tuple[list[int], int, list[int]]]],
                   width: int | None = None) -> list[BatchTensors]:
        """build() for several batches in two host-to-device copies (int64 and int32) in all, from pinned
        memory without waiting: a speculative round builds its draft steps', verify's and draft extend's
        batches at once, and the host runs ahead of the GPU instead of stalling on each small copy (a pageable
        copy waits for the stream: five of them per batch cost a synchronisation each)."""
        longs, ints, layout = [], [], []
        for rows in batches:
            ids, pos, loc, lens, ext, pages_flat = [], [], [], [], [], []
            P = width or max(len(r[2]) for r in rows)
            for toks, first, pages in rows:
                n = len(toks)
                ids += toks
                p = range(first, first + n)
                pos += p
                loc += [pages[q // self.page_size] * self.page_size + q % self.page_size for q in p]
                lens.append(first + n)
                ext.append(n)
                pages_flat += list(pages) + [0] * (P - len(pages))
            layout.append((len(ids), len(rows), P, ext))
            longs += ids + pos + loc
            ints += lens + pages_flat
        pin = self.device.type == "cuda"
        host64 = torch.tensor(longs, dtype=torch.int64)
        host32 = torch.tensor(ints, dtype=torch.int32)
        dev64 = (host64.pin_memory() if pin else host64).to(self.device, non_blocking=pin)
        dev32 = (host32.pin_memory() if pin else host32).to(self.device, non_blocking=pin)
        out, o64, o32 = [], 0, 0
        for N, B, P, ext in layout:
            ids, pos, loc = dev64[o64:o64 + 3 * N].view(3, N)
            o64 += 3 * N
            lens = dev32[o32:o32 + B]
            table = dev32[o32 + B:o32 + B + B * P].view(B, P)
            o32 += B + B * P
            out.append(BatchTensors(ids, pos, table, lens, loc, ext))
        return out

    # -- forwards ------------------------------------------------------------------------------------
    @torch.inference_mode()
    def target_extend(self, bt: BatchTensors):
        fb = self._fb(self.target_kv, ForwardMode.EXTEND, bt.page_table, bt.seq_lens, bt.out_cache_loc, 1,
                      bt.extend_lens)
        logits, _, aux = self.target(bt.input_ids, bt.positions, fb, self.aux_layer_ids)
        return logits, (torch.cat(aux, dim=-1) if aux else None)

    @torch.inference_mode()
    def target_uniform(self, bt: BatchTensors, T: int, verify: bool):
        runner = self.target_verify if verify else self.target_decode
        out = runner(len(bt.extend_lens), T, input_ids=bt.input_ids, positions=bt.positions,
                     page_table=bt.page_table, seq_lens=bt.seq_lens, out_cache_loc=bt.out_cache_loc)
        return out[0], (out[1] if len(out) > 1 else None)

    @torch.inference_mode()
    def draft_extend_ragged(self, bt: BatchTensors, hidden: torch.Tensor):
        fb = self._fb(self.draft_kv, ForwardMode.EXTEND, bt.page_table, bt.seq_lens, bt.out_cache_loc, 1,
                      bt.extend_lens)
        return self._draft_propose(bt.input_ids, hidden, bt.positions, fb)

    @torch.inference_mode()
    def draft_uniform(self, bt: BatchTensors, hidden: torch.Tensor, T: int):
        runner = self.draft_extend if T > 1 else self.draft_decode
        return runner(len(bt.extend_lens), T, input_ids=bt.input_ids, hidden=hidden, positions=bt.positions,
                      page_table=bt.page_table, seq_lens=bt.seq_lens, out_cache_loc=bt.out_cache_loc)
