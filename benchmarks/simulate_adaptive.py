"""The adaptive draft-length policy (sglang_eagle3/runtime/adaptive.py) against simulated acceptance, on a GPU's
measured round costs: tokens a second against the best fixed k of each phase, and how many rounds it takes to draft
again after a poor draft turns good. CPU only, seconds to run; no model, no GPU.

A round is what the scheduler does with one request: the policy chooses k, a chain draft of k is accepted position by
position with the phase's probability (independent draws: real acceptance also varies within a request), and the
round costs the timed cost of k (k = 0 resting: a decode step and a share of a catch-up). A switch of k adds
--switch-ms (the round loses the overlap schedule's look-ahead: ~0.8 ms of host time a round on the Kimi slice,
runtime/scheduler.py). Compared in one run, the three ways a resting draft's rounds have reached the policy
(FEEDINGS): every round, each rested token's position 1 checked at its catch-up (the scheduler since the forty-fifth
session); every round, position 1 checked only on the round after each catch-up (from `1115be2`); both at each
--halflife-rounds; only the rounds that checked a draft (before `1115be2`), at the default half-life. The
oracle takes, in each phase, the candidate of most expected tokens a second.

    python benchmarks/simulate_adaptive.py                       # the Kimi-K2.5 slice's costs at batch 1 (H200)
    python benchmarks/simulate_adaptive.py --costs OTHER_E2E.json --runs 40 --halflife-rounds 32 64 --out sim.json
    python benchmarks/simulate_adaptive.py --costs benchmarks/results/h200/e2e_rest_kimi_c16_2f3662c.json --batch 16

--costs: a bench_e2e.py JSON with an adaptive run (its `adaptive.round_ms`, batch 1), by default
benchmarks/results/h200/e2e_rest_kimi_2f3662c.json (the forty-third session's).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import os
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sglang_eagle3.runtime.adaptive import (  # noqa: E402
    CATCH_UP,
    DECODE,
    AdaptiveConfig,
    DraftLengthPolicy,
    RoundCosts,
)

DEFAULT_COSTS = Path(__file__).resolve().parent / "results" / "h200" / "e2e_rest_kimi_2f3662c.json"
# (acceptance a position, rounds) phases; the name says what the policy must follow
SCENARIOS = {
    "constant 0.05": [(0.05, 2000)],
    "constant 0.3": [(0.3, 2000)],
    "constant 0.6": [(0.6, 2000)],
    "constant 0.85": [(0.85, 2000)],
    "0.05 then 0.85": [(0.05, 1000), (0.85, 1000)],
    "0.85 then 0.05": [(0.85, 1000), (0.05, 1000)],
    "0.1 / 0.8 every 300": [(0.1, 300), (0.8, 300)] * 4,
    "0.2 / 0.7 every 40": [(0.2, 40), (0.7, 40)] * 25,  # faster than a short half-life should chase
    "0.4 / 0.9 every 20": [(0.4, 20), (0.9, 20)] * 50,
    # requests of ~100-200 tokens whose drafts fit (or do not) in turn, one at a time
    "0.95 / 0.02 every 50": [(0.95, 50), (0.02, 50)] * 20,
    "0.02 / 0.8 every 120": [(0.02, 120), (0.8, 120)] * 8,
}


def chain_accepts(rng: random.Random, p: float | list[float], k: int) -> int:
    """Accepted drafts of a round of k: position i passes with p (or p[i - 1]) once every one before it passed."""
    a = 0
    while a < k and rng.random() < (p[a] if isinstance(p, list) else p):
        a += 1
    return a


FEEDINGS = {
    "tokens": "every round, each rested token checked at its catch-up",  # the scheduler since the 45th session
    "rounds": "every round, one check a catch-up",  # `1115be2` .. the 45th session
    "evidence": "only rounds with a check",  # before `1115be2`
}


def simulate(policy: DraftLengthPolicy, phases, rng: random.Random, *, k: int = 3, feeding: str = "tokens",
             switch_s: float = 0.0, batch: int = 1):
    """Rounds of ``batch`` requests through the policy (one batch all along, each request's drafts drawn on their
    own): (tokens, seconds, per phase the round index at which it first drafted (k > 0), per phase the one at which
    it first rested (k = 0); None where it never did).
    ``feeding`` (FEEDINGS), how a resting draft's rounds reach the policy: "tokens", every round, and each catch-up
    checks position 1 at every token it covers (the round after it the last; _catch_up_checks in
    runtime/scheduler.py); "rounds", every round, only the round after each catch-up checks; "evidence", only the
    rounds that check. ``switch_s``: seconds a change of k adds."""
    if feeding not in FEEDINGS:
        raise ValueError(f"feeding={feeding!r}: one of {', '.join(FEEDINGS)}")
    probe = policy.config.probe_rounds
    tokens, seconds, resting, first_draft, first_rest, rested = 0, 0.0, 0, [], [], []
    for p, n in phases:
        first = rest = None
        for r in range(n):
            k, prev = policy.choose(k, batch), k
            seconds += switch_s if k != prev else 0.0
            if k and first is None:
                first = r
            if not k and rest is None:
                rest = r
            # (k = 0: whether each request's d_1 there would have passed)
            acc = [chain_accepts(rng, p, max(k, 1)) for _ in range(batch)]
            resting = resting + 1 if k == 0 and probe else 0
            # resting: a catch-up before every probe-th round (from the first), and before the first round that drafts
            catch_up = bool(rested) and (resting % probe == 1 % probe if resting else True)
            # (the first rested round checked the catch-up before it, as this round checks this one's last proposal)
            checks = [a for rnd in rested[1:] for a in rnd] if catch_up and feeding == "tokens" else []
            if catch_up:
                rested = []
            evidence = k > 0 or not probe or resting % probe == 1 % probe
            if resting:
                rested.append(acc)
            if evidence or feeding != "evidence":
                policy.observe(max(k, 1), acc if evidence else [], checks)
            tokens += sum(a + 1 for a in acc) if k else batch
            seconds += policy.cost(k, batch)
        first_draft.append(first)
        first_rest.append(rest)
    return tokens, seconds, first_draft, first_rest


def best_k(policy: DraftLengthPolicy, p: float, batch: int = 1) -> int:
    """The candidate of most expected tokens a second at acceptance p a position (timed costs)."""
    return max(policy.config.candidates, key=lambda k: sum(p ** j for j in range(k + 1)) / policy.cost(k, batch))


def oracle_rate(policy: DraftLengthPolicy, phases, batch: int = 1) -> float:
    """Tokens a second of the best candidate in each phase (expected tokens, timed costs) for ``batch`` requests."""
    tokens = seconds = 0.0
    for p, n in phases:
        best = best_k(policy, p, batch)
        tokens += n * batch * sum(p ** j for j in range(best + 1))
        seconds += n * policy.cost(best, batch)
    return tokens / seconds


def load_costs(path: str, batch: int = 1, sampled: bool = False) -> RoundCosts:
    """Round costs at ``batch`` (a batch bucket the run timed) from a bench_e2e.py JSON's first adaptive run with a
    catch-up timed; ``sampled``: its costs for batches with sampled requests (timed since the forty-sixth session)."""
    try:
        runs = json.loads(Path(path).read_text())["runs"]
    except (OSError, ValueError, KeyError) as e:
        raise SystemExit(f"--costs {path}: not a readable bench_e2e.py JSON with 'runs' "
                         f"({type(e).__name__}: {e})") from None
    for run in runs:
        ms = (run.get("adaptive") or {}).get("round_ms") or {}
        if "catch_up" in ms:
            if sampled:
                if "sampled" not in ms:
                    raise SystemExit(f"{path}: its adaptive run timed no sampled rounds (round_ms.sampled)")
                ms = ms["sampled"]
            ms = {k: v for k, v in ms.items() if k != "sampled"}
            if any(str(batch) not in v for v in ms.values()):
                raise SystemExit(f"{path}: its adaptive run timed batches {sorted(ms['catch_up'], key=int)}, not "
                                 f"--batch {batch}")
            return RoundCosts({(k if k in (DECODE, CATCH_UP) else int(k), batch): v[str(batch)] / 1e3
                               for k, v in ms.items()})
    raise SystemExit(f"{path}: no adaptive run with a timed catch-up (round_ms.catch_up) in its runs")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--costs", default=str(DEFAULT_COSTS), help="a bench_e2e.py JSON with an adaptive run")
    ap.add_argument("--runs", type=int, default=20, help="simulated requests a scenario (fresh draws each)")
    ap.add_argument("--halflife-rounds", type=float, nargs="+", default=None,
                    help="the policy's half-lives to compare, fed every round (default: AdaptiveConfig's)")
    ap.add_argument("--change-nats", type=float, nargs="+", default=None,
                    help="the change test's thresholds to compare, inf: no test (default: AdaptiveConfig's and inf)")
    ap.add_argument("--change-halflife-rounds", type=float, nargs="+", default=None,
                    help="the change test's recent window half-lives to compare (default: AdaptiveConfig's)")
    ap.add_argument("--switch-ms", type=float, default=0.8, help="what a change of k adds to its round")
    ap.add_argument("--seed", type=int, default=None, help="fixes the draws (default: fresh)")
    ap.add_argument("--batch", type=int, default=1,
                    help="requests a round, one policy for all (a batch bucket the --costs run timed; e.g. 16 with "
                    "benchmarks/results/h200/e2e_rest_kimi_c16_2f3662c.json)")
    ap.add_argument("--sampled", action="store_true",
                    help="the --costs run's costs for batches with sampled requests (round_ms.sampled)")
    ap.add_argument("--out")
    a = ap.parse_args()
    if (a.runs < 1 or a.switch_ms < 0 or a.batch < 1
            or any(not h > 0 for h in (*(a.halflife_rounds or ()), *(a.change_nats or ()),
                                       *(a.change_halflife_rounds or ())))):
        ap.error(f"--runs {a.runs} must be >= 1, --switch-ms {a.switch_ms} >= 0, --batch {a.batch} >= 1, "
                 f"--halflife-rounds {a.halflife_rounds}, --change-nats {a.change_nats} and "
                 f"--change-halflife-rounds {a.change_halflife_rounds} > 0")
    logging.disable(logging.WARNING)  # (the policy's "slower than plain decoding" warning, once a request)
    costs = load_costs(a.costs, a.batch, a.sampled)
    base = AdaptiveConfig(candidates=tuple(sorted(k for k, _ in costs.seconds if isinstance(k, int))))
    # (label, config, feeding): the scheduler's feeding at each setting compared, the older feedings at the defaults
    variants = []
    for h in a.halflife_rounds or (base.halflife_rounds,):
        for nats in a.change_nats or (base.change_nats, math.inf):
            for ch in (a.change_halflife_rounds or (base.change_halflife_rounds,)) if nats < math.inf else (1.0,):
                test = f"change test {nats:g} nats over {ch:g} rounds" if nats < math.inf else "no change test"
                variants.append((f"{FEEDINGS['tokens']}, half-life {h:g}, {test}",
                                 dataclasses.replace(base, halflife_rounds=h, change_nats=nats,
                                                     change_halflife_rounds=ch), "tokens"))
    # the stepping up's price: the default setting without it
    variants.append((f"{FEEDINGS['tokens']}, half-life {base.halflife_rounds:g}, change test {base.change_nats:g} "
                     f"nats over {base.change_halflife_rounds:g} rounds, no step up",
                     dataclasses.replace(base, step_up=False), "tokens"))
    variants += [(f"{FEEDINGS[f]}, half-life {base.halflife_rounds:g}, no change test",
                  dataclasses.replace(base, change_nats=math.inf), f) for f in ("rounds", "evidence")]
    rng = random.Random(a.seed)
    print(f"round costs (ms, batch {a.batch}) from {a.costs}: {costs.as_dict()}; candidates {base.candidates}, "
          f"probe_rounds {base.probe_rounds}, a switch +{a.switch_ms} ms, {a.runs} runs a scenario")
    print("tok/s (of the oracle's) [median rounds to draft again after the drafts turn good, to rest again after "
          "they turn useless] {the change test's firings}")
    rows = []
    for name, phases in SCENARIOS.items():
        pol0 = DraftLengthPolicy(base, costs)
        oracle = oracle_rate(pol0, phases, a.batch)
        row = {"scenario": name, "phases": phases, "oracle_tok_per_s": round(oracle, 2), "variants": {}}
        for label, config, feeding in variants:
            rates, back, down, changes = [], [], [], 0
            for _ in range(a.runs):
                policy = DraftLengthPolicy(config, costs)
                tokens, seconds, first, rest = simulate(policy, phases, rng, feeding=feeding,
                                                        switch_s=a.switch_ms / 1e3, batch=a.batch)
                rates.append(tokens / seconds)
                changes += policy.changes
                # after a phase of p < 0.5, the next phase's first round at k > 0 (the phase's length if never)
                back += [f if f is not None else n for (p0, _), (p, n), f in zip(phases[:-1], phases[1:], first[1:],
                                                                                  strict=True) if p0 < 0.5 <= p]
                # after a phase of p >= 0.5, the next phase's first round at k = 0 where resting is its best k
                down += [f if f is not None else n for (p0, _), (p, n), f in zip(phases[:-1], phases[1:], rest[1:],
                                                                                  strict=True)
                         if p0 >= 0.5 and best_k(pol0, p, a.batch) == 0]
            row["variants"][label] = {"tok_per_s": round(statistics.mean(rates), 2),
                                      "of_oracle": round(statistics.mean(rates) / oracle, 4),
                                      "rounds_to_draft_again": statistics.median(back) if back else None,
                                      "rounds_to_rest_again": statistics.median(down) if down else None,
                                      # the change test's firings (at a constant acceptance: false alarms)
                                      "changes_per_1000_rounds": round(1000 * changes / a.runs
                                                                       / sum(n for _, n in phases), 3)}
        rows.append(row)
        print(f"{name} (oracle {oracle:.1f}):")
        for label, v in row["variants"].items():
            again = "".join(f" [{what} {v[key]:g}]" for what, key in (("draft again", "rounds_to_draft_again"),
                                                                       ("rest again", "rounds_to_rest_again"))
                            if v[key] is not None)
            fired = v["changes_per_1000_rounds"]
            fired = f" {{changes {fired:g} / 1000 rounds}}" if fired else ""
            print(f"    {label:<100} {v['tok_per_s']:8.1f} ({v['of_oracle']:.3f}){again}{fired}")
    if a.out:
        os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
        Path(a.out).write_text(json.dumps({"command": " ".join(sys.argv), "costs": a.costs, "runs": a.runs,
                                           "seed": a.seed, "batch": a.batch, "sampled": a.sampled,
                                           "switch_ms": a.switch_ms,
                                           "round_ms": costs.as_dict(), "scenarios": rows}, indent=1))
        print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
