"""Verify-path guard: how did each EAGLE target-verify forward run inside SGLang, and why?

SGLang 0.5.23 runs the target verify (``ForwardMode.TARGET_VERIFY``) in ``ModelRunner._forward_raw``:
  1. ``DecodeCudaGraphRunner.can_run_graph`` true  -> replay of a decode-runner graph captured with
     ``capture_forward_mode = TARGET_VERIFY``                                         ("graph")
  2. else ``PrefillCudaGraphRunner.can_run_graph`` true -> piecewise prefill graph    ("prefill_graph")
  3. else ``EagerRunner.execute`` -> ``_execute_extend``, metadata re-planned per step ("eager")
The guard wraps those three methods (nothing else), counts each verify forward by path and records the
first failing condition of ``can_run_graph`` as the reason. In strict mode a verify that cannot replay the
decode graph raises ``VerifyFallbackError`` *before* any fallback work: at ``eagle_prepare_for_verify``'s
``can_run_graph`` call, or at ``_forward_raw`` entry when no decode graph runner exists at all.

Counters live in the process that runs the model (SGLang's scheduler worker); the overlay exposes them
through the scheduler's internal state (``Engine.get_server_info()["internal_states"]``).
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger(__name__)

PATHS = ("graph", "prefill_graph", "eager")

REASON_NO_DECODE_RUNNER = ("no decode CUDA graph runner on the target (--disable-cuda-graph, "
                           "--disable-decode-cuda-graph / --cuda-graph-backend-decode disabled, or no graph was "
                           "captured for the current --speculative-adaptive step count)")
REASON_MODE_NOT_GRAPHABLE = "forward mode is not graphable on this device (mode_check() returned False)"


class VerifyFallbackError(RuntimeError):
    """Strict mode: a target-verify forward would not replay the decode CUDA graph."""


@dataclass
class VerifyStats:
    """Counts of target-verify forwards by path; ``reasons`` counts each fallback reason."""

    graph: int = 0
    prefill_graph: int = 0
    eager: int = 0
    reasons: Counter = field(default_factory=Counter)
    max_fallback_bs: int = 0  # largest batch size seen on a fallback path

    @property
    def total(self) -> int:
        return self.graph + self.prefill_graph + self.eager

    def as_dict(self) -> dict[str, Any]:
        return {"graph": self.graph, "prefill_graph": self.prefill_graph, "eager": self.eager,
                "total": self.total, "reasons": dict(self.reasons), "max_fallback_bs": self.max_fallback_bs}


class VerifyGuard:
    """Process-wide accounting of target-verify forwards (one instance per process, owned by the overlay).

    ``strict``: raise ``VerifyFallbackError`` instead of letting a verify fall back.
    ``summary_every``: log the counters every N verify forwards (0 = never).
    """

    def __init__(self, *, strict: bool = False, summary_every: int = 1000) -> None:
        self.strict = strict
        self.summary_every = summary_every
        self.stats = VerifyStats()
        self._lock = threading.Lock()
        self._local = threading.local()  # decisions of the forward in flight on this thread
        self._warned: set[str] = set()

    # -- decisions, recorded by the can_run_graph wrappers ------------------------------------------
    def note_decode_decision(self, ok: bool, reason: str | None, batch_size: int) -> None:
        self._local.decode = ok
        self._local.decode_reason = reason
        if not ok and self.strict:
            raise VerifyFallbackError(
                f"target verify (batch size {batch_size}) cannot replay the decode CUDA graph: {reason}. "
                "Strict mode is on (apply(strict_verify=True)); fix the configuration, e.g. "
                "--cuda-graph-max-bs-decode >= --max-running-requests, or turn strict mode off. NOTE: the "
                "error ends the scheduler, and SGLang then takes the whole server down.")

    def note_prefill_decision(self, ok: bool) -> None:
        self._local.prefill = ok

    def begin(self) -> None:
        self._local.decode = None
        self._local.decode_reason = None
        self._local.prefill = None

    def check_runner_present(self, model_runner: Any, batch_size: int) -> str | None:
        """Reason when the decode graph cannot even be tried; raises in strict mode."""
        if not getattr(model_runner, "decode_cuda_graph_runner", None):
            if self.strict:
                raise VerifyFallbackError(f"target verify (batch size {batch_size}): {REASON_NO_DECODE_RUNNER}. "
                                          "Strict mode is on (apply(strict_verify=True)).")
            return REASON_NO_DECODE_RUNNER
        return None

    def finish(self, *, ran_graph_flag: bool, batch_size: int, pre_reason: str | None) -> str:
        """Classify the forward that just ran and count it; returns the path name."""
        decode = getattr(self._local, "decode", None)
        if decode:
            path, reason = "graph", None
        else:
            # ModelRunnerOutput.can_run_graph is also True after a prefill-graph replay.
            path = "prefill_graph" if ran_graph_flag else "eager"
            reason = getattr(self._local, "decode_reason", None) or pre_reason or REASON_MODE_NOT_GRAPHABLE
        with self._lock:
            s = self.stats
            setattr(s, path, getattr(s, path) + 1)
            if reason is not None:
                s.reasons[reason] += 1
                s.max_fallback_bs = max(s.max_fallback_bs, batch_size)
            total = s.total
        if reason is not None and reason not in self._warned:
            self._warned.add(reason)
            logger.warning("EAGLE target verify fell back to the %s path (batch size %d): %s "
                           "(logged once per reason; counts in the overlay's verify stats)", path, batch_size, reason)
        if self.summary_every and total % self.summary_every == 0:
            logger.info("EAGLE target verify paths after %d forwards: %s", total, self.stats.as_dict())
        return path

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return self.stats.as_dict()

    def reset(self) -> None:
        with self._lock:
            self.stats = VerifyStats()
        self._warned.clear()


def _is_target_verify(forward_batch: Any) -> bool:
    mode = getattr(forward_batch, "forward_mode", None)
    return mode is not None and mode.is_target_verify()


def diagnose_decode_fallback(runner: Any, forward_batch: Any) -> str:
    """First condition of ``DecodeCudaGraphRunner.can_run_graph`` (0.5.23) that fails, in its order.

    Called only after ``can_run_graph`` returned False, so it costs nothing on the graph path.
    """
    if getattr(forward_batch, "replace_embeds", None) is not None:
        return "token embedding overrides (replace_embeds) are never graphed"
    if getattr(runner, "ragged_verify_mode", False):
        return "ragged verify layout not admitted by the captured ragged graphs"
    spec_info = getattr(forward_batch, "spec_info", None)
    width = getattr(spec_info, "num_tokens_per_req", 0) if spec_info is not None else 0
    captured = getattr(runner, "captured_req_width", None)
    if width and width > 0 and captured is not None and width != captured:
        return (f"draft width mismatch: {width} tokens per request vs {captured} captured "
                "(the runner in place was captured for another --speculative-num-draft-tokens)")
    bs = forward_batch.batch_size
    label = f"batch size {bs}"
    if getattr(runner, "require_mlp_tp_gather", False):
        # DP attention: SGLang sizes the graph by the largest batch of any DP rank (_max_dp_batch_size), so a rank
        # with a small batch falls back with the others when one rank's batch is too large.
        try:
            dp_bs = runner._max_dp_batch_size(forward_batch)
        except Exception:  # no per-rank counts: SGLang itself would have raised in can_run_graph
            dp_bs = None
        if dp_bs is not None:
            bs, label = dp_bs, f"largest batch across DP ranks {dp_bs}"
    max_bs = getattr(runner, "max_bs", None)
    if getattr(runner, "disable_padding", False):
        # Without padding only a captured size replays; one that is captured may still fail the later conditions
        # (under DP attention most often the sync vote below), which must then be the reason given.
        captured = getattr(runner, "capture_bs", None)
        if captured is None or bs not in captured:
            shown = f"; captured: {', '.join(map(str, sorted(captured)))}" if captured else ""
            return f"no graph captured for {label} (padding disabled{shown})"
    elif max_bs is not None and bs > max_bs:
        return f"{label} > max captured batch size {max_bs} (raise --cuda-graph-max-bs-decode)"
    if getattr(runner, "require_mlp_sync", False) and not getattr(forward_batch, "can_run_decode_cuda_graph", True):
        return "DP/MLP sync: another rank cannot run the decode graph this step"
    if getattr(runner, "is_encoder_decoder", False):
        return "encoder-decoder batch with a zero encoder length"
    if getattr(runner, "enable_two_batch_overlap", False) and not getattr(forward_batch, "can_run_tbo", True):
        return "two-batch overlap cannot split this batch"
    return "can_run_graph returned False (condition not identified by the guard)"


# -- wrappers, built by the overlay around SGLang's originals -----------------------------------------
def wrap_forward_raw(original, guard: VerifyGuard):
    """``ModelRunner._forward_raw``: count each target-verify forward of the target model."""

    def _forward_raw(self, forward_batch, *args, **kwargs):
        if getattr(self, "is_draft_worker", False) or not _is_target_verify(forward_batch):
            return original(self, forward_batch, *args, **kwargs)
        bs = forward_batch.batch_size
        guard.begin()
        pre_reason = guard.check_runner_present(self, bs)
        out = original(self, forward_batch, *args, **kwargs)
        guard.finish(ran_graph_flag=bool(getattr(out, "can_run_graph", False)), batch_size=bs,
                     pre_reason=pre_reason)
        return out

    return _forward_raw


def wrap_decode_can_run_graph(original, guard: VerifyGuard):
    """``DecodeCudaGraphRunner.can_run_graph``: record the decision and its reason for verify batches."""

    def can_run_graph(self, forward_batch):
        ok = original(self, forward_batch)
        if _is_target_verify(forward_batch) and not getattr(getattr(self, "model_runner", None),
                                                           "is_draft_worker", False):
            reason = None if ok else diagnose_decode_fallback(self, forward_batch)
            guard.note_decode_decision(bool(ok), reason, forward_batch.batch_size)
        return ok

    return can_run_graph


def wrap_prefill_can_run_graph(original, guard: VerifyGuard):
    """``PrefillCudaGraphRunner.can_run_graph``: record whether the prefill graph takes the verify."""

    def can_run_graph(self, forward_batch):
        ok = original(self, forward_batch)
        if _is_target_verify(forward_batch):
            guard.note_prefill_decision(bool(ok))
        return ok

    return can_run_graph
