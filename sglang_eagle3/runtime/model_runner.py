"""Runs the target and draft forwards: owns the KV pools, the page allocator and the graph runners.

The scheduler hands it host-side batch descriptions (tokens, positions, page tables); it builds the
device tensors, picks graph replay or eager, and returns device tensors.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from dataclasses import dataclass

import torch

from sglang_eagle3 import env
from sglang_eagle3.core import ForwardBatch, ForwardMode, KVPool
from sglang_eagle3.distributed.parallel_state import get_tp, tp_max_floats
from sglang_eagle3.kernels.gemv import fma_for_engine
from sglang_eagle3.models.deepseek_v3 import DeepseekV3ForCausalLM
from sglang_eagle3.models.eagle3 import Eagle3Draft
from sglang_eagle3.progress import beat
from sglang_eagle3.runtime.adaptive import CATCH_UP, DECODE
from sglang_eagle3.runtime.grammar import (
    PREFILL_BELOW_S,
    GrammarBatch,
    allowed_columns,
    apply_token_bitmask,
    bitmask_words,
)
from sglang_eagle3.runtime.graph_runner import ForwardStats, GraphRunner, InputSpec
from sglang_eagle3.runtime.kv_cache import PageAllocator, make_pool, pages_for
from sglang_eagle3.runtime.sampling import (
    ALL_FILTERS,
    UNRANKED,
    Filters,
    Penalties,
    SamplerBatch,
    SamplingParams,
    draft_candidates,
    draft_tokens,
    penalized_logits,
    sample_tokens,
    sampling_rows,
)

logger = logging.getLogger(__name__)
# The requests time_rounds' sampled kind stands for: temperature only (the sampled rounds' UNRANKED graphs; top_k /
# top_p run ALL_FILTERS', a few launches more).
SAMPLED_TIMING = SamplingParams(temperature=0.8)

_UNIFORM_SPECS = {
    "input_ids": InputSpec(per_token=True),
    "positions": InputSpec(per_token=True),
    "page_table": InputSpec(per_token=False),
    "seq_lens": InputSpec(per_token=False, pad_with_tokens_per_req=True),
    "out_cache_loc": InputSpec(per_token=True),
}
# A prefill batch's logits are taken at one row a request (its last real token): last_rows [B].
_PREFILL_SPECS = dict(_UNIFORM_SPECS, last_rows=InputSpec(per_token=False))


@dataclass
class BatchTensors:
    """Device tensors of one forward. Per-token rows are grouped by request."""

    input_ids: torch.Tensor  # [N] int64
    positions: torch.Tensor  # [N] int64
    page_table: torch.Tensor  # [B, P] int32
    seq_lens: torch.Tensor  # [B] int32
    out_cache_loc: torch.Tensor  # [N] int64
    extend_lens: list[int]


def _as_part(runner: GraphRunner):
    """A runner called as the raw forwards are (keyword inputs and tokens_per_req), batch size from seq_lens."""
    def part(tokens_per_req: int, **inputs):
        return runner(inputs["seq_lens"].shape[0], tokens_per_req, **inputs)

    return part


def processed_logits(logits: torch.Tensor, pen: Penalties | None, grammar: GrammarBatch | None) -> torch.Tensor:
    """float32 logits [B, V] (one row a request: decode, prefill) with each row's penalties
    (sampling.penalized_logits), then its grammar's mask (-inf for the tokens it forbids: GrammarBatch.masks). A
    speculative round does the same to each verify row, the drafts before it counted (grammar_spec_round and the
    penalized round)."""
    scores = penalized_logits(logits, pen) if pen is not None else logits
    if grammar is not None:
        scores = apply_token_bitmask(scores, grammar.masks())
    return scores


def _pack_round(a: torch.Tensor, nxt: torch.Tensor, next_draft: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """[B, 3 + k] int64: accepted count, the target's token after them, next round's d_1, d_1..d_k (one copy
    brings a round's results to the host)."""
    B = ids.shape[0]
    return torch.cat([a.view(B, 1), nxt.view(B, 1), next_draft.view(B, 1).to(ids.dtype), ids[:, 1:]], dim=1)


class ModelRunner:
    def __init__(self, target: DeepseekV3ForCausalLM, draft: Eagle3Draft | None, *, aux_layer_ids: tuple[int, ...],
                 num_pages: int, page_size: int, max_context: int, device: torch.device, dtype: torch.dtype,
                 use_cuda_graph: bool, cuda_graph_max_bs: int, verify_widths: tuple[int, ...],
                 attention_backend: str, moe_backend: str = "auto", graph_disabled_reason: str = "",
                 prefill_tokens: tuple[int, ...] = (), mha_prefill_tokens: int = 0, grammar_graphs: bool = False,
                 catch_up_tokens: int = 0):
        """``grammar_graphs``: capture the graphs of grammar rounds too (the engine can serve structured output:
        runtime/grammar.py), else their calls run eager, counted with the reason. ``catch_up_tokens``: the tokens a
        request a resting draft's catch-up covers (the adaptive policy's probe_rounds; 0: the draft never rests),
        for which the sampled catch-up's graphs are captured (catch_up)."""
        for name, model in (("target", target), ("draft", draft)):
            # Positions index the rotary cos/sin tables, which the kernels read unchecked: past the table a
            # position reads other memory (NaN logits, or an illegal address), so refuse the pool up front.
            limit = None if model is None else model.config.max_position_embeddings
            if limit is not None and max_context > limit:
                raise ValueError(f"max_context={max_context} exceeds the {name}'s max_position_embeddings={limit} "
                                 "(its rotary table); positions past it cannot be embedded")
        self.target, self.draft = target, draft
        self._draft_token_ids: torch.Tensor | None = None  # the target id of each draft column (_draft_choice)
        # Whether the draft proposes within a request's grammar (grammar_spec_round); off: its own choice, refused
        # by the verify's masks where the grammar forbids it (tests script drafts that way).
        self.grammar_drafts = True
        # Candidates a grammar round's draft step returns, best first; the host proposes the first its grammar
        # accepts (GrammarBatch.choose). In the graphs' shapes: set before capture_graphs. With rows after the steps,
        # 8 on the embedded pair left 14-17% of steps to refill under a regular expression of words, 42-48% under
        # $$ANY$$ and nearly all under a schema's forced keys (BENCHMARKS.md section 7): hence rows ahead where
        # they are cheap (grammar_prefill_below_s).
        self.grammar_candidates = 8
        # A request whose mask rows recently took under this long to fill has its row filled before each draft step
        # (GrammarBatch.step_mask; grammar.PREFILL_BELOW_S says why this default).
        self.grammar_prefill_below_s = env.GRAMMAR_PREFILL_BELOW_US.number(PREFILL_BELOW_S * 1e6) * 1e-6
        # Proposals made in grammar rounds, and those whose step's candidates the grammar refused all of (refilled:
        # its mask row filled between the draft steps and the proposal chosen again under it).
        self.grammar_proposals = {"proposed": 0, "refilled": 0}
        self.aux_layer_ids = aux_layer_ids if draft is not None else ()
        self.device, self.dtype = device, dtype
        self.page_size = page_size
        self.max_pages = (max_context + page_size - 1) // page_size
        self.max_context = max_context
        target.set_kernel_backends(attention_backend, moe_backend)
        # One GEMV form per matrix for every row count, the same for a speculative engine and a plain one
        # with these arguments (kernels/gemv.py fma_for_engine).
        target.set_gemv_fma(fma_for_engine(cuda_graph_max_bs))
        if draft is not None:
            draft.set_kernel_backends(attention_backend)
        cfg = target.config
        self.allocator = PageAllocator(num_pages)
        # Prefill of >= mha_prefill_tokens new tokens a request in MLA's non-absorbed form, over a scratch the pool
        # holds (EngineArgs.mha_prefill_tokens).
        self.target_kv: KVPool = make_pool(cfg.num_hidden_layers, num_pages, page_size, (cfg.kv_cache_dim,), dtype,
                                           device, target.set_mha_prefill(mha_prefill_tokens))
        if self.target_kv.mha_scratch is not None:
            scratch = self.target_kv.mha_scratch
            cache = sum(t.numel() for t in self.target_kv.layers)
            logger.info("MLA prefill from %d tokens a request in the non-absorbed form: a scratch of %.1f MiB (%.0f%% "
                        "of the target's KV cache; mha_prefill_tokens=0 turns it off)", mha_prefill_tokens,
                        scratch.numel() * scratch.element_size() / 2**20, 100.0 * scratch.numel() / cache)
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
        # A greedy (or simulated-acceptance) speculative round as ONE graph: draft steps, verify, acceptance and
        # draft extend replay together, so the host queues one replay a round instead of k+1. Its eager form
        # (bs past the buckets, graphs off, CPU) runs the same steps through the part runners above.
        raw = {"draft_decode": self.draft_decode.fn, "target_verify": self.target_verify.fn,
               "draft_extend": self.draft_extend.fn}
        parts = {r.name: _as_part(r) for r in (self.draft_decode, self.target_verify, self.draft_extend)}
        round_specs = dict(_UNIFORM_SPECS, hidden=InputSpec(per_token=False), sim_accept=InputSpec(per_token=False,
                                                                                                    pad_value=-1))
        counts = lambda T: ("draft_decode",) * (T - 2) + ("target_verify", "draft_extend")  # noqa: E731
        self.spec_round = GraphRunner("spec_round", self._round_fn(raw), round_specs, tokens_per_req=verify_widths,
                                      eager_fn=self._round_fn(parts), replay_counts=counts, **common)
        # The same round for batches with sampled requests: the target's tokens from the sampler (sampling.py:
        # Gumbel-max with noise fixed by each request's key and the positions) instead of the argmax, its
        # parameters per request as two more inputs (padded rows: temperature 0, greedy). Graphs of their own, so
        # greedy rounds pay nothing for it: one set for temperature and min_p, one with top_k and top_p too (their
        # radix selects: ~0.06-0.1 ms more at Kimi's vocabulary and 4 rows on the H200; kernels.top_threshold).
        sampled_specs = dict(round_specs, samp_f=InputSpec(per_token=False), samp_i=InputSpec(per_token=False))
        self.sampled_rounds = {
            filters: GraphRunner(name, self._round_fn(raw, filters), sampled_specs, tokens_per_req=verify_widths,
                                 eager_fn=self._round_fn(parts, filters), replay_counts=counts, **common)
            for name, filters in (("spec_round_sampled", UNRANKED), ("spec_round_filtered", ALL_FILTERS))}
        # Batches with penalties (frequency / presence / repetition, min_new_tokens, logit_bias): each verify row's
        # logits are penalized with the draft tokens before it counted (sampling.penalized_logits), so that the
        # output is the one plain decoding gives. Not captured as one graph (their per-request state is [B, V]
        # counts a batch): the round runs as its parts, each replaying its own graph (the verify forward too), with
        # acceptance eager between them, and is counted as spec_round_penalized EAGER with this reason.
        processed = self._round_fn(parts, ALL_FILTERS, processed=True)
        self.penalized_round = GraphRunner(
            "spec_round_penalized", processed, sampled_specs, self.stats, enabled=False,
            disabled_reason="a request has penalties (frequency/presence/repetition_penalty, min_new_tokens or "
            "logit_bias): the round runs as its parts, each replaying its own graph")
        # Batches with a grammar (json_schema / regex / ebnf; penalties too, if any): the host picks each draft among
        # its step's candidates (runtime/grammar.py), so the round is k + 2 replays (grammar_spec_round): the draft's
        # candidates for d_1 again from its hidden (grammar_draft_head, which also chooses under a mask where the
        # grammar refuses every candidate), each draft step returning its candidates (grammar_draft_decode), the
        # verify forward (target_verify), then the masked acceptance and the draft extend (spec_round_grammar, over
        # target_verify's logits, penalized between the two where a request has penalties).
        grammar_common = dict(common, enabled=use_cuda_graph and grammar_graphs and draft is not None,
                              disabled_reason=graph_disabled_reason if not use_cuda_graph
                              else "the engine has no grammar backend (grammar graphs not captured)")
        mask = InputSpec(per_token=True, pad_value=-1)  # padded rows: every token allowed (no -inf rows)
        samp_specs = dict(samp_f=InputSpec(per_token=False), samp_i=InputSpec(per_token=False))
        self.grammar_head = GraphRunner(
            "grammar_draft_head", self._grammar_head_fn(), dict(
                hidden=InputSpec(per_token=True), positions=InputSpec(per_token=True), mask=mask, **samp_specs),
            tokens_per_req=(1,), **grammar_common)
        self.grammar_draft = GraphRunner("grammar_draft_decode", self._grammar_draft_fn(),
                                         dict(draft_specs, mask=mask, **samp_specs), tokens_per_req=(1,),
                                         **grammar_common)
        tail_specs = dict(_UNIFORM_SPECS, logits=InputSpec(per_token=True), aux=InputSpec(per_token=True), mask=mask,
                          sim_accept=InputSpec(per_token=False, pad_value=-1), **samp_specs)
        self.grammar_tail = GraphRunner(
            "spec_round_grammar", self._grammar_tail_fn(raw), tail_specs, tokens_per_req=verify_widths,
            eager_fn=self._grammar_tail_fn(parts), replay_counts=lambda T: ("draft_extend",), **grammar_common)
        # Prefill as graphs: prompts padded to the next token bucket (causal, so padded tokens after the real
        # ones change nothing), the target and the draft's extend over them. Buckets past the page table's
        # reach (the context) are dropped: padded positions must index the table and the rotary cache like
        # real ones.
        reach = self.max_pages * page_size
        self.prefill_tokens = tuple(t for t in sorted(set(prefill_tokens)) if t <= reach)
        # A few short prompts admitted together replay one graph (batch buckets up to 8, at most the largest
        # configured bucket's tokens in all, a memory bound that the context length does not change); longer
        # ones go a request at a time.
        prefill_common = dict(common, max_bs=min(cuda_graph_max_bs, 8), tokens_per_req=self.prefill_tokens,
                              max_tokens=max(prefill_tokens) if prefill_tokens else None)
        self.target_prefill = GraphRunner("target_prefill", self._prefill_fn(ForwardMode.PREFILL), _PREFILL_SPECS,
                                          **prefill_common)
        self._prefill_ragged = self._prefill_fn(ForwardMode.EXTEND)  # the eager fallback: the same outputs
        self.draft_prefill = GraphRunner("draft_prefill", self._draft_fn(ForwardMode.PREFILL), draft_specs,
                                         **prefill_common)
        # A resting draft's catch-up over sampled requests (catch_up): the same extend with each row's proposal drawn
        # inside the graph as a round's d_1 would be there (the requests' sampler inputs repeated over their rows;
        # padded rows temperature 0, the argmax). Drawn after the greedy graph instead, the draft head's second pass
        # over the rows and the draw ran eager: 2.2-2.4x the greedy catch-up's time at batch 1 on an H100, 1.15x in
        # these graphs (BENCHMARKS.md section 8). Only the token buckets a catch-up reaches: up to the first that holds
        # catch_up_tokens + 1 (the overlap schedule can keep one row more before the catch-up runs).
        reach_up = next((t for t in self.prefill_tokens if t > catch_up_tokens), None) if catch_up_tokens > 0 else None
        catch_up_buckets = tuple(t for t in self.prefill_tokens if reach_up is not None and t <= reach_up)
        self.draft_prefill_sampled = GraphRunner(
            "draft_prefill_sampled", self._draft_fn(ForwardMode.PREFILL),
            dict(draft_specs, samp_f=InputSpec(per_token=True), samp_i=InputSpec(per_token=True)),
            **dict(prefill_common, tokens_per_req=catch_up_buckets or (1,),
                   enabled=prefill_common["enabled"] and bool(catch_up_buckets) and draft is not None,
                   disabled_reason=(prefill_common["disabled_reason"] if not prefill_common["enabled"] else
                                    "no sampled catch-up graphs: the draft never rests (catch_up_tokens=0) or no "
                                    f"prefill bucket holds {catch_up_tokens + 1} tokens")))
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

    def _prefill_fn(self, mode: ForwardMode):
        """The target over a prefill batch with logits at ``last_rows`` only (a request's last real token): the
        other rows' logits are needed only for input logprobs, which logits_of computes from the returned hidden
        states when asked. Under TP the lm_head all-gathers B rows of float32 logits instead of every prompt
        token's (671 MB for 1024 tokens at Kimi's vocabulary), and the graphs' pool does not hold them.
        Returns (logits [B, V], hidden [N, H], aux [N, 3H] if the draft is wired)."""
        def fn(input_ids, positions, page_table, seq_lens, out_cache_loc, last_rows, tokens_per_req, extend_lens=None):
            fb = self._fb(self.target_kv, mode, page_table, seq_lens, out_cache_loc, tokens_per_req, extend_lens)
            h, aux = self.target.model(input_ids, positions, fb, self.aux_layer_ids)
            logits = self.target.lm_head(h.index_select(0, last_rows))
            return (logits, h, torch.cat(aux, dim=-1)) if aux else (logits, h)

        return fn

    def _draft_fn(self, mode: ForwardMode):
        def fn(input_ids, hidden, positions, page_table, seq_lens, out_cache_loc, tokens_per_req, samp_f=None,
               samp_i=None):
            fb = self._fb(self.draft_kv, mode, page_table, seq_lens, out_cache_loc, tokens_per_req)
            return self._draft_propose(input_ids, hidden, positions, fb, samp_f, samp_i)

        return fn

    @staticmethod
    def propose_verify(parts: dict, input_ids, positions, page_table, seq_lens, out_cache_loc, hidden, T: int,
                       samp: tuple[torch.Tensor, torch.Tensor] | None = None):
        """Draft steps d_2..d_k, then the target verify of [last, d_1..d_k]: the first half of a round.

        Inputs are the verify batch (B requests x T = k+1 tokens, ids [last, d_1, anything]) and the draft
        hidden [B, Hd] of each request's last committed position. Draft step j feeds d_j at position
        seq_len-2+j (the draft pairs the target's hidden at p with token p+1): column j-1 of the verify batch's
        positions and cache slots, seq_len - (T - j) keys. ``parts`` maps draft_decode / target_verify to
        forwards called with keyword inputs and tokens_per_req. ``samp``: the requests' (samp_f, samp_i), for
        sampled draft proposals (_draft_propose). Returns (ids [B, T], logits [B*T, V], aux)."""
        B = seq_lens.shape[0]
        ids = input_ids.view(B, T).clone()
        pos, loc = positions.view(B, T), out_cache_loc.view(B, T)
        cur = ids[:, 1].contiguous() if T > 1 else None  # (T = 1, k = 0: the verify of the last token alone)
        extra = {} if samp is None else dict(samp_f=samp[0], samp_i=samp[1])
        for j in range(1, T - 1):
            cur, hidden = parts["draft_decode"](
                input_ids=cur, hidden=hidden, positions=pos[:, j - 1].contiguous(), page_table=page_table,
                seq_lens=seq_lens - (T - j), out_cache_loc=loc[:, j - 1].contiguous(), tokens_per_req=1, **extra)
            ids[:, j + 1] = cur  # copied out: a replayed part's outputs are rewritten by its next replay
        logits, aux = parts["target_verify"](input_ids=ids.view(-1), positions=positions, page_table=page_table,
                                             seq_lens=seq_lens, out_cache_loc=out_cache_loc, tokens_per_req=T)
        return ids, logits, aux

    @staticmethod
    def extend_next(parts: dict, ids, a, nxt, aux, positions, page_table, seq_lens, out_cache_loc, T: int,
                    samp: tuple[torch.Tensor, torch.Tensor] | None = None):
        """The second half of a round: the draft extend over the accepted tokens d_1..d_a, nxt (padded to T with
        nxt) with the target's aux hidden states. Returns (next round's d_1 [B], its draft hidden [B, Hd]). (T = 1, a
        k = 0 round: the extend over the target's token alone.)"""
        B = seq_lens.shape[0]
        if T == 1:
            ext = nxt.view(B, 1)
        else:
            drafts = ids[:, 1:]
            col = torch.arange(T, device=ids.device).view(1, T)
            ext = torch.where(col < a.view(B, 1), torch.cat([drafts, drafts[:, -1:]], dim=1), nxt.view(B, 1))
        extra = {} if samp is None else dict(samp_f=samp[0].repeat_interleave(T, 0),
                                            samp_i=samp[1].repeat_interleave(T, 0))
        proposals, hidden = parts["draft_extend"](
            input_ids=ext.reshape(-1), hidden=aux, positions=positions, page_table=page_table, seq_lens=seq_lens,
            out_cache_loc=out_cache_loc, tokens_per_req=T, **extra)
        last = torch.arange(B, device=ids.device) * T + a
        return proposals[last], hidden[last]

    def _round_fn(self, parts: dict, filters: Filters | None = None, processed: bool = False):
        """A round with acceptance on the device: a = the longest prefix where the drafts equal the target's
        tokens (its argmax; with ``filters``: sampling.sample_tokens with the per-request samp_f / samp_i, of the
        logits with the penalties where ``processed``: input ``pen``, sampling.penalized_logits), or
        sim_accept where >= 0 (benchmarking). Returns (logits [B*T, V] as the target gave them, packed [B, 3+k] int64
        of a, the target's token after them, the next round's d_1, then d_1..d_k; the next draft hidden [B, Hd])."""
        def fn(input_ids, positions, page_table, seq_lens, out_cache_loc, hidden, sim_accept, tokens_per_req,
               samp_f=None, samp_i=None, pen=None, batch_filters=None):
            T = tokens_per_req
            # batch_filters: the batch's own (the processed rounds, never captured, take them per call: a batch
            # of greedy requests with penalties then neither samples nor proposes samples).
            used = batch_filters or filters
            batch = dict(positions=positions, page_table=page_table, seq_lens=seq_lens, out_cache_loc=out_cache_loc,
                         samp=None if used is None or not used.sampled else (samp_f, samp_i))
            ids, logits, aux = self.propose_verify(parts, input_ids, hidden=hidden, T=T, **batch)
            scores = penalized_logits(logits, pen, ids) if processed else logits
            return (logits, *self._accept_extend(parts, ids, scores, aux, sim_accept, used, samp_f, samp_i, batch))

        return fn

    def _accept_extend(self, parts: dict, ids, scores, aux, sim_accept, used: Filters | None, samp_f, samp_i,
                       batch: dict):
        """A round's second half: the target's token at each verify row of ids [B, T] (the argmax of its scores
        [B*T, V], or with ``used`` filters sampling.sample_tokens), a = the drafts accepted (or sim_accept where
        >= 0), then the draft extend. Returns (packed [B, 3+k], the next draft hidden [B, Hd])."""
        B, T = ids.shape
        if used is not None:  # row j of a request samples the token at its position + 1
            target = sample_tokens(scores, samp_f.repeat_interleave(T, 0), samp_i.repeat_interleave(T, 0),
                                   batch["positions"] + 1, used).view(B, T)
        else:
            target = scores.view(B, T, -1).argmax(-1)
        matched = (ids[:, 1:] == target[:, :-1]).to(torch.int64).cumprod(1).sum(1)
        a = torch.where(sim_accept >= 0, sim_accept, matched)
        nxt = target.gather(1, a.view(B, 1)).view(B)
        next_draft, next_hidden = self.extend_next(parts, ids, a, nxt, aux, T=T, **batch)
        return _pack_round(a, nxt, next_draft, ids), next_hidden

    def _grammar_head_fn(self):
        """The candidates [B, grammar_candidates] (target ids) for the token after the draft hidden [B, Hd], among
        those its mask [B, words] allows (d_1's again, from the hidden that proposed it; or a step's choice where
        the grammar refused all its candidates). The draft's forward, replayed as a graph, returns no logits: the
        head runs again over the hidden."""
        def fn(hidden, positions, mask, samp_f, samp_i, tokens_per_req):
            logits = self.draft_head(self.draft.norm(hidden))
            return (self._draft_candidates(logits, mask, samp_f, samp_i, positions),)

        return fn

    def _grammar_draft_fn(self):
        """A draft step returning its candidates [B, grammar_candidates] (target ids, best first) among the tokens its
        mask [B, words] allows (GrammarBatch.step_mask), and its hidden."""
        def fn(input_ids, hidden, positions, page_table, seq_lens, out_cache_loc, mask, samp_f, samp_i,
               tokens_per_req):
            fb = self._fb(self.draft_kv, ForwardMode.DECODE, page_table, seq_lens, out_cache_loc, tokens_per_req)
            logits, h = self.draft(input_ids, hidden, positions, fb, self.embed_weight, self.draft_head)
            return self._draft_candidates(logits, mask, samp_f, samp_i, positions + 2), h

        return fn

    def _grammar_tail_fn(self, parts: dict):
        """A grammar round after its verify forward: the verify's logits [B*T, V] (penalized, where a request has
        penalties) masked (mask [B*T, words]), the acceptance on them (every row sampled by sample_tokens: greedy
        rows take the argmax) and the draft extend over aux [B*T, 3H]. Returns (packed, next draft hidden)."""
        def fn(logits, aux, input_ids, positions, page_table, seq_lens, out_cache_loc, mask, samp_f, samp_i,
               sim_accept, tokens_per_req):
            batch = dict(positions=positions, page_table=page_table, seq_lens=seq_lens, out_cache_loc=out_cache_loc,
                         samp=(samp_f, samp_i))
            ids = input_ids.view(seq_lens.shape[0], tokens_per_req)
            return self._accept_extend(parts, ids, apply_token_bitmask(logits, mask), aux, sim_accept, ALL_FILTERS,
                                       samp_f, samp_i, batch)

        return fn

    def _pick_in_grammar(self, grammar: GrammarBatch, candidates: torch.Tensor, hidden, samp, positions) -> list[int]:
        """The next drafts [B] (host ints) from a step's ``candidates`` [B, K]: the first each request's grammar
        accepts (GrammarBatch.choose, a wait for the stream); where it accepts none, chosen again under the
        grammar's row (refill) from the draft ``hidden`` [B, Hd] that made them (positions [B]: those sampled). The
        draft knows nothing of the grammar: its own proposals under a JSON grammar on the embedded pair were refused
        so often that a round accepted 0.12 drafts on average (3.23 tokens a round within the grammar, 1.12
        without)."""
        chosen, stuck = grammar.choose(candidates.tolist())
        self.grammar_proposals["proposed"] += len(chosen)
        if stuck:
            self.grammar_proposals["refilled"] += len(stuck)
            again = self.grammar_head(len(chosen), 1, hidden=hidden, positions=positions, mask=grammar.refill(stuck),
                                      samp_f=samp.f, samp_i=samp.i)[0][:, 0].tolist()
            for b in stuck:
                chosen[b] = again[b]
                grammar.take(b, chosen[b])
        return chosen

    def _draft_candidates(self, logits, mask, samp_f, samp_i, positions):
        """Target ids [N, grammar_candidates] from draft logits [N, Vd] among the draft columns mask [N, words(V)]
        allows, _draft_choice's (under the mask) first: sampling.draft_candidates."""
        cols = self._draft_columns(logits)
        scores = logits.float().masked_fill(~allowed_columns(mask, cols), float("-inf"))
        k = min(self.grammar_candidates, logits.shape[-1])
        return self.draft.to_target_ids(draft_candidates(scores, samp_f, samp_i, positions, cols, k))

    def _draft_propose(self, input_ids, hidden, positions, fb, samp_f=None, samp_i=None):
        """Draft forward -> (proposed target token ids [N], next hidden [N, H]): the draft's argmax, or with
        per-row sampler inputs samp_f / samp_i [N, ...] its sample with the target's noise (sampling.draft_tokens:
        a row at position p proposes the token at p + 2, the draft pairing the target's hidden at p with token
        p + 1). Any proposal keeps the output exact (a draft token is accepted only where it equals the target's
        own sample); sharing the noise makes the two samples agree as often as the distributions allow."""
        logits, h = self.draft(input_ids, hidden, positions, fb, self.embed_weight, self.draft_head)
        return self._draft_choice(logits, samp_f, samp_i, positions + 2), h

    def _draft_columns(self, logits: torch.Tensor) -> torch.Tensor:
        """The target id of each draft column [Vd] (built once, by the eager warm-up when graphs are captured)."""
        token_ids = self._draft_token_ids
        if token_ids is None or token_ids.shape[0] != logits.shape[-1]:
            token_ids = self._draft_token_ids = self.draft.to_target_ids(
                torch.arange(logits.shape[-1], device=logits.device))
        return token_ids

    def _draft_choice(self, logits, samp_f, samp_i, positions):
        """Target token ids [N] from draft logits [N, Vd]: the argmax, or with sampler inputs the draft's sample at
        ``positions`` (sampling.draft_tokens; the noise of each column's target token)."""
        if samp_f is None:
            return self.draft.to_target_ids(logits.argmax(-1))
        return self.draft.to_target_ids(draft_tokens(logits, samp_f, samp_i, positions, self._draft_columns(logits)))

    @torch.inference_mode()
    def draft_proposals(self, hidden: torch.Tensor, samp: SamplerBatch, positions: torch.Tensor) -> torch.Tensor:
        """The draft's proposals [B] from its hidden states [B, Hd] at ``positions`` (the rows' own: a prefill's
        last rows, whose graphs proposed the argmax), with the requests' sampler inputs."""
        logits = self.draft_head(self.draft.norm(hidden))
        return self._draft_choice(logits, samp.f, samp.i, positions + 2)

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

        def samp(n):  # n rows of sampler inputs: temperature 1 (the graphs' padded rows get 0, greedy)
            return dict(samp_f=torch.ones(n, 3, dtype=torch.float32, device=self.device),
                        samp_i=torch.zeros(n, 2, dtype=torch.int64, device=self.device))

        if self.prefill_tokens:  # the largest graphs first: the shared pool then serves the smaller ones
            try:
                self.target_prefill.capture(lambda bs, T: dict(
                    example(bs, T, False), last_rows=torch.arange(T - 1, bs * T, T, device=self.device)))
                if self.draft is not None:
                    self.draft_prefill.capture(lambda bs, T: example(bs, T, "aux"))
                    self.draft_prefill_sampled.capture(lambda bs, T: dict(example(bs, T, "aux"), **samp(bs * T)))
            except torch.cuda.OutOfMemoryError as e:
                # The prefill graphs are an optimisation the engine can serve without (their activations for
                # the largest bucket can exceed what the KV cache left free): eager prefill, counted, and said.
                reason = (f"prefill graphs not captured: CUDA out of memory ({str(e).splitlines()[0]}); lower "
                          "cuda_graph_prefill_tokens or max_total_tokens to have them")
                logger.warning("%s", reason)
                for runner in (self.target_prefill, self.draft_prefill, self.draft_prefill_sampled):
                    runner.graphs.clear()
                    runner.enabled, runner.disabled_reason = False, reason
                torch.cuda.empty_cache()
        self.target_verify.capture(lambda bs, T: example(bs, T, False))
        self.target_decode.capture(lambda bs, T: example(bs, T, False))
        if self.draft is not None:
            self.draft_extend.capture(lambda bs, T: example(bs, T, "aux"))
            self.draft_decode.capture(lambda bs, T: example(bs, T, "h"))
            def round_inputs(bs, T):
                return dict(example(bs, T, False), hidden=torch.zeros(bs, self.draft.config.hidden_size,
                                                                      dtype=self.dtype, device=self.device),
                            sim_accept=torch.full((bs,), -1, dtype=torch.int64, device=self.device))

            self.spec_round.capture(round_inputs)
            for runner in self.sampled_rounds.values():
                runner.capture(lambda bs, T: dict(round_inputs(bs, T), **samp(bs)))
            words = bitmask_words(self.target.config.vocab_size)

            def mask(n):
                return torch.full((n, words), -1, dtype=torch.int32, device=self.device)

            self.grammar_tail.capture(lambda bs, T: dict(
                example(bs, T, False), logits=torch.zeros(bs * T, self.target.config.vocab_size, dtype=torch.float32,
                                                          device=self.device),
                aux=torch.zeros(bs * T, aux_w, dtype=self.dtype, device=self.device), mask=mask(bs * T),
                sim_accept=torch.full((bs,), -1, dtype=torch.int64, device=self.device), **samp(bs)))
            self.grammar_draft.capture(lambda bs, T: dict(example(bs, T, "h"), mask=mask(bs), **samp(bs)))
            self.grammar_head.capture(lambda bs, T: dict(
                hidden=torch.zeros(bs, self.draft.config.hidden_size, dtype=self.dtype, device=self.device),
                positions=torch.ones(bs, dtype=torch.int64, device=self.device), mask=mask(bs), **samp(bs)))

    @property
    def graph_runners(self) -> list[GraphRunner]:
        """Every graph runner, all of whose graphs share one memory pool."""
        return [self.target_decode, self.target_verify, self.draft_decode, self.draft_extend, self.spec_round,
                *self.sampled_rounds.values(), self.grammar_head, self.grammar_draft, self.grammar_tail,
                self.target_prefill, self.draft_prefill, self.draft_prefill_sampled]

    def graph_report(self) -> dict:
        return {r.name: {"graphs": len(r.graphs), "buckets": r.buckets, "tokens_per_req": list(r.tokens_per_req),
                         "capture_seconds": round(r.capture_seconds, 3),
                         "capture_mib": round(r.capture_bytes / 2**20, 1)} for r in self.graph_runners}

    # -- batch building ------------------------------------------------------------------------------
    def build(self, rows: list[tuple[list[int], int, list[int]]], width: int | None = None,
              pad_to: int | None = None) -> BatchTensors:
        """rows: per request (new token ids, first position, page list). New tokens occupy positions
        first .. first+n-1 and seq_len = first + n. ``width`` pads page tables (graphs want max_pages).
        ``pad_to``: every request padded to that many tokens (a prefill graph's bucket): token 0 at the
        positions after the real ones, cache slot 0 (the scratch page), seq_len = first + pad_to; extend_lens
        stay the real counts.

        Two host-to-device copies (int64 and int32 parts), from pinned memory without waiting: the host runs
        ahead of the GPU (a pageable copy waits for the stream, so five of them cost a synchronisation each)."""
        ids, pos, loc, lens, ext, pages_flat = [], [], [], [], [], []
        P = width or max(len(r[2]) for r in rows)
        for toks, first, pages in rows:
            n = len(toks)
            if len(pages) > P:
                raise ValueError(f"a request's page list holds {len(pages)} pages, more than the page table's "
                                 f"width {P} ({self.max_pages} pages of {self.page_size} tokens: the context limit)")
            pad = 0 if pad_to is None else pad_to - n
            ids += list(toks) + [0] * pad
            p = range(first, first + n)
            pos += list(p) + list(range(first + n, first + n + pad))
            loc += [pages[q // self.page_size] * self.page_size + q % self.page_size for q in p] + [0] * pad
            lens.append(first + n + pad)
            ext.append(n)
            pages_flat += list(pages) + [0] * (P - len(pages))
        N, B = len(ids), len(rows)
        dev64 = self._upload(torch.tensor(ids + pos + loc, dtype=torch.int64))
        dev32 = self._upload(torch.tensor(lens + pages_flat, dtype=torch.int32))
        ids_d, pos_d, loc_d = dev64.view(3, N)
        return BatchTensors(ids_d, pos_d, dev32[B:].view(B, P), dev32[:B], loc_d, ext)

    def advance(self, bt: BatchTensors, T: int, steps: torch.Tensor, ids: torch.Tensor,
                pages: list[list[int]]) -> BatchTensors:
        """The batch of the round after ``bt`` (B requests x T tokens), built on the device without waiting for
        it: request b moves ``steps[b]`` positions on (int64 [B], on the device: its accepted tokens + 1) with new
        ids [B, T]; its cache slots are looked up in the page table of ``pages`` (the host's page lists, which
        must already cover the new positions), the only part uploaded. The same tensors build() makes from the
        host's state once it has read the round, so a graph replay of either computes the same."""
        B, P = len(pages), max(len(p) for p in pages)
        if P > self.max_pages:  # (the scheduler queues no round that could pass the context limit)
            raise ValueError(f"a request's page list holds {P} pages, more than the page table's width "
                             f"{self.max_pages} ({self.page_size}-token pages: the context limit)")
        page_table = self._upload(torch.tensor([p + [0] * (P - len(p)) for p in pages], dtype=torch.int32))
        pos = bt.positions.view(B, T) + steps.view(B, 1)
        loc = page_table.gather(1, pos // self.page_size).to(torch.int64) * self.page_size + pos % self.page_size
        return BatchTensors(ids.reshape(-1), pos.view(-1), page_table, bt.seq_lens + steps.to(bt.seq_lens.dtype),
                            loc.view(-1), bt.extend_lens)

    def to_host(self, t: torch.Tensor) -> tuple[torch.Tensor, torch.cuda.Event | None]:
        """(a host copy of t, an event that has passed once it is complete): on CUDA a pinned copy queued
        without waiting (read it after event.synchronize()); elsewhere a copy made now (event None)."""
        if self.device.type != "cuda":
            return t.clone(), None  # (a forward's outputs may be rewritten by the next, as replays' are)
        host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        host.copy_(t, non_blocking=True)
        ready = torch.cuda.Event()
        ready.record()
        return host, ready

    def _upload(self, host: torch.Tensor) -> torch.Tensor:
        if self.device.type != "cuda":
            return host.to(self.device)
        return host.pin_memory().to(self.device, non_blocking=True)

    def to_device(self, values: list[int]) -> torch.Tensor:
        """A small int64 tensor on the device without waiting for the stream (from pinned memory on CUDA)."""
        return self._upload(torch.tensor(values, dtype=torch.int64))

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
    def draft_extend_ragged(self, bt: BatchTensors, hidden: torch.Tensor, samp_f=None, samp_i=None):
        fb = self._fb(self.draft_kv, ForwardMode.EXTEND, bt.page_table, bt.seq_lens, bt.out_cache_loc, 1,
                      bt.extend_lens)
        return self._draft_propose(bt.input_ids, hidden, bt.positions, fb, samp_f, samp_i)

    # -- prefill -------------------------------------------------------------------------------------
    def prefill_bucket(self, rows: list) -> int | None:
        """The smallest token bucket that holds every row's tokens with each row's padded positions
        first .. first+bucket-1 within the page table's reach; None if none does."""
        reach = self.max_pages * self.page_size
        n = max(len(toks) for toks, _, _ in rows)
        last = max(first for _, first, _ in rows)
        return next((t for t in self.prefill_tokens if t >= n and last + t <= reach), None)

    def _prefill_plan(self, runner: GraphRunner, rows: list) -> tuple[list | None, str | None]:
        """([(rows, bucket, ends)] to replay in order, None), else (None, why not). Consecutive prompts go
        together while their batch bucket times their longest prompt's bucket was captured (one replay reads the
        experts once for all of them); a prompt longer than the largest bucket goes alone, in chunks of that
        bucket (each chunk's queries read the earlier chunks' keys from the cache), the last padded to its own.
        ``ends``: whether the piece's rows end their requests (False only for a chunk before a prompt's last)."""
        if not runner.enabled:
            return None, runner.disabled_reason
        if not self.prefill_tokens:
            return None, "no prefill graphs (cuda_graph_prefill_tokens empty or all above the context length)"
        cannot_pad = "a prompt's last chunk, padded to a bucket, would run past the context's page table"
        size, pieces, group = self.prefill_tokens[-1], [], []
        for toks, first, pages in rows:
            chunks = [[(toks[i:i + size], first + i, pages)] for i in range(0, len(toks), size)]
            if len(chunks) == 1 and group:
                together = group + chunks[0]
                bucket = self.prefill_bucket(together)
                if bucket is not None and runner.why_not(len(together), bucket) is None:
                    group = together
                    continue
            if group:
                pieces.append((group, self.prefill_bucket(group), True))
            buckets = [self.prefill_bucket(chunk) for chunk in chunks]
            if None in buckets:
                return None, cannot_pad
            pieces += [(chunk, bucket, False) for chunk, bucket in zip(chunks[:-1], buckets[:-1], strict=True)]
            group = chunks[-1]
        pieces.append((group, self.prefill_bucket(group), True))
        reason = next((r for r in (runner.why_not(len(g), b) for g, b, _ in pieces) if r is not None), None)
        return (pieces, None) if reason is None else (None, reason)

    def _replay_prefill(self, runner: GraphRunner, pieces: list, **per_token: torch.Tensor) -> tuple:
        """Replays each (rows, bucket, ends) in order (``per_token``: more inputs of one row a real token, in the
        same order, such as the draft's hidden input; padded rows zero); returns each output's real rows,
        concatenated in that order: one row a request for the target's logits (its first output, taken at
        last_rows; none from a chunk that does not end its prompt), the real tokens' rows for every other output."""
        target = runner is self.target_prefill
        outs, start = [], 0
        for rows, bucket, ends in pieces:
            bt = self.build(rows, width=self.max_pages, pad_to=bucket)
            inputs = dict(input_ids=bt.input_ids, positions=bt.positions, page_table=bt.page_table,
                          seq_lens=bt.seq_lens, out_cache_loc=bt.out_cache_loc)
            if target:
                inputs["last_rows"] = self.to_device([b * bucket + n - 1 for b, n in enumerate(bt.extend_lens)])
            # The real tokens' rows in the padded batch, uploaded once: one scatter an input and one gather an
            # output, where a copy a request and input had cost the host a launch each (48 for a catch-up of 16
            # sampled requests).
            n_real = sum(bt.extend_lens)
            real = self.to_device([b * bucket + j for b, n in enumerate(bt.extend_lens) for j in range(n)])
            for name, x in per_token.items():
                inputs[name] = x.new_zeros(len(rows) * bucket, *x.shape[1:]).index_copy_(0, real,
                                                                                          x[start:start + n_real])
            start += n_real
            out = runner(len(rows), bucket, **inputs)
            # Copied out before the next replay: every graph's outputs live in the one shared pool, where any
            # later replay (of any bucket) may reuse their memory.
            outs.append([o[:len(rows) if ends else 0].clone() if target and i == 0 else o.index_select(0, real)
                         for i, o in enumerate(out)])
        return tuple(col[0] if len(col) == 1 else torch.cat(col) for col in zip(*outs, strict=True))

    @torch.inference_mode()
    def prefill(self, rows: list[tuple[list[int], int, list[int]]]):
        """The target over each request's new tokens (rows as build() takes them): graph replays of the token
        buckets (_prefill_plan), every prompt padded to its bucket; where that cannot be, the whole batch runs
        ragged and eager, counted as target_prefill EAGER with the reason. Returns (logits [B, V] at each
        request's last token, hidden [N, H] and aux [N, 3H] or None over the real tokens, grouped by request);
        logits_of(hidden rows) gives the other rows' logits."""
        pieces, reason = self._prefill_plan(self.target_prefill, rows)
        if pieces is None:
            self.stats.record("target_prefill", graph=False, reason=reason)
            bt = self.build(rows)
            ends = torch.tensor(bt.extend_lens).cumsum(0) - 1
            out = self._prefill_ragged(bt.input_ids, bt.positions, bt.page_table, bt.seq_lens, bt.out_cache_loc,
                                       self.to_device(ends.tolist()), 1, bt.extend_lens)
        else:
            out = self._replay_prefill(self.target_prefill, pieces)
        return out[0], out[1], (out[2] if len(out) > 2 else None)

    @torch.inference_mode()
    def logits_of(self, hidden: torch.Tensor) -> torch.Tensor:
        """float32 logits [n, V] of the target's final hidden states [n, H] (prefill's; eager, and under TP a
        collective: every rank calls it with the same rows)."""
        return self.target.lm_head(hidden)

    @torch.inference_mode()
    def prefill_draft(self, rows: list[tuple[list[int], int, list[int]]], aux: torch.Tensor):
        """The draft's extend over each request's tokens shifted by one, with the target's aux hidden states
        [N, 3H] (as prefill returned them): graph replays as in prefill, else ragged eager, counted as
        draft_prefill. Returns (proposed target ids [N], draft hidden [N, Hd])."""
        pieces, reason = self._prefill_plan(self.draft_prefill, rows)
        if pieces is None:
            self.stats.record("draft_prefill", graph=False, reason=reason)
            return self.draft_extend_ragged(self.build(rows), aux)
        return self._replay_prefill(self.draft_prefill, pieces, hidden=aux)

    @torch.inference_mode()
    def greedy_round(self, bt: BatchTensors, hidden: torch.Tensor, sim_accept: torch.Tensor, T: int):
        """A whole speculative round with acceptance on the device (_round_fn), one graph replay where captured.
        bt: the verify batch; hidden [B, Hd]; sim_accept [B] (-1: computed). Returns (logits [B*T, V], packed
        [B, 3+k], next draft hidden [B, Hd])."""
        B = len(bt.extend_lens)
        logits, packed, next_hidden = self.spec_round(
            B, T, input_ids=bt.input_ids, positions=bt.positions, page_table=bt.page_table, seq_lens=bt.seq_lens,
            out_cache_loc=bt.out_cache_loc, hidden=hidden, sim_accept=sim_accept)
        return logits, packed[:B], next_hidden[:B]  # a replay's per-request outputs hold the bucket's rows

    @torch.inference_mode()
    def time_rounds(self, ks: tuple[int, ...], batch_sizes: list[int], iters: int = 5, context: int = 512,
                    min_seconds: float = 0.1, max_iters: int = 64, catch_up_tokens: int = 0,
                    sampled: bool = False) -> dict:
        """Seconds a greedy speculative round of k draft steps takes at each batch size (median of ``iters`` after
        one warm-up, or more, up to ``max_iters``, until the batch size's passes took ``min_seconds``: a small
        model's rounds take a fraction of a millisecond, where a few would be at the host's mercy; k = 0 too: a
        round of the verify of the last token and the draft's one-token extend), and a
        plain decode step under adaptive.DECODE, for the adaptive draft length (runtime/adaptive.py): the
        round's graph where captured, as a request would replay it, the host's launch included. Every row reads and
        writes the scratch page only (the page padded rows use), ``context`` tokens in, so no request's cache is
        touched; acceptance is pinned to all k drafts (a round's graph costs the same whatever it accepts); the
        forward counts are left as they were. ``catch_up_tokens`` > 0: also a resting draft's catch-up over that many
        tokens a request (prefill_draft, under CATCH_UP). ``sampled``: the same for a batch of sampled requests
        (temperature only, SAMPLED_TIMING): the decode step's sampler, the round's sampled graphs (sampled_round),
        the catch-up's proposal drawn at every row (as the scheduler's _catch_up_checks draws them).
        {(k, DECODE or CATCH_UP; batch): seconds}."""
        cuda = self.device.type == "cuda"
        kmax = max(ks)
        # A round reaches past its verify's rows; a catch-up past its tokens to its prefill bucket's end (a bucket
        # past the page table would run it eager, not as a request's catch-up replays it).
        room = max(2 * kmax + 2, next((t for t in self.prefill_tokens if t >= catch_up_tokens), catch_up_tokens)
                   if catch_up_tokens > 0 else 0)
        first = max(0, min(context, self.max_context - room))
        pages = [0] * min(self.max_pages, pages_for(first + room, self.page_size))
        hidden_w = self.draft.config.hidden_size if self.draft is not None else 0
        aux_w = len(self.aux_layer_ids) * self.target.config.hidden_size

        def one_pass(calls: dict, times: dict | None) -> float:
            """Each call once, timed alone (the k's in turn: a slow moment of the machine hits them alike); the
            seconds go to ``times`` unless None (the warm-up). Returns the pass's seconds."""
            spent = 0.0
            for k, once in calls.items():
                if cuda:
                    torch.cuda.synchronize(self.device)
                t0 = time.perf_counter()
                once()
                if cuda:
                    torch.cuda.synchronize(self.device)
                dt = time.perf_counter() - t0
                spent += dt
                if times is not None:
                    times[k].append(dt)
            return spent

        out: dict[tuple[int | str, int], float] = {}
        what = "sampled" if sampled else "greedy"
        with self.stats.uncounted():
            for B in batch_sizes:
                beat("timing the adaptive draft length's rounds (%s): batch %d of %s", what, B, batch_sizes)
                samp = self.sampler_batch([SAMPLED_TIMING] * B, list(range(B))) if sampled else None
                bt = self.build([([0], first, pages)] * B, width=self.max_pages)
                calls = {DECODE: lambda bt=bt, samp=samp: self.sample(self.target_uniform(bt, 1, verify=False)[0],
                                                                      samp, bt.positions + 1)}
                for k in ks:
                    bt = self.build([([0] * (k + 1), first, pages)] * B, width=self.max_pages)
                    hidden = torch.zeros(B, hidden_w, dtype=self.dtype, device=self.device)
                    sim = torch.full((B,), k, dtype=torch.int64, device=self.device)
                    calls[k] = (lambda bt=bt, hidden=hidden, sim=sim, k=k: self.greedy_round(bt, hidden, sim, k + 1)[1]
                                ) if samp is None else (lambda bt=bt, hidden=hidden, sim=sim, k=k, samp=samp:
                                                        self.sampled_round(bt, hidden, sim, k + 1, samp)[1])
                if catch_up_tokens > 0:
                    rows = [([0] * catch_up_tokens, first, pages)] * B
                    aux = torch.zeros(B * catch_up_tokens, aux_w, dtype=self.dtype, device=self.device)
                    calls[CATCH_UP] = lambda rows=rows, aux=aux, samp=samp: self.catch_up(rows, aux, samp)[0]
                times: dict[int | str, list[float]] = {k: [] for k in calls}
                one_pass(calls, None)  # the warm-up (compiles, caches)
                spent = one_pass(calls, times)
                passes = min(max_iters, max(iters, math.ceil(min_seconds / max(spent, 1e-9))))
                # every TP rank runs as many passes (each pass's forwards hold collectives): the most any rank wants
                passes = int(tp_max_floats([float(passes)], self.device)[0])
                for _ in range(passes - 1):
                    beat("timing the adaptive draft length's rounds (%s): batch %d of %s", what, B, batch_sizes)
                    one_pass(calls, times)
                out.update({(k, B): statistics.median(t) for k, t in times.items()})
        return out

    def catch_up(self, rows: list, aux: torch.Tensor, samp: SamplerBatch | None = None):
        """A resting draft's catch-up (prefill_draft over ``rows`` with the target's ``aux`` rows), its proposal at
        every row the prefill graph's argmax, or with ``samp`` (the rows' requests' sampler inputs) drawn as a
        round's d_1 would be there (_draft_propose at each row's position): replays of draft_prefill_sampled,
        else one eager extend, counted with the reason. Returns (proposals [N], hidden [N, Hd])."""
        if samp is None:
            return self.prefill_draft(rows, aux)
        # (each row's request uploaded without waiting: sizing a repeat_interleave on the device, or a pageable copy,
        # would hold the host until the GPU drained, 0.3 ms a catch-up on an H100)
        per_row = samp.proposal_rows(self.to_device([b for b, (toks, _, _) in enumerate(rows) for _ in toks]))
        runner = self.draft_prefill_sampled
        pieces, reason = self._prefill_plan(runner, rows)
        if pieces is None:
            self.stats.record(runner.name, graph=False, reason=reason)
            return self.draft_extend_ragged(self.build(rows), aux, per_row.f, per_row.i)
        return self._replay_prefill(runner, pieces, hidden=aux, samp_f=per_row.f, samp_i=per_row.i)

    @torch.inference_mode()
    def sampled_round(self, bt: BatchTensors, hidden: torch.Tensor, sim_accept: torch.Tensor, T: int,
                      samp: SamplerBatch):
        """greedy_round for a batch with sampled requests: the target's tokens from the sampler (the graphs whose
        filters cover the batch's). Returns what greedy_round returns."""
        B = len(bt.extend_lens)
        inputs = dict(input_ids=bt.input_ids, positions=bt.positions, page_table=bt.page_table, seq_lens=bt.seq_lens,
                      out_cache_loc=bt.out_cache_loc, hidden=hidden, sim_accept=sim_accept, samp_f=samp.f,
                      samp_i=samp.i)
        if samp.grammar is not None:
            return self.grammar_spec_round(bt, hidden, sim_accept, T, samp)
        if samp.penalties is not None:
            runner = self.penalized_round
            inputs.update(pen=samp.penalties, batch_filters=samp.filters)
        else:
            runner = self.sampled_rounds[ALL_FILTERS if samp.filters.ranked else UNRANKED]
        logits, packed, next_hidden = runner(B, T, **inputs)
        return logits, packed[:B], next_hidden[:B]

    def grammar_spec_round(self, bt: BatchTensors, hidden: torch.Tensor, sim_accept: torch.Tensor, T: int,
                           samp: SamplerBatch):
        """sampled_round for a batch with a grammar (penalties too, if any): k + 2 replays. d_1 and each draft step's
        proposal are picked by the host among the draft's candidates (grammar_drafts: the first the request's grammar
        accepts after the drafts before it, _pick_in_grammar, a wait for the stream each draft step; else the
        draft's own choices, refused by the verify's masks where the grammar forbids them); the verify's mask rows
        are filled while its forward runs; penalties (sampling.penalized_logits, the drafts before each row counted)
        apply to its logits before the masks, as processed_logits applies them. Returns what greedy_round returns."""
        B, g = len(bt.extend_lens), samp.grammar
        ids = bt.input_ids.view(B, T).clone()
        pos, loc = bt.positions.view(B, T), bt.out_cache_loc.view(B, T)
        drafts = None  # the host's [B][T] rows (ids[:, 0] left out: host_masks does not read it)
        if self.grammar_drafts and T > 1:  # (T = 1, k = 0: no draft to choose; the verify's mask row only)
            try:
                cheap = self.grammar_prefill_below_s
                if get_tp().size > 1 and 0 < cheap < float("inf"):
                    # Ranks pick their drafts themselves and must pick the same: a row filled ahead or not can pick
                    # differently where two allowed candidates tie, so no rank may decide by its own clock.
                    cheap = None
                first = self.grammar_head(B, 1, hidden=hidden, positions=pos[:, 0] + 1, mask=g.step_mask(cheap),
                                          samp_f=samp.f, samp_i=samp.i)[0]
                drafts = [[None, d] for d in self._pick_in_grammar(g, first, hidden, samp, pos[:, 0] + 1)]
                for j in range(1, T - 1):
                    cur = self._upload(torch.tensor([row[j] for row in drafts], dtype=torch.int64))
                    cands, hidden = self.grammar_draft(
                        B, 1, input_ids=cur, hidden=hidden, positions=pos[:, j - 1].contiguous(),
                        page_table=bt.page_table, seq_lens=bt.seq_lens - (T - j),
                        out_cache_loc=loc[:, j - 1].contiguous(), mask=g.step_mask(cheap), samp_f=samp.f,
                        samp_i=samp.i)
                    for row, d in zip(drafts, self._pick_in_grammar(g, cands, hidden, samp, pos[:, j - 1] + 2),
                                      strict=True):
                        row.append(d)
            finally:
                g.end_drafts()
            ids[:, 1:] = self._upload(torch.tensor([row[1:] for row in drafts], dtype=torch.int64))
        else:  # the draft's own choices (tests script them), refused by the verify's masks where the grammar forbids
            cur = ids[:, 1].contiguous() if T > 1 else None
            for j in range(1, T - 1):
                cur, hidden = self.draft_decode(
                    B, 1, input_ids=cur, hidden=hidden, positions=pos[:, j - 1].contiguous(), page_table=bt.page_table,
                    seq_lens=bt.seq_lens - (T - j), out_cache_loc=loc[:, j - 1].contiguous())
                ids[:, j + 1] = cur  # copied out: a replay's outputs are rewritten by its next replay
            g.prefetch(ids)
        flat = ids.view(-1)
        logits, aux = self.target_verify(B, T, input_ids=flat, positions=bt.positions, page_table=bt.page_table,
                                         seq_lens=bt.seq_lens, out_cache_loc=bt.out_cache_loc)
        scores = logits if samp.penalties is None else penalized_logits(logits, samp.penalties, ids)
        # The host fills every mask row while the verify runs (the drafts known here, or their copy queued first).
        packed, next_hidden = self.grammar_tail(
            B, T, logits=scores, aux=aux, input_ids=flat, positions=bt.positions, page_table=bt.page_table,
            seq_lens=bt.seq_lens, out_cache_loc=bt.out_cache_loc, mask=g.masks(ids if drafts is None else drafts, T),
            samp_f=samp.f, samp_i=samp.i, sim_accept=sim_accept)
        return logits, packed[:B], next_hidden[:B]

    def sampler_batch(self, params: list, keys: list[int], outputs: list[list[int]] | None = None,
                      eos: frozenset[int] = frozenset(), matchers: list | None = None) -> SamplerBatch:
        """The sampler's inputs for requests with ``params`` and sampling ``keys``, uploaded without waiting; with
        the penalty state (sampling.Penalties) of their ``outputs`` so far where a request has penalties (``eos``:
        the engine's end tokens, which min_new_tokens holds back), and their grammar matchers (``matchers``: one
        grammar.GrammarMatcher or None a request) where one has a grammar."""
        f, i = sampling_rows(params, keys)
        pen = None
        if any(p.penalized for p in params):
            pen = Penalties.build(params, outputs if outputs is not None else [[] for _ in params], eos,
                                  self.target.config.vocab_size, self._upload)
        grammar = None
        if matchers is not None and any(m is not None for m in matchers):
            grammar = GrammarBatch(matchers, self.target.config.vocab_size, self._upload, self.to_host)
        return SamplerBatch(self._upload(torch.tensor(f, dtype=torch.float32)),
                            self._upload(torch.tensor(i, dtype=torch.int64)), Filters.of(params), pen, grammar)

    @staticmethod
    def sample(logits: torch.Tensor, samp: SamplerBatch | None, positions: torch.Tensor | None) -> torch.Tensor:
        """One token a request (decode, prefill) from logits [B, V] at ``positions`` [B], the positions being
        sampled -> int64 [B] on the device; the argmax when ``samp`` is None (every request greedy, none penalized
        or constrained: no positions needed). Penalties and grammars (processed_logits) apply first, as a verify
        row's do."""
        if samp is None:
            return logits.argmax(-1)
        if samp.processed:
            logits = processed_logits(logits, samp.penalties, samp.grammar)
        return sample_tokens(logits, samp.f, samp.i, positions, samp.filters)
