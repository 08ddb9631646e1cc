from __future__ import annotations

import time
from dataclasses import dataclass, field

from sglang_eagle3.runtime.sampling import SamplingParams


@dataclass
class Request:
    """One generation request and its decoding state.

    Invariant between steps: the target and draft caches hold len(tokens) - 1 positions; the last token
    (just sampled) is not yet in either cache. (While an adaptive policy rests the draft at k = 0, the draft's cache
    lags by the positions whose aux hidden states the scheduler keeps for its catch-up: runtime/scheduler.py.)
    """

    rid: str
    input_ids: list[int]
    params: SamplingParams
    return_logprob: bool = False
    logprob_start_len: int = -1
    top_logprobs_num: int = 0
    output_ids: list[int] = field(default_factory=list)
    pages: list[int] = field(default_factory=list)
    finished_reason: dict | None = None
    verify_ct: int = 0
    accepted_draft_tokens: int = 0
    sampling_key: int | None = None  # the sampler's noise key (sampling.py), set by the scheduler from the seed
    # Prefill-time outputs, kept only when logprobs are asked for.
    input_token_logprobs: list = field(default_factory=list)
    input_top_logprobs: list = field(default_factory=list)
    output_token_logprobs: list = field(default_factory=list)
    output_top_logprobs: list = field(default_factory=list)
    # Draft state carried between rounds: the draft's first proposal and hidden for the next round.
    next_draft_token: int | None = None
    text_offset: int = 0
    # For meta_info's e2e_latency (SGLang's: from the request's arrival to its end, in seconds): perf_counter
    # when the request was made, and when the engine first saw it finished (Engine.result).
    arrival_time: float = field(default_factory=time.perf_counter)
    finished_time: float | None = None

    def snapshot(self) -> Request:
        """A copy safe to send to another process (copied lists)."""
        import copy

        return copy.deepcopy(self)

    @property
    def tokens(self) -> list[int]:
        return self.input_ids + self.output_ids

    @property
    def seq_len(self) -> int:
        return len(self.input_ids) + len(self.output_ids)

    @property
    def finished(self) -> bool:
        return self.finished_reason is not None
