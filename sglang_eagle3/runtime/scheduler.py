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

Overlap (SGLang's overlap schedule; off with ``overlap=False``, EngineArgs.disable_overlap_schedule): a greedy
round's successor depends on it only through its accepted count and tokens, which are on the device, so the
scheduler queues round n+1 (its inputs derived there: ModelRunner.advance) BEFORE it waits for round n's results.
The host's work between rounds (reading the results, emitting tokens, building and launching the next replay:
~0.8 ms a round on the Kimi slice, where a replay's launch alone takes ~0.35-0.5 ms of host time; docs/BENCHMARKS.md,
twentieth session) then runs while the GPU computes instead of in front of it. Round n+1 computes exactly what it
would have computed had it been built after round n's results were read (same ids, positions, cache slots, draft
hidden), so outputs do not change. When round n finishes a request, round n+1 is read at once and the finished
request's part of it dropped; admissions and aborts wait until the round in flight is read. Sampled requests
overlap too: their tokens are drawn on the device (sampling.py: the noise is fixed by each request's key and the
positions, so a round computes the same tokens whenever it runs), and so do requests that return logprobs: a
round's logprobs are gathered on the device right after it (_token_logprobs), before the round behind it rewrites
the graph's logits, and copied with its results.

Adaptive draft length (``adaptive``, runtime/adaptive.py): every speculative round's accept counts go to the
policy, which may set another k before the next round; the round in flight is then read first (its successor
would draft the old k), so a switch costs one round's overlap. While k = 0 the draft rests (AdaptiveConfig.
probe_rounds > 0): the rounds are plain decode steps that keep the target's aux hidden states of their token,
and the draft catches up over them in one extend (_catch_up) every probe_rounds rounds and before it drafts again.
With the overlap, a catch-up over the rounds already read is queued behind the round in flight (before the round
after it), and its proposals are read with that round: resting costs no look-ahead and no wait of its own.
"""

from __future__ import annotations

import logging
import random
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from sglang_eagle3.runtime.adaptive import DraftLengthPolicy
from sglang_eagle3.runtime.grammar import GrammarBackend, GrammarError, GrammarMatcher
from sglang_eagle3.runtime.interrupts import defer_interrupt
from sglang_eagle3.runtime.kv_cache import pages_for
from sglang_eagle3.runtime.model_runner import BatchTensors, ModelRunner
from sglang_eagle3.runtime.reasoning import ThinkingMatcher
from sglang_eagle3.runtime.request import Request
from sglang_eagle3.runtime.sampling import SamplerBatch, find_stop, find_stop_regex, sampling_key, settled_chars

logger = logging.getLogger(__name__)


@dataclass
class SchedulerStats:
    verify_forwards: int = 0  # target verify forwards (one per request per round, SGLang's spec_verify_ct)
    # Tokens verify rounds gave requests (a round cut by a stop or max_new_tokens counts what the request kept, as
    # SGLang counts it), and rounds by that count: what serving got.
    accepted_tokens: int = 0
    accept_length_hist: dict[int, int] = field(default_factory=dict)
    # Rounds by the drafts their verify accepted (0..k), whether or not the request kept them all: the draft's
    # quality, apart from where requests end.
    draft_accept_hist: dict[int, int] = field(default_factory=dict)
    step_seconds: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    generated_tokens: int = 0
    finished_requests: int = 0
    # Retractions (_make_room): requests sent back to the waiting queue, with their prompt and output tokens at that
    # moment (SGLang's num_retracted_*_total), and the latest retraction's requests and perf_counter (SGLang's
    # num_retracted_reqs gauge reports the latest one).
    retracted_requests: int = 0
    retracted_input_tokens: int = 0
    retracted_output_tokens: int = 0
    last_retraction_requests: int = 0
    last_retraction_time: float | None = None

    @property
    def avg_accept_length(self) -> float:
        return self.accepted_tokens / self.verify_forwards if self.verify_forwards else 0.0


@dataclass
class _Round:
    """A greedy decode or speculative round launched on the device whose results the host has not read yet."""

    reqs: list[Request]
    T: int  # tokens a request (1: decode, or a speculative round of k = 0)
    spec: bool  # a speculative round (packed results), not a plain decode
    bt: BatchTensors  # its inputs: the next round's are derived from them (ModelRunner.advance)
    out: torch.Tensor  # device results: decode tokens [B]; speculative: packed [B, 3 + k] (ModelRunner)
    host: torch.Tensor  # their copy on the host (pinned on CUDA), complete once `ready` has passed
    ready: torch.cuda.Event | None
    hidden: torch.Tensor | None = None  # speculative: the next draft hidden [B, Hd], a copy (replays rewrite theirs)
    aux: torch.Tensor | None = None  # a resting draft's round: the target's aux hidden [B, 3H] of its token, a copy
    logprobs: tuple[torch.Tensor, ...] | None = None  # with logprob requests: _token_logprobs' tensors, on the host
    samp: SamplerBatch | None = None  # with sampled requests: the sampler's inputs


class Scheduler:
    def __init__(self, runner: ModelRunner, *, num_steps: int | None, max_running: int, max_context: int,
                 eos_token_ids: tuple[int, ...], detokenize: Callable[..., str] | None = None,
                 seed: int = 0, grammar: GrammarBackend | None = None):
        self.runner = runner
        self.num_steps = num_steps  # None: no speculation
        self.max_running = max_running
        self.max_context = max_context
        self.eos = set(eos_token_ids)
        self.detokenize = detokenize
        self.grammar = grammar  # makes the matchers of requests with a grammar (json_schema, regex, ebnf)
        # Benchmarking only (as SGLang's SGLANG_SIMULATE_ACC_LEN): pin the mean accepted tokens per verify so
        # step times can be measured with random-weight models; the output is then NOT the target's.
        self.simulate_accept_length: float | None = None
        # The adaptive draft length (runtime/adaptive.py; EngineArgs.speculative_adaptive): fed every speculative
        # round's accept counts, it sets num_steps before a round is launched. None: k stays as set.
        self.adaptive: DraftLengthPolicy | None = None
        self._sim_rng = torch.Generator().manual_seed(0)
        # Seeds of requests that bring none (their sampling keys, sampling.py). Drawn in admission order from one
        # seeded stream, so under TP every rank's scheduler (fed the same requests in the same order) draws the
        # same, and an engine started with the same random_seed samples the same outputs.
        self._seeds = random.Random(seed)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.stats = SchedulerStats()
        # Per-request draft state between rounds: draft hidden [H] of the last committed position.
        self._draft_hidden: dict[str, torch.Tensor] = {}
        # While the draft rests (k = 0, module doc): per request, the target's aux hidden rows [3H] of the positions
        # the draft has not seen yet, oldest first (the draft's cache holds len(tokens) - 1 - len(rows) positions).
        self._pending_aux: dict[str, list[torch.Tensor]] = {}
        # The draft's proposals (the next round's d_1) of its last extend, until the host reads them (_read_proposals):
        # (requests, host copy, its event, a catch-up's checks: _catch_up_checks).
        self._proposals: tuple[list[Request], torch.Tensor, torch.cuda.Event | None, list | None] | None = None
        # Checks of draft position 1 made by catch-ups read since the last round was (1 passed, 0 failed), for the
        # policy's next observe (runtime/adaptive.py: a resting draft is checked at every token it catches up on).
        self._first_checks: list[int] = []
        # Requests with a grammar: its matcher, which has accepted the request's output so far (kept through a
        # retraction; dropped when the request finishes). Here, not in the Request: TP ranks each keep their own.
        self._matchers: dict[str, GrammarMatcher] = {}
        # Overlap (module doc): the round in flight whose results are read in the next step, queued behind it.
        self.overlap = True
        self._ahead: _Round | None = None
        # Prompt rows whose logprobs are computed at once (_input_logprobs): 512 x Kimi's 163840-token vocabulary
        # is 336 MB of float32 logits (and as much for their log_softmax).
        self.input_logprob_rows = 512

    # -- queue ------------------------------------------------------------------------------------
    @property
    def speculative(self) -> bool:
        """Whether rounds draft (k = num_steps may be 0 then: the draft's extend still follows every token)."""
        return self.num_steps is not None

    @property
    def resting(self) -> bool:
        """Whether the next rounds leave the draft out (k = 0 under an adaptive policy that rests it; module doc)."""
        return self.num_steps == 0 and self.adaptive is not None and self.adaptive.config.rests

    @property
    def lookahead(self) -> int:
        return self.num_steps or 0

    def add(self, req: Request) -> None:
        if req.sampling_key is None:
            seed = req.params.seed if req.params.seed is not None else self._seeds.getrandbits(64)
            req.sampling_key = sampling_key(seed)
        req.queued_at = time.perf_counter()
        self.waiting.append(req)

    def abort(self, rid: str) -> bool:
        # Both queues are searched to the end: an interrupt inside _admit (between its two moves) can leave a request
        # listed in both for a moment, and an abort must take it out of each.
        found = False
        # Whole or not at all: abort runs outside a step, where no reclaim follows, so a Ctrl-C between _release's
        # two moves (the pages off the request, then onto the free list) would lose them for good.
        with defer_interrupt():
            for q in (self.waiting, self.running):
                for r in [r for r in q if r.rid == rid]:
                    r.finished_reason = {"type": "abort", "message": "aborted"}
                    self._release(r)
                    _remove_identical(q, r)
                    found = True
        return found

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def _release(self, r: Request) -> None:
        # Detached before they are freed: an interrupt between the two must not leave them listed as the request's
        # too (an abort would free them twice).
        pages, r.pages = r.pages, []
        self.runner.allocator.free(pages)
        self._draft_hidden.pop(r.rid, None)
        self._pending_aux.pop(r.rid, None)
        if r.finished:
            self._matchers.pop(r.rid, None)

    def _ensure_pages(self, r: Request, tokens: int) -> None:
        need = pages_for(tokens, self.runner.page_size) - len(r.pages)
        if need > 0:
            r.pages += self.runner.allocator.alloc(need)

    def _pages_short(self, reqs: list[Request], tokens: list[int]) -> bool:
        """Whether the pool lacks the pages that would bring each request to its ``tokens`` cache positions."""
        ps = self.runner.page_size
        need = sum(max(0, pages_for(t, ps) - len(r.pages)) for r, t in zip(reqs, tokens, strict=True))
        return need > self.runner.allocator.num_free

    def _trim_pages(self, r: Request, tokens: int) -> None:
        keep = pages_for(tokens, self.runner.page_size)
        if len(r.pages) > keep:
            spare = r.pages[keep:]
            del r.pages[keep:]  # detached first, as in _release
            self.runner.allocator.free(spare)

    # -- one step -----------------------------------------------------------------------------------
    def step(self) -> list[Request]:
        """Runs one prefill or one decode round (with the overlap: queues the next round, then reads the one in
        flight, and reads the one queued too when a request ended); returns the requests that changed (finished
        ones included, already removed from the running set)."""
        try:
            return self._step()
        except BaseException:
            self._reclaim_pages()
            raise

    def _reclaim_pages(self) -> None:
        """After a step cut short (a Ctrl-C, most often): every page that no queued request holds goes back to the
        pool, once. Between steps the pages in use are exactly those of the running requests (a round in flight
        holds only theirs), but a page being handed out or freed is, for a few bytecodes, in the free list and a
        page list both or in neither (PageAllocator.reclaim); an interrupt there would leak it or free it twice,
        and no order of the two moves closes that."""
        reqs = {id(r): r for q in (self.waiting, self.running) for r in q}.values()
        held = [p for r in reqs for p in r.pages]
        if len(held) != len(set(held)):
            logger.error("KV pages held by two requests after an interrupted step: %s",
                         sorted({p for p in held if held.count(p) > 1}))
        lost = self.runner.allocator.reclaim(set(held))
        if lost:
            logger.warning("%d KV page(s) held by no request after an interrupted step returned to the pool",
                           len(lost))

    def _step(self) -> list[Request]:
        t0 = time.perf_counter()
        if self.adaptive is not None and self.speculative and self.running:
            # A new k first reads the round in flight (_ahead_continues: its successor would have the old k).
            self.num_steps = self.adaptive.choose(self.num_steps, len(self.running), self.samples(self.running))
        if self._ahead is not None and not self._ahead_continues():
            changed = self._finish(self._ahead)  # an admission or an abort waits for the round in flight
            self._ahead = None
            return self._retire(changed)
        changed = self._admit_and_prefill()
        if not changed:  # nothing admitted: a decode round
            if not self.running:
                return []
            if self._ahead is not None:
                changed = self._advance()
            else:
                batch = self._make_room()
                changed = self._round(batch)
            self.stats.step_seconds.append(time.perf_counter() - t0)
            if len(self.stats.step_seconds) > 4096:
                del self.stats.step_seconds[:2048]
        return self._retire(changed)

    def _retire(self, changed: list[Request]) -> list[Request]:
        """Releases the finished requests among ``changed`` (no round in flight holds any of them)."""
        running = {id(r) for r in self.running}
        for r in changed:
            if r.finished and id(r) in running:
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
        retracted = 0
        while self._pages_short(batch, [self._round_tokens(r) for r in batch]):
            if len(batch) == 1:  # cannot happen for requests validated against the pool size
                raise RuntimeError(f"request {batch[0].rid} alone needs more KV pages than the pool holds")
            victim = batch.pop()
            self._release(victim)
            self.running.remove(victim)
            self.waiting.appendleft(victim)
            retracted += 1
            victim.retractions += 1
            self.stats.retracted_requests += 1
            self.stats.retracted_input_tokens += len(victim.input_ids)
            self.stats.retracted_output_tokens += len(victim.output_ids)
            logger.info("KV pool full: request %s retracted to the waiting queue (%d tokens so far)",
                        victim.rid, len(victim.output_ids))
        if retracted:
            self.stats.last_retraction_requests = retracted
            self.stats.last_retraction_time = time.perf_counter()
        for r in batch:
            self._ensure_pages(r, self._round_tokens(r))
        return batch

    def _admit_and_prefill(self) -> list[Request]:
        """Admits what fits and prefills it; returns the admitted requests ([] when none). An exception (a Ctrl-C
        included) anywhere in between puts this step's admissions back at the front of the waiting queue without
        pages, as if never admitted: left in the running set unprefilled, a request of another caller (whose
        generate does not abort it) would next be given a decode round with no draft state."""
        first = len(self.running)
        try:
            admitted = self._admit()
            return self._prefill(admitted) if admitted else []
        except BaseException:
            self._unadmit(self.running[first:])
            raise

    def _admit(self) -> list[Request]:
        """Moves waiting requests to the running set while the pool holds their pages, giving each its prompt's.
        A request is listed as running before it leaves the waiting queue and before it holds a page, so that at
        every point of an interrupt it, and every page it holds, is where abort and _unadmit find it."""
        first = len(self.running)
        ps = self.runner.page_size
        # The pages the running batch's next round takes stay free: a request admitted into them would be retracted
        # again by that round's _make_room, its prefill wasted.
        free = self.runner.allocator.num_free - sum(max(0, pages_for(self._round_tokens(x), ps) - len(x.pages))
                                                    for x in self.running)
        now = time.perf_counter()
        while self.waiting and len(self.running) < self.max_running:
            r = self.waiting[0]
            need = pages_for(r.seq_len + self.lookahead + 1, ps)
            if need > free:
                if not self.running:
                    raise RuntimeError(f"request {r.rid} needs {need} KV pages but the pool has only "
                                       f"{self.runner.allocator.num_free} free: raise num_pages/max_total_tokens")
                break
            self.running.append(r)
            self.waiting.popleft()
            self._ensure_pages(r, r.seq_len)
            free -= need
            if r.queue_time is None and r.queued_at is not None:  # its first admission (SGLang's queue time)
                r.queue_time = now - r.queued_at
        return self.running[first:]

    def _unadmit(self, reqs: list[Request]) -> None:
        """Returns requests admitted by an interrupted step to the front of the waiting queue, in their order, their
        pages freed. One that emitted its first token before the interrupt re-prefills as a retracted one does."""
        for r in reversed(reqs):
            self._release(r)
            _remove_identical(self.running, r)
            if not (self.waiting and self.waiting[0] is r):  # interrupted between _admit's two moves: still there
                self.waiting.appendleft(r)

    # -- prefill ------------------------------------------------------------------------------------
    def _prefill(self, reqs: list[Request]) -> list[Request]:
        """Prefills prompts; a request readmitted after retraction re-prefills all but its last token (which
        it already has) and emits nothing."""
        runner = self.runner
        resumed = [bool(r.output_ids) for r in reqs]
        rows = [(r.tokens[:-1] if res else r.input_ids, 0, r.pages) for r, res in zip(reqs, resumed, strict=True)]
        lens = [len(row[0]) for row in rows]
        for r, res in zip(reqs, resumed, strict=True):
            if not res and (r.params.grammar is not None or (self.grammar is not None
                                                               and self.grammar.strict_thinking)):
                self._matchers[r.rid] = self._matcher(r)
                if self._matchers[r.rid].terminated:  # complete before any token, on an engine without an eos
                    r.finished_reason = {"type": "stop", "matched": None}
        # Graph replays of token buckets where they fit (ModelRunner.prefill); logits at each prompt's last token.
        last, hidden_states, aux = runner.prefill(rows)
        # Each prompt's next token, at position len(prompt) (a resumed request keeps the one it has).
        samp = self._sampler(reqs)
        positions = None if samp is None else runner.to_device([r.seq_len for r in reqs])  # (greedy: the argmax)
        sampled = runner.sample(last, samp, positions).tolist()
        first_tokens, start = [], 0
        for i, (r, n, res) in enumerate(zip(reqs, lens, resumed, strict=True)):
            if res:
                first_tokens.append(r.tokens[-1])
            else:
                if r.return_logprob:  # the prompt rows' logits asked for, from their hidden states
                    self._input_logprobs(r, lambda a, b, s=start: runner.logits_of(hidden_states[s + a:s + b]))
                first_tokens.append(sampled[i])
                self.stats.prompt_tokens += n
            start += n
        if self.speculative:
            # Draft extend over the prompt: position p pairs target hidden p with token p+1.
            self._extend_draft(reqs, [(r.tokens[1:] if res else r.input_ids[1:] + [t], 0, r.pages)
                                      for r, t, res in zip(reqs, first_tokens, resumed, strict=True)], aux, samp)
        lps = self._logprob_lists(reqs, last.view(len(reqs), 1, -1),
                                  torch.tensor(first_tokens, device=last.device).view(-1, 1))
        for i, (r, tok, res) in enumerate(zip(reqs, first_tokens, resumed, strict=True)):
            if not res and not r.finished:
                self._emit(r, [tok], lps[i] if lps else None)
        return reqs

    def _extend_draft(self, reqs: list[Request], rows: list[tuple[list[int], int, list[int]]], aux: torch.Tensor,
                      samp: SamplerBatch | None, lazy: bool = False, checks: list | None = None) -> None:
        """The draft's extend over each request's row (its tokens shifted by one from the row's first position:
        position p pairs the target's aux hidden p, rows of ``aux`` in order, with token p + 1), which leaves it
        holding every position before the request's last token: the next round's d_1 and draft hidden come from
        each row's last position (sampled from there where ``samp`` has sampled requests). ``lazy``: the proposals
        are read when first needed (_read_proposals), by the end of the step, not now: the host goes on queueing
        work meanwhile (an overlapped catch-up, read with the round in flight). ``checks``: a catch-up's
        (_catch_up_checks): every row's proposal (sampled where ``samp`` has sampled requests) comes to the host
        too, to be checked when read."""
        runner = self.runner
        self._read_proposals()
        # with checks, every row's proposal, sampled as a round's d_1 would be there
        every, hidden = runner.catch_up(rows, aux, samp if checks else None)
        ends = torch.tensor([len(toks) for toks, _, _ in rows]).cumsum(0) - 1
        if samp is not None and not checks:  # the last row (position first + n - 1) proposes the token two after it
            proposals = runner.draft_proposals(hidden[ends.to(hidden.device)], samp,
                                               runner.to_device([first + len(toks) - 1 for toks, first, _ in rows]))
        else:
            proposals = every[ends.to(every.device)]
        for i, r in enumerate(reqs):
            self._draft_hidden[r.rid] = hidden[int(ends[i])].clone()
            self._pending_aux.pop(r.rid, None)
        if checks:  # (one copy: the proposals, then every row's)
            proposals = torch.cat([proposals, every.to(proposals.dtype)])
        self._proposals = (reqs, *runner.to_host(proposals), checks or None)
        if not lazy:
            self._read_proposals()

    def _read_proposals(self) -> None:
        """Sets each request's next_draft_token from the draft's last extend (waiting for it if need be), and
        checks a catch-up's proposals before its last against the tokens they proposed (for the policy)."""
        if self._proposals is None:
            return
        reqs, host, ready, checks = self._proposals
        self._proposals = None
        if ready is not None:
            ready.synchronize()
        host = host.tolist()
        for r, tok in zip(reqs, host[:len(reqs)], strict=True):
            r.next_draft_token = tok
        every = host[len(reqs):]
        for start, tokens, rules in checks or ():
            proposed = every[start:start + len(tokens)]
            if rules is None:
                self._first_checks += [int(p == t) for p, t in zip(proposed, tokens, strict=True)]
                continue
            # Under a matcher a round's d_1 is the draft's choice among the tokens its rule allows, which is the
            # unmasked proposal where the rule allows that (always when it matched: the token was accepted); a
            # refused proposal says nothing of what the round would have drafted, and is left out.
            self._first_checks += [int(p == t) for p, t, rule in zip(proposed, tokens, rules, strict=True)
                                   if rule is not None and (p == t or rule(p))]

    def _catch_up_due(self, r: Request) -> bool:
        """Whether the draft must catch up on r before its next round: it drafts again (k > 0) with rows kept, or
        it rests and probe_rounds rows are kept (of the rounds read)."""
        kept = len(self._pending_aux.get(r.rid, ()))
        return kept > 0 and (not self.resting or kept >= self.adaptive.config.probe_rounds)

    def _catch_up(self, reqs: list[Request], lazy: bool = False) -> None:
        """The resting draft's extend over the positions of the rounds read that it has not seen (module doc), for
        ``reqs``: afterwards it holds every position before each request's last token read, as after a round; its
        proposal is for the token after it (that of the round in flight, if one is; ``lazy``: _extend_draft's)."""
        if not reqs:
            return
        rows, aux = [], []
        for r in reqs:
            kept = self._pending_aux[r.rid]
            n = len(kept)  # the last n tokens' positions: seq_len - 1 - n .. seq_len - 2, paired with the tokens after
            rows.append((r.tokens[-n:], r.seq_len - 1 - n, r.pages))
            aux += kept
        self._extend_draft(reqs, rows, torch.stack(aux), self._sampler(reqs), lazy, self._catch_up_checks(reqs, rows))

    def _catch_up_checks(self, reqs: list[Request], rows: list[tuple[list[int], int, list[int]]]) -> list | None:
        """What a catch-up tells the policy of draft position 1 (runtime/adaptive.py): its row j (position first + j)
        proposes the token at first + j + 2, which for j < n - 1 the rounds read already gave (the row's token j +
        1); the last row's proposal is the next d_1, checked by the round after (_finish). Each such proposal is what
        a round's d_1 would have been there (the draft holding the same positions), so each is a check of position 1
        as a k = 0 round's was: the argmax for a greedy request; a sampled one's drawn with the target's noise at
        each row's position (_extend_draft draws every row then; penalties never reach a proposal, so a penalized
        request's are as its rounds' d_1). A request under a matcher drafts d_1 among the tokens the matcher allows:
        its rows are checked where the rule of the token they proposed is known (ThinkingMatcher.past_rules: a
        reasoning model's thinking, strict or free, and the answer after it without a grammar; not a grammar's
        tokens). Returns [(offset of the request's rows among all, the tokens its rows before the last proposed,
        None or each token's rule)], or None (no adaptive policy; a pinned acceptance draws its checks now
        instead)."""
        if self.adaptive is None:
            return None
        if self.simulate_accept_length is not None:
            self._first_checks += [self._simulated_accept(1) for toks, _, _ in rows for _ in toks[1:]]
            return None
        checks, start = [], 0
        for r, (toks, _, _) in zip(reqs, rows, strict=True):
            matcher = self._matchers.get(r.rid)
            if len(toks) > 1 and matcher is None:
                checks.append((start, toks[1:], None))
            elif len(toks) > 1 and isinstance(matcher, ThinkingMatcher):  # (its log ends at the last token read)
                checks.append((start, toks[1:], matcher.past_rules(len(toks) - 1)))
            start += len(toks)
        return checks

    def _matcher(self, r: Request) -> GrammarMatcher:
        """The request's matcher: its grammar's, and under strict thinking its thinking's rules (runtime/reasoning.py;
        a request without a grammar has the latter alone)."""
        if self.grammar is None:
            raise GrammarError(f"request {r.rid} has a grammar ({r.params.grammar.kind}) and this scheduler has no "
                               "grammar backend")
        return self.grammar.matcher(r.params.grammar, r.input_ids, r.params.thinking_budget)

    def _input_logprobs(self, r: Request, logits_of_rows) -> None:
        """The prompt's logprobs from logprob_start_len on; ``logits_of_rows(a, b)``: the logits [b - a, V] of
        prompt rows a..b (row i predicts token i + 1), computed only for the rows asked for, at most
        input_logprob_rows at a time: a long prompt's whole [n, V] would be gigabytes at Kimi's vocabulary (an
        echoed 32k-token prompt: 21 GB of logits, then as much again for their log_softmax)."""
        ids = r.input_ids
        # -1 (the default) means the output tokens only, as in SGLang.
        start = len(ids) if r.logprob_start_len == -1 else r.logprob_start_len
        first = max(start, 1)  # the first token with a row before it
        per_row = []
        for a in range(first - 1, len(ids) - 1, self.input_logprob_rows):
            b = min(a + self.input_logprob_rows, len(ids) - 1)
            rows = logits_of_rows(a, b)
            tokens = torch.tensor(ids[a + 1:b + 1], dtype=torch.long, device=rows.device)
            per_row += self._logprob_lists([r], rows.unsqueeze(0), tokens.unsqueeze(0))[0]
        lead = start == 0  # the first token has no logprob: [None, id, None] (and no top list)
        r.input_token_logprobs = ([[None, ids[0], None]] if lead else []) + [
            [v, t, None] for (v, _), t in zip(per_row, ids[first:], strict=True)]
        if r.top_logprobs_num:
            r.input_top_logprobs = ([None] if lead else []) + [top for _, top in per_row]

    @staticmethod
    def _token_logprobs(logits: torch.Tensor, tokens: torch.Tensor, top: int) -> tuple[torch.Tensor, ...]:
        """On the device: log_softmax of logits [B, T, V] at tokens [B, T] -> (float32 [B, T]), and with ``top``
        > 0 the top values [B, T, top] and ids [B, T, top]."""
        lp = torch.log_softmax(logits.float(), -1)
        out = (lp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1),)
        return out + tuple(lp.topk(top, dim=-1)) if top else out

    def _logprob_lists(self, reqs: list[Request], logits: torch.Tensor, tokens: torch.Tensor) -> list | None:
        """Per request, per row: (logprob of the row's token, its top list or None), read now (prefill)."""
        if not any(r.return_logprob for r in reqs):
            return None
        return self._read_logprobs(reqs, [t.cpu() for t in self._token_logprobs(
            logits, tokens, max(r.top_logprobs_num for r in reqs))])

    @staticmethod
    def _read_logprobs(reqs: list[Request], host: list[torch.Tensor]) -> list:
        """_token_logprobs' tensors on the host -> per request, per row: (logprob, [[value, id, None]] or None)."""
        vals = host[0].tolist()
        tops = (host[1].tolist(), host[2].tolist()) if len(host) > 1 else None
        out = []
        for b, r in enumerate(reqs):
            n = r.top_logprobs_num
            out.append([(v, [[a, i, None] for a, i in zip(tops[0][b][j][:n], tops[1][b][j][:n], strict=True)]
                         if tops and n else None) for j, v in enumerate(vals[b])])
        return out

    # -- decode rounds -------------------------------------------------------------------------------
    def _round(self, batch: list[Request]) -> list[Request]:
        """One round of every running request (pages for it reserved by _make_room); with overlap, the round
        after it is queued before this one is read (module doc)."""
        if self.speculative:
            self._catch_up([r for r in batch if self._catch_up_due(r)])
        rnd = self._launch(batch, *self._first_batch(batch))
        # Every round's tokens, acceptance and logprobs are made on the device, but a grammar's masks are made on
        # the host from the tokens before them (runtime/grammar.py): its batch reads each round before the next.
        if self.overlap and not any(r.rid in self._matchers for r in batch):
            self._ahead = rnd
            return self._advance()
        return self._finish(rnd)

    def _advance(self) -> list[Request]:
        """Queues the round after the one in flight, then reads the one in flight."""
        prev = self._ahead
        if self._may_all_finish(prev.reqs) or not self._reserve_ahead(prev.reqs):
            self._ahead = None  # read it without a round behind it (one that would be wasted, or no pages)
            return self._finish(prev)
        if self.resting:  # queued behind the round in flight (module doc): its proposal is for that round's token
            self._catch_up([r for r in prev.reqs if self._catch_up_due(r)], lazy=True)  # (read in _finish below)
        nxt = self._launch(prev.reqs, *self._batch_after(prev), samp=prev.samp)
        changed = self._finish(prev, in_flight=True)
        if any(r.finished for r in prev.reqs):  # the batch ends here: the round behind it is read now
            seen = {id(r) for r in changed}
            changed += [r for r in self._finish(nxt) if id(r) not in seen]
            self._ahead = None
        else:
            self._ahead = nxt
        return changed

    def _ahead_continues(self) -> bool:
        """Whether the next step may queue a round behind the one in flight: nothing to admit, nothing aborted,
        the same draft length (an adaptive k may have changed it)."""
        if self.waiting and len(self.running) < self.max_running or self._ahead.T != self.lookahead + 1:
            return False
        reqs = self._ahead.reqs
        return len(reqs) == len(self.running) and all(a is b for a, b in zip(reqs, self.running, strict=True))

    def _may_all_finish(self, reqs: list[Request]) -> bool:
        """Whether the round about to be read may end every request of its batch at its token limit: a round
        queued behind it would then be all waste (a whole round of GPU time, against the ~0.5-0.8 ms of host time
        the overlap hides), so none is. (A stop token cannot be foreseen: after one, the round behind is dropped.)"""
        return all(len(r.output_ids) + self.lookahead + 1 >= r.params.max_new_tokens for r in reqs)

    def _reserve_ahead(self, reqs: list[Request]) -> bool:
        """Pages for the round after the one about to be read (up to 2k + 1 positions past each request's length,
        as its accepted count is not known yet); False, reserving nothing, when the pool is short or a request's
        positions could pass the context limit (the page table's width: near its end a request reads each round
        before the next, as requests that end there would otherwise have a round queued past it)."""
        tokens = [r.seq_len + 2 * self.lookahead + 1 for r in reqs]
        # The context, not only the page table's reach: with a page size that does not divide the context, the table
        # reaches past the rotary table's last position.
        reach = min(self.runner.max_pages * self.runner.page_size, self.max_context)
        if max(tokens) > reach or self._pages_short(reqs, tokens):
            return False
        for r, t in zip(reqs, tokens, strict=True):
            self._ensure_pages(r, t)
        return True

    def _first_batch(self, reqs: list[Request]) -> tuple[BatchTensors, torch.Tensor | None]:
        """A round's inputs built on the host: (batch, draft hidden [B, Hd] or None)."""
        self._read_proposals()  # (none is left unread between steps; the batch's d_1 must not be a stale one)
        if not self.speculative:
            return self.runner.build([([r.tokens[-1]], r.seq_len - 1, r.pages) for r in reqs]), None
        # The verify batch: positions seq_len-1 .. seq_len-1+k, ids [last, d_1, placeholders for d_2..d_k] ([last]
        # at k = 0).
        k = self.num_steps
        bt = self.runner.build([([r.tokens[-1]] + ([r.next_draft_token] + [0] * (k - 1) if k else []),
                                 r.seq_len - 1, r.pages) for r in reqs])
        return bt, torch.stack([self._draft_hidden[r.rid] for r in reqs])

    def _batch_after(self, prev: _Round) -> tuple[BatchTensors, torch.Tensor | None]:
        """The inputs of the round after ``prev`` built on the device from its results, before the host has
        read them: each request moves on by its accepted count + 1 (decode: 1) and starts from the target's
        token after them and (speculative) the draft extend's d_1 and hidden."""
        B, T = len(prev.reqs), prev.T
        if prev.spec:
            ids = torch.zeros(B, T, dtype=torch.int64, device=prev.out.device)
            ids[:, :2] = prev.out[:, 1:1 + min(T, 2)]  # the target's token after the accepted ones, the next d_1
            steps = prev.out[:, 0] + 1
        else:
            ids, steps = prev.out.view(B, 1), torch.ones(B, dtype=torch.int64, device=prev.out.device)
        return self.runner.advance(prev.bt, T, steps, ids, [r.pages for r in prev.reqs]), prev.hidden

    def samples(self, reqs: list[Request]) -> bool:
        """Whether a batch of ``reqs`` runs the sampler (a request sampled, penalized or under a grammar); else its
        tokens are the argmax, with none of the sampler's work. (The adaptive policy prices its rounds by it.)"""
        return not all(r.params.greedy and not r.params.penalized and r.rid not in self._matchers for r in reqs)

    def _sampler(self, reqs: list[Request]) -> SamplerBatch | None:
        """The sampler's inputs for a batch (ModelRunner.sampler_batch), None when every request is greedy
        (samples)."""
        if not self.samples(reqs):
            return None
        return self.runner.sampler_batch([r.params for r in reqs], [r.sampling_key for r in reqs],
                                         [r.output_ids for r in reqs], frozenset(self.eos),
                                         [self._matchers.get(r.rid) for r in reqs])

    def _launch(self, reqs: list[Request], bt: BatchTensors, hidden: torch.Tensor | None,
                samp: SamplerBatch | None = None) -> _Round:
        """Queues one round on the device: its tokens (argmax, or the sampler where a request samples) and a
        speculative round's acceptance are computed there, in the round's one graph. ``samp``: the sampler's
        parameters when a previous round of the same requests made them."""
        runner, B = self.runner, len(reqs)
        samp = samp or self._sampler(reqs)
        spec = self.speculative and not self.resting
        aux = None
        if spec:
            T = self.num_steps + 1
            if self.simulate_accept_length is not None:
                sim = runner.to_device([self._simulated_accept(self.num_steps) for _ in reqs])
            else:  # -1: acceptance computed on the device (a fill, no host copy)
                sim = torch.full((B,), -1, dtype=torch.int64, device=runner.device)
            if samp is None:
                logits, out, next_hidden = runner.greedy_round(bt, hidden, sim, T)
            else:
                logits, out, next_hidden = runner.sampled_round(bt, hidden, sim, T, samp)
            hidden = next_hidden.clone()  # a replay's outputs are rewritten by the next replay: kept apart
        else:
            T = 1
            logits, aux = runner.target_uniform(bt, 1, verify=False)
            out = runner.sample(logits, samp, bt.positions + 1)
            hidden = None
            # a resting draft's rows for its catch-up (copied: the next replay rewrites the graph's)
            aux = aux.clone() if self.speculative else None
        penalties = samp.penalties if samp is not None else None
        logprobs = None
        if penalties is not None or any(r.return_logprob for r in reqs):  # (a few more launches: only if needed)
            if spec:  # row j emits d_(j+1) where j < a, then (j = a) the target's token after them
                col = torch.arange(T, device=out.device).view(1, T)
                toks = torch.where(col < out[:, :1], torch.cat([out[:, 3:], out[:, 1:2]], 1), out[:, 1:2])
            else:
                toks = out.view(B, 1)
        if penalties is not None:  # the next round of this batch counts these tokens (queued in stream order)
            emitted = out[:, 0] + 1 if spec else torch.ones(B, dtype=torch.int64, device=out.device)
            penalties.advance(toks, emitted)
        if any(r.return_logprob for r in reqs):  # now, before a round queued behind rewrites the logits
            top = max(r.top_logprobs_num for r in reqs)
            # copied ahead of the results, whose event covers them (one stream)
            logprobs = tuple(runner.to_host(t)[0] for t in self._token_logprobs(logits.view(B, T, -1), toks, top))
        host, ready = runner.to_host(out)
        return _Round(reqs, T, spec, bt, out, host, ready, hidden=hidden, aux=aux, logprobs=logprobs, samp=samp)

    def _finish(self, rnd: _Round, in_flight: bool = False) -> list[Request]:
        """Reads a round's results (the host's one wait a round) and emits its tokens. A request finished or
        aborted before it was read is skipped. ``in_flight``: a round behind this one still writes past the
        accepted tokens, so their pages stay."""
        if rnd.ready is not None:
            rnd.ready.synchronize()
        self._read_proposals()  # (a catch-up queued behind this round: its proposal is for this round's token)
        rows = rnd.host.tolist()
        lp_rows = self._read_logprobs(rnd.reqs, list(rnd.logprobs)) if rnd.logprobs is not None else None
        changed, accepted = [], []
        for i, r in enumerate(rnd.reqs):
            if r.finished:
                continue
            lps = lp_rows[i] if lp_rows else None
            if not rnd.spec:
                if rnd.aux is not None:  # the draft rests
                    kept = self._pending_aux.setdefault(r.rid, [])
                    if not kept:  # caught up before this token: its proposal for it (d_1) is position 1's evidence
                        accepted.append(self._simulated_accept(1) if self.simulate_accept_length is not None
                                        else int(rows[i] == r.next_draft_token))
                    kept.append(rnd.aux[i])
                    self._emit_round(r, [rows[i]], lps, 0, 0)
                else:
                    self._emit(r, [rows[i]], lps)
            else:
                n_acc, tok, nd, *drafts = rows[i]
                if rnd.T > 1:
                    accepted.append(n_acc)
                elif self.simulate_accept_length is not None:  # k = 0: what a round of 1 would have accepted
                    accepted.append(self._simulated_accept(1))
                else:  # k = 0: whether the draft's proposal for this position (the round before's d_1) was the token
                    accepted.append(int(tok == r.next_draft_token))
                r.next_draft_token = nd
                self._draft_hidden[r.rid] = rnd.hidden[i]
                self._emit_round(r, drafts[:n_acc] + [tok], lps, n_acc, rnd.T - 1)
                # (the round behind one in flight drafts as many: _ahead_continues)
                self._trim_pages(r, r.seq_len + rnd.T - 1 if in_flight else r.seq_len - 1)
            changed.append(r)
        if self.adaptive is not None:  # (every round, a resting one without evidence too: adaptive.py)
            first, self._first_checks = self._first_checks, []
            self.adaptive.observe(max(rnd.T - 1, 1), accepted, first)
        return changed

    def _emit_round(self, r: Request, toks: list[int], logprobs: list | None, n_acc: int, proposed: int) -> None:
        """Emits a speculative round's tokens (its n_acc accepted drafts of the ``proposed`` it verified, and the
        target's next; a resting draft's decode step: one, none proposed) and counts its target forward with the
        tokens it gave the request: those after a stop or past max_new_tokens are not output, so not counted, as
        SGLang's verify cuts its accept lengths at the finish (counted whole, a run of short requests read as a
        longer accept length than SGLang's on the same outputs)."""
        before = len(r.output_ids)
        self._emit(r, toks, logprobs)
        n = len(r.output_ids) - before
        r.verify_ct += 1
        r.accepted_draft_tokens += n_acc
        r.proposed_draft_tokens += proposed
        self.stats.verify_forwards += 1
        self.stats.accepted_tokens += n
        self.stats.accept_length_hist[n] = self.stats.accept_length_hist.get(n, 0) + 1
        self.stats.draft_accept_hist[n_acc] = self.stats.draft_accept_hist.get(n_acc, 0) + 1

    def _simulated_accept(self, k: int) -> int:
        """Accepted draft tokens with mean simulate_accept_length - 1 (floor/ceil mix), clipped to [0, k]."""
        target = min(max(self.simulate_accept_length - 1.0, 0.0), float(k))
        lo = int(target)
        return min(k, lo + int(torch.rand((), generator=self._sim_rng) < target - lo))

    # -- emission and stopping ------------------------------------------------------------------------
    def _emit(self, r: Request, toks: list[int], logprobs: list | None) -> None:
        """Appends tokens (stopping at max_new_tokens / eos / stop ids / stop strings); ``logprobs``: per token,
        (its logprob, its top list or None) where the request returns logprobs (_read_logprobs)."""
        p = r.params
        matcher = self._matchers.get(r.rid)
        for j, t in enumerate(toks):
            if len(r.output_ids) >= p.max_new_tokens:  # max_new_tokens=0: prefill only
                r.finished_reason = {"type": "length", "length": p.max_new_tokens}
                return
            if matcher is not None and not matcher.accept(t):
                # Never with the mask applied (the benchmark's simulated acceptance aside): the request ends here
                # rather than continue past its grammar.
                logger.error("request %s: token %d is outside its grammar (%s); the request is aborted", r.rid, t,
                             matcher.kind)
                r.finished_reason = {"type": "abort", "message": f"token {t} is outside the request's grammar"}
                return
            if matcher is not None and getattr(matcher, "spent", False):
                # Strict thinking's matcher, past the thinking of a request without a grammar: nothing left to
                # enforce, and the request's rounds are plain ones again (the overlap schedule among them).
                del self._matchers[r.rid]
                matcher = None
            r.output_ids.append(t)
            self.stats.generated_tokens += 1
            if r.return_logprob:
                value, top = logprobs[j]
                r.output_token_logprobs.append([value, t, None])
                if r.top_logprobs_num:
                    r.output_top_logprobs.append(top)
            if not p.ignore_eos and t in self.eos:
                r.finished_reason = {"type": "stop", "matched": t}
            elif t in p.stop_token_ids:
                r.finished_reason = {"type": "stop", "matched": t}
            elif matcher is not None and matcher.terminated:
                # A stop token ended the grammar (ignore_eos: it is trimmed from the text, as SGLang trims it), or the
                # grammar is complete on an engine without one (no stop token: nothing matched, nothing trimmed).
                r.finished_reason = {"type": "stop", "matched": t if t in self.eos else None}
            elif len(r.output_ids) >= p.max_new_tokens:
                r.finished_reason = {"type": "length", "length": p.max_new_tokens}
            elif (p.stop or p.stop_regex) and self.detokenize is not None and len(r.output_ids) >= p.min_new_tokens:
                window = r.output_ids[-p.stop_window:]
                # Stop strings are not looked for in the first min_new_tokens - 1 tokens: one that ended there is
                # text. While the window still holds such a token, only a match ending in this token's text counts
                # (every later token's text was searched when it came).
                # Special tokens' text included, whatever skip_special_tokens says of the output text (SGLang's
                # tail_str: a stop string such as "<|im_end|>" ends the request though the text leaves it out).
                after = 0
                if len(r.output_ids) - len(window) < p.min_new_tokens - 1:
                    after = settled_chars(self.detokenize(window[:-1], skip_special_tokens=False))
                text = self.detokenize(window, skip_special_tokens=False)
                hit = find_stop(text, p.stop, after) or find_stop_regex(text, p.stop_patterns, after)
                if hit is not None:
                    r.finished_reason = {"type": "stop", "matched": hit[0]}
            if r.finished_reason is not None:
                return


def _remove_identical(q: list[Request] | deque[Request], r: Request) -> None:
    """Removes ``r`` itself from ``q`` (list.remove compares the dataclass's fields, not identity)."""
    del q[next(i for i, x in enumerate(q) if x is r)]
