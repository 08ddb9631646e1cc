"""OpenAI function calling on /v1/chat/completions: ``tools``, ``tool_choice``, ``parallel_tool_calls``.

Two ways a call comes out, as SGLang (and vLLM) make them:

- ``tool_choice: "auto"`` (the default with tools): the chat template shows the model the tools, the model writes
  calls in its own format, and the server's ``--tool-call-parser`` reads them out of the text (with a strict tool,
  a call section's arguments are held to the schemas: use_markup). ``kimi_k2`` is the format of Kimi-K2 / K2.5
  (special tokens, so the request decodes with them)::

      <|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>{"a": 1}
      <|tool_call_end|>...<|tool_calls_section_end|>

- ``tool_choice: "required"`` or a named function: the output is constrained (runtime/grammar.py) to calls of the
  allowed tools whose arguments satisfy their parameters' schemas (at most one with ``parallel_tool_calls: false``).
  With the kimi_k2 parser and a tokenizer that holds Kimi's markers as special tokens, in Kimi's own markup above
  (a structural tag requiring the markers as those tokens; a named function called once), as SGLang 0.5.23 forces
  it, and read back as auto's calls are: the model writes what it was trained to write. Otherwise (any model, no
  parser needed) as a JSON array of ``{"name": ..., "parameters": {...}}`` objects, read back as calls.

Call ids: Kimi's own ``functions.NAME:IDX`` (IDX counting the conversation's earlier calls) with the kimi_k2
parser, as SGLang gives them; else ``call_<24 hex>``. ``tool_choice: "none"`` leaves the tools out of the prompt.
"""

from __future__ import annotations

import json
import logging
import re
import uuid
from dataclasses import dataclass

from sglang_eagle3.runtime.grammar import unenforced_json_schema, xgrammar_reason
from sglang_eagle3.runtime.sampling import short_repr
from sglang_eagle3.server.protocol import APIError
from sglang_eagle3.server.reasoning import held_back

logger = logging.getLogger(__name__)

_NAME = re.compile(r"[A-Za-z0-9_\-.]{1,64}")


@dataclass(frozen=True)
class Call:
    name: str
    arguments: str  # JSON text, as OpenAI's ``function.arguments``


class KimiK2Format:
    """Kimi-K2's tool-call markup (its tokenizer's special tokens)."""

    SECTION_BEGIN, SECTION_END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
    CALL_BEGIN, ARG_BEGIN, CALL_END = "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"
    MARKERS = (SECTION_BEGIN, SECTION_END, CALL_BEGIN, ARG_BEGIN, CALL_END)
    # A call's arguments never run past another call's or the section's marker: a call cut short (no end marker)
    # is dropped, not read together with the next one as its arguments.
    _CALL = re.compile(re.escape(CALL_BEGIN) + r"\s*(?P<id>[^\s<|]+)\s*" + re.escape(ARG_BEGIN)
                       + r"\s*(?P<args>(?:(?!" + "|".join(map(re.escape, (CALL_BEGIN, SECTION_BEGIN, SECTION_END)))
                       + r").)*?)\s*" + re.escape(CALL_END), re.DOTALL)
    _ID = re.compile(r"(?:functions\.)?(?P<name>[\w.\-]+):(?P<index>\d+)")

    def start(self, text: str) -> int | None:
        """Where the calls begin in ``text`` (the section's or the first call's marker), or None."""
        found = [i for i in (text.find(self.SECTION_BEGIN), text.find(self.CALL_BEGIN)) if i >= 0]
        return min(found) if found else None

    def calls(self, text: str) -> list[tuple[str, str]]:
        """The complete calls in ``text`` (from start() on): (the call's id as written, arguments)."""
        return [(m.group("id"), m.group("args")) for m in self._CALL.finditer(text)]

    def name(self, call_id: str) -> str | None:
        """The function a call's id names (``functions.NAME:IDX`` or ``NAME:IDX``); "" for a bare counter
        (``3``: the model left the name out; SGLang reads it from the arguments, and so does ToolPlan); None for
        any other id."""
        if call_id.isdecimal():
            return ""
        m = self._ID.fullmatch(call_id)
        return m.group("name") if m else None

    def held_back(self, text: str) -> int:
        """How many characters at the end of ``text`` may be the start of a marker (not shown as content yet)."""
        return held_back(text, (self.SECTION_BEGIN, self.CALL_BEGIN))

    def markup_format(self, allowed: list[tuple[str, dict]], parallel: bool, ids: dict[str, int],
                      forced: bool = True) -> dict:
        """The xgrammar structural-tag format of calls in this markup: a section of calls (at least one; exactly one
        without ``parallel``), each ``functions.NAME:IDX`` of an ``allowed`` (name, parameters schema) with
        arguments that satisfy its schema. ``forced``: the answer is that section; else (tool_choice auto with
        strict tools) free text, in which the section's begin marker opens one (no other marker outside it; without
        ``parallel`` nothing after it). ``ids``: each marker's token id; the markers are required as those tokens
        (spelled out in text they are not the model's markup) and can come nowhere else, not inside an argument's
        string either (runtime/grammar.py grammar_vocab)."""
        def token(marker: str) -> dict:
            return {"type": "token", "token": ids[marker]}

        calls = [{"type": "sequence", "elements": [
            token(self.CALL_BEGIN), {"type": "const_string", "value": f"functions.{name}:"},
            {"type": "regex", "pattern": r"[0-9]{1,6}"}, token(self.ARG_BEGIN),
            {"type": "json_schema", "json_schema": params},
            token(self.CALL_END)]} for name, params in allowed]
        call = calls[0] if len(calls) == 1 else {"type": "or", "elements": calls}
        content = {"type": "plus", "content": call} if parallel else call
        if forced:
            return {"type": "sequence", "elements": [token(self.SECTION_BEGIN), content, token(self.SECTION_END)]}
        return {"type": "token_triggered_tags", "trigger_tokens": [ids[self.SECTION_BEGIN]],
                "tags": [{"type": "tag", "begin": token(self.SECTION_BEGIN), "content": content,
                          "end": token(self.SECTION_END)}],
                "exclude_tokens": [ids[m] for m in self.MARKERS if m != self.SECTION_BEGIN],
                "stop_after_first": not parallel}


_ESCAPES = {"\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escaped_controls(text: str) -> str:
    """JSON ``text`` with the raw control characters inside its strings escaped (a code argument's newlines: xgrammar's
    JSON lets them through, and a strict parser, JSON.parse or json.loads, refuses them); the rest as written.
    SGLang hands such arguments on raw."""
    if not any(c < " " for c in text):
        return text
    out, in_string, escaped = [], False, False
    for c in text:
        if in_string and c < " ":
            c = _ESCAPES.get(c) or f"\\u{ord(c):04x}"
        elif escaped:
            escaped = False
        elif c == "\\" and in_string:
            escaped = True
        elif c == '"':
            in_string = not in_string
        out.append(c)
    return "".join(out)


def _properties(schema) -> set[str]:
    """The argument names a parameters schema declares: its ``properties``, else those of its ``anyOf`` /
    ``oneOf`` / ``allOf`` branches."""
    if not isinstance(schema, dict):
        return set()
    if isinstance(schema.get("properties"), dict):
        return set(schema["properties"])
    return {name for key in ("anyOf", "oneOf", "allOf") if isinstance(schema.get(key), list)
            for branch in schema[key] for name in _properties(branch)}


_FORMATS = {"kimi_k2": KimiK2Format}  # --tool-call-parser name -> the call format it reads
TOOL_CALL_PARSERS = tuple(_FORMATS)


def _tool_error(msg: str, param: str) -> APIError:
    return APIError(400, msg, param=param)


@dataclass
class ToolPlan:
    """How one chat request's tools are used: ``mode`` "auto" (the parser reads calls out of the text) or
    "forced" (the output constrained to calls); ``tools`` what the chat template shows the model: the client's
    list, or with a named function only that one (as SGLang renders it: the model is not shown tools it may not
    call), ``names`` the functions, ``schema`` the forced mode's JSON schema (a JSON array of calls)."""

    mode: str
    tools: list[dict]
    names: list[str]
    parser: str | None
    schema: dict | None
    first_index: int  # calls before this request in the conversation (Kimi's ids count them)
    # (name, parameters schema) of the functions a constrained output may call: forced mode's; auto mode's where a
    # tool is strict (the others' schema an object), else () (auto's calls are then free)
    allowed: tuple[tuple[str, dict], ...] = ()
    parallel: bool = True
    named: bool = False  # forced mode: tool_choice named the function
    # forced mode in the parser's own markup (use_markup), read as tool_choice auto's calls are; else a JSON array
    native: bool = False
    markup: dict[str, int] | None = None  # the markers' ids where the output is constrained in the markup

    @staticmethod
    def of(body, parser: str | None, messages: list[dict]) -> ToolPlan | None:
        """The plan for a ChatCompletionRequest (None: no tools, or tool_choice "none"); 400s naming the field for
        malformed tools, an unknown named function, "auto" on a server without a parser."""
        choice = body.tool_choice
        if body.tools is None:
            if choice not in (None, "none"):
                raise _tool_error(f"tool_choice={short_repr(choice)} needs tools", "tool_choice")
            return None
        if not isinstance(body.tools, list) or not body.tools:
            raise _tool_error("tools must be a non-empty list of {\"type\": \"function\", \"function\": {...}}",
                              "tools")
        names, specs, strict = [], [], []
        for i, tool in enumerate(body.tools):
            fn = tool.get("function") if isinstance(tool, dict) else None
            if not isinstance(tool, dict) or tool.get("type", "function") != "function" or not isinstance(fn, dict):
                raise _tool_error(f"tools[{i}]={short_repr(tool)} must be {{\"type\": \"function\", \"function\": "
                                  "{\"name\": ..., \"parameters\": {...}}}", f"tools.{i}")
            name = fn.get("name")
            if not isinstance(name, str) or not _NAME.fullmatch(name):
                raise _tool_error(f"tools[{i}].function.name={short_repr(name)} must be 1-64 letters, digits, "
                                  "'_', '-' or '.'", f"tools.{i}.function.name")
            if name in names:
                raise _tool_error(f"tools[{i}].function.name={name!r} is given twice", f"tools.{i}.function.name")
            params = fn.get("parameters", {"type": "object", "properties": {}})
            if not isinstance(params, dict):
                raise _tool_error(f"tools[{i}].function.parameters={short_repr(params)} must be a JSON schema "
                                  "(an object)", f"tools.{i}.function.parameters")
            if fn.get("strict") is not None and not isinstance(fn["strict"], bool):
                raise _tool_error(f"tools[{i}].function.strict={short_repr(fn['strict'])} must be a boolean",
                                  f"tools.{i}.function.strict")
            names.append(name)
            specs.append((name, params))
            strict.append(fn.get("strict") is True)
        if choice == "none":
            return None
        parallel = body.parallel_tool_calls is not False
        first = sum(len(m["tool_calls"]) for m in messages
                    if m.get("role") == "assistant" and isinstance(m.get("tool_calls"), list))
        if choice in (None, "auto"):
            if parser is None:
                raise _tool_error("tools with tool_choice 'auto' need the server's --tool-call-parser (one of "
                                  f"{', '.join(TOOL_CALL_PARSERS)}) to read the model's calls; tool_choice "
                                  "'required' or a named function works without one", "tool_choice")
            # Strict tools hold their calls' arguments to their schemas (use_markup), the others to an object.
            allowed = tuple((name, params if st else {"type": "object"})
                            for (name, params), st in zip(specs, strict, strict=True)) if any(strict) else ()
            return ToolPlan("auto", body.tools, names, parser, None, first, allowed, parallel)
        if choice == "required":
            allowed, shown = specs, body.tools
        elif isinstance(choice, dict) and choice.get("type", "function") == "function" \
                and isinstance(choice.get("function"), dict):
            want = choice["function"].get("name")
            allowed = [s for s in specs if s[0] == want]
            shown = [tool for tool, spec in zip(body.tools, specs, strict=True) if spec[0] == want]
            if not allowed:
                raise _tool_error(f"tool_choice names function {short_repr(want)}, which is not among tools "
                                  f"({', '.join(names)})", "tool_choice")
        else:
            raise _tool_error(f"tool_choice={short_repr(choice)} must be 'none', 'auto', 'required' or "
                              "{\"type\": \"function\", \"function\": {\"name\": ...}}", "tool_choice")
        items = [{"type": "object", "properties": {"name": {"const": name}, "parameters": params},
                  "required": ["name", "parameters"], "additionalProperties": False} for name, params in allowed]
        schema = {"type": "array", "minItems": 1, "items": items[0] if len(items) == 1 else {"anyOf": items}}
        if not parallel:
            schema["maxItems"] = 1
        return ToolPlan("forced", shown, names, parser, schema, first, tuple(allowed), parallel, choice != "required")

    def markup_ids(self, tokenizer) -> dict[str, int] | None:
        """The token id of each marker of the parser's call markup where the calls are to be constrained in it
        (forced mode; auto mode with strict tools), each marker is one special token of ``tokenizer`` and xgrammar
        can require tokens (its structural tags' token formats); else None (forced calls are then a JSON array,
        auto's calls free)."""
        fmt = _FORMATS.get(self.parser)
        if not self.allowed or fmt is None or tokenizer is None:
            return None
        try:
            from xgrammar import structural_tag
        except ImportError:
            return None
        if not hasattr(structural_tag, "TokenFormat"):  # (xgrammar before 0.2.x's token formats)
            return None
        ids = {m: tokenizer.encode(m) for m in fmt.MARKERS}
        if not all(len(i) == 1 and i[0] in tokenizer.special_ids for i in ids.values()):
            return None
        return {m: i[0] for m, i in ids.items()}

    def use_markup(self, ids: dict[str, int], thinking_end: int | None = None) -> str:
        """The structural tag (SGLang's ``structural_tag`` sampling parameter) that holds the calls to the parser's
        own markup (``ids``: markup_ids'), as SGLang 0.5.23 constrains them: forced mode, the answer is calls written
        as the model writes them under tool_choice auto (a named function called once whatever
        parallel_tool_calls says, as SGLang's tag forces it; its JSON array allows several), read back as auto's
        are; auto mode with strict tools, free text in which a call section holds strict tools' arguments to their
        schemas (the others' to an object) and, without parallel_tool_calls, one call. ``thinking_end``: the output
        starts inside a thinking (the prompt opened it, and the engine's grammars do not wait for it), free text
        up to that token (the end marker's id), as SGLang's tag holds a reasoning prefix then. 400 as grammar()."""
        import xgrammar  # (markup_ids found it)

        self._check_parameters(xgrammar)
        fmt = _FORMATS[self.parser]()
        self.markup = ids
        if self.mode == "forced":
            self.native = True
            tag = fmt.markup_format(list(self.allowed), self.parallel and not self.named, ids)
        else:
            tag = fmt.markup_format(list(self.allowed), self.parallel, ids, forced=False)
        if thinking_end is not None:
            thinking = {"type": "tag", "begin": "", "content": {"type": "any_text"},
                        "end": {"type": "token", "token": thinking_end}}
            tag = {"type": "sequence", "elements": [thinking, tag]}
        return json.dumps({"type": "structural_tag", "format": tag})

    def _check_parameters(self, xgrammar) -> None:
        """400 naming ``tools`` and the function where a parameters schema states a constraint xgrammar compiles but
        does not keep (what json_schema requests are refused for), or is not one xgrammar reads (its error for the
        whole grammar would quote that grammar, which the client never wrote)."""
        for name, params in self.allowed:
            reason = unenforced_json_schema(params)
            if reason is not None:
                raise APIError(400, f"tools: function {short_repr(name)}'s parameters are not supported: {reason}",
                               param="tools")
            try:
                xgrammar.Grammar.from_json_schema(json.dumps(params))
            except (RuntimeError, ValueError) as e:
                raise APIError(400, f"tools: function {short_repr(name)}'s parameters are not a JSON schema this "
                               f"server can follow: {xgrammar_reason(e)}", param="tools") from None

    def grammar(self) -> str:
        """The forced mode's constraint as a JSON array: ``schema`` as an EBNF grammar of JSON with fixed
        separators (", ", ": ", no other whitespace: a JSON schema would allow any, and a model may then write
        nothing else). 400 naming ``tools`` where a parameters schema is not one xgrammar reads, or without
        xgrammar."""
        try:
            import xgrammar
        except ImportError:
            raise APIError(400, f"tool_choice {self.mode} needs the server's grammar backend (the 'xgrammar' "
                           "package)", param="tool_choice") from None
        self._check_parameters(xgrammar)
        try:
            return str(xgrammar.Grammar.from_json_schema(json.dumps(self.schema), any_whitespace=False))
        except (RuntimeError, ValueError) as e:
            raise APIError(400, f"tools: a function's parameters are not a JSON schema this server can follow: "
                           f"{xgrammar_reason(e)}", param="tools") from None

    # -- reading the output --------------------------------------------------------------------------------
    def parse(self, text: str) -> tuple[str, list[Call]]:
        """(content, calls) of a whole output."""
        if self.mode == "forced" and not self.native:
            try:
                # strict=False: the grammar lets a JSON string hold raw control characters (xgrammar's does);
                # the arguments are written back escaped.
                value = json.loads(text, strict=False)
            except ValueError:  # cut short (max_tokens): no call, the text as content
                return text, []
            calls = [Call(c["name"], json.dumps(c["parameters"], ensure_ascii=False)) for c in value
                     if isinstance(c, dict) and c.get("name") in self.names and "parameters" in c]
            return "", calls
        fmt = _FORMATS[self.parser]()
        start = fmt.start(text)
        if start is None:
            return text, []
        # The content is the text before the calls (as SGLang's and vLLM's kimi_k2 parsers give it, and as
        # ToolStream streams it): text after the section is dropped.
        return text[:start], self._known(fmt.calls(text[start:]))

    def _known(self, raw: list[tuple[str, str]]) -> list[Call]:
        """The calls among ``raw`` (id, arguments) a client can run: a function among the tools (a bare counter's
        read from its arguments, as SGLang reads it), arguments a JSON object (OpenAI clients parse them as one;
        SGLang's kimi_k2 parser reads none that are not brace-delimited). The rest are dropped, logged."""
        fmt = _FORMATS[self.parser]()
        calls = []
        for call_id, args in raw:
            try:
                value = json.loads(args, strict=False)
            except ValueError:
                value = None
            if not isinstance(value, dict):
                logger.warning("the model's call %r has arguments that are not a JSON object (%s); dropped", call_id,
                               short_repr(args))
                continue
            name = fmt.name(call_id)
            if name == "":
                name = self._named_by(value)
            # NOTE: SGLang's JSON-format parsers drop these too; its kimi_k2 parser hands them on.
            if name not in self.names:
                logger.warning("the model called %r (id %r), which is not among the request's tools; dropped", name,
                               call_id)
                continue
            calls.append(Call(name, _escaped_controls(args)))
        return calls

    def _named_by(self, arguments: dict) -> str | None:
        """The tool a call without a name is to: the only one offered, else the one whose parameters' properties
        best cover the arguments' keys (each key it declares counts one, each it does not counts minus one; a
        score below zero names none; the first on a tie), as SGLang infers it."""
        if len(self.names) == 1:
            return self.names[0]
        keys, best, best_score = set(arguments), None, -1
        for tool in self.tools:
            fn = tool["function"]
            props = _properties(fn.get("parameters"))
            if not props:
                continue
            score = len(keys & props) - len(keys - props)
            if score > best_score:
                best, best_score = fn["name"], score
        return best

    def call_id(self, index: int, call: Call) -> str:
        if self.parser == "kimi_k2":
            return f"functions.{call.name}:{self.first_index + index}"
        return f"call_{uuid.uuid4().hex[:24]}"

    def tool_calls(self, calls: list[Call], start: int = 0, with_index: bool = False) -> list[dict]:
        """OpenAI ``tool_calls`` entries for calls start, start + 1, ... (streamed deltas carry their index)."""
        out = []
        for i, c in enumerate(calls, start):
            d = {"id": self.call_id(i, c), "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            out.append({"index": i, **d} if with_index else d)
        return out

    def message(self, text: str, reason: str | None) -> tuple[dict, str | None]:
        """A finished choice's (message, finish_reason): "tool_calls" where calls came and the output stopped."""
        content, calls = self.parse(text)
        msg = {"role": "assistant", "content": content or None}
        if calls:
            msg["tool_calls"] = self.tool_calls(calls)
            if reason == "stop":
                reason = "tool_calls"
        else:
            msg["content"] = content
        return msg, reason

    def streamer(self) -> ToolStream:
        return ToolStream(self)


def parsed_calls(text: str, tools: list, parser: str | None, server_parser: str | None = None) -> dict:
    """SGLang's /parse_function_call answer: the calls in ``text`` as the chat reads them for tool_choice auto
    (ToolPlan.parse; ``parser``'s format, else ``server_parser``, the server's --tool-call-parser): ``{"normal_text":
    the text before the call section (the whole text where there is none, or no tools: SGLang's reads none then),
    "calls": [{"tool_index": the call's place among them, "name", "parameters": its arguments' JSON text}]}``. A call
    to a function not among ``tools`` is left out, as the chat leaves it out (SGLang's kimi_k2 parser keeps it).
    APIError 400s naming the field: an unknown format or none at all, malformed tools."""
    chosen = parser or server_parser
    if chosen not in TOOL_CALL_PARSERS:
        why = "" if parser else " (left out: the server's --tool-call-parser, which is not set)"
        raise _tool_error(f"tool_call_parser={short_repr(chosen)} must be one of {', '.join(TOOL_CALL_PARSERS)}{why}",
                          "tool_call_parser")
    if not tools:
        return {"normal_text": text, "calls": []}
    content, calls = ToolPlan.of(_AutoChoice(tools), chosen, []).parse(text)
    return {"normal_text": content,
            "calls": [{"tool_index": i, "name": c.name, "parameters": c.arguments} for i, c in enumerate(calls)]}


@dataclass(frozen=True)
class _AutoChoice:
    """What ToolPlan.of reads of a request, for a list of tools to read calls to (parsed_calls)."""

    tools: list
    tool_choice: str = "auto"
    parallel_tool_calls: bool | None = None


class ToolStream:
    """One streamed choice: ``feed(text so far, finished)`` -> the deltas to send (content, then each call once
    it is complete; forced mode: the calls at the end)."""

    def __init__(self, plan: ToolPlan):
        self.plan = plan
        self.fmt = _FORMATS[plan.parser]() if plan.mode == "auto" or plan.native else None
        self.sent = 0  # characters of content sent
        self.raw_seen = 0  # complete calls read from the text (known or not)
        self.calls_sent = 0
        self.any_calls = False

    def feed(self, text: str, finished: bool) -> list[dict]:
        if self.fmt is None:  # forced: a JSON array, sent as calls once whole
            if not finished:
                return []
            content, calls = self.plan.parse(text)
            self.any_calls = bool(calls)
            if calls:
                return [{"tool_calls": self.plan.tool_calls(calls, with_index=True)}]
            return [{"content": content}] if content else []
        out = []
        start = self.fmt.start(text)
        visible = len(text) if finished else len(text) - self.fmt.held_back(text)
        if start is not None:
            visible = start
        if visible > self.sent:
            out.append({"content": text[self.sent:visible]})
            self.sent = visible
        if start is not None:
            raw = self.fmt.calls(text[start:])
            calls = self.plan._known(raw[self.raw_seen:])
            self.raw_seen = len(raw)
            if calls:
                out.append({"tool_calls": self.plan.tool_calls(calls, self.calls_sent, True)})
                self.calls_sent += len(calls)
                self.any_calls = True
        return out

    def finish_reason(self, reason: str | None) -> str | None:
        return "tool_calls" if self.any_calls and reason == "stop" else reason
