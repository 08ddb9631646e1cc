"""Sampling parameters, the target's processed distribution, and the sampler that makes speculation lossless.

Speculation must not change what the user gets: for greedy, the output is the target's argmax chain; for
sampling, every emitted token is distributed exactly as the target's processed distribution p (temperature,
top_k, min_p, top_p applied, in that order).

The sampler is Gumbel-max over noise fixed in advance: the token at position n of a request is
argmax_v (log p_n(v) + g(key, n, v)), where g is standard Gumbel noise hashed from the request's key (its seed),
the position and the token id (kernels.gumbel_argmax), independent across positions and tokens. Given the tokens
before n, that is an exact sample of p_n. A speculative round then accepts a draft token exactly when it equals
the target's sample at its position, as greedy acceptance compares it with the argmax (an argmax proposal d is
so accepted with probability p_n(d), as by rejection sampling of a one-hot proposal), and every emitted token is
the one plain decoding would have sampled there. So for a given seed the output is the
same with speculation on or off, whatever the draft length, the batch or the step a token was verified in; and
the whole round stays on the device (one graph, the overlap schedule).

Whatever the draft proposes, the output stays the target's. So for sampled requests the draft proposes its own
sample with the same noise (draft_tokens; the noise of position n and target token v, whichever model scores v):
where its distribution is close to the target's the two argmaxes of noisy scores coincide with probability near
1 - their total variation distance, above the target's probability of the draft's argmax that an argmax proposal
is accepted with (the embedded pair at temperature 0.7, k = 3: accept length 1.82 -> 2.29).
"""

from __future__ import annotations

import functools
import itertools
import math
import re
from dataclasses import dataclass, field

import torch

from sglang_eagle3 import env, kernels
from sglang_eagle3.kernels.ref import MIX32_MUL1, MIX32_MUL2

# SamplingParams' grammar fields (runtime/grammar.py)
GRAMMAR_KINDS = ("json_schema", "regex", "ebnf", "structural_tag")
SAMPLING_EPS = 1e-6  # a temperature below this is greedy (SGLang's _SAMPLING_EPS)


class SamplingParamsError(ValueError):
    """An invalid sampling parameter; the message names the field and value."""


MAX_SAMPLES = 128  # OpenAI's limit on n (each sample is a request in flight)


def parallel_samples(n, param: str = "n") -> int:
    """SGLang's ``sampling_params.n`` / OpenAI's ``n``: samples a prompt, 1 when left out (None)."""
    if n is None:
        return 1
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_SAMPLES:
        raise SamplingParamsError(f"{param}={short_repr(n)} must be an integer in [1, {MAX_SAMPLES}] "
                                  "(samples a prompt)")
    return n


SEED_RANGE = (-(2 ** 63), 2 ** 63 - 1)  # SGLang's SamplingParams.verify bounds on sampling_seed (an int64)


def seeded(sp: dict, j: int) -> dict:
    """Sampling params of a prompt's sample j: with a seed (``seed`` or SGLang's ``sampling_seed``), seed + j (sample
    0 keeps the client's own), so the n samples differ and a rerun repeats them; without one each sample draws its
    own key. seed + j wraps within SEED_RANGE (the same low 64 bits, so the same noise key: sampling_key)."""
    if j == 0:
        return sp
    lo, hi = SEED_RANGE
    out = dict(sp)
    for name in ("seed", "sampling_seed"):
        s = sp.get(name)
        if isinstance(s, int) and not isinstance(s, bool) and lo <= s <= hi:  # (a bad seed is refused as it is)
            out[name] = (s + j - lo) % (hi - lo + 1) + lo
    return out


def _finite(v: int | float) -> bool:
    """Whether ``v`` is a finite float, or an int that converts to one."""
    try:
        return math.isfinite(v)
    except OverflowError:  # an int past the largest float
        return False


def _check_seed(name: str, v) -> None:
    lo, hi = SEED_RANGE
    if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
        raise SamplingParamsError(f"{name}={short_repr(v)} must be an integer in [-2**63, 2**63 - 1]")


# SGLang's SamplingParams fields that ask for what this runtime does not do: (whether a value asks for nothing, what
# it would ask for). A neutral value (SGLang's default, or what its __post_init__ reads as unset) is accepted; any
# other is refused naming the field, never ignored.
_SGLANG_ONLY = {
    "spaces_between_special_tokens": (lambda v: v is None or v is True,  # the text is decoded as this engine does
                                      "decoding without spaces between special tokens"),
    "beam_width": (lambda v: v is None or (type(v) is int and v == 1), "beam search"),  # 1: not a beam request
    "stream_interval": (lambda v: v is None or (type(v) is int and v == 1),  # a stream chunk every step, as 1 is
                        "stream intervals (a stream's chunk comes every step)"),
    "watermark": (lambda v: v is None, "watermarks"),
}


@dataclass
class SamplingParams:
    """SGLang's sampling_params names. temperature 0 (below SAMPLING_EPS) or top_k 1 is greedy."""

    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    # SGLang's stop_regex: Python regular expressions, searched as stop strings are (the output so far, special
    # tokens' text included); a match of unbounded length is found within its last STOP_REGEX_REACH characters.
    stop_regex: list[str] = field(default_factory=list)
    ignore_eos: bool = False
    seed: int | None = None
    # Penalties (SGLang's meanings, over the request's OUTPUT tokens so far): a token's logit less
    # frequency_penalty x its count and presence_penalty if it occurred, then divided by repetition_penalty where
    # positive, multiplied where negative; no stop token (eos unless ignore_eos, stop_token_ids) and no stop string
    # before min_new_tokens tokens. Exact with speculation: each verify row counts the draft tokens before it
    # (penalized_logits).
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_new_tokens: int = 0
    # Added to the token's logit after the penalties (SGLang's and OpenAI's logit_bias: token id -> bias; JSON's
    # string keys are read as ints; at most MAX_LOGIT_BIAS entries of at most 100 in magnitude, OpenAI's limits).
    logit_bias: dict[int, float] | None = None
    # Text only (SGLang's meaning): keep the matched stop string / stop token's text in the output; decode
    # special tokens too.
    no_stop_trim: bool = False
    skip_special_tokens: bool = True
    # Structured output (SGLang's names; at most one): the output follows a JSON schema (serialized; "$$ANY$$": any
    # JSON value), a regular expression, an EBNF grammar or a structural tag (serialized: free text in which each
    # trigger opens a tagged JSON value; runtime/grammar.py). Exact with speculation.
    json_schema: str | None = None
    regex: str | None = None
    ebnf: str | None = None
    structural_tag: str | None = None
    # SGLang's custom logit processors' parameters; this engine runs no custom processor and reads one key:
    # ``thinking_budget`` (an integer; negative: no limit), the request's thinking budget under strict thinking
    # (runtime/reasoning.py; SGLang's /generate puts its max_thinking_tokens there). Any other key is refused.
    custom_params: dict | None = None

    @staticmethod
    def from_dict(d: dict | None) -> SamplingParams:
        d = dict(d or {})
        known = set(SamplingParams.__dataclass_fields__)
        unknown = sorted(set(d) - known - {"n", "sampling_seed", *_SGLANG_ONLY})
        if unknown:
            shown = ", ".join(short_repr(k, 40) for k in unknown[:5]) + (f" and {len(unknown) - 5} more"
                                                                            if len(unknown) > 5 else "")
            raise SamplingParamsError(f"unknown sampling parameter(s): {shown} (known: {sorted(known)})")
        for name, (neutral, what) in _SGLANG_ONLY.items():
            v = d.pop(name, None)
            if not neutral(v):
                raise SamplingParamsError(f"{name}={short_repr(v)} is not supported: this engine has no {what} "
                                          "(leave it out or null)")
        if d.get("sampling_seed") is not None:  # SGLang's name of the seed
            _check_seed("sampling_seed", d["sampling_seed"])
            if d.get("seed") is not None and d["seed"] != d["sampling_seed"]:
                raise SamplingParamsError(f"seed={short_repr(d['seed'])} and sampling_seed="
                                          f"{short_repr(d['sampling_seed'])} differ: give one seed")
            d["seed"] = d["sampling_seed"]
        if d.get("n") is not None and d["n"] != 1:
            raise SamplingParamsError(f"n={d['n']!r} is not supported (only n=1)")
        for k in ("n", "sampling_seed"):
            d.pop(k, None)
        for name in ("stop", "stop_regex"):
            if isinstance(d.get(name), str):
                d[name] = [d[name]]
            if d.get(name) is None:
                d[name] = []
            if isinstance(d[name], tuple):  # SGLang iterates whatever sequence it is given
                d[name] = list(d[name])
        if d.get("stop_token_ids") is None:
            d["stop_token_ids"] = []
        if isinstance(d["stop_token_ids"], (tuple, set, frozenset)):  # SGLang's field is a Set[int]
            ids = list(d["stop_token_ids"])
            d["stop_token_ids"] = sorted(ids) if all(type(t) is int for t in ids) else ids
        # null is the default, as SGLang's SamplingParams.__post_init__ reads it (callers build sampling_params
        # from optional settings: {"temperature": args.temperature}), the booleans ignore_eos, skip_special_tokens
        # and no_stop_trim too. max_new_tokens is not among them: null there means no limit but the context's (the
        # engine reads it).
        for name in ("temperature", "top_p", "top_k", "min_p", "frequency_penalty", "presence_penalty",
                     "repetition_penalty", "min_new_tokens", "logit_bias", "ignore_eos", "skip_special_tokens",
                     "no_stop_trim", *GRAMMAR_KINDS):
            if name in d and d[name] is None:
                del d[name]
        for name in GRAMMAR_KINDS:
            if d.get(name) == "":  # SGLang: an empty grammar is unset, not a grammar that allows nothing
                del d[name]
        t, k = d.get("temperature"), d.get("top_k")
        if type(t) in (int, float) and 0 <= t < SAMPLING_EPS and type(k) is int and k < 1 and k != -1:
            # SGLang's __post_init__ makes a greedy request's top_k 1 before verify() reads it: a "top_k": 0 (off, to
            # some clients) beside "temperature": 0 is greedy there, not an error.
            d["top_k"] = 1
        if isinstance(d.get("logit_bias"), dict):
            d["logit_bias"] = _int_keys(d["logit_bias"])
        p = SamplingParams(**d)
        p.validate()
        return p

    def validate(self) -> None:
        def bad(name, why):  # the value cut short: a client's string may be megabytes
            raise SamplingParamsError(f"{name}={short_repr(getattr(self, name))} {why}")

        def bad_item(name, i, why):
            items = getattr(self, name)
            raise SamplingParamsError(f"{name}[{i}]={short_repr(items[i])} {why} ({name} holds {len(items)} items)")

        def is_num(v):
            return isinstance(v, (int, float)) and not isinstance(v, bool)

        if not isinstance(self.max_new_tokens, int) or isinstance(self.max_new_tokens, bool) \
                or self.max_new_tokens < 0:
            bad("max_new_tokens", "must be an integer >= 0")
        # (an int past a float's range, which JSON allows, compares as finite: float() of it raised OverflowError in
        # the engine thread's sampler)
        if not is_num(self.temperature) or not self.temperature >= 0 or not _finite(self.temperature):
            bad("temperature", "must be a finite number >= 0")
        if not is_num(self.top_p) or not 0 < self.top_p <= 1:
            bad("top_p", "must be in (0, 1]")
        if not isinstance(self.top_k, int) or isinstance(self.top_k, bool) or (self.top_k < 1 and self.top_k != -1):
            bad("top_k", "must be -1 (off) or an integer >= 1")
        if not is_num(self.min_p) or not 0 <= self.min_p <= 1:
            bad("min_p", "must be in [0, 1]")
        # The list fields' errors name the first bad item, not the list: a client's list may hold 10^5 items.
        if not isinstance(self.stop, list):
            bad("stop", "must be a string or a list of strings")
        for i, s in enumerate(self.stop):
            if not isinstance(s, str):
                bad_item("stop", i, "must be a string")
            if s == "":
                bad_item("stop", i, "is an empty string, which would match before any text")
        if not isinstance(self.stop_regex, list):
            bad("stop_regex", "must be a string or a list of strings")
        for i, s in enumerate(self.stop_regex):
            if not isinstance(s, str):
                bad_item("stop_regex", i, "must be a string")
        if not isinstance(self.stop_token_ids, list):
            bad("stop_token_ids", "must be a list of integers")
        for i, t in enumerate(self.stop_token_ids):
            if not isinstance(t, int) or isinstance(t, bool):
                bad_item("stop_token_ids", i, "must be an integer")
        if self.seed is not None:
            _check_seed("seed", self.seed)
        for name in ("ignore_eos", "no_stop_trim", "skip_special_tokens"):
            if not isinstance(getattr(self, name), bool):
                bad(name, "must be true or false")  # "false" is a truthy string
        for name in ("frequency_penalty", "presence_penalty"):
            if not is_num(getattr(self, name)) or not -2 <= getattr(self, name) <= 2:
                bad(name, "must be a number in [-2, 2]")
        if not is_num(self.repetition_penalty) or not 0 < self.repetition_penalty <= 2:
            bad("repetition_penalty", "must be a number in (0, 2] (1: none)")
        if self.logit_bias is not None:
            if not isinstance(self.logit_bias, dict):
                bad("logit_bias", "must be an object of token id -> bias")
            if len(self.logit_bias) > MAX_LOGIT_BIAS:
                raise SamplingParamsError(f"logit_bias holds {len(self.logit_bias)} entries, more than "
                                          f"{MAX_LOGIT_BIAS}")
            for k, v in self.logit_bias.items():
                if not isinstance(k, int) or isinstance(k, bool):
                    raise SamplingParamsError(f"logit_bias key {short_repr(k)} must be a token id (an integer, "
                                              "written as one: no sign, spaces or leading zeros)")
                if not is_num(v) or not -100 <= v <= 100:
                    raise SamplingParamsError(f"logit_bias[{k}]={short_repr(v)} must be a number in [-100, 100]")
        if not isinstance(self.min_new_tokens, int) or isinstance(self.min_new_tokens, bool) \
                or not 0 <= self.min_new_tokens <= self.max_new_tokens:
            raise SamplingParamsError(f"min_new_tokens={short_repr(self.min_new_tokens)} must be an integer in [0, "
                                      f"max_new_tokens={self.max_new_tokens}]")
        given = [name for name in GRAMMAR_KINDS if getattr(self, name) is not None]
        for name in given:
            if not isinstance(getattr(self, name), str):
                serialized = {"json_schema": " (the schema serialized as JSON)",
                              "structural_tag": " (the tag serialized as JSON)"}
                bad(name, "must be a string" + serialized.get(name, ""))
        if len(given) > 1:
            raise SamplingParamsError(f"{' and '.join(given)} are given: a request takes at most one grammar")
        if self.custom_params is not None:
            if not isinstance(self.custom_params, dict):
                bad("custom_params", "must be an object")
            if set(self.custom_params) - {"thinking_budget"}:
                bad("custom_params", "is not supported: this engine has no custom logit processors (of "
                    "custom_params it reads thinking_budget alone, strict thinking's budget)")
            b = self.custom_params.get("thinking_budget")
            if b is not None and (not isinstance(b, int) or isinstance(b, bool)):
                raise SamplingParamsError(f"custom_params.thinking_budget={short_repr(b)} must be an integer (the "
                                          "thinking's most tokens; negative: no limit)")
        if given and self.min_new_tokens > 0:
            # Where the grammar allows only a stop token, min_new_tokens would forbid it too: no token left.
            raise SamplingParamsError(f"min_new_tokens={self.min_new_tokens} cannot be combined with {given[0]}: the "
                                      "grammar decides where the output may end")

    @property
    def greedy(self) -> bool:
        """temperature below SAMPLING_EPS (SGLang's rule) or top_k 1: logits / a temperature of 1e-45 overflow
        float32 to +-inf, and every positive logit would tie."""
        return self.temperature < SAMPLING_EPS or self.top_k == 1

    @property
    def penalized(self) -> bool:
        """Whether a penalty changes this request's logits (a greedy one's too: its argmax is of them)."""
        return (self.frequency_penalty != 0 or self.presence_penalty != 0 or self.repetition_penalty != 1
                or self.min_new_tokens > 0 or bool(self.logit_bias))

    @property
    def grammar(self):
        """The request's GrammarSpec (runtime/grammar.py), or None."""
        from sglang_eagle3.runtime.grammar import GrammarSpec

        for kind in GRAMMAR_KINDS:
            if getattr(self, kind) is not None:
                return GrammarSpec(kind, getattr(self, kind))
        return None

    @property
    def thinking_budget(self) -> int | None:
        """custom_params.thinking_budget: the most tokens the request's thinking may hold under strict thinking;
        None where it names none (the engine's default applies), -1 where it asks for no limit (SGLang's meaning of
        any negative one)."""
        b = (self.custom_params or {}).get("thinking_budget")
        return None if b is None else max(b, -1)

    @functools.cached_property
    def stop_window(self) -> int:
        """Output tokens whose text a newly emitted token's stop string can lie in. Every token decodes to at
        least one byte (special tokens aside), so a stop string of B bytes ends within the last B + 1 tokens (one
        more for a character split across tokens); a shorter window misses long ones. Cached: the scheduler
        reads it for every emitted token, and its cost grows with the stop strings' total length. NOTE: stale if
        ``stop`` is changed in place after it is read (dataclasses.replace makes a fresh one)."""
        longest = max([len(s.encode()) for s in self.stop] + [4 * w for w in self.stop_regex_widths], default=0)
        return max(16, longest + 2)

    def check_stop_regex(self) -> None:
        """SamplingParamsError naming the first stop_regex pattern that does not compile or matches only the empty
        string. Apart from validate(): the engine calls it once its limits on the patterns' number and length
        hold (a client's megabyte pattern is not compiled to be refused)."""
        for i, s in enumerate(self.stop_regex):
            try:
                width = _regex_width(s)
            except (re.error, RecursionError, OverflowError) as e:
                raise SamplingParamsError(f"stop_regex[{i}]={short_repr(s)} does not compile: "
                                          f"{short_repr(str(e), 200)} (stop_regex holds {len(self.stop_regex)} "
                                          "items)") from None
            if width == 0:
                raise SamplingParamsError(f"stop_regex[{i}]={short_repr(s)} matches only the empty string, which "
                                          f"would match before any text (stop_regex holds {len(self.stop_regex)} "
                                          "items)")

    @functools.cached_property
    def stop_regex_widths(self) -> list[int]:
        """The longest match of each stop_regex, in characters (at most STOP_REGEX_REACH)."""
        return [min(_regex_width(s), STOP_REGEX_REACH) for s in self.stop_regex]

    @functools.cached_property
    def stop_patterns(self) -> list[re.Pattern]:
        return [re.compile(s) for s in self.stop_regex]


STOP_REGEX_REACH = 256  # characters of output a stop_regex of unbounded length is searched in (its window)


def _regex_width(pattern: str) -> int:
    """The longest text ``pattern`` can match, in characters (huge where unbounded); re.error where it does not
    compile. (Python's own parser: the width it computes for the pattern's engine.)"""
    re.compile(pattern)
    try:
        from re import _parser as sre_parse
    except ImportError:  # Python 3.10
        import sre_parse
    return sre_parse.parse(pattern).getwidth()[1]


def find_stop_regex(text: str, patterns: list[re.Pattern], after: int = 0) -> tuple[str, int] | None:
    """find_stop for regular expressions: the first pattern (in order) with a match in ``text`` ending past its
    first ``after`` characters (a non-empty one), and where that match starts."""
    for p in patterns:
        for m in p.finditer(text):
            if m.end() > after and m.end() > m.start():
                return p.pattern, m.start()
    return None


MAX_LOGIT_BIAS = 300  # OpenAI's limit on logit_bias entries


def settled_chars(text: str) -> int:
    """Characters of a decoded prefix of tokens that the tokens after it cannot change: all but a trailing
    partial character (decoded as U+FFFD until its last byte comes)."""
    return len(text.rstrip("\ufffd"))


def find_stop(text: str, stop: list[str], after: int = 0) -> tuple[str, int] | None:
    """The first string of ``stop`` (in its order) found in ``text`` ending past its first ``after`` characters,
    and where it starts there; None when none is. ``after``: the settled text before the tokens searched, e.g.
    those before min_new_tokens, where stop strings are not looked for (an occurrence there is text)."""
    for s in stop:
        i = text.find(s, max(0, after - len(s) + 1))
        if i >= 0:
            return s, i
    return None


_DECIMAL_INT = re.compile(r"0|-?[1-9][0-9]{0,18}")  # an integer's own decimal text (ASCII, up to 19 digits)


def _int_keys(bias: dict) -> dict:
    """logit_bias as JSON sends it ({"50256": -100}) -> int keys. Only an integer's own decimal text is read as
    one: Python's int() also takes " 5", "05", "+5", "5_0" and other scripts' digits, so {"5": 1, "05": -1}
    would silently keep one of two biases. Any other key is left for validate() to name."""
    out = {}
    for k, v in bias.items():
        if isinstance(k, str) and _DECIMAL_INT.fullmatch(k):
            k = int(k)
        out[k] = v
    return out


def short_repr(v, limit: int = 80) -> str:
    """repr cut to ``limit`` characters: an error names the value without echoing a client's megabytes back."""
    r = repr(v)
    return r if len(r) <= limit else f"{r[:limit]}... ({len(r)} characters)"


KEY_MASK = 0xFFFFFFFF
_FLOAT32_MAX = torch.finfo(torch.float32).max


def sampling_key(seed: int) -> int:
    """A request's 32-bit noise key from its seed (any Python int): both halves of its low 64 bits, mixed."""
    s = seed & 0xFFFFFFFFFFFFFFFF

    def mix(x: int) -> int:  # lowbias32, as kernels/ref.py's mix32 computes it on tensors
        x ^= x >> 16
        x = (x * MIX32_MUL1) & KEY_MASK
        x ^= x >> 15
        x = (x * MIX32_MUL2) & KEY_MASK
        return x ^ (x >> 16)

    return mix(mix(s & KEY_MASK) ^ (s >> 32))


def sampling_rows(params: list[SamplingParams], keys: list[int]) -> tuple[list[list[float]], list[list[int]]]:
    """Per request: [temperature, top_p, min_p] and [top_k, key], the rows of the sampler's two parameter
    tensors (float32 [B, 3], int64 [B, 2]). A greedy request has temperature 0 (top_k 1 is greedy too). A
    temperature past float32's range is its largest value (every logit / it is ~0, the same uniform choice): as
    float32 it would be +inf, and a blocked token's -inf / inf is NaN, which the sampler's argmax picks."""
    f = [[0.0 if p.greedy else min(float(p.temperature), _FLOAT32_MAX), float(p.top_p), float(p.min_p)]
         for p in params]
    i = [[p.top_k, k & KEY_MASK] for p, k in zip(params, keys, strict=True)]
    return f, i


@dataclass(frozen=True)
class Filters:
    """Which filters a sampler applies (each one skipped costs nothing). top_k and top_p rank the row (a radix
    select on the GPU, a sort elsewhere: filtered_scores), min_p needs only its maximum; a row whose parameters
    leave a filter off (top_k <= 0, min_p 0, top_p 1) passes it unchanged, so a batch may take a wider set than
    its requests use: every row computes what it would alone. ``sampled`` False: no row samples (a batch of
    greedy requests with penalties), so the sampler is the argmax alone, as it is for each greedy row anyway."""

    top_k: bool = True
    min_p: bool = True
    top_p: bool = True
    sampled: bool = True

    @staticmethod
    def of(params: list[SamplingParams]) -> Filters:
        """The filters a batch's sampled requests use."""
        sampled = [p for p in params if not p.greedy]
        return Filters(top_k=any(p.top_k > 0 for p in sampled), min_p=any(p.min_p > 0 for p in sampled),
                       top_p=any(p.top_p < 1 for p in sampled), sampled=bool(sampled))

    @property
    def ranked(self) -> bool:
        """Whether a filter ranks the row's tokens (top_k, top_p), beyond its maximum (min_p)."""
        return self.top_k or self.top_p


@dataclass(frozen=True, eq=False)
class Penalties:
    """A batch's penalty state on the device (SamplingParams' penalties), kept current by ``advance`` after every
    round queued for the batch, so that a round queued before the host has read the one ahead of it (the overlap
    schedule) counts that round's tokens too.

    counts  int32 [B, V]  each token's occurrences among the request's output tokens so far
    params  float32 [B, 3] frequency_penalty, presence_penalty, repetition_penalty (0, 0, 1: none)
    min_left int64 [B]    output tokens still to come before a stop token may be sampled (min_new_tokens less
                          the outputs so far; <= 0: none blocked)
    stops   bool [B, V] or None  each request's stop tokens (eos unless ignore_eos, stop_token_ids); None when no
                          request of the batch asks for min_new_tokens
    bias    float32 [B, V] or None  logit_bias, dense; None when no request of the batch has one"""

    counts: torch.Tensor
    params: torch.Tensor
    min_left: torch.Tensor
    stops: torch.Tensor | None
    bias: torch.Tensor | None = None

    @staticmethod
    def build(params: list[SamplingParams], outputs: list[list[int]], eos: set[int] | frozenset[int], vocab: int,
              upload) -> Penalties:
        """The state of requests with ``params`` that have emitted ``outputs`` (host lists); ``upload`` moves a
        host tensor to the device (ModelRunner._upload). Requests without penalties get no counts (their rows are
        left as they are whatever the counts say). Built on the device from (row, token) lists: a batch is rebuilt
        whenever it changes, and its [B, V] tensors would be megabytes to upload (16 rows of Kimi's vocabulary:
        10 MB of counts); the lists are the tokens, at most a few per request beside its outputs."""
        B = len(params)
        par = upload(torch.tensor([[float(p.frequency_penalty), float(p.presence_penalty),
                                    float(p.repetition_penalty)] for p in params], dtype=torch.float32))

        def dense(dtype, per_row: list[list[int]], values: list[float] | None = None) -> torch.Tensor:
            """[B, vocab] on the device: ``values`` (default 1; in the order of the tokens) summed at each row's
            tokens ``per_row[b]``."""
            out = torch.zeros(B, vocab, dtype=dtype, device=par.device)
            flat = list(itertools.chain.from_iterable(per_row))
            if flat:
                rows = torch.repeat_interleave(torch.arange(B), torch.tensor([len(r) for r in per_row]))
                idx = upload(torch.stack([rows, torch.tensor(flat, dtype=torch.int64)]))
                val = (upload(torch.tensor(values, dtype=dtype)) if values is not None
                       else torch.ones(len(flat), dtype=dtype, device=par.device))
                out.index_put_((idx[0], idx[1]), val, accumulate=dtype != torch.bool)
            return out

        counts = dense(torch.int32, [out if p.penalized else [] for p, out in zip(params, outputs, strict=True)])
        stops = None
        if any(p.min_new_tokens > 0 for p in params):
            stops = dense(torch.bool, [[t for t in set(p.stop_token_ids) | (set() if p.ignore_eos else set(eos))
                                        if 0 <= t < vocab] for p in params])
        bias = None
        if any(p.logit_bias for p in params):
            biases = [p.logit_bias or {} for p in params]
            bias = dense(torch.float32, [list(b) for b in biases], [float(v) for b in biases for v in b.values()])
        left = upload(torch.tensor([p.min_new_tokens - len(out) for p, out in zip(params, outputs, strict=True)],
                                   dtype=torch.int64))
        return Penalties(counts, par, left, stops, bias)

    def advance(self, tokens: torch.Tensor, emitted: torch.Tensor) -> None:
        """After a round (on the device, queued in stream order): request b emitted tokens[b, :emitted[b]] of
        tokens [B, T] (int64; emitted [B] int64). The host may still cut a request short (max_new_tokens, a stop
        string); it then finishes and its batch's state is rebuilt, so the counts never run ahead of a request
        that goes on."""
        col = torch.arange(tokens.shape[1], device=tokens.device).view(1, -1)
        self.counts.scatter_add_(1, tokens, (col < emitted.view(-1, 1)).to(torch.int32))
        self.min_left.sub_(emitted)


def _penalize(z: torch.Tensor, counts: torch.Tensor, params: torch.Tensor) -> torch.Tensor:
    """SGLang's penalties on float32 logits z [..., n] given the tokens' float counts [..., n] and per-row
    (frequency, presence, repetition) params [..., 3] (broadcast): additive first, then the repetition scaling
    of the tokens that occurred. The one formula for every row and every token, whether it is applied to a whole
    row or to gathered entries (penalized_logits), so that both give the same bits."""
    f, p, r = params[..., 0:1], params[..., 1:2], params[..., 2:3]
    seen = counts > 0
    z = z - f * counts - torch.where(seen, p, 0.0)
    return torch.where(seen, torch.where(z < 0, z * r, z / r), z)


def penalized_logits(logits: torch.Tensor, pen: Penalties, drafts: torch.Tensor | None = None) -> torch.Tensor:
    """logits [B * T, V] (T rows a request) -> float32 [B * T, V] with each row's penalties (_penalize), the
    tokens before row j of request b being its outputs so far (pen) and, in a verify, the draft tokens
    drafts[b, 1..j] (drafts [B, T]: the verify's input ids [last, d_1, .., d_k]; row j predicts the token after
    d_j). So a verify row's penalized logits are bit for bit those its position's decode would have had, had
    the drafts before it been emitted, and speculation stays exact. min_new_tokens: row j's token is output
    number (outputs so far) + j, so its stop tokens are blocked (-inf) while min_left - j > 0. logit_bias is added
    last (SGLang's order)."""
    B, V = pen.counts.shape
    T = logits.shape[0] // B
    z = logits.float().view(B, T, V)
    params = pen.params.view(B, 1, 3)
    out = _penalize(z, pen.counts.view(B, 1, V).float(), params)
    block = None
    if pen.stops is not None:
        block = pen.min_left.view(B, 1) > torch.arange(T, device=z.device).view(1, T)  # [B, T]
        out = out.masked_fill(block.unsqueeze(-1) & pen.stops.view(B, 1, V), float("-inf"))
    if pen.bias is not None:
        out = out + pen.bias.view(B, 1, V)
    if drafts is not None and T > 1:
        # Each row's entries for the tokens d_1..d_{T-1} recomputed with the drafts before the row counted: entry
        # (j, i) holds token d_i with count counts[d_i] + #{i' < j: d_i' == d_i}. Where d_i is not among the row's
        # drafts that is its plain value, and two entries of one token in a row are equal: the writes agree.
        d = drafts.view(B, T)[:, 1:]  # [B, T-1]
        before = (torch.arange(T - 1, device=z.device).view(1, T - 1)
                  < torch.arange(T, device=z.device).view(T, 1))  # [j, i']: d_i' is before row j
        same = d.unsqueeze(2) == d.unsqueeze(1)  # [B, i, i']
        extra = (same.unsqueeze(1) & before.view(1, T, 1, T - 1)).sum(-1)  # [B, j, i]
        idx = d.unsqueeze(1).expand(B, T, T - 1)
        counts = pen.counts.gather(1, d).float().unsqueeze(1) + extra
        vals = _penalize(z.gather(2, idx), counts, params)
        if block is not None:
            vals = vals.masked_fill(block.unsqueeze(-1) & pen.stops.gather(1, d).unsqueeze(1), float("-inf"))
        if pen.bias is not None:
            vals = vals + pen.bias.gather(1, d).unsqueeze(1)
        out = out.scatter(2, idx, vals)
    return out.view(B * T, V)


@dataclass(frozen=True, eq=False)
class SamplerBatch:
    """A batch's sampler inputs on the device: f float32 [B, 3] (temperature, top_p, min_p) and i int64 [B, 2]
    (top_k, key), sampling_rows' rows, the filters its requests use, its penalty state where a request has
    penalties and its grammars (runtime/grammar.GrammarBatch) where a request has one (None otherwise: the rows'
    logits are sampled as they are)."""

    f: torch.Tensor
    i: torch.Tensor
    filters: Filters
    penalties: Penalties | None = None
    grammar: object | None = None  # a grammar.GrammarBatch

    @property
    def processed(self) -> bool:
        """Whether the rows' logits are changed before sampling (penalties, a grammar): a speculative round then
        runs as several replays (ModelRunner.sampled_round)."""
        return self.penalties is not None or self.grammar is not None

    def proposal_rows(self, requests: torch.Tensor) -> SamplerBatch:
        """The inputs a draft's proposals need for rows of the requests ``requests`` [N] (indices into this batch,
        on its device; a draft extend's rows each proposing a token): f and i gathered; no penalties or grammar,
        which a proposal never applies (draft_tokens)."""
        return SamplerBatch(self.f.index_select(0, requests), self.i.index_select(0, requests), self.filters)


ALL_FILTERS = Filters()
UNRANKED = Filters(top_k=False, top_p=False)  # temperature and min_p: one of the speculative round's graph sets
SCAN_CHUNK = 1024  # top_p's prefix sums: chunks of a row, scanned side by side (see _prefix_sums)


def _prefix_sums(x: torch.Tensor) -> torch.Tensor:
    """Inclusive prefix sums along the rows of x [R, V] in two levels: chunks of SCAN_CHUNK scanned as rows of
    their own, plus the exclusive sums of the chunk totals. On the H200 torch's cumsum over 4 rows of 163840
    took 209 us (one block a row), over one row 11 us: [R * V / 1024, 1024] keeps every row's cost that of the
    short rows. The order of the additions depends only on V, not on R: a row's sums are the same in any batch."""
    R, V = x.shape
    C = -(-V // SCAN_CHUNK)
    chunks = torch.nn.functional.pad(x, (0, C * SCAN_CHUNK - V)).view(R, C, SCAN_CHUNK)
    totals = chunks.sum(-1)
    offsets = totals.cumsum(-1) - totals
    return (chunks.cumsum(-1) + offsets.unsqueeze(-1)).view(R, C * SCAN_CHUNK)[:, :V]


def filtered_scores(logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor, top_k: torch.Tensor,
                    min_p: torch.Tensor, filters: Filters = ALL_FILTERS,
                    use_triton: bool | None = None) -> torch.Tensor:
    """logits [R, V] -> float32 [R, V]: z = logits / temperature where the row's processed distribution keeps the
    token, -inf elsewhere, so softmax of a row is that distribution. Per-row parameters [R] (temperature > 0;
    top_k <= 0 or >= V: off); ``filters``: which to apply at all. Graph-safe (no host sync).

    top_k keeps the tokens at least as likely as the k-th; min_p those at least min_p times the most likely;
    top_p, over what those leave, the most likely tokens up to the first whose cumulative mass reaches top_p of
    it. Each is a threshold on z (the probability's order), so the three compose into one and a token tied with
    the last kept one is kept too. The thresholds are computed in z whatever the filter set (min_p: z >= max +
    log(min_p)), so a row keeps the same tokens in any batch.

    top_k and top_p: with Triton (CUDA) a radix select over the row (kernels.top_threshold: 9 launches of
    streaming passes, no sort); elsewhere, or with SGLANG_EAGLE3_SAMPLER_RADIX=0, a sort of the row and prefix
    sums. Both compute the definition above;
    they may differ only for a row whose mass sits within float rounding of top_p's boundary, and each is
    deterministic and independent of the batch."""
    z = logits.float() / temperature.view(-1, 1)
    if not (filters.min_p or filters.ranked):
        return z
    thr = torch.full_like(z[:, 0], float("-inf"))
    zmax = z.amax(-1)
    if filters.min_p:
        # min_p 0 is off (-inf), also where the row's maximum is +inf (a repetition_penalty or temperature near 0
        # overflows float32): inf + log(0) is NaN, and a NaN threshold dropped every token (the row sampled token 0).
        thr = torch.maximum(thr, torch.where(min_p > 0, zmax + torch.log(min_p), float("-inf")))
    if env.SAMPLER_RADIX.switch(default=True) and kernels.triton_runs(z, use_triton):
        if filters.top_k:  # k as float32 (the kernel's counts); k <= 0 or >= V leaves the threshold as it is
            thr = kernels.top_threshold(z, thr, top_k.clamp(0, z.shape[-1]).float(), use_triton=use_triton)
        if filters.top_p:
            thr = kernels.top_threshold(z, thr, top_p.float(), zmax, use_triton=use_triton)
        return torch.where(z >= thr.view(-1, 1), z, float("-inf"))
    thr = thr.view(-1, 1)
    if filters.ranked:
        srt = z.sort(dim=-1, descending=True).values
        V = z.shape[-1]
        if filters.top_k:
            kth = torch.where((top_k > 0) & (top_k < V), top_k, V) - 1
            thr = torch.maximum(thr, srt.gather(1, kth.view(-1, 1)))
        if filters.top_p:
            kept = torch.where(srt >= thr, torch.exp(srt - zmax.view(-1, 1)), 0.0)  # mass relative to the maximum
            cum = _prefix_sums(kept)
            in_p = (cum - kept) < top_p.view(-1, 1) * cum[:, -1:]  # a prefix of the kept tokens, never empty
            last = (in_p & (kept > 0)).sum(-1).clamp_min(1) - 1
            # top_p 1 leaves the row as it is: the sums above would drop tokens whose mass is below the total's
            # float rounding (a row's tail behind a far more likely token), unlike a batch without top_p.
            thr = torch.where(top_p.view(-1, 1) < 1, torch.maximum(thr, srt.gather(1, last.view(-1, 1))), thr)
    return torch.where(z >= thr, z, float("-inf"))


def sample_tokens(logits: torch.Tensor, samp_f: torch.Tensor, samp_i: torch.Tensor, positions: torch.Tensor,
                  filters: Filters = ALL_FILTERS, use_triton: bool | None = None) -> torch.Tensor:
    """The tokens at ``positions`` [R] (the positions being sampled: a logits row's own position + 1) from
    logits [R, V] -> int64 [R]: the argmax for greedy rows (temperature 0), else the Gumbel-max sample of the
    row's processed distribution with its request's key (module doc). samp_f float32 [R, 3] (temperature, top_p,
    min_p), samp_i int64 [R, 2] (top_k, key): sampling_rows' rows, a request's repeated for each of its rows;
    ``filters``: at least those the rows use (Filters.of)."""
    if not filters.sampled:  # every row greedy: the argmax, which is what each greedy row takes below too
        return logits.argmax(-1)
    greedy = samp_f[:, 0] <= 0
    temperature = torch.where(greedy, 1.0, samp_f[:, 0])
    scores = filtered_scores(logits, temperature, samp_f[:, 1], samp_i[:, 0], samp_f[:, 2], filters, use_triton)
    sampled = kernels.gumbel_argmax(scores, samp_i[:, 1], positions, use_triton=use_triton)
    return torch.where(greedy, logits.argmax(-1), sampled)


def draft_tokens(logits: torch.Tensor, samp_f: torch.Tensor, samp_i: torch.Tensor, positions: torch.Tensor,
                 token_ids: torch.Tensor, use_triton: bool | None = None) -> torch.Tensor:
    """A draft's proposals from its logits [R, Vd] (columns: draft ids; ``token_ids`` [Vd] their target ids) ->
    draft ids int64 [R]: the argmax for greedy rows; for sampled rows the Gumbel-max of logits / temperature with the
    noise the target's sampler draws for the same request, position and target token (no filters: a proposal
    needs no exactness). Where the draft's distribution is near the target's, the two samples agree with
    probability near 1 - their total variation distance (the argmax proposal: the target's probability of it)."""
    greedy = samp_f[:, 0] <= 0
    scores = logits.float() / torch.where(greedy, 1.0, samp_f[:, 0]).view(-1, 1)
    sampled = kernels.gumbel_argmax(scores, samp_i[:, 1], positions, token_ids=token_ids, use_triton=use_triton)
    return torch.where(greedy, logits.argmax(-1), sampled)


def draft_candidates(logits: torch.Tensor, samp_f: torch.Tensor, samp_i: torch.Tensor, positions: torch.Tensor,
                     token_ids: torch.Tensor, k: int, use_triton: bool | None = None) -> torch.Tensor:
    """draft_tokens' choice, then the draft's k - 1 best columns by logits: draft ids int64 [R, k] from
    logits [R, Vd] (-inf where a column is not to be proposed). A grammar round picks the first of them its grammar
    allows on the host (ModelRunner.grammar_spec_round), so that the draft's steps wait for no mask row; the first is
    exactly the proposal draft_tokens makes (under the same -inf columns), and the others, which a sampled row falls
    back to only where the grammar refuses its sample, need no exactness. (They carry no Gumbel noise: its torch form
    over every column added two dozen small launches to each draft step; the round with it measured slower than the
    masked steps before it, BENCHMARKS.md section 7.) The choice may recur among the others."""
    best = logits.topk(k - 1, dim=-1).indices  # (a temperature > 0 keeps the order: no division)
    return torch.cat([draft_tokens(logits, samp_f, samp_i, positions, token_ids, use_triton).view(-1, 1), best], 1)

