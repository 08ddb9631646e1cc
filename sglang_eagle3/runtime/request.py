from __future__ import annotations

import time
from dataclasses import dataclass, field

from sglang_eagle3.runtime.sampling import SamplingParams

# Fields of SGLang's GenerateReqInput (its Engine.generate arguments, its /generate body) that ask for what this
# runtime does not do, with what that is. Left out or neutral (sglang_neutral) they ask for nothing; any other value
# is refused naming the field: an image dropped from the prompt or a LoRA adapter not applied would be an answer
# as if they had not been asked for. Engine.generate and the server's /generate both check them.
SGLANG_UNSUPPORTED = {
    "input_embeds": "prompts as embeddings", "image_data": "images", "audio_data": "audio", "video_data": "videos",
    "mm_hashes": "images", "mm_content_hashes": "images", "token_ids_logprob": "logprobs of chosen token ids",
    "lora_path": "LoRA adapters", "lora_id": "LoRA adapters", "custom_logit_processor": "custom logit processors",
    "require_reasoning": "hybrid reasoning", "return_hidden_states": "hidden states",
    "return_routed_experts": "routed experts", "routed_experts_start_len": "routed experts",
    "bootstrap_host": "prefill/decode disaggregation", "bootstrap_port": "prefill/decode disaggregation",
    "bootstrap_room": "prefill/decode disaggregation", "disagg_prefill_dp_rank": "prefill/decode disaggregation",
    "routed_dp_rank": "data parallelism", "data_parallel_rank": "data parallelism", "session_params": "sessions",
    "priority": "priority scheduling",
}


def sglang_neutral(v) -> bool:
    """None, False, 0, "" or a batch's list of them: an SGLang field that asks for nothing (code written for SGLang
    passes lora_path=None, return_hidden_states=False, routed_dp_rank=0 explicitly; 0 is also the only data-parallel
    rank there is without data parallelism)."""
    return (v is None or v is False or v == "" or (type(v) is int and v == 0)
            or (isinstance(v, (list, tuple)) and all(sglang_neutral(x) for x in v)))


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
    # Draft tokens its verify rounds accepted (whether or not the request kept them all: a round cut by a stop counts
    # the verify's count, as SGLang's num_correct_drafts), and those they verified (k a round; 0 while the draft
    # rests): SGLang's spec_accept_rate is the one over the other.
    accepted_draft_tokens: int = 0
    proposed_draft_tokens: int = 0
    retractions: int = 0  # times the KV pool's pressure sent it back to the waiting queue (SGLang's num_retractions)
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
    # SGLang's queue time: seconds from entering the scheduler's waiting queue to its first admission into a prefill
    # batch (a readmission after a retraction does not count again). ``queued_at``: perf_counter of that entry, in
    # the scheduler's process (with TP, a worker's: only the duration leaves it).
    queued_at: float | None = None
    queue_time: float | None = None

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
