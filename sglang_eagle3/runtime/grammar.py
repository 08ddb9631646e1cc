"""Structured output: a request's grammar (SGLang's ``json_schema``, ``regex`` or ``ebnf`` sampling parameter)
limits the tokens it may emit, exactly, with speculation on or off.

xgrammar (SGLang's default grammar backend) compiles the grammar against the tokenizer's vocabulary and keeps a
matcher per request: the tokens accepted so far, and from them a bitmask of the tokens that may come next (one
bit a token in int32 words). A token outside it gets -inf before the sampler (apply_token_bitmask), so the argmax
and the sampler alike choose among the allowed ones, and the end of the output is where the grammar allows a stop
token (the engine's eos) and the model takes it.

With speculation, verify row j of a request (the token after d_j) is masked as plain decoding would have masked
that position had the drafts d_1..d_j been emitted: the matcher accepts the drafts one by one while the rows are
filled, then rolls them back (GrammarBatch.masks). A draft the grammar refuses ends the walk: the target's token at
the row before it is never that draft (its mask forbids it), so the round accepts nothing past it and the later
rows are never read (left all allowed). The emitted tokens are accepted for good when the host reads the round
(Scheduler._emit). The masks need the round's drafts on the host between the draft steps and the acceptance, so
a batch with a grammar runs its round as k + 2 graph replays (ModelRunner.grammar_spec_round; penalties, where a
request has them too, applied between the verify and the masks) and without the overlap schedule (the next
round's masks need this round's tokens). The draft proposes within the grammar too: each of its steps returns its
best few candidates and the host takes the first the grammar accepts after the drafts before it (GrammarBatch.choose:
one accept a candidate, microseconds). Where a request's rows are cheap to fill (JSON schemas: microseconds), its
row is filled before the step and masks the candidates (step_mask: forced tokens, which a draft seldom proposes by
itself, then cost nothing more); where they are not (a regular expression over a large vocabulary: 1-2 ms a row),
the candidates go unmasked and the rows are filled while the verify runs (masks()), except for a step none of whose
candidates the grammar accepts, whose row is filled then and its proposal chosen again under it (refill()). Every
row filled for a proposal is the verify's row after the same drafts, kept and not filled twice.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import torch

from sglang_eagle3.env import max_think_tokens
from sglang_eagle3.runtime.reasoning import REASONING_FORMATS, ReasoningFormat, ThinkingMatcher
from sglang_eagle3.runtime.sampling import SamplingParamsError, short_repr

logger = logging.getLogger(__name__)

# A request whose mask rows recently took under this long to fill (seconds) has its row filled before each draft step
# (GrammarBatch.step_mask), its candidates masked; above it the candidates are checked one by one and the rows are
# filled while the verify runs. A refill (none of a step's candidates allowed) costs the host a head replay and a
# wait for it on top of the row, so filling ahead pays for rows this cheap whatever the candidates: JSON schemas'
# rows take microseconds, a regular expression of words at Kimi's vocabulary 1-2.5 ms (BENCHMARKS.md section 7).
PREFILL_BELOW_S = 100e-6
# A verify's rows of requests whose rows take at least this long (seconds) are filled together on xgrammar's threads
# (GrammarBatch.host_masks; a fork of the matcher a row), the others one by one on the calling thread: a regular
# expression at Kimi's vocabulary, 8 rows of ~0.9 ms, took 7.4 ms one by one and 3.9 ms on 2 threads (the CPU box).
PARALLEL_FILL_ABOVE_S = 100e-6
ANY_JSON = "$$ANY$$"  # SGLang's json_schema for "any JSON value" (OpenAI's response_format json_object)
# xgrammar's C++ errors start "[hh:mm:ss] /project/cpp/file.cc:123: " and often "Check failed: (...) is false: ".
_XGR_PREFIX = re.compile(r"^\[[\d:]+\] \S+?:\d+: (?:Check failed: .*? is false: )?")

# -- JSON schemas xgrammar would follow only in part -------------------------------------------------------------
# xgrammar compiles these without a word (a warning on stderr at most) and drops the constraint, so the output need
# not satisfy the schema (a "contains" array came out "[]"; a "required" property outside "properties" never came).
# SGLang 0.5.23 refuses most of them the same way (constrained/json_schema_validation.py); each was checked against
# xgrammar 0.2.7 and 0.2.9 (tests/test_grammar_parity.py keeps the list honest).
_IGNORED_KEYWORDS = ("not", "if", "then", "else", "contains", "minContains", "maxContains", "dependentRequired",
                     "dependentSchemas", "dependencies")
# Formats xgrammar writes a grammar for; any other format of a string is dropped (the string is free).
_STRING_FORMATS = frozenset({"date", "date-time", "duration", "email", "hostname", "ipv4", "ipv6", "json-pointer",
                             "relative-json-pointer", "time", "uri", "uri-reference", "uri-template", "uuid"})
# Keywords that assert nothing: they may stand beside anyOf / oneOf / allOf / enum / const, whose siblings xgrammar
# otherwise drops ({"type": "string", "anyOf": [{"type": "integer"}]} allowed 1).
_ANNOTATIONS = frozenset({"$schema", "$id", "$anchor", "$comment", "$defs", "definitions", "title", "description",
                          "default", "examples", "deprecated", "readOnly", "writeOnly", "discriminator"})
_SUBSCHEMA = ("items", "additionalProperties", "additionalItems", "propertyNames", "unevaluatedItems",
              "unevaluatedProperties", "contentSchema", "contains", "not", "if", "then", "else")
_SUBSCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems")
_SUBSCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_LOOKAROUND = re.compile(r"(?<!\\)\(\?<?[=!]")  # (?= (?! (?<= (?<!: xgrammar ignores them in a "pattern"


def _subschemas(schema, pointer: str = "#"):
    """(each object subschema of ``schema``, its JSON pointer), ``schema`` first."""
    if not isinstance(schema, dict):
        return
    yield schema, pointer
    for key in _SUBSCHEMA:
        yield from _subschemas(schema.get(key), f"{pointer}/{key}")
    for key in _SUBSCHEMA_LISTS:
        if isinstance(schema.get(key), list):
            for i, sub in enumerate(schema[key]):
                yield from _subschemas(sub, f"{pointer}/{key}/{i}")
    for key in _SUBSCHEMA_MAPS:
        if isinstance(schema.get(key), dict):
            for name, sub in schema[key].items():
                yield from _subschemas(sub, f"{pointer}/{key}/{name.replace('~', '~0').replace('/', '~1')}")


def _is_string(schema: dict) -> bool:
    """Whether ``schema`` may describe a string (its string keywords then count)."""
    t = schema.get("type")
    return t is None or t == "string" or (isinstance(t, list) and "string" in t)


def unenforced_json_schema(schema) -> str | None:
    """Where and why xgrammar would compile ``schema`` (parsed JSON) but not hold the output to it: "at <JSON
    pointer>: <reason>", or None where every constraint it states is kept."""
    for sub, at in _subschemas(schema):
        reason = _unenforced_here(sub)
        if reason is not None:
            return f"at {at}: {reason}"
    return None


def _unenforced_here(sub: dict) -> str | None:
    """unenforced_json_schema's reason for one subschema, its own keywords only."""
    ignored = [k for k in _IGNORED_KEYWORDS if k in sub] + (["uniqueItems"] if sub.get("uniqueItems") is True else [])
    if ignored:
        return f"{', '.join(ignored)} would be ignored"
    if "multipleOf" in sub:
        m = sub["multipleOf"]
        bounds = [k for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum") if k in sub]
        if sub.get("type") != "integer" or isinstance(m, bool) or not isinstance(m, int) or m <= 0 or bounds:
            return (f"multipleOf={short_repr(m)} would be ignored: it is kept only for type 'integer', a positive "
                    "integer and no minimum / maximum")
    ref = sub.get("$ref")
    if isinstance(ref, str) and not (ref == "#" or ref.startswith("#/")):
        return f"$ref={short_repr(ref)} would be ignored: only references within the schema ('#/...') are followed"
    combined = next((k for k in ("anyOf", "oneOf", "allOf", "enum", "const") if k in sub), None)
    if combined is not None:
        if isinstance(sub.get("allOf"), list) and len(sub["allOf"]) > 1:
            return "allOf with more than one schema would be ignored (merge them into one)"
        siblings = set(sub) - _ANNOTATIONS - {combined} - ({"type"} if combined in ("enum", "const") else set())
        if siblings:
            return f"{', '.join(sorted(siblings))} beside {combined} would be ignored (move them into it)"
    if isinstance(sub.get("required"), list):
        props = sub["properties"] if isinstance(sub.get("properties"), dict) else {}
        missing = [name for name in sub["required"] if name not in props]
        if missing:
            return f"required {short_repr(missing)} would be ignored: only names under properties are required"
    if not _is_string(sub):
        return None
    fmt = sub.get("format")
    if fmt is not None and fmt not in _STRING_FORMATS:
        return (f"string format {short_repr(fmt)} would be ignored (xgrammar's formats: "
                f"{', '.join(sorted(_STRING_FORMATS))})")
    kinds = [k for k in ("format", "pattern") if k in sub] + (
        ["minLength/maxLength"] if "minLength" in sub or "maxLength" in sub else [])
    if len(kinds) > 1:
        return f"{' and '.join(kinds)} together: all but one would be ignored"
    pattern = sub.get("pattern")
    if isinstance(pattern, str) and _LOOKAROUND.search(pattern):
        return f"pattern={short_repr(pattern)}: its lookaround would be ignored"
    return None


class GrammarError(SamplingParamsError):
    """A grammar that cannot be used: it does not compile, or this engine cannot constrain output (no tokenizer,
    no xgrammar). The message names the parameter."""


@dataclass(frozen=True)
class GrammarSpec:
    """One request's grammar: ``kind`` one of sampling.GRAMMAR_KINDS, ``text`` the schema (serialized JSON), regular
    expression or EBNF grammar as the client sent it."""

    kind: str
    text: str


def _xgrammar():
    try:
        import xgrammar
    except ImportError as e:
        raise GrammarError("structured output (json_schema, regex, ebnf) needs the 'xgrammar' package: pip install "
                           "'sglang_eagle3[grammar]'") from e
    return xgrammar


def xgrammar_reason(e: Exception, limit: int = 300) -> str:
    """An xgrammar error's first line without its C++ log prefix, cut to ``limit`` characters (it may quote the
    client's text)."""
    text = str(e).strip()
    why = _XGR_PREFIX.sub("", text).splitlines()[0] if text else type(e).__name__
    return why if len(why) <= limit else why[:limit] + "..."


def grammar_vocab(tokenizer, vocab_size: int, exposed: frozenset[int] = frozenset()) -> list[bytes]:
    """The bytes of each of the model's ``vocab_size`` token ids as the grammar reads them: a token's own bytes
    (Tokenizer.token_bytes), empty for special tokens and ids the tokenizer lacks (a padded vocabulary), which
    xgrammar then never allows (stop tokens aside: it allows those where the grammar may end). The special tokens
    in ``exposed`` get bytes no text holds (0xFF, never in UTF-8, then their name): a structural tag's token format
    can then require them by id (tag_tokens), and nothing else can match them, a JSON string or free text included."""
    special = tokenizer.special_ids
    n = min(vocab_size, tokenizer.vocab_size)
    return ([(b"\xff" + tokenizer.token_bytes(i) if i in exposed else b"") if i in special
             else tokenizer.token_bytes(i) for i in range(n)] + [b""] * (vocab_size - n))


def tag_tokens(tag, special: Callable[[str], int | None]) -> set[int]:
    """The token ids an xgrammar structural tag (parsed JSON, any shape) names at token level: a ``token`` format's
    token, ``trigger_tokens`` / ``exclude_tokens`` lists, a ``token_dispatch``'s rules' tokens. A text that
    ``special`` finds the id of (a special token's) is rewritten to that id in ``tag``: grammar_vocab gives such a
    token no text that xgrammar could look it up by. Other texts are left to xgrammar (a regular token's)."""
    found: set[int] = set()

    def resolve(ref):
        if isinstance(ref, str):
            i = special(ref)
            ref = ref if i is None else i
        if isinstance(ref, int) and not isinstance(ref, bool):
            found.add(ref)
        return ref

    stack = [tag]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
            continue
        if not isinstance(node, dict):
            continue
        if node.get("type") == "token" and "token" in node:
            node["token"] = resolve(node["token"])
        for key in ("trigger_tokens", "exclude_tokens"):
            if isinstance(node.get(key), list):
                node[key] = [resolve(t) for t in node[key]]
        if node.get("type") == "token_dispatch" and isinstance(node.get("rules"), list):
            for rule in node["rules"]:
                if isinstance(rule, list) and rule:
                    rule[0] = resolve(rule[0])
        stack.extend(v for v in node.values() if isinstance(v, (dict, list)))
    return found


def _non_finite(value, pointer: str = "#") -> str | None:
    """Where ``value`` (parsed JSON) holds NaN or a number past a float's range (JSON's 1e400 reads as inf): "at
    <pointer>: ...", or None. xgrammar's error for one names neither ("does not compile: RuntimeError")."""
    if isinstance(value, float) and not math.isfinite(value):
        return f"at {pointer}: {value} is not a finite number (NaN, Infinity or past a float's range)"
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, sub in items:
        found = _non_finite(sub, f"{pointer}/{str(key).replace('~', '~0').replace('/', '~1')}")
        if found:
            return found
    return None


def _schema_problem(schema) -> str | None:
    """Why xgrammar would not hold output to ``schema`` (parsed JSON) in full, or None (check_json_schema)."""
    try:
        return _non_finite(schema) or unenforced_json_schema(schema)
    except RecursionError:
        return "it nests too deeply to check"


def check_json_schema(text: str) -> None:
    """GrammarError where xgrammar would compile the schema ``text`` but not enforce all of it (SGLang refuses
    these too), rather than constrain the output to part of what the client asked. Text that is not JSON is left to
    xgrammar, whose error names the position."""
    try:
        schema = json.loads(text)
    except (ValueError, RecursionError):
        return
    reason = _schema_problem(schema)
    if reason is not None:
        raise GrammarError(f"json_schema={short_repr(text)} is not supported: {reason}")


# -- structural tags ---------------------------------------------------------------------------------------------
# SGLang's structural_tag takes two shapes (protocol.py's StructuralTagResponseFormat): the legacy one, {"structures":
# [{"begin", "schema", "end"}], "triggers": [...], "at_least_one"}, free text in which a trigger opens one of the
# tagged JSON values; and xgrammar's own, {"format": {...}} (type "structural_tag" beside it optional), whose
# formats nest (tag, sequence, or, triggered_tags, ...). Both compile to one xgrammar grammar.
_TAG_SCHEMA_FORMATS = ("json_schema", "qwen_xml_parameter")  # formats whose "json_schema" holds a schema
_TAG_NESTED = {"content": False, "elements": True, "tags": True}  # where formats nest: key -> holds a list


def _schema_formats(fmt, at: str):
    """(format, where) of each format in an xgrammar structural tag's format tree (parsed JSON) that holds a JSON
    schema under "json_schema"."""
    if not isinstance(fmt, dict):
        return
    if fmt.get("type") in _TAG_SCHEMA_FORMATS:
        yield fmt, at
    for key, many in _TAG_NESTED.items():
        sub = fmt.get(key)
        if many and isinstance(sub, list):
            for i, item in enumerate(sub):
                yield from _schema_formats(item, f"{at}.{key}[{i}]")
        elif not many:
            yield from _schema_formats(sub, f"{at}.{key}")


def structural_tag_grammar(text: str, xgr, max_whitespace_cnt: int | None = None):
    """What xgrammar's compile_structural_tag takes for SGLang's structural_tag ``text`` (either shape above): an
    xgrammar StructuralTag for the legacy shape, the JSON text for xgrammar's. GrammarError naming the part at
    fault where the text is not such a tag, or a schema in it would be enforced only in part (check_json_schema's
    rule). ``max_whitespace_cnt`` (the engine's constrained_json_max_whitespace_cnt) bounds the whitespace runs of
    each JSON value whose format sets no bound of its own: a weak model pads a tag's JSON with spaces as it pads
    a json_schema's."""
    fields = getattr(getattr(getattr(xgr, "structural_tag", None), "JSONSchemaFormat", None), "model_fields", {})
    bound = max_whitespace_cnt if "max_whitespace_cnt" in fields else None  # (an older xgrammar has no bound)

    def bad(why: str) -> GrammarError:
        return GrammarError(f"structural_tag={short_repr(text)} {why}")

    try:
        tag = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise bad(f"is not JSON: {e}") from None
    if not isinstance(tag, dict):
        raise bad("must be a JSON object: {\"structures\": [...], \"triggers\": [...]} or {\"format\": {...}}")
    if "structures" in tag:
        structures, triggers = tag["structures"], tag.get("triggers")
        if not isinstance(structures, list) or not structures:
            raise bad("has structures that are not a non-empty list of {begin, schema, end}")
        if not isinstance(triggers, list) or not triggers or not all(isinstance(t, str) and t for t in triggers):
            raise bad(f"has triggers={short_repr(triggers)}: a non-empty list of non-empty strings is needed (each "
                      "structure's begin starts with one)")
        if not isinstance(tag.get("at_least_one", False), bool):
            raise bad(f"has at_least_one={short_repr(tag['at_least_one'])}: true or false")
        items = []
        for i, st in enumerate(structures):
            if not isinstance(st, dict) or not isinstance(st.get("begin"), str) or not isinstance(st.get("end"), str):
                raise bad(f"has structures[{i}]={short_repr(st)}: an object with string begin and end is needed")
            schema = {} if st.get("schema") is None else st["schema"]
            if not isinstance(schema, (dict, bool)):
                raise bad(f"has structures[{i}].schema={short_repr(schema)}: a JSON schema (an object) is needed")
            reason = _schema_problem(schema)
            if reason is not None:
                raise bad(f"has structures[{i}].schema, which is not supported: {reason}")
            items.append(xgr.StructuralTagItem(begin=st["begin"], schema=json.dumps(schema), end=st["end"]))
        if not hasattr(xgr, "StructuralTag"):  # an older xgrammar (no StructuralTag): the legacy call, no at_least_one
            if tag.get("at_least_one"):
                raise bad("has at_least_one, which this xgrammar cannot enforce (pip install -U xgrammar)")
            return items, triggers
        compiled_tag = xgr.StructuralTag.from_legacy_structural_tag(items, triggers)
        compiled_tag.format.at_least_one = bool(tag.get("at_least_one", False))
        if bound is not None:
            for t in compiled_tag.format.tags:
                t.content.max_whitespace_cnt = bound
        return (compiled_tag,)
    if "format" not in tag:
        raise bad("has neither structures (with triggers) nor format")
    if not hasattr(xgr, "StructuralTag"):
        raise bad("uses xgrammar's format shape, which this xgrammar cannot read (pip install -U xgrammar)")
    for fmt, where in _schema_formats(tag["format"], "format"):
        if fmt.get("json_schema") is None:
            fmt["json_schema"] = {}  # (no schema: any JSON value, as SGLang reads it; xgrammar would refuse it)
        if bound is not None and fmt.get("type") == "json_schema" and fmt.get("max_whitespace_cnt") is None:
            fmt["max_whitespace_cnt"] = bound
        reason = _schema_problem(fmt["json_schema"]) if isinstance(fmt["json_schema"], (dict, bool)) else None
        if reason is not None:
            raise bad(f"has {where}.json_schema, which is not supported: {reason}")
    return (json.dumps(tag),)


class GrammarBackend:
    """Compiles grammars against one tokenizer's vocabulary and makes matchers. Built on the first grammar (xgrammar
    is imported and the vocabulary read then: engines that never see one pay nothing); compiled grammars are kept
    by spec, the ``cache_size`` most recent. Thread-safe: the server validates requests (compiles) in worker threads
    while the engine's thread makes matchers.

    Special tokens have no text in the grammar's vocabulary, so no grammar writes one (a JSON string cannot hold
    ``<|im_end|>``), except where a structural tag names one at token level (``{"type": "token", "token": ...}``,
    tag_tokens): that tag is compiled over a vocabulary in which those tokens can be required by id, and only so
    (grammar_vocab; a compiler per such set, a few kept). Kimi-K2's forced tool calls are written so, in its own
    markup (server/tools.py)."""

    MAX_EXPOSING = 4  # compilers kept whose vocabulary lets a tag require some special tokens (grammar_vocab)

    def __init__(self, tokenizer, vocab_size: int, stop_token_ids, *, any_whitespace: bool = True,
                 disabled_reason: str | None = None, cache_size: int = 256, reasoning: ReasoningFormat | None = None,
                 fill_threads: int | None = None, max_whitespace_cnt: int | None = None,
                 strict_thinking: bool = False, max_think_tokens: int | None = None):
        """``reasoning``: a reasoning model's format (runtime/reasoning.py): the grammars then wait for its thinking
        to end (ThinkingMatcher), where its markers are single tokens. ``strict_thinking``: every request's thinking
        is held to the format's rules (excluded tokens, a budget: runtime/reasoning.py), ``max_think_tokens`` the
        budget of a request that names none (None: no limit). ``fill_threads``: threads filling dear mask
        rows together (RowFiller; default half the cores, at most 8; 1: rows one by one). ``max_whitespace_cnt``:
        at most this many whitespace characters in a row between a JSON schema's tokens (SGLang's
        constrained_json_max_whitespace_cnt; None: any number, as SGLang's default: a weak model may then pad with
        spaces until max_new_tokens)."""
        if max_whitespace_cnt is not None and (isinstance(max_whitespace_cnt, bool) or max_whitespace_cnt < 1):
            raise GrammarError(f"{max_whitespace_cnt=} must be a positive integer or None")
        if strict_thinking and reasoning is None:
            raise GrammarError("strict thinking needs a reasoning format (reasoning_parser): it says where the "
                               "thinking starts and ends")
        self.strict_thinking, self.max_think_tokens = strict_thinking, max_think_tokens
        self.max_whitespace_cnt = max_whitespace_cnt
        self.fill_threads = fill_threads or max(1, min(8, (os.cpu_count() or 2) // 2))
        self.tokenizer, self.vocab_size, self.reasoning = tokenizer, vocab_size, reasoning
        self._think_ids: tuple[int | None, int] | None | bool = False  # (start, end) marker ids; False: not read yet
        self._excluded: frozenset[int] = frozenset()  # the format's excluded tokens' ids (strict thinking)
        self.stop_token_ids = sorted(set(stop_token_ids))
        self.any_whitespace, self.disabled_reason = any_whitespace, disabled_reason
        self.cache_size = cache_size
        # xgrammar compilers by the special tokens a tag may require in their vocabulary (frozenset() for every
        # grammar but structural tags that name special tokens: tag_tokens), each with the ids it never allows
        self._compilers: OrderedDict[frozenset[int], tuple[object, frozenset[int]]] = OrderedDict()
        self._filler: RowFiller | None = None  # fills dear rows together on threads (GrammarBatch.host_masks)
        # compiled grammars by spec, with the ids their compiler never allows
        self._cache: OrderedDict[GrammarSpec, tuple[object, frozenset[int]]] = OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def for_engine(args, tokenizer, vocab_size: int, stop_token_ids) -> GrammarBackend:
        """The backend EngineArgs ask for (grammar_backend, constrained_json_disable_any_whitespace)."""
        return GrammarBackend(tokenizer, vocab_size, stop_token_ids,
                              any_whitespace=not args.constrained_json_disable_any_whitespace,
                              disabled_reason="grammar_backend='none'" if args.grammar_backend == "none" else None,
                              reasoning=REASONING_FORMATS.get(args.reasoning_parser),
                              max_whitespace_cnt=args.constrained_json_max_whitespace_cnt,
                              strict_thinking=args.enable_strict_thinking, max_think_tokens=max_think_tokens())

    @property
    def available(self) -> bool:
        """Whether requests with a grammar can be served (not turned off, a tokenizer, xgrammar installed): the
        engine then captures the graphs of grammar rounds too."""
        import importlib.util

        return (self.disabled_reason is None and self.tokenizer is not None
                and importlib.util.find_spec("xgrammar") is not None)

    def _get_compiler(self, exposed: frozenset[int] = frozenset()) -> tuple[object, frozenset[int]]:
        """(xgrammar compiler, the ids it never allows) over the vocabulary in which a structural tag may require the
        special tokens ``exposed`` (grammar_vocab). Built on first use outside the lock (a vocabulary of Kimi's size
        takes a while, and the engine's thread must not wait for it to make matchers); the base one is kept for
        good, those exposing special tokens the MAX_EXPOSING most recent."""
        with self._lock:
            if exposed in self._compilers:
                self._compilers.move_to_end(exposed)
                return self._compilers[exposed]
        if self.disabled_reason is not None:
            raise GrammarError(f"structured output (json_schema, regex, ebnf) is off in this engine "
                               f"({self.disabled_reason})")
        if self.tokenizer is None:
            raise GrammarError("structured output (json_schema, regex, ebnf) needs the engine's tokenizer, and "
                               "this engine runs without one (skip_tokenizer_init)")
        xgr = _xgrammar()
        t0 = time.perf_counter()
        vocab = grammar_vocab(self.tokenizer, self.vocab_size, exposed)
        # Tokens no grammar allows (special, padding): refused without asking xgrammar, which logs a warning
        # to stderr for each (a draft may propose one where the grammar leaves its vocabulary nothing).
        never = frozenset(i for i, b in enumerate(vocab) if not b) - set(self.stop_token_ids)
        info = xgr.TokenizerInfo(vocab, xgr.VocabType.RAW, vocab_size=self.vocab_size,
                                 stop_token_ids=self.stop_token_ids)
        entry = (xgr.GrammarCompiler(info, max_threads=2), never)
        logger.info("grammar backend (xgrammar) over %d tokens%s ready in %.2f s", self.vocab_size,
                    f" (special tokens {sorted(exposed)} for token formats)" if exposed else "",
                    time.perf_counter() - t0)
        with self._lock:
            entry = self._compilers.setdefault(exposed, entry)  # (another thread's, if it was first)
            self._compilers.move_to_end(exposed)
            while len(self._compilers) > self.MAX_EXPOSING + 1:
                oldest = next(k for k in self._compilers if k)  # (never the base one)
                del self._compilers[oldest]
            return entry

    def _exposed(self, tag) -> frozenset[int]:
        """The special tokens (not stop tokens) a structural tag (parsed JSON, rewritten: tag_tokens) names at token
        level, by id or by text: its grammar is compiled over a vocabulary where they can be required by id (Kimi's
        tool-call markers)."""
        tok = self.tokenizer

        def special(text: str) -> int | None:
            ids = tok.encode(text)
            return ids[0] if len(ids) == 1 and ids[0] in tok.special_ids else None

        ids = tag_tokens(tag, special)
        return frozenset(i for i in ids if i in tok.special_ids and i not in self.stop_token_ids
                         and 0 <= i < self.vocab_size)

    def compile(self, spec: GrammarSpec):
        """The compiled grammar (cached); GrammarError naming the parameter when it does not compile. Compiled
        outside the lock (xgrammar's compiler is thread-safe): a large schema compiling for one client must not hold
        up the engine thread's matchers for grammars already compiled."""
        return self._compiled(spec)[0]

    def _compiled(self, spec: GrammarSpec) -> tuple[object, frozenset[int]]:
        """compile()'s grammar and the ids its compiler never allows."""
        with self._lock:
            if spec in self._cache:
                self._cache.move_to_end(spec)
                return self._cache[spec]
        compiler, never = self._get_compiler()  # (first: the error where this engine has no grammars)
        if spec.kind == "structural_tag":
            tag_args = structural_tag_grammar(spec.text, _xgrammar(), self.max_whitespace_cnt)
            if isinstance(tag_args[0], str):  # (xgrammar's format shape: it may name tokens)
                tag = json.loads(tag_args[0])
                exposed = self._exposed(tag)
                if exposed:
                    compiler, never = self._get_compiler(exposed)
                    tag_args = (json.dumps(tag),)
        if spec.kind == "json_schema" and spec.text != ANY_JSON:
            check_json_schema(spec.text)
        try:
            if spec.kind == "json_schema":
                # (max_whitespace_cnt only where set: an older xgrammar has no such argument)
                limit = {} if self.max_whitespace_cnt is None else {"max_whitespace_cnt": self.max_whitespace_cnt}
                compiled = (compiler.compile_builtin_json_grammar() if spec.text == ANY_JSON
                            else compiler.compile_json_schema(spec.text, any_whitespace=self.any_whitespace, **limit))
            elif spec.kind == "regex":
                compiled = compiler.compile_regex(spec.text)
            elif spec.kind == "structural_tag":
                compiled = compiler.compile_structural_tag(*tag_args)
            else:
                compiled = compiler.compile_grammar(spec.text)
        except (RuntimeError, ValueError, json.JSONDecodeError) as e:
            raise GrammarError(f"{spec.kind}={short_repr(spec.text)} does not compile: {xgrammar_reason(e)}") from None
        with self._lock:
            self._cache[spec] = (compiled, never)
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
            return compiled, never

    def matcher(self, spec: GrammarSpec | None, prompt_ids=None,
                thinking_budget: int | None = None) -> GrammarMatcher | ThinkingMatcher:
        """A request's matcher. With a reasoning format the output starts inside the thinking where the format says
        so (``forced``) or where the prompt (``prompt_ids``) ends with its start marker: a chat template that opens
        the thinking in its generation prompt (Kimi-K2.5's unless ``thinking`` is false, DeepSeek-V3.1's with
        ``thinking`` true), whose output is ``thoughts</think>answer``; held to the grammar from its first token,
        such a model could not think at all. Under strict thinking the thinking is held to its rules too (``spec``
        None: a request without a grammar, held to them alone), within ``thinking_budget`` tokens (SGLang's: negative
        means no limit; None: the engine's max_think_tokens)."""
        # An engine without stop tokens (no eos) ends a grammar's output where the grammar is complete; otherwise
        # the mask there would allow no token at all.
        m = None
        if spec is not None:
            xgr = _xgrammar()
            compiled, never = self._compiled(spec)
            m = GrammarMatcher(xgr.GrammarMatcher(compiled, terminate_without_stop_token=not self.stop_token_ids),
                               self.vocab_size, never, self._batch_filler(xgr), spec.kind)
        elif not self.strict_thinking:
            raise GrammarError("a matcher without a grammar is strict thinking's, and this engine has it off")
        ids = self.thinking_ids()
        if ids is None:
            return m
        start, end = ids
        opened = start is not None and bool(prompt_ids) and prompt_ids[-1] == start
        if not self.strict_thinking:
            return ThinkingMatcher(m, start, end, thinking=self.reasoning.forced or opened)
        budget = self.max_think_tokens if thinking_budget is None else thinking_budget
        return ThinkingMatcher(m, start, end, thinking=self.reasoning.forced or opened,
                               budget=None if budget is None or budget < 0 else budget, excluded=self._excluded)

    def _batch_filler(self, xgr) -> RowFiller | None:
        """The engine's RowFiller (made once), None with one thread. Half the cores by default: the engine's own
        thread and torch's want the rest, and tensor-parallel ranks each have one."""
        if self._filler is None and self.fill_threads > 1:
            self._filler = RowFiller(xgr, self.fill_threads)
        return self._filler

    def thinking_ids(self) -> tuple[int | None, int] | None:
        """The reasoning format's (start, end) marker ids where the end marker is one token (the start may be None:
        not one token), else None (a warning: the grammars then constrain the whole output); read once. Under strict
        thinking an end marker that is not one token is an error (GrammarError: the engine's start names it), and
        the format's excluded tokens that are one token each are read too."""
        with self._lock:
            if self._think_ids is False:
                self._think_ids = self._read_thinking_ids()
            return self._think_ids

    def _read_thinking_ids(self) -> tuple[int | None, int] | None:
        if self.reasoning is None:
            return None
        if self.tokenizer is None:
            if self.strict_thinking:
                raise GrammarError("strict thinking needs the engine's tokenizer to find the thinking's markers, and "
                                   "this engine runs without one (skip_tokenizer_init)")
            return None

        def one(text: str) -> int | None:
            ids = self.tokenizer.encode(text)
            return ids[0] if len(ids) == 1 else None

        start, end = one(self.reasoning.start), one(self.reasoning.end)
        if end is None:
            if self.strict_thinking:
                raise GrammarError(f"strict thinking: the reasoning format's end marker {self.reasoning.end!r} is not "
                                   "one token of this tokenizer, so a thinking budget could not end the thinking "
                                   "(is reasoning_parser the model's?)")
            logger.warning("reasoning parser: %r is not one token of this tokenizer; grammars constrain the whole "
                           "output, thinking included", self.reasoning.end)
            return None
        if self.strict_thinking:
            # (SGLang refuses every piece of an excluded string that is several tokens, common text among them;
            # such a string is not one of this tokenizer's special tokens, so it is left alone here.)
            self._excluded = frozenset(i for i in map(one, self.reasoning.excluded) if i is not None)
        return start, end


class GrammarMatcher:
    """One request's grammar state: the tokens it has accepted (its output so far)."""

    def __init__(self, matcher, vocab_size: int, never: frozenset[int] = frozenset(), filler=None,
                 kind: str = "ebnf"):
        """``filler``: the engine's RowFiller (None: rows one by one); ``kind``: its GrammarSpec's."""
        self._m, self.vocab_size, self._never, self.filler, self.kind = matcher, vocab_size, never, filler, kind
        # What its recent fills took (a running average, seconds): GrammarBatch.step_mask fills a draft step's row
        # ahead of the step only where that is cheap.
        self.fill_seconds = 0.0

    def accept(self, token: int) -> bool:
        """Accepts ``token`` if the grammar allows it here (True), else changes nothing (False)."""
        return token not in self._never and bool(self._m.accept_token(int(token)))

    @property
    def terminated(self) -> bool:
        """Whether a stop token ended the grammar: nothing may follow."""
        return bool(self._m.is_terminated())

    def fill(self, bitmask: torch.Tensor, row: int) -> None:
        """Row ``row`` of ``bitmask`` (int32 [R, words(V)], on the host) := the tokens allowed next."""
        t0 = time.perf_counter()
        self._m.fill_next_token_bitmask(bitmask, row)
        self.fill_seconds += 0.5 * (time.perf_counter() - t0 - self.fill_seconds)

    def rollback(self, n: int) -> None:
        if n:
            self._m.rollback(n)

    def row_job(self):
        """(xgrammar's matcher at this state, independent of this one: a fork, microseconds; a step to finish the
        row after it is filled, or None) for RowFiller: the row it fills is fill()'s. None (ThinkingMatcher's): no
        grammar decides the row, and fill() makes it at once."""
        return self._m.fork(), None


class RowFiller:
    """Fills rows of many matchers together on xgrammar's threads (its BatchGrammarMatcher)."""

    def __init__(self, xgr, threads: int):
        self.threads, self._batch = threads, xgr.BatchGrammarMatcher(threads)

    def fill(self, forks: list, bitmask: torch.Tensor, rows: list[int]) -> None:
        """bitmask[rows[i]] := the tokens forks[i] allows next. The matchers' fill_seconds are left alone: a batch's
        time holds the threads' start and its wait for the slowest, and fed back it kept a matcher whose rows had
        become cheap on the threads (the rows a refill fills, one by one, measure them)."""
        self._batch.batch_fill_next_token_bitmask(forks, bitmask, rows)


def bitmask_words(vocab_size: int) -> int:
    return (vocab_size + 31) // 32


class GrammarBatch:
    """A batch's matchers (None for a request without a grammar) for one round's masks and draft proposals."""

    def __init__(self, matchers: list[GrammarMatcher | None], vocab_size: int, upload, to_host=None):
        """``upload`` / ``to_host``: ModelRunner's (a host tensor to the device without waiting; a device tensor to a
        host copy queued without waiting, and an event or None)."""
        self.matchers, self.vocab_size, self._upload, self._to_host = matchers, vocab_size, upload, to_host
        self._pending = None  # prefetch's (host copy, its event)
        self._walked: list[int] | None = None  # drafts accepted into each matcher this round (choose / take)
        self._refused: set[int] = set()  # requests whose grammar refused a draft of this round
        self._known: dict[tuple[int, int], torch.Tensor] = {}  # (request, j): its verify row j, filled for a draft
        self._every: torch.Tensor | None = None  # step_mask's mask where it fills no row (uploaded once a round)

    def prefetch(self, drafts: torch.Tensor) -> None:
        """Queues the copy of a verify's ids [B, T] to the host, before the verify forward is queued: masks() then
        waits for the drafts alone and fills the masks while the verify runs (as SGLang's grammar barrier overlaps
        its bitmask with the verify forward)."""
        if self._to_host is not None:
            self._pending = self._to_host(drafts)

    def _read(self, drafts: torch.Tensor, T: int) -> list[list[int]]:
        if self._pending is not None:
            host, ready = self._pending
            self._pending = None
            if ready is not None:
                ready.synchronize()
            if host.shape == drafts.shape:
                return host.view(-1, T).tolist()
        return drafts.view(-1, T).tolist()

    def host_masks(self, drafts: list[list[int]] | None, T: int,
                   known: dict[tuple[int, int], torch.Tensor] | None = None) -> torch.Tensor:
        """int32 [B * T, words(V)] on the host: row b * T + j holds the tokens request b may emit after accepting
        drafts[b][1..j] (drafts[b] the verify's ids [last, d_1, .., d_k]; None: T = 1, the matchers' states as they
        are). All allowed where a request has no grammar, where a draft before the row is refused, and past a stop
        token. ``known[(b, j)]``: rows filled already (for the draft's proposals this round), taken as they are.
        Each request's drafts are accepted one by one and rolled back after; the rows of requests whose rows are
        dear (PARALLEL_FILL_ABOVE_S) are filled together on threads, from forks of their matchers."""
        B = len(self.matchers)
        known = known or {}
        # Request-major, as returned ([B, T, words], row b * T + j of its flat view): no transposed copy after (at
        # Kimi's vocabulary 20 KB a row: B = 32, T = 4 is 2.6 MB).
        mask = torch.full((B, T, bitmask_words(self.vocab_size)), -1, dtype=torch.int32)
        flat = mask.view(B * T, -1)
        jobs, filler = [], None  # (a fork of a matcher, its finishing step, its row of flat) for the filler's threads
        for b, m in enumerate(self.matchers):
            if m is None:
                continue
            together = getattr(m, "filler", None) is not None and m.fill_seconds >= PARALLEL_FILL_ABOVE_S
            accepted = 0
            for j in range(T):
                if j:
                    if m.terminated or not m.accept(drafts[b][j]):
                        break  # a refused draft: the rows from here on are never read
                    accepted += 1
                if (b, j) in known:
                    mask[b, j] = known[(b, j)]
                elif m.terminated:
                    break
                elif together and (job := m.row_job()) is not None:
                    jobs.append((*job, b * T + j))
                    filler = m.filler
                else:  # (a row no grammar decides, ThinkingMatcher's thinking: fill() makes it at once)
                    m.fill(flat, b * T + j)
            m.rollback(accepted)
        if len(jobs) == 1:  # one row: no threads
            jobs[0][0].fill_next_token_bitmask(flat, jobs[0][2])
        elif jobs:
            filler.fill([f for f, _, _ in jobs], flat, [r for _, _, r in jobs])
        for _, finish, row in jobs:
            if finish is not None:
                finish(flat, row)
        return flat

    def masks(self, drafts: torch.Tensor | list[list[int]] | None = None, T: int = 1) -> torch.Tensor:
        """host_masks on the device; ``drafts`` [B, T] as host lists (the drafts this round's choose() picked: the
        rows it filled for them are the verify's), or a device tensor (read here, a wait for the stream, unless
        prefetch() queued its copy before the verify)."""
        known, self._known = self._known, {}
        if isinstance(drafts, torch.Tensor):
            drafts = self._read(drafts, T)
        return self._upload(self.host_masks(drafts, T, known))

    # -- the draft's proposals (ModelRunner.grammar_spec_round) ----------------------------------------------------
    def _live(self, b: int) -> bool:
        m = self.matchers[b]
        return m is not None and b not in self._refused and not m.terminated

    def _fill_known(self, mask: torch.Tensor, b: int) -> None:
        """mask[b] := the tokens request b may emit after this round's drafts so far, kept as its verify row."""
        self.matchers[b].fill(mask, b)
        self._known[(b, self._walked[b])] = mask[b].clone()

    def step_mask(self, cheap_below: float | None) -> torch.Tensor:
        """int32 [B, words(V)] on the device for the draft's next step: the tokens each request's grammar allows after
        the drafts chosen so far where its recent rows took under ``cheap_below`` seconds to fill (its candidates
        are then all allowed: a JSON schema's forced tokens, which a draft rarely proposes by itself, cost it no
        refill), every token for the others, whose candidates choose() checks one by one (a regular expression over
        a large vocabulary: 1-2 ms a row, filled instead while the verify runs). The rows filled are the verify's.
        ``cheap_below`` None: by the grammar's kind instead of the clock (every rank of a tensor-parallel engine
        then fills the same rows: ModelRunner.grammar_spec_round), a regular expression's rows after the step."""
        if self._walked is None:
            self._walked, self._refused = [0] * len(self.matchers), set()
        mask = torch.full((len(self.matchers), bitmask_words(self.vocab_size)), -1, dtype=torch.int32)
        filled = False
        for b, m in enumerate(self.matchers):
            if self._live(b) and (m.kind != "regex" if cheap_below is None else m.fill_seconds < cheap_below):
                self._fill_known(mask, b)
                filled = True
        if filled:
            return self._upload(mask)
        if self._every is None:
            self._every = self._upload(mask)
        return self._every

    def choose(self, candidates: list[list[int]]) -> tuple[list[int], list[int]]:
        """Each request's next draft among its draft's candidates (best first; step_mask() came first): the first its
        grammar accepts after the drafts chosen before it this round (accepted into its matcher until end_drafts());
        the first candidate where it has no grammar, has ended, or refused a draft before. Returns (the drafts, the
        requests none of whose candidates it accepts: their drafts are placeholders until refill() and take())."""
        chosen, stuck = [], []
        for b, (m, cands) in enumerate(zip(self.matchers, candidates, strict=True)):
            if self._live(b):
                c = next((c for c in cands if m.accept(c)), None)
                if c is not None:
                    self._walked[b] += 1
                    chosen.append(c)
                    continue
                stuck.append(b)
            chosen.append(cands[0])
        return chosen, stuck

    def refill(self, stuck: list[int]) -> torch.Tensor:
        """int32 [B, words(V)] on the device: the tokens the requests ``stuck`` (choose()'s) may emit next, every
        token for the others. The rows filled are the verify's."""
        mask = torch.full((len(self.matchers), bitmask_words(self.vocab_size)), -1, dtype=torch.int32)
        for b in stuck:
            self._fill_known(mask, b)
        return self._upload(mask)

    def take(self, b: int, token: int) -> None:
        """Request b's draft chosen under its refill() row: accepted into its matcher, or, where its grammar refuses it
        too (none of the draft's columns allowed), its later drafts are its draft's own choices."""
        if self.matchers[b].accept(token):
            self._walked[b] += 1
        else:
            self._refused.add(b)

    def end_drafts(self) -> None:
        """The matchers back where the round found them (the drafts rolled back)."""
        walked, self._walked = self._walked, None
        for m, n in zip(self.matchers, walked or [0] * len(self.matchers), strict=True):
            if m is not None:
                m.rollback(n)


def allowed_tokens(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """bool [R, V] from bitmask [R, words(V)] (int32; bit i of word w: token 32 w + i)."""
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    return ((bitmask.unsqueeze(-1) >> shifts) & 1).view(bitmask.shape[0], -1)[:, :vocab_size].bool()


def allowed_columns(bitmask: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """bool [R, C] from bitmask [R, words(V)]: whether row r allows token token_ids[c] (int64 [C], e.g. the target
    ids of a draft's columns). Gathers one word a column instead of expanding the whole row (allowed_tokens), so
    that a draft's proposal masked in a graph reads [R, C] words, not [R, V] bits."""
    words = bitmask[:, token_ids >> 5]
    return ((words >> (token_ids & 31).to(torch.int32)) & 1).bool()


def apply_token_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """float32 logits [R, V] with -inf where bitmask [R, words(V)] has a 0 bit."""
    return logits.float().masked_fill(~allowed_tokens(bitmask, logits.shape[1]), float("-inf"))
