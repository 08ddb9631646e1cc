"""Adaptive draft length: the k that makes the most tokens a second, from measured costs and observed acceptance.

A speculative round of k draft steps costs C(k, B) seconds at batch size B and emits E(k) tokens a request on
average, so a request advances E(k) / C(k, B) tokens a second. Both sides are measured, never assumed:

* C(k, B), the round's cost, is timed once at start-up (``ModelRunner.time_rounds``: the round's graph replayed
  for every candidate k and batch bucket, plus the plain decode step for comparison), then fixed. Twice: for a batch
  of greedy requests and for one with sampled requests, whose rounds replay the sampler's graphs and whose catch-ups
  draw a proposal at every row; each decision prices the batch's own kind (on an H100 a poor draft under sampling was
  held at k = 1 by the greedy prices, 0.96x of plain decoding, where greedy requests resting made 0.98x; forty-sixth
  session). Under tensor parallelism every rank takes the slowest rank's number (``tp_max_floats``), so all ranks
  hold one table and, fed the same accept counts, choose the same k in the same round: a choice made from each
  rank's own clock could split them (the grammar rounds' rule too, runtime/grammar.py).
* E(k) comes from the accept counts of the rounds so far. A chain draft's i-th token is checked only when the
  i - 1 before it were accepted, so the policy keeps, per draft position i, how often it was reached and how
  often accepted (decayed with a half-life in rounds, so the estimate follows the prompt mix), and estimates the
  acceptance p_i given the ones before it. E(k) = 1 + sum over j <= k of p_1 ... p_j (the target's own token,
  plus each draft accepted with all before it). A position never reached (past the longest k tried, or not tried
  for a while) borrows the estimate of the position before it: optimistic, so the policy tries a longer k when
  the last position it knows is accepted often, and learns that position's real rate there. That is also how it
  comes back to a longer k after the acceptance rose: the half-life forgets the old evidence.

k = 0 is a round too: the target verifies only the last token (a decode step) and the draft's extend runs over the
token it gives, so the draft keeps its cache and hidden state and a later round can draft again at once (plain
decoding would leave the draft without the target's hidden states of the tokens decoded meanwhile). It costs a
decode step plus a one-token draft extend, against a k = 1 round's verify of two tokens, draft step and two-token
extend: where the drafts are seldom accepted it loses less to plain decoding. It checks no draft, yet its target
token still tells whether the draft's proposal for that position (the previous round's d_1) was right, so position
1's acceptance keeps being observed while k = 0.

Resting (``probe_rounds`` > 0, the default): while k = 0 the draft does not run at all. The rounds are plain decode
steps whose target aux hidden states are kept (a row of 3 x hidden a token), and every ``probe_rounds`` rounds, or
as soon as the policy drafts again, the draft catches up over the kept rows in one extend (the prefill's path:
a draft_prefill graph replay), which leaves it where the k = 0 rounds would have and proposes the next token, so
the round after a catch-up observes position 1. A catch-up of n tokens costs about one draft forward, against n
one-token extends: k = 0 then costs a decode step plus a catch-up every ``probe_rounds`` rounds (both timed at
start-up, CATCH_UP). Position 1 is still observed at every token: the catch-up's extend proposes a token at each
position it covers, as the one-token extends did, and the n - 1 proposals before its last are checked against the
target's tokens there (already read), the last by the round after (``observe``'s ``first_checks``; the scheduler's
_catch_up_checks: greedy and sampled requests, each row's proposal drawn as a round's d_1 would be there; a request
under a matcher at the tokens whose rule is known, a reasoning model's thinking among them, and where the rule allowed
the proposal; a grammar's tokens once a catch-up, by the round after). (Before the forty-fifth session only the round
after a catch-up was evidence, once a request every ``probe_rounds`` rounds: with a 64-round half-life a useless
draft's position-1 estimate leaned on the prior, ~0.13 against 0.01.)
The rounds between catch-ups observe no draft, yet they are rounds: they age the evidence and count toward the next
decision as any round does, so the half-life and the decision interval stay in rounds (tokens), not in observations.
(Counting only the observed rounds made both 16 times longer at rest: after a poor stretch the policy took ~280
rounds to draft again once the drafts turned good, against ~70 at the same half-life of 256 fed every round, on the
Kimi slice's costs; benchmarks/simulate_adaptive.py.) (probe_rounds = 0: k = 0 rounds keep the draft's one-token
extend, as above.)

A change: the half-life trades noise for lag. Fed the same checks, a recent window of position 1 (a half-life of
``change_halflife_rounds``, 3) is compared after every round with the older checks (the long evidence less the
recent window's); where the two are ``change_nats`` (3) likelier under a rate each than under one rate for both (the
two-sample binomial likelihood ratio), the acceptance has changed: position 1's evidence becomes the recent window's,
the deeper positions' shrinks as much, and the next round decides. With the 24-round half-life alone a draft accepted
85% of the time that stops landing went on drafting ~72 rounds at batch 1 (the old passes had to decay below the
break-even rate) and ~17 at 16 requests; with the test it rests after ~15-20 and ~6, and at a constant acceptance the
test fires under once in 1000 rounds (benchmarks/simulate_adaptive.py on the Kimi slice's timed costs;
docs/BENCHMARKS.md section 8).

Stepping up: a position never reached borrows the one before it, so a change to good drafts, seen at position 1
alone (a resting draft's checks), would price every longer k as position 1 and jump to the longest; where the deeper
positions are worse (a draft that rarely lands a third token) that jump costs an interval of long rounds. So a
decision picks no k past the first candidate beyond the deepest position with evidence (an effective check): from
rest, up to the next candidate past 1; once that k's positions are checked, the next. On the Kimi slice with the
accept length pinned at 3 (the third draft never accepted) the change test without it went 0 -> 5 for 8 rounds on
each rise (H100, forty-sixth session); in simulation, where every position has position 1's rate, it costs nothing
measurable (docs/BENCHMARKS.md section 8).

The policy only ever moves between the candidates the engine captured graphs for (``EngineArgs.step_candidates``),
after every ``interval`` rounds, and only for a predicted gain of at least ``min_gain``. The first decision needs
evidence rather than rounds: it comes once draft position 1 has been checked ``first_evidence`` times (8 rounds at
batch 1, one round at 8 or more requests) or after ``interval`` rounds, whichever is first, so a batch of requests
does not spend ``interval`` rounds at a configured k its acceptance has already ruled out; a switch costs one round
without the overlap schedule's look-ahead (runtime/scheduler.py). It warns, once, when even its best k is predicted
slower than plain decoding (which the timing measures too), which is what a user of a draft that does not fit the
target needs to know (README, "Adaptive draft length").

Greedy output does not depend on k (speculation is lossless at every k), nor does a sampled request's, whose
tokens are drawn with noise fixed by its key and position (sampling.py).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class AdaptiveConfig:
    """How the draft-length policy decides; the candidates come from the engine. Decisions every 8 rounds keep a
    switch's lost overlap (one round's host time) under a few per cent of the rounds between, a 2% margin keeps
    timing noise from flipping k back and forth, and the first decision after 8 checks of position 1 rests its
    estimate on four times the prior's weight of observations (reasoned, not tuned). The half-life of 24 rounds was
    chosen in simulation on the Kimi-K2.5 slice's timed costs (benchmarks/simulate_adaptive.py, docs/BENCHMARKS.md
    section 8) once a resting draft's catch-ups check every token (forty-fifth session): against the setting before
    (one check a catch-up, 64 rounds) it follows a drop of acceptance 2.3% closer to the best k of each phase and
    alternations up to 5% closer (a rise after a poor stretch and the fastest alternation level), and holds within
    0.4% of it where the acceptance holds still. (With one check a catch-up a half-life that short rested a useless
    draft's estimate on the prior and drafted it again and again: 2.3% lost at a constant 0.05.) The change test's 3
    nats over a 3-round window were chosen the same way (forty-sixth session) among 2.5-6 nats and 3-8 rounds: over
    eleven scenarios 0.948 of the oracle on average against 0.925 without the test at batch 1, 0.962 against 0.940 at
    16 requests (2.5 nats level within the draws, with more false alarms), constants within 0.3%, alternations every
    50 rounds 19-20% / 29% faster; the one loss, alternations every 20 rounds at 16 requests (0.78 against 0.82), where
    resting at each low phase pays up to a catch-up interval's wait to draft again."""

    candidates: tuple[int, ...]  # draft lengths with captured graphs, the only ones the policy picks
    interval: int = 8  # rounds between two decisions (the first: see first_evidence)
    halflife_rounds: float = 24.0  # the acceptance evidence of a round weighs half as much this many rounds later
    min_gain: float = 0.02  # a switch needs this much more predicted throughput than staying
    prior_weight: float = 2.0  # pseudo-observations a position's estimate borrows from the one before it
    first_prior: float = 0.5  # the prior acceptance of the first draft position
    # While k = 0 the draft rests and catches up every this many rounds (module doc); 0: it extends every round.
    probe_rounds: int = 16
    # The first decision once draft position 1 was checked this many times (or after interval rounds, if sooner).
    first_evidence: int = 8
    # A change of acceptance (module doc): position 1's recent checks, weighed with this half-life in rounds,
    # replace the long evidence once they and the older checks are this many nats likelier under a rate each than
    # under one; math.inf: never.
    change_halflife_rounds: float = 3.0
    change_nats: float = 3.0
    # A decision picks no k past the first candidate beyond the deepest draft position with evidence (module doc).
    step_up: bool = True

    def __post_init__(self):
        if not self.candidates or any(not isinstance(k, int) or k < 0 for k in self.candidates):
            raise ValueError(f"candidates={self.candidates!r} must be draft lengths >= 0")
        if self.interval < 1:
            raise ValueError(f"interval={self.interval!r} must be >= 1 round")
        if not isinstance(self.first_evidence, int) or self.first_evidence < 1:
            raise ValueError(f"first_evidence={self.first_evidence!r} must be an int >= 1 (checks of position 1)")
        if not self.halflife_rounds > 0:
            raise ValueError(f"halflife_rounds={self.halflife_rounds!r} must be > 0")
        if not isinstance(self.step_up, bool):
            raise ValueError(f"step_up={self.step_up!r} must be a bool")
        if not 0 < self.change_halflife_rounds < self.halflife_rounds or not self.change_nats > 0:
            raise ValueError(f"change_halflife_rounds={self.change_halflife_rounds!r} must be > 0 and shorter than "
                             f"halflife_rounds={self.halflife_rounds!r}; change_nats={self.change_nats!r} > 0 "
                             f"(math.inf: never)")
        if not isinstance(self.probe_rounds, int) or self.probe_rounds < 0:
            raise ValueError(f"probe_rounds={self.probe_rounds!r} must be an int >= 0 (0: the draft never rests)")
        if not 0 < self.first_prior < 1 or not self.prior_weight > 0 or self.min_gain < 0:
            raise ValueError(f"first_prior={self.first_prior!r} (in (0, 1)), prior_weight={self.prior_weight!r} "
                             f"(> 0), min_gain={self.min_gain!r} (>= 0)")

    @property
    def rests(self) -> bool:
        """Whether the draft rests while k = 0 (module doc): k = 0 is a candidate and probe_rounds > 0."""
        return 0 in self.candidates and self.probe_rounds > 0


DECODE = "decode"  # RoundCosts' key of the plain decode step (no draft at all), beside the rounds' k
CATCH_UP = "catch_up"  # RoundCosts' key of a resting draft's catch-up over probe_rounds tokens a request


@dataclass(frozen=True)
class RoundCosts:
    """Seconds a round takes, by (k, batch bucket), k a draft length, DECODE (the plain decode step, for
    comparison) or CATCH_UP (a resting draft's catch-up), for a batch of greedy requests; ``sampled``: the same
    keys for a batch with sampled requests (its rounds replay the sampler's graphs and its catch-ups draw a
    proposal at every row), or None where only greedy rounds were timed. Measured at start-up
    (ModelRunner.time_rounds)."""

    seconds: dict[tuple[int | str, int], float]
    sampled: dict[tuple[int | str, int], float] | None = None
    batch_sizes: tuple[int, ...] = field(init=False)

    def __post_init__(self):
        for table in (self.seconds, self.sampled):
            if table is None:
                continue
            bad = {key: s for key, s in table.items() if not (isinstance(s, float) and s > 0 and math.isfinite(s))}
            if not table or bad:
                raise ValueError(f"round costs must be positive finite seconds (bad: {bad or 'none measured'})")
        if self.sampled is not None and set(self.sampled) != set(self.seconds):
            raise ValueError(f"sampled round costs must time what the greedy ones do: "
                             f"{sorted(map(str, set(self.sampled) ^ set(self.seconds)))} differ")
        object.__setattr__(self, "batch_sizes", tuple(sorted({b for _, b in self.seconds})))

    def at(self, k: int | str, batch: int, sampled: bool = False) -> float:
        """A round of k draft steps (or DECODE) for ``batch`` requests, of the sampled kind where ``sampled`` and
        timed: the smallest measured bucket that holds the batch (the graph it replays), or past the largest, the
        largest's cost scaled by the batch."""
        table = self.sampled if sampled and self.sampled is not None else self.seconds
        for b in self.batch_sizes:
            if b >= batch:
                return table[(k, b)]
        top = self.batch_sizes[-1]
        return table[(k, top)] * batch / top

    def as_dict(self) -> dict:
        """{k or "decode": {batch: ms}} for reports (server info), and under "sampled" the same for the sampled
        kind where timed."""
        def ms(table):
            out: dict[int | str, dict[int, float]] = {}
            for (k, b), s in sorted(table.items(), key=lambda kv: (str(kv[0][0]), kv[0][1])):
                out.setdefault(k, {})[b] = round(s * 1e3, 4)
            return out
        return ms(self.seconds) | ({} if self.sampled is None else {"sampled": ms(self.sampled)})


class DraftLengthPolicy:
    """Chooses each round's draft length (module doc). ``observe`` after every speculative round, ``choose``
    before launching the next; both are deterministic functions of the accept counts seen, so TP ranks agree."""

    def __init__(self, config: AdaptiveConfig, costs: RoundCosts):
        needed = (DECODE, *config.candidates, *((CATCH_UP,) if config.rests else ()))
        missing = [k for k in needed if (k, costs.batch_sizes[0]) not in costs.seconds]
        if missing:
            raise ValueError(f"round costs lack draft lengths {missing} (measured: {costs.as_dict()})")
        self.config = config
        self.costs = costs
        self.max_k = max(1, *config.candidates)
        self._reached = [0.0] * (self.max_k + 1)  # index i: draft position i (1-based; 0 unused)
        self._passed = [0.0] * (self.max_k + 1)
        self._decay = 0.5 ** (1.0 / config.halflife_rounds)
        # position 1's recent checks (reached, passed), decayed faster: the change test's window
        self._recent = [0.0, 0.0]
        self._recent_decay = 0.5 ** (1.0 / config.change_halflife_rounds)
        self.changes = 0
        self._rounds_since_decision = 0
        self._checks = 0  # times position 1 was checked, undecayed (the first decision's evidence)
        self.decisions = 0
        self.switches = 0
        self.rounds = 0
        self._warned_slower = False

    def cost(self, k: int | str, batch: int, sampled: bool = False) -> float:
        """Seconds a round of k draft steps (or DECODE) takes at ``batch`` (a batch with sampled requests where
        ``sampled``); k = 0 while resting: a decode step and a share of the catch-up every probe_rounds rounds."""
        if k == 0 and self.config.rests:
            return (self.costs.at(DECODE, batch, sampled)
                    + self.costs.at(CATCH_UP, batch, sampled) / self.config.probe_rounds)
        return self.costs.at(k, batch, sampled)

    def observe(self, k: int, accepted: list[int], first_checks: list[int] = ()) -> None:
        """One round of k draft steps: each request's accepted drafts (0..k). (A k = 0 round reports its position
        1 as a round of 1: 1 where the previous round's d_1 was the target's token, else 0; a resting draft's round
        between catch-ups, none: it observes no draft, and still ages the evidence and counts toward a decision.)
        ``first_checks``: more checks of position 1 alone, 1 passed / 0 failed, that are not this round's drafts: a
        resting draft's catch-up proposes a token at every position it covers, and each but the last is checked
        against the target's token there (module doc)."""
        bad = [a for a in accepted if not 0 <= a <= k]
        if bad:  # (checked before anything is counted)
            raise ValueError(f"accepted drafts {bad[0]} outside [0, {k}]")
        if any(c not in (0, 1) for c in first_checks):
            raise ValueError(f"a check of draft position 1 is 1 (passed) or 0, got {list(first_checks)!r}")
        self.rounds += 1
        self._rounds_since_decision += 1
        self._checks += len(accepted) + len(first_checks)
        d = self._decay
        for i in range(1, self.max_k + 1):
            self._reached[i] *= d
            self._passed[i] *= d
        self._reached[1] += len(first_checks)
        self._passed[1] += sum(first_checks)
        hist = [0] * (k + 2)
        for a in accepted:
            hist[a] += 1
        # Position i was checked where the i - 1 before it were accepted (a >= i - 1), and passed where a >= i.
        at_least = [0] * (k + 2)
        for a in range(k, -1, -1):
            at_least[a] = at_least[a + 1] + hist[a]
        for i in range(1, min(k, self.max_k) + 1):
            self._reached[i] += at_least[i - 1]
            self._passed[i] += at_least[i]
        checked = (len(accepted) if k else 0) + len(first_checks)
        r = self._recent_decay
        self._recent = [self._recent[0] * r + checked,
                        self._recent[1] * r + (at_least[1] if k else 0) + sum(first_checks)]
        if checked and self.change_evidence() > self.config.change_nats:
            self._forget()

    def change_evidence(self) -> float:
        """Nats by which position 1's recent checks and its older ones (the long evidence less the recent window's:
        each round weighed by the difference of the two decays, so the latest rounds count in the recent window
        only) are likelier under a rate each than under one rate for both: the two-sample binomial log-likelihood
        ratio (half the G statistic), the module doc's change test."""
        n_new, s_new = self._recent
        n_old = max(self._reached[1] - n_new, 0.0)
        s_old = min(max(self._passed[1] - s_new, 0.0), n_old)
        # (add-a-half rates: finite logs for a window all passed or all failed)
        both = (s_new + s_old + 0.5) / (n_new + n_old + 1.0)
        nats = 0.0
        for n, passed in ((n_new, s_new), (n_old, s_old)):
            mine = (passed + 0.5) / (n + 1.0)
            nats += passed * math.log(mine / both) + (n - passed) * math.log((1.0 - mine) / (1.0 - both))
        return nats

    def _forget(self) -> None:
        """The acceptance changed: position 1's evidence becomes the recent window's, every deeper position's
        weighs as much less (the same rounds' age), and the next choose decides."""
        keep = min(1.0, self._recent[0] / self._reached[1]) if self._reached[1] else 0.0
        for i in range(2, self.max_k + 1):
            self._reached[i] *= keep
            self._passed[i] *= keep
        self._reached[1], self._passed[1] = self._recent
        self._rounds_since_decision = self.config.interval
        self.changes += 1

    def acceptance(self) -> list[float]:
        """p_1 .. p_max_k: each draft position's estimated acceptance given the ones before it were accepted."""
        c = self.config
        out, prior = [], c.first_prior
        for i in range(1, self.max_k + 1):
            p = (self._passed[i] + c.prior_weight * prior) / (self._reached[i] + c.prior_weight)
            out.append(p)
            prior = p
        return out

    def expected_tokens(self, k: int, acceptance: list[float] | None = None) -> float:
        """Tokens a round of k draft steps is expected to emit per request (the target's own included)."""
        p = self.acceptance() if acceptance is None else acceptance
        total, run = 1.0, 1.0
        for j in range(k):
            run *= p[j]
            total += run
        return total

    def predicted_rates(self, batch: int, sampled: bool = False) -> dict[int | str, float]:
        """Tokens a second per request for each candidate k, and for plain decoding (DECODE), at ``batch`` requests
        (with sampled ones where ``sampled``)."""
        p = self.acceptance()
        rates: dict[int | str, float] = {k: self.expected_tokens(k, p) / self.cost(k, batch, sampled)
                                         for k in self.config.candidates}
        rates[DECODE] = 1.0 / self.cost(DECODE, batch, sampled)
        return rates

    def reachable(self) -> tuple[int, ...]:
        """The candidates a decision may pick: with ``step_up``, none past the first candidate beyond the deepest
        position with evidence (an effective check or more), so a longer k is tried on the positions just checked."""
        c = self.config
        if not c.step_up:
            return c.candidates
        known = max((i for i in range(1, self.max_k + 1) if self._reached[i] >= 1.0), default=0)
        ceiling = min((k for k in c.candidates if k > known), default=max(c.candidates))
        return tuple(k for k in c.candidates if k <= ceiling)

    def choose(self, current: int, batch: int, sampled: bool = False) -> int:
        """The draft length for the next round of ``batch`` requests, some of them sampled where ``sampled`` (the
        round costs of that kind); ``current`` until a decision is due."""
        c = self.config
        if self._rounds_since_decision < c.interval and (self.decisions or self._checks < c.first_evidence):
            return current
        self._rounds_since_decision = 0
        self.decisions += 1
        rates = self.predicted_rates(batch, sampled)
        best = max(self.reachable(), key=lambda k: (rates[k], -k))
        if rates[best] < rates[DECODE] and not self._warned_slower:
            self._warned_slower = True
            logger.warning(
                "speculation is predicted SLOWER than plain decoding at the acceptance seen so far (best k=%d: %.1f "
                "tokens/s a request against %.1f without a draft; accepted drafts a round %.2f at k=%d): the draft "
                "does not fit this target or workload", best, rates[best], rates[DECODE],
                self.expected_tokens(max(current, 1)) - 1.0, max(current, 1))
        if current not in rates or rates[best] >= rates[current] * (1.0 + c.min_gain):
            if best != current:
                self.switches += 1
                logger.info("adaptive draft length %d -> %d (predicted %.1f -> %.1f tokens/s a request at batch %d%s)",
                            current, best, rates.get(current, 0.0), rates[best], batch,
                            " with sampled requests" if sampled else "")
            return best
        return current

    def report(self, current: int, batch: int, sampled: bool = False) -> dict:
        """What the policy knows, for server info (the predicted rates at ``batch`` requests of the kind given)."""
        rates = self.predicted_rates(max(batch, 1), sampled)
        return {"num_steps": current, "candidates": list(self.config.candidates), "rounds": self.rounds,
                "resting": current == 0 and self.config.rests, "probe_rounds": self.config.probe_rounds,
                "decisions": self.decisions, "switches": self.switches, "changes": self.changes,
                "step_up": self.config.step_up,
                "change_test": None if math.isinf(self.config.change_nats) else {
                    "nats": self.config.change_nats, "halflife_rounds": self.config.change_halflife_rounds},
                "position_1_checks": self._checks,
                "acceptance": [round(p, 4) for p in self.acceptance()],
                "predicted_tokens_per_s": {k: round(r, 2) for k, r in rates.items()},
                "predicted_for": "sampled" if sampled and self.costs.sampled is not None else "greedy",
                "round_ms": self.costs.as_dict()}
