"""Continuous-batching scheduler and the EAGLE-3 speculative loop.

One ``step()`` either prefills newly admitted requests or advances every running request by one round:
  non-speculative: one target decode (1 token per request)
  EAGLE-3 (chain, topk=1, k steps):
      draft decode x (k-1)          proposals d_2..d_k (d_1 came from the previous round's draft extend)
      target verify, T = k+1        [last, d_1..d_k] in ONE forward, causal inside the draft
      accept                        longest agreeing prefix + one target token (lossless, sampling.py)
      draft extend, T = k+1         over the accepted tokens with the target's aux hidden states; its row
                                    a gives the next round's d_1 and draft hidden
Rejected positions are rolled back by truncating each request's length and returning pages beyond it;
stale cache entries past a request's length are never read before they are rewritten.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from sglang_eagle3.runtime.kv_cache import pages_for
from sglang_eagle3.runtime.model_runner import ModelRunner
from sglang_eagle3.runtime.request import Request
from sglang_eagle3.runtime.sampling import accept_draft, sample_token

logger = logging.getLogger(__name__)


@dataclass
class SchedulerStats:
    verify_forwards: int = 0  # target verify forwards (one per request per round, SGLang's spec_verify_ct)
    accepted_tokens: int = 0  # tokens emitted by verify rounds
    accept_length_hist: dict[int, int] = field(default_factory=dict)
    step_seconds: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    generated_tokens: int = 0
    finished_requests: int = 0
    retracted_requests: int = 0

    @property
    def avg_accept_length(self) -> float:
        return self.accepted_tokens / self.verify_forwards if self.verify_forwards else 0.0


class Scheduler:
    def __init__(self, runner: ModelRunner, *, num_steps: int | None, max_running: int, max_context: int,
                 eos_token_ids: tuple[int, ...], detokenize: Callable[[list[int]], str] | None = None):
        self.runner = runner
        self.num_steps = num_steps  # None: no speculation
        self.max_running = max_running
        self.max_context = max_context
        self.eos = set(eos_token_ids)
        self.detokenize = detokenize
        # Benchmarking only (as SGLang's SGLANG_SIMULATE_ACC_LEN): pin the mean accepted tokens per verify so
        # step times can be measured with random-weight models; the output is then NOT the target's.
        self.simulate_accept_length: float | None = None
        self._sim_rng = torch.Generator().manual_seed(0)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.stats = SchedulerStats()
        # Per-request draft state between rounds: draft hidden [H] of the last committed position.
        self._draft_hidden: dict[str, torch.Tensor] = {}

    # -- queue ------------------------------------------------------------------------------------
    @property
    def lookahead(self) -> int:
        return self.num_steps or 0

    def add(self, req: Request) -> None:
        if req.params.seed is not None and req.generator is None:
            # Created here, not by the engine: under TP every rank builds the same generator.
            req.generator = torch.Generator().manual_seed(req.params.seed)
        self.waiting.append(req)

    def abort(self, rid: str) -> bool:
        for q in (self.waiting, self.running):
            for r in list(q):
                if r.rid == rid:
                    r.finished_reason = {"type": "abort", "message": "aborted"}
                    self._release(r)
                    q.remove(r)
                    return True
        return False

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def _release(self, r: Request) -> None:
        self.runner.allocator.free(r.pages)
        r.pages = []
        self._draft_hidden.pop(r.rid, None)

    def _ensure_pages(self, r: Request, tokens: int) -> None:
        need = pages_for(tokens, self.runner.page_size) - len(r.pages)
        if need > 0:
            r.pages += self.runner.allocator.alloc(need)

    def _trim_pages(self, r: Request, tokens: int) -> None:
        keep = pages_for(tokens, self.runner.page_size)
        if len(r.pages) > keep:
            self.runner.allocator.free(r.pages[keep:])
            del r.pages[keep:]

    # -- one step -----------------------------------------------------------------------------------
    def step(self) -> list[Request]:
        """Runs one prefill or one decode round; returns the requests that changed (finished ones included,
        already removed from the running set)."""
        t0 = time.perf_counter()
        admitted = self._admit()
        if admitted:
            changed = self._prefill(admitted)
        elif self.running:
            batch = self._make_room()
            changed = self._spec_round(batch) if self.num_steps else self._decode_round(batch)
            self.stats.step_seconds.append(time.perf_counter() - t0)
            if len(self.stats.step_seconds) > 4096:
                del self.stats.step_seconds[:2048]
        else:
            return []
        done = [r for r in changed if r.finished]
        for r in done:
            self._release(r)
            self.stats.finished_requests += 1
        self.running = [r for r in self.running if not r.finished]
        return changed

    def _round_tokens(self, r: Request) -> int:
        """Cache positions a request needs for its next decode round (verify writes k+1 new tokens)."""
        return r.seq_len + self.lookahead

    def _make_room(self) -> list[Request]:
        """Pages for every running request's next round. When the pool is short, the newest requests are
        retracted to the front of the waiting queue (their pages returned; they re-prefill prompt + output so
        far when readmitted), as SGLang does, instead of failing the batch."""
        batch = list(self.running)
        alloc, ps = self.runner.allocator, self.runner.page_size
        while sum(max(0, pages_for(self._round_tokens(r), ps) - len(r.pages)) for r in batch) > alloc.num_free:
            if len(batch) == 1:  # cannot happen for requests validated against the pool size
                raise RuntimeError(f"request {batch[0].rid} alone needs more KV pages than the pool holds")
            victim = batch.pop()
            self._release(victim)
            self.running.remove(victim)
            self.waiting.appendleft(victim)
            self.stats.retracted_requests += 1
            logger.info("KV pool full: request %s retracted to the waiting queue (%d tokens so far)",
                        victim.rid, len(victim.output_ids))
        for r in batch:
            self._ensure_pages(r, self._round_tokens(r))
        return batch

    def _admit(self) -> list[Request]:
        out = []
        while self.waiting and len(self.running) + len(out) < self.max_running:
            r = self.waiting[0]
            need = pages_for(r.seq_len + self.lookahead + 1, self.runner.page_size)
            if need > self.runner.allocator.num_free:
                if not self.running and not out:
                    raise RuntimeError(f"request {r.rid} needs {need} KV pages but the pool has only "
                                       f"{self.runner.allocator.num_free} free: raise num_pages/max_total_tokens")
                break
            self.waiting.popleft()
            self._ensure_pages(r, r.seq_len)
            out.append(r)
        self.running += out
        return out

    # -- prefill ------------------------------------------------------------------------------------
    def _prefill(self, reqs: list[Request]) -> list[Request]:
        """Prefills prompts; a request readmitted after retraction re-prefills all but its last token (which
        it already has) and emits nothing."""
        runner = self.runner
        resumed = [bool(r.output_ids) for r in reqs]
        rows = [(r.tokens[:-1] if res else r.input_ids, 0, r.pages) for r, res in zip(reqs, resumed, strict=True)]
        lens = [len(row[0]) for row in rows]
        # Graph replays of token buckets where they fit (ModelRunner.prefill); logits at each prompt's last token.
        last, hidden_states, aux = runner.prefill(rows)
        first_tokens, start = [], 0
        for i, (r, n, res) in enumerate(zip(reqs, lens, resumed, strict=True)):
            if res:
                first_tokens.append(r.tokens[-1])
            else:
                if r.return_logprob:  # every prompt row's logits, from its hidden state (only when asked)
                    self._input_logprobs(r, runner.logits_of(hidden_states[start:start + n]))
                first_tokens.append(sample_token(last[i], r.params, r.generator))
                self.stats.prompt_tokens += n
            start += n
        if self.num_steps:
            # Draft extend over the prompt: position p pairs target hidden p with token p+1.
            proposals, hidden = runner.prefill_draft([(r.tokens[1:] if res else r.input_ids[1:] + [t], 0, r.pages)
                                                      for r, t, res in zip(reqs, first_tokens, resumed, strict=True)],
                                                     aux)
            ends = torch.tensor(lens).cumsum(0) - 1
            proposals = proposals[ends.to(proposals.device)].tolist()
            for i, r in enumerate(reqs):
                r.next_draft_token = proposals[i]
                self._draft_hidden[r.rid] = hidden[int(ends[i])].clone()
        for i, (r, tok, res) in enumerate(zip(reqs, first_tokens, resumed, strict=True)):
            if not res:
                self._emit(r, [tok], last[i:i + 1])
        return reqs

    def _input_logprobs(self, r: Request, rows: torch.Tensor) -> None:
        lp = torch.log_softmax(rows.float(), -1)  # row i predicts token i+1
        start = max(r.logprob_start_len, 0)
        ids = r.input_ids
        out = [[None, ids[0], None]] if start == 0 else []
        idx = torch.tensor(ids[max(start, 1):], dtype=torch.long, device=lp.device)
        if len(idx):
            vals = lp[torch.arange(max(start, 1) - 1, len(ids) - 1, device=lp.device), idx].tolist()
            out += [[v, t, None] for v, t in zip(vals, ids[max(start, 1):], strict=True)]
        r.input_token_logprobs = out
        if r.top_logprobs_num:
            tops = [None] if start == 0 else []
            for i in range(max(start, 1) - 1, len(ids) - 1):
                tops.append(self._top(lp[i], r.top_logprobs_num))
            r.input_top_logprobs = tops

    @staticmethod
    def _top(lp_row: torch.Tensor, n: int) -> list:
        v, i = lp_row.topk(n)
        return [[a, b, None] for a, b in zip(v.tolist(), i.tolist(), strict=True)]

    # -- decode rounds -------------------------------------------------------------------------------
    def _decode_round(self, reqs: list[Request]) -> list[Request]:
        runner = self.runner  # pages for this round were reserved by _make_room
        bt = runner.build([([r.tokens[-1]], r.seq_len - 1, r.pages) for r in reqs])
        logits, _ = runner.target_uniform(bt, 1, verify=False)
        if all(r.params.greedy for r in reqs):  # one argmax and one wait for the whole batch
            tokens = logits.argmax(-1).tolist()
        else:
            tokens = [sample_token(logits[i], r.params, r.generator) for i, r in enumerate(reqs)]
        for i, r in enumerate(reqs):
            self._emit(r, [tokens[i]], logits[i:i + 1])
        return reqs

    def _spec_round(self, reqs: list[Request]) -> list[Request]:
        """One round; greedy (or simulated) acceptance runs on the device inside the round's one graph, sampled
        acceptance on the host between its halves. Either way the host waits once for the round's results."""
        runner, k = self.runner, self.num_steps
        T, B = k + 1, len(reqs)  # pages for positions up to seq_len - 1 + k were reserved by _make_room
        # The verify batch: positions seq_len-1 .. seq_len-1+k, ids [last, d_1, placeholders for d_2..d_k].
        bt = runner.build([([r.tokens[-1], r.next_draft_token] + [0] * (k - 1), r.seq_len - 1, r.pages)
                           for r in reqs])
        hidden = torch.stack([self._draft_hidden[r.rid] for r in reqs])
        if self.simulate_accept_length is None and not all(r.params.greedy for r in reqs):
            def accept(drafts, logits):  # exact rejection sampling (sampling.py), per request
                a_nxt = [accept_draft(logits[i], drafts[i], r.params, r.generator) for i, r in enumerate(reqs)]
                return [x[0] for x in a_nxt], [x[1] for x in a_nxt]

            logits, packed, next_hidden = runner.sampled_round(bt, hidden, T, accept)
        else:
            if self.simulate_accept_length is not None:
                sim = runner.to_device([self._simulated_accept(k) for _ in reqs])
            else:  # -1: acceptance computed on the device (a fill, no host copy)
                sim = torch.full((B,), -1, dtype=torch.int64, device=runner.device)
            logits, packed, next_hidden = runner.greedy_round(bt, hidden, sim, T)
        logits = logits.view(B, T, -1)
        next_hidden = next_hidden.clone()  # a replay's outputs are rewritten by the next replay: kept apart
        for i, (n_acc, tok, nd, *drafts) in enumerate(packed.tolist()):  # the round's one wait
            r = reqs[i]
            acc = drafts[:n_acc] + [tok]
            r.verify_ct += 1
            self.stats.verify_forwards += 1
            self.stats.accepted_tokens += n_acc + 1
            self.stats.accept_length_hist[n_acc + 1] = self.stats.accept_length_hist.get(n_acc + 1, 0) + 1
            r.next_draft_token = nd
            self._draft_hidden[r.rid] = next_hidden[i]
            self._emit(r, acc, logits[i, : len(acc)])
            self._trim_pages(r, r.seq_len - 1)
        return reqs

    def _simulated_accept(self, k: int) -> int:
        """Accepted draft tokens with mean simulate_accept_length - 1 (floor/ceil mix), clipped to [0, k]."""
        target = min(max(self.simulate_accept_length - 1.0, 0.0), float(k))
        lo = int(target)
        return min(k, lo + int(torch.rand((), generator=self._sim_rng) < target - lo))

    # -- emission and stopping ------------------------------------------------------------------------
    def _emit(self, r: Request, toks: list[int], logit_rows: torch.Tensor) -> None:
        """Appends tokens (stopping at max_new_tokens / eos / stop ids / stop strings)."""
        p = r.params
        for j, t in enumerate(toks):
            if len(r.output_ids) >= p.max_new_tokens:  # max_new_tokens=0: prefill only
                r.finished_reason = {"type": "length", "length": p.max_new_tokens}
                return
            r.output_ids.append(t)
            self.stats.generated_tokens += 1
            if r.return_logprob:
                lp = torch.log_softmax(logit_rows[j].float(), -1)
                r.output_token_logprobs.append([float(lp[t]), t, None])
                if r.top_logprobs_num:
                    r.output_top_logprobs.append(self._top(lp, r.top_logprobs_num))
            if not p.ignore_eos and t in self.eos:
                r.finished_reason = {"type": "stop", "matched": t}
            elif t in p.stop_token_ids:
                r.finished_reason = {"type": "stop", "matched": t}
            elif len(r.output_ids) >= p.max_new_tokens:
                r.finished_reason = {"type": "length", "length": p.max_new_tokens}
            elif p.stop and self.detokenize is not None:
                tail = self.detokenize(r.output_ids[-16:])
                hit = next((s for s in p.stop if s in tail), None)
                if hit is not None:
                    r.finished_reason = {"type": "stop", "matched": hit}
            if r.finished_reason is not None:
                return
