"""Shared fixtures: tiny random checkpoints on disk (real Hugging Face layouts) and the ``gpu`` marker's skip.

Checkpoints are written once per session under pytest's tmp_path_factory and cached by a key, so test modules
that ask for the same (config, seed, scale) share one directory.
"""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch

from sglang_eagle3.config import DraftConfig, ModelConfig
from sglang_eagle3.testing import tiny_config, tiny_draft_config, write_tiny_pair


@pytest.fixture(autouse=True)
def _root_logging_restored():
    """Every test leaves the root and package loggers as it found them: launch_server.main (and other CLIs' mains)
    point the root at sys.stderr, which capsys closes when its test ends (a later test's records would then fail to
    write: "--- Logging error ---"), and Engine(log_level=...) sets the package's level (a later test reading the
    package's info lines would see none)."""
    import logging

    loggers = [logging.getLogger(), logging.getLogger("sglang_eagle3")]
    saved = [(lg.handlers[:], lg.level) for lg in loggers]
    yield
    for lg, (handlers, level) in zip(loggers, saved, strict=True):
        lg.handlers[:] = handlers
        lg.setLevel(level)


@pytest.fixture(scope="module")
def torch_one_thread():
    """Tiny models gain nothing from intra-op threads, and on a shared 2-core machine two spinning torch threads
    per process make them 10-50x slower; modules that drive tiny engines opt in with
    ``pytestmark = pytest.mark.usefixtures("torch_one_thread")``."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# The kernel checks' subprocess runs (tests/kernels/case_runner.py: the interpreter's and the compile checks') start as
# soon as the session's tests are collected: they are most of the CPU suite's time, single-threaded a shard, and run
# beside the other tests (pytest_collection_modifyitems puts their modules last) instead of after them: the suite
# took ~20 minutes on a 2-core machine with them run in turn. A test module with ``start_cases(items)`` takes part;
# its fixture asks ``started_case_run`` for the run.
_CASE_RUNS = pytest.StashKey[dict]()


def pytest_collection_finish(session):
    if session.config.option.collectonly:
        return
    runs = session.config.stash.setdefault(_CASE_RUNS, {})
    for module in {item.module for item in session.items if hasattr(getattr(item, "module", None), "start_cases")}:
        run = module.start_cases(session.items)
        if run is not None:
            runs[module.__file__] = run


def pytest_sessionfinish(session):
    for run in session.config.stash.get(_CASE_RUNS, {}).values():
        run.kill()  # (the session ended before the module's tests: -x, Ctrl-C)


@pytest.fixture(scope="module")
def started_case_run(request):
    """The case run pytest_collection_finish started for this test module, or None (e.g. a module collected by
    another runner): the module's fixture starts one then."""
    return request.config.stash.get(_CASE_RUNS, {}).pop(request.module.__file__, None)


def pytest_collection_modifyitems(config, items):
    # The modules whose cases run in the background (above) go last, so that every other test runs while they do.
    items.sort(key=lambda item: hasattr(getattr(item, "module", None), "start_cases"))  # (a stable sort)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA (marked gpu)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# Small enough that an engine step takes ~1 ms on one CPU core, big enough to have every structural feature:
# a dense layer, MoE layers with 2 groups, q_lora, a draft with GQA and a reduced vocabulary.
SMALL = dict(vocab=96, hidden=32, layers=3, heads=2, q_lora=16, kv_lora=16, nope=8, rope=4, v=8, experts=4,
             top_k=2, n_group=2, topk_group=1, shared=1, dense=1, moe_inter=16, inter=48, max_pos=256)


def small_config(**overrides) -> ModelConfig:
    return tiny_config(**{**SMALL, **overrides})


def small_draft_config(cfg: ModelConfig, **overrides) -> DraftConfig:
    return tiny_draft_config(cfg, **{**dict(heads=2, kv_heads=1, inter=48), **overrides})


@dataclasses.dataclass(frozen=True)
class TinyPair:
    target: str
    draft: str | None
    config: ModelConfig
    draft_config: DraftConfig | None


@pytest.fixture(scope="session")
def make_pair(tmp_path_factory):
    """make_pair(cfg, dcfg=None, *, seed=0, scale=3.0, draft_naming="midlayer") -> TinyPair (cached)."""
    cache: dict = {}

    def make(cfg: ModelConfig, dcfg: DraftConfig | None = None, *, seed: int = 0, scale: float = 3.0,
             draft_naming: str = "midlayer", dtype: torch.dtype = torch.float32) -> TinyPair:
        key = (cfg, dcfg, seed, scale, draft_naming, dtype)
        if key not in cache:
            root = tmp_path_factory.mktemp(f"pair{len(cache)}")
            t, d = write_tiny_pair(str(root), cfg, dcfg, seed=seed, scale=scale, draft_naming=draft_naming,
                                   dtype=dtype)
            cache[key] = TinyPair(t, d, cfg, dcfg)
        return cache[key]

    return make


@pytest.fixture(scope="session")
def small_pair(make_pair) -> TinyPair:
    """The default tiny target + EAGLE-3 draft (draft vocab 48 of 96, mapped through d2t)."""
    cfg = small_config()
    return make_pair(cfg, small_draft_config(cfg, draft_vocab=48), seed=11)


def scheduler_of(engine):
    """The in-process engine's Scheduler (engine.scheduler is the backend interface, local or remote)."""
    return engine.backend.scheduler


def sampled_catch_up_reference(runner, rows, aux, params, keys):
    """What ModelRunner.catch_up(rows, aux, sampler batch of ``params`` and ``keys``) must return, composed eagerly
    as it ran before its graphs: the draft's ragged extend over ``rows``, then its head and draw at every row, each
    row's sampler inputs built anew from its request's parameters and key. Returns (proposals [N], the extend's
    argmax proposals [N], hidden [N, Hd])."""
    every, hidden = runner.draft_extend_ragged(runner.build(rows), aux)
    lengths = [len(toks) for toks, _, _ in rows]
    positions = runner.to_device([first + j for toks, first, _ in rows for j in range(len(toks))])
    per_row = runner.sampler_batch([params[b] for b, n in enumerate(lengths) for _ in range(n)],
                                   [keys[b] for b, n in enumerate(lengths) for _ in range(n)])
    return runner.draft_proposals(hidden, per_row, positions), every, hidden


class PatchedDraft:
    """Replaces ``runner._draft_propose`` of an in-process engine with scripted proposals.

    The real draft still runs on every call (its KV cache and hidden states stay real; its hidden is what the
    scheduler carries), only the proposed tokens are replaced by ``propose(request, prefix)``: ``prefix`` is
    the token sequence the row has seen (committed tokens, then the tokens fed to the draft this round), and
    the proposal is for index ``len(prefix)``. A draft row at position p reads token p+1 and proposes token
    p+2 (EAGLE's shift); a row's request is found through its page table (a request's first page is its own
    for its lifetime). In a ragged prefill only each request's last row is used by the scheduler, so only it
    is scripted.
    """

    def __init__(self, engine, propose):
        self.engine, self.propose = engine, propose
        self.real = engine.runner._draft_propose
        self.seen: dict[str, dict[int, int]] = {}  # per request: token index -> token fed to the draft
        self.prefill_last: list[int] = []  # the last ragged (prefill) call's scripted last-row proposals
        engine.runner._draft_propose = self
        # A batch with sampled requests takes its prefill proposals from the draft's last hidden rows
        # (ModelRunner.draft_proposals): scripted too, as the prefill call just made them.
        engine.runner.draft_proposals = lambda hidden, samp, positions: torch.tensor(
            self.prefill_last, dtype=torch.int64, device=hidden.device)

    def __call__(self, input_ids, hidden, positions, fb, samp_f=None, samp_i=None):
        _, h = self.real(input_ids, hidden, positions, fb, samp_f, samp_i)
        if fb.extend_lens is not None:
            self.prefill_last = []
        owner = {r.pages[0]: r for r in scheduler_of(self.engine).running}
        ragged = fb.extend_lens is not None
        counts = fb.extend_lens if ragged else [fb.tokens_per_req] * fb.batch_size
        pos, ids = positions.tolist(), input_ids.tolist()
        out, row = [], 0
        for b, n in enumerate(counts):
            r = owner[int(fb.page_table[b, 0])]
            known = self.seen.setdefault(r.rid, {})
            for p, t in zip(pos[row:row + n], ids[row:row + n], strict=True):
                known[p + 1] = t
            toks = r.tokens
            for j, p in enumerate(pos[row:row + n]):
                if ragged and j < n - 1:
                    out.append(0)
                    continue
                missing = [i for i in range(len(toks), p + 2) if i not in known]
                assert not missing, (f"draft row at position {p} of request {r.rid} follows token indices {missing} "
                                     f"that were never fed to the draft ({len(toks)} tokens committed)")
                prefix = tuple(toks[i] if i < len(toks) else known[i] for i in range(p + 2))
                out.append(int(self.propose(r, prefix)))
                if ragged:
                    self.prefill_last.append(out[-1])
            row += n
        return torch.tensor(out, dtype=torch.int64, device=h.device), h


def reference_draft(refs: dict, mode: str, vocab: int, noise: float = 0.0, seed: int = 0):
    """propose() for PatchedDraft from known target greedy sequences ``refs[tuple(prompt)]``.

    "oracle": the reference token (always accepted); "adversarial": reference + 1 (never accepted); "noisy":
    the reference token, replaced with probability ``noise`` by any other token."""
    rng = random.Random(seed)

    def propose(r, prefix):
        ref = refs[tuple(r.input_ids)]
        want = ref[len(prefix)] if len(prefix) < len(ref) else 0
        if mode == "adversarial":
            return (want + 1) % vocab
        if mode == "noisy" and rng.random() < noise:
            return (want + 1 + rng.randrange(vocab - 1)) % vocab
        return want

    return propose
