"""Tool calls held to Kimi-K2's own markup (server/tools.py ToolPlan.use_markup, runtime/grammar.py tag_tokens).

With the kimi_k2 parser and a tokenizer that holds Kimi's markers as special tokens, tool_choice "required" or a
named function constrains the output to one section of calls written as the model writes them by itself (its
markers as their special tokens, arguments that satisfy the function's schema), as SGLang 0.5.23 forces them,
rather than to a JSON array; under tool_choice auto a strict tool's calls are held so within free text; a thinking
the prompt opens is left room where the engine's grammars do not wait for it. Checked against what the tests build
independently: Kimi texts written here from its documented markup (accepted token by token; each broken variant
refused), random walks through the grammar's own masks read back by the parser and checked against the schemas
with test_tools' hand-written checker, plain decoding (EAGLE-3's and two ranks' outputs equal it), and the served
answer (calls, ids, the stream equal to the whole answer) on the tiny pair with a marker tokenizer.
"""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_eagle3.runtime.grammar import GrammarBackend, GrammarSpec
from sglang_eagle3.tokenizer import load_tokenizer

from .grammar_walk import random_walk
from .test_http_fuzz import EXAMPLES, FUZZ, _encode, chat_bodies, check, schema
from .test_reasoning import thinking_model  # noqa: F401  (a fixture: the tiny pair, the markers as tokens)
from .test_tools import (
    AB,
    CB,
    CE,
    COUNT,
    FLAG,
    FORCED_TOOLS,
    IM_END,
    PICK,
    PING,
    SB,
    SE,
    WEATHER,
    ask,
    call,
    params_of,
    plan_for,
    schema_errors,
    scripted_app,
    streamed_message,
    write_marker_tokenizer,
)

xgrammar = pytest.importorskip("xgrammar")
if not hasattr(getattr(xgrammar, "structural_tag", None), "TokenFormat"):
    pytest.skip("this xgrammar has no token formats in its structural tags", allow_module_level=True)


@pytest.fixture(scope="module")
def marker_tok(tiny_model, tmp_path_factory):
    d = tmp_path_factory.mktemp("marker_tok")
    write_marker_tokenizer(str(d), tiny_model.vocab_size)
    return load_tokenizer(str(d))


@pytest.fixture(scope="module")
def backend(marker_tok, tiny_model):
    return GrammarBackend(marker_tok, tiny_model.vocab_size, [marker_tok.encode(IM_END)[0]])


@pytest.fixture(scope="module")
def scripted(tiny_model, tmp_path_factory, torch_one_thread):
    """test_tools' ``scripted`` app (the tiny pair, Kimi's markers in its tokenizer, --tool-call-parser kimi_k2),
    its engine bounding a JSON value's whitespace runs (the tiny model pads with whitespace until max_tokens
    otherwise, and few forced answers would finish), with Kimi's turn end as its EOS (a grammar that lets the text
    run free, auto's with strict tools, is complete at once on an engine without one, which then stops there)."""
    yield from scripted_app(tiny_model, str(tmp_path_factory.mktemp("markup_model")),
                            engine_args={"constrained_json_max_whitespace_cnt": 1}, eos=IM_END,
                            tool_call_parser="kimi_k2")


def _named(name: str) -> dict:
    return {"type": "function", "function": {"name": name}}


def _spec(plan, tok) -> GrammarSpec:
    ids = plan.markup_ids(tok)
    assert ids is not None
    return GrammarSpec("structural_tag", plan.use_markup(ids))


def _walk(backend, spec: GrammarSpec, ids: list[int]) -> int:
    """How many of ``ids`` the grammar accepts before it refuses one (len(ids): all)."""
    m = backend.matcher(spec)
    for i, t in enumerate(ids):
        if not m.accept(t):
            return i
    return len(ids)


def test_markup_ids_only_where_the_tokenizer_holds_the_markers(marker_tok, tiny_model):
    """The markers' ids with the marker tokenizer; None (the JSON array then) for the tiny model's own tokenizer
    (no such special tokens), for tool_choice auto without a strict tool, and without the kimi_k2 parser."""
    plan = plan_for(FORCED_TOOLS, tool_choice="required")
    got = plan.markup_ids(marker_tok)
    assert got == {m: marker_tok.encode(m)[0] for m in (SB, SE, CB, AB, CE)}
    assert set(got.values()) <= marker_tok.special_ids
    assert plan.markup_ids(load_tokenizer(tiny_model.target)) is None
    assert plan_for(FORCED_TOOLS, tool_choice="auto").markup_ids(marker_tok) is None
    assert plan_for(FORCED_TOOLS, tool_choice="required", parser=None).markup_ids(marker_tok) is None


@pytest.mark.parametrize("parallel", [True, False])
def test_kimi_calls_are_accepted_and_broken_ones_refused(marker_tok, backend, parallel):
    """A section of calls as Kimi writes them is accepted, then the turn's end; each way of breaking it is refused
    at some token (before its end)."""
    tok = marker_tok
    stop = tok.encode(IM_END)[0]
    plan = plan_for(FORCED_TOOLS + [WEATHER], tool_choice="required", parallel=parallel)
    spec = _spec(plan, tok)
    one = call("functions.count:0", json.dumps({"n": 7, "tag": "ab"}))
    two = call("functions.pick:1", json.dumps({"color": "green", "ok": False}))
    good = SB + one + (two if parallel else "") + SE
    ids = tok.encode(good) + [stop]
    assert _walk(backend, spec, ids) == len(ids)
    m = backend.matcher(spec)
    assert all(m.accept(t) for t in ids) and m.terminated

    spelled = [t for piece in ("<|", "tool_calls_section_begin", "|>") for t in tok.encode(piece)]
    assert tok.decode(spelled, skip_special_tokens=False) == SB and tok.encode(SB)[0] not in spelled
    broken = {
        "text before the section": "Sure. " + good,
        "a function not offered": SB + call("functions.nope:0", "{}") + SE,
        "arguments against the schema": SB + call("functions.flag:0", '{"on": "yes"}') + SE,
        "a missing required argument": SB + call("functions.count:0", '{"n": 1}') + SE,
        "a marker inside a string": SB + call("functions.get_weather:0", '{"city": "a' + CE + '"}') + SE,
        "no call at all": SB + SE,
        "no index": SB + CB + "functions.flag:" + AB + '{"on": true}' + CE + SE,
    }
    if not parallel:
        broken["a second call"] = SB + one + two + SE
    for why, text in broken.items():
        t = tok.encode(text)
        assert _walk(backend, spec, t) < len(t), why
    assert _walk(backend, spec, spelled) == 0
    # the section must end before the turn does
    t = tok.encode(SB + one) + [stop]
    assert _walk(backend, spec, t) == len(t) - 1


def test_a_named_function_is_called_once(marker_tok, backend):
    """Only the named function, once even with parallel_tool_calls (as SGLang forces it in Kimi's markup)."""
    tok = marker_tok
    plan = plan_for(FORCED_TOOLS, tool_choice=_named("flag"), parallel=True)
    spec = _spec(plan, tok)
    one = call("functions.flag:3", '{"on": true}')
    ok = tok.encode(SB + one + SE)
    assert _walk(backend, spec, ok) == len(ok)
    for text in (SB + call("functions.ping:0", "{}") + SE, SB + one + one + SE):
        assert _walk(backend, spec, tok.encode(text)) < len(tok.encode(text)), text


def test_arguments_with_raw_control_characters_are_written_back_escaped():
    """A string argument holding a raw newline or tab (xgrammar's JSON lets them through; a model writing code
    does) reaches the client as JSON a strict parser reads, with the same value; well-formed arguments are passed
    on as written (spacing kept)."""
    value = {"code": "def f():\n\treturn 1", "n": 1}
    raw = '{"code": "def f():\n\treturn 1",  "n": 1}'  # (raw newline and tab inside the string)
    assert "\n" in raw
    plan = plan_for(FORCED_TOOLS + [WEATHER], tool_choice="auto")
    msg, _ = plan.message(SB + call("functions.get_weather:0", raw) + call("functions.flag:1", '{"on":  true}') + SE,
                          "stop")
    got = [c["function"]["arguments"] for c in msg["tool_calls"]]
    assert json.loads(got[0]) == value and got[1] == '{"on":  true}'


def test_a_tag_naming_special_tokens_requires_them_and_nothing_else_writes_them(marker_tok, backend):
    """SGLang's structural_tag parameter with token formats: a special token named by id or by its text is required
    there as that token (its text spelled out is refused), and comes nowhere else: not in a JSON string of the same
    tag, nor in an ordinary grammar compiled after it (the base vocabulary still has no text for it). A few
    compilers exposing tokens are kept, the base one always."""
    tok = marker_tok
    sb, ce = tok.encode(SB)[0], tok.encode(CE)[0]
    for ref in (sb, SB):
        tag = {"type": "structural_tag", "format": {"type": "sequence", "elements": [
            {"type": "token", "token": ref}, {"type": "json_schema", "json_schema": {"type": "string"}},
            {"type": "token", "token": CE}]}}
        spec = GrammarSpec("structural_tag", json.dumps(tag))
        ids = tok.encode(SB + '"a b"' + CE)
        assert ids[0] == sb and ids[-1] == ce and _walk(backend, spec, ids) == len(ids)
        spelled = tok.encode("<|") + tok.encode("tool_calls_section_begin|>")
        assert _walk(backend, spec, spelled) == 0
        inside = tok.encode(SB + '"a' + CE + '"' + CE)
        assert _walk(backend, spec, inside) == inside.index(ce)  # (refused inside the string)
    plain = GrammarSpec("json_schema", json.dumps({"type": "string"}))
    ids = tok.encode('"a' + SB + '"')
    assert _walk(backend, plain, ids) == ids.index(sb)
    for i in range(GrammarBackend.MAX_EXPOSING + 3):  # (each a different set of named tokens: a compiler each)
        marker = (SB, SE, CB, AB, CE)[i % 5]
        tag = {"type": "structural_tag", "format": {"type": "sequence", "elements": [
            {"type": "token", "token": marker}, {"type": "const_string", "value": "x" * (1 + i)}]
            + [{"type": "token", "token": m} for m in (SB, SE, CB, AB, CE)[:1 + i // 5]]}}
        backend.compile(GrammarSpec("structural_tag", json.dumps(tag)))
    assert frozenset() in backend._compilers and len(backend._compilers) <= GrammarBackend.MAX_EXPOSING + 1


@pytest.mark.parametrize("parallel", [True, False])
def test_random_walks_read_back_as_valid_calls(marker_tok, backend, parallel):
    """Whatever the grammar lets a model write (random tokens among those allowed, a fresh seed) reads back as
    calls of the offered functions whose arguments satisfy their schemas, one call per call marker written, Kimi's
    ids; at most one call without parallel_tool_calls."""
    tok = marker_tok
    stop = tok.encode(IM_END)[0]
    tools = [PICK, COUNT, FLAG, PING]
    by_name = {t["function"]["name"]: t for t in tools}
    plan = plan_for(tools, tool_choice="required", parallel=parallel)
    spec = _spec(plan, tok)
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    done = 0
    for _ in range(12):
        out = random_walk(backend, spec, stop, rng, 400)
        if out is None:
            continue
        done += 1
        text = tok.decode(out, skip_special_tokens=False)
        msg, reason = plan.message(text, "stop")
        n = out.count(tok.encode(CB)[0])
        assert reason == "tool_calls" and msg["content"] is None, (seed, text, msg)
        assert len(msg["tool_calls"]) == n >= 1 and (parallel or n == 1), (seed, text)
        for i, c in enumerate(msg["tool_calls"]):
            name = c["function"]["name"]
            args = json.loads(c["function"]["arguments"])
            assert not schema_errors(args, params_of(by_name[name])), (seed, text, args)
            assert c["id"] == f"functions.{name}:{i}"
    assert done >= 3, seed


def test_forced_calls_served_in_kimis_markup(scripted):
    """The tiny pair served with the marker tokenizer and the kimi_k2 parser: a forced request reaches the engine
    as a structural tag decoded with its special tokens; every finished choice is calls of the allowed tools with
    schema-valid arguments and Kimi's ids, a cut one (max_tokens) the calls completed before the cut; the stream
    gives the same."""
    tools = [PICK, COUNT, FLAG, PING]
    by_name = {t["function"]["name"]: t for t in tools}
    finished = 0
    for choice, allowed in (("required", tools), (_named("count"), [COUNT])):
        for parallel in (True, False):
            for sampling in ({"temperature": 0}, {"temperature": 1.0, "seed": random.randrange(1000)}):
                body = {"tools": tools, "tool_choice": choice, "parallel_tool_calls": parallel, "max_tokens": 80,
                        **sampling}
                whole, chunks = ask(scripted, None, body)
                assert scripted.seen and all(p.structural_tag and p.skip_special_tokens is False
                                             for p in scripted.seen), scripted.seen
                assert json.loads(scripted.seen[0].structural_tag)["type"] == "structural_tag"
                ch = whole["choices"][0]
                msg = ch["message"]
                content, calls, reason, _ = streamed_message(chunks)
                assert reason == ch["finish_reason"] and calls == [{"index": i, **c} for i, c in
                                                                   enumerate(msg.get("tool_calls", []))]
                assert content == (msg["content"] or "")
                assert ch["finish_reason"] in ("tool_calls", "length"), ch
                if ch["finish_reason"] == "tool_calls":
                    finished += 1
                    assert msg["content"] is None and len(msg["tool_calls"]) >= 1, ch
                else:
                    assert not msg["content"], ch  # (the section starts the answer: nothing before it)
                assert (parallel and choice == "required") or len(msg.get("tool_calls", [])) <= 1, ch
                names = {t["function"]["name"] for t in allowed}
                for i, c in enumerate(msg.get("tool_calls", [])):
                    name = c["function"]["name"]
                    assert name in names and c["id"] == f"functions.{name}:{i}", c
                    args = json.loads(c["function"]["arguments"])
                    assert not schema_errors(args, params_of(by_name[name])), args
    assert finished >= 2


def test_unsupported_parameters_are_400_in_markup_too(scripted):
    """A parameters schema xgrammar would keep only in part, or cannot read (an unclosed pattern), is refused with
    a 400 naming tools and the function, forced or strict under auto, as for the JSON array (not the structural
    tag's own error, which would quote a tag the client never wrote)."""
    import asyncio

    import httpx

    def fn(params, strict=None):
        return {"type": "function", "function": {"name": "f", "parameters": params,
                                                 **({} if strict is None else {"strict": strict})}}

    async def go(tools, choice):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=scripted.app), base_url="http://t") as c:
            return await c.post("/v1/chat/completions", json={"model": "tiny", "messages": [
                {"role": "user", "content": "hi"}], "tools": tools, "tool_choice": choice, "max_tokens": 2})

    partial = {"type": "object", "properties": {"x": {"not": {"type": "string"}}}}
    unreadable = {"type": "object", "properties": {"x": {"type": "string", "pattern": "(("}}}
    for params, words in ((partial, "not"), (unreadable, "parenthesis")):
        for tools, choice in (([fn(params)], "required"), ([fn(params, True)], "auto")):
            r = asyncio.run(go(tools, choice))
            err = r.json()["error"]
            assert r.status_code == 400 and err["param"] == "tools", r.text
            assert "'f'" in err["message"] and words in err["message"] and "structural_tag" not in err["message"]
    # a non-strict tool's schema is not followed under auto, so not checked either
    assert asyncio.run(go([fn(unreadable, False)], "auto")).status_code == 200
    # the JSON array's path (a tokenizer without the markers) names the function too
    from sglang_eagle3.server.protocol import APIError

    with pytest.raises(APIError) as e:
        plan_for([fn(unreadable)], tool_choice="required").grammar()
    assert e.value.param == "tools" and "'f'" in str(e.value) and "parenthesis" in str(e.value)


def test_thinking_then_calls_in_markup_and_speculation_is_exact(thinking_model):  # noqa: F811
    """An engine with the kimi_k2 reasoning parser and strict thinking, a prompt that opens the thinking, the forced
    markup's structural tag: the output thinks for its budget (free of the markup), ends the thinking, then opens
    the call section at once; a finished section reads back as schema-valid calls. EAGLE-3's output equals plain
    decoding's, greedy and sampled (the masks of the compiler exposing the markers are the same for both), and so
    does plain decoding's over two tensor-parallel worker processes (each rank compiles the tag over its own
    vocabulary; the tiny draft's one KV head does not split two ways)."""
    from sglang_eagle3 import Engine

    rng = random.Random()
    tools = [PICK, COUNT, FLAG, PING]
    by_name = {t["function"]["name"]: t for t in tools}
    # (two of the three requests one call each: a parallel section may go on calling past max_new_tokens)
    plans = [plan_for(tools, tool_choice="required", parallel=p) for p in (False, False, True)]
    prompts = [" ".join(rng.choice(["pack", "my", "box", "quartz"]) for _ in range(rng.randint(2, 6))) + "<think>"
               for _ in range(3)]
    budgets = [rng.randint(0, 5) for _ in prompts]
    seed = rng.randrange(1 << 30)
    outputs = {}
    for spec in ("plain", "eagle3", "plain tp2"):
        extra = dict(speculative_algorithm="EAGLE3", speculative_draft_model_path=thinking_model[1],
                     speculative_num_steps=3) if spec == "eagle3" else {}
        if spec == "plain tp2":
            extra["tp_size"] = 2
        # (a whitespace bound: the tiny model pads a tag's JSON with whitespace until max_new_tokens otherwise)
        eng = Engine(model_path=thinking_model[0], device="cpu", log_level="warning", reasoning_parser="kimi_k2",
                     enable_strict_thinking=True, constrained_json_max_whitespace_cnt=1, **extra)
        tok = eng.tokenizer
        # (</think> pushed down: the thinking lasts its budget, which then ends it)
        params = [{"temperature": 0, "max_new_tokens": 150, "structural_tag": plan.use_markup(plan.markup_ids(tok)),
                   "skip_special_tokens": False, "logit_bias": {tok.encode("</think>")[0]: -100.0},
                   "custom_params": {"thinking_budget": b}} for plan, b in zip(plans, budgets, strict=True)]
        params[2] = dict(params[2], temperature=1.0, seed=seed)
        outputs[spec] = [o["output_ids"] for o in eng.generate(prompts, params)]
        eng.shutdown()
    assert outputs["eagle3"] == outputs["plain"] and outputs["plain tp2"] == outputs["plain"], seed
    [end], [sb], [se] = tok.encode("</think>"), tok.encode(SB), tok.encode(SE)
    finished = 0
    for ids, budget, plan in zip(outputs["plain"], budgets, plans, strict=True):
        assert end not in ids[:budget] and ids[budget] == end and ids[budget + 1] == sb, (budget, ids)
        assert sb not in ids[:budget], ids
        if se not in ids:
            continue
        finished += 1
        msg, reason = plan.message(tok.decode(ids[budget + 1:], skip_special_tokens=False), "stop")
        assert reason == "tool_calls" and msg["content"] is None, msg
        for c in msg["tool_calls"]:
            args = json.loads(c["function"]["arguments"])
            assert not schema_errors(args, params_of(by_name[c["function"]["name"]])), args
    assert finished >= 1, [tok.decode(ids, skip_special_tokens=False) for ids in outputs["plain"]]


# -- tool_choice auto with strict tools ------------------------------------------------------------------------------

def _strict(tool: dict) -> dict:
    return {**tool, "function": {**tool["function"], "strict": True}}


@pytest.mark.parametrize("parallel", [True, False])
def test_auto_with_strict_tools_holds_only_the_calls(marker_tok, backend, parallel):
    """tool_choice auto with a strict tool (SGLang 0.5.23 constrains these): text runs free until the section's
    marker opens calls; a strict tool's arguments must satisfy its schema, a non-strict one's be an object; no
    other marker comes in the text; without parallel_tool_calls one call, and nothing after the section."""
    tok = marker_tok
    stop = tok.encode(IM_END)[0]
    plan = plan_for([_strict(COUNT), FLAG], tool_choice="auto", parallel=parallel)
    spec = _spec(plan, tok)
    good = "Let me count. " + SB + call("functions.count:0", '{"n": 3, "tag": "x"}') + SE
    for text in (good, "No calls needed.", SB + call("functions.flag:0", '{"any": [1, {"thing": null}]}') + SE):
        ids = tok.encode(text) + [stop]
        assert _walk(backend, spec, ids) == len(ids), text
    broken = {
        "a strict tool's arguments against its schema": SB + call("functions.count:0", '{"n": "3", "tag": "x"}') + SE,
        "a non-strict tool's arguments not an object": SB + call("functions.flag:0", "[1]") + SE,
        "a call marker outside a section": "Hm " + call("functions.count:0", '{"n": 3, "tag": "x"}'),
        "a function not offered": SB + call("functions.nope:0", "{}") + SE,
    }
    if not parallel:
        broken["a second call"] = SB + call("functions.flag:0", "{}") + call("functions.flag:1", "{}") + SE
        broken["text after the section"] = good + "and more"
    for why, text in broken.items():
        ids = tok.encode(text)
        assert _walk(backend, spec, ids) < len(ids), why
    # without a strict tool, auto's calls are free (no grammar)
    assert plan_for([COUNT, FLAG], tool_choice="auto").markup_ids(tok) is None


def test_strict_must_be_a_boolean():
    from sglang_eagle3.server.protocol import APIError

    bad = {**FLAG, "function": {**FLAG["function"], "strict": "yes"}}
    with pytest.raises(APIError) as e:
        plan_for([COUNT, bad], tool_choice="auto")
    assert e.value.param == "tools.1.function.strict" and "'yes'" in str(e.value)


def test_auto_with_strict_tools_served(scripted):
    """Served (the tiny pair, the section's marker pushed by logit_bias so that the model opens calls): the engine
    gets the structural tag, and every call that comes is of an offered tool, a strict one's arguments satisfying
    its schema; the stream gives the same."""
    tools = [_strict(COUNT), _strict(PICK), FLAG]
    by_name = {t["function"]["name"]: t for t in tools}
    sb = scripted.tokenizer.encode(SB)[0]
    came = 0
    for parallel in (True, False):
        for sampling in ({"temperature": 0}, {"temperature": 1.0, "seed": random.randrange(1000)}):
            body = {"tools": tools, "parallel_tool_calls": parallel, "max_tokens": 80, "logit_bias": {str(sb): 30.0},
                    **sampling}
            whole, chunks = ask(scripted, None, body)
            assert all(json.loads(p.structural_tag)["type"] == "structural_tag" for p in scripted.seen)
            ch = whole["choices"][0]
            content, calls, reason, _ = streamed_message(chunks)
            assert reason == ch["finish_reason"] and calls == [{"index": i, **c} for i, c in
                                                               enumerate(ch["message"].get("tool_calls", []))]
            for c in ch["message"].get("tool_calls", []):
                came += 1
                name = c["function"]["name"]
                args = json.loads(c["function"]["arguments"])
                assert name in by_name and isinstance(args, dict), c
                if by_name[name]["function"].get("strict"):
                    assert not schema_errors(args, params_of(by_name[name])), args
            assert parallel or len(ch["message"].get("tool_calls", [])) <= 1
    assert came >= 1


def test_a_thinking_the_prompt_opens_is_left_room(tiny_model, tmp_path_factory):
    """A thinking model (<think> / </think> special tokens), forced calls and strict tools under auto: where the chat
    template opens the thinking (the prompt ends with <think>) and the engine's grammars do not wait for it, the
    markup's tag starts with free text up to </think> (no grammar lets a special token into free text, so the
    thinking could not end otherwise; SGLang's tag holds a reasoning prefix then); with the engine waiting (its
    reasoning_parser), or a prompt that opens none, it does not. Served with </think> pushed: the output ends the
    thinking, then the forced section's calls come, and the server's reasoning parser splits the (empty)
    thinking off."""
    from .test_tools import NAMES_TEMPLATE

    opening = NAMES_TEMPLATE.replace("<|assistant|>\n{% endif %}", "<|assistant|>\n<think>{% endif %}")
    assert opening != NAMES_TEMPLATE
    seen = {}
    for waits in (False, True):
        for app in scripted_app(tiny_model, str(tmp_path_factory.mktemp("think_room")), ("<think>", "</think>"),
                                engine_args={"constrained_json_max_whitespace_cnt": 1,
                                             **({"reasoning_parser": "kimi_k2"} if waits else {})},
                                eos=IM_END, tool_call_parser="kimi_k2", reasoning_parser="kimi_k2"):
            end = app.tokenizer.encode("</think>")[0]
            for template in (NAMES_TEMPLATE, opening):
                app.tokenizer.set_chat_template(template)
                for choice, tools in (("required", [COUNT, FLAG]), ("auto", [_strict(COUNT), FLAG])):
                    # (the tag is what the other cases check: a few tokens do)
                    room_forced = template == opening and not waits and choice == "required"
                    whole, _ = ask(app, None, {"tools": tools, "tool_choice": choice, "parallel_tool_calls": False,
                                               "max_tokens": 60 if room_forced else 2,
                                               "logit_bias": {str(end): 30.0}, "temperature": 0})
                    tags = {p.structural_tag for p in app.seen}
                    assert len(tags) == 1 and None not in tags, tags
                    fmt = json.loads(tags.pop())["format"]
                    room = fmt["type"] == "sequence" and fmt["elements"][0].get("end") == {"type": "token",
                                                                                         "token": end}
                    seen[(waits, template == opening, choice)] = room
                    msg = whole["choices"][0]["message"]
                    if room_forced:  # (</think> first, then one call: the thinking is split off, empty)
                        assert whole["choices"][0]["finish_reason"] == "tool_calls", whole
                        assert msg["reasoning_content"] == "" and msg["content"] is None, msg
                        assert len(msg["tool_calls"]) == 1 and msg["tool_calls"][0]["function"]["name"] in (
                            "count", "flag"), msg
    assert seen == {(waits, opens, choice): opens and not waits for waits in (False, True)
                    for opens in (False, True) for choice in ("required", "auto")}, seen


def _markup_bodies() -> st.SearchStrategy:
    """Chat bodies that mostly reach the markup's structural tag: well-formed tools (test_http_fuzz's odd schemas
    among their parameters, strict or not), each tool_choice, parallel or not, streamed or not, n, a grammar beside
    them at times (a 400), odd fields of test_http_fuzz's chat bodies now and then."""
    tool = st.builds(lambda name, params, strict: {"type": "function", "function": {
        "name": name, "parameters": params, **({} if strict is None else {"strict": strict})}},
        st.sampled_from(["f", "g", "get.weather-2"]), schema, st.sampled_from([None, True, False]))
    tools = st.lists(tool, min_size=1, max_size=3, unique_by=lambda t: t["function"]["name"])
    choice = st.sampled_from(["auto", "required", {"type": "function", "function": {"name": "f"}}])
    body = st.fixed_dictionaries(
        {"model": st.just("tiny"), "messages": st.just([{"role": "user", "content": "hi"}]), "tools": tools,
         "tool_choice": choice, "max_tokens": st.integers(1, 24)},
        optional={"parallel_tool_calls": st.booleans(), "stream": st.booleans(), "n": st.integers(1, 2),
                  "temperature": st.sampled_from([0, 1.0]), "response_format": st.just({"type": "json_object"})})
    return st.one_of(body, body, body, chat_bodies())


@settings(FUZZ, max_examples=max(20, EXAMPLES // 2))
@given(body=_markup_bodies())
def test_chat_fuzz_with_the_markup(scripted, body):
    """Chat bodies with tools on a server whose tokenizer holds Kimi's markers, so that forced calls and strict tools
    take the markup's structural tag (test_http_fuzz's rule): a 2xx or a 4xx in the error shape, never a 500, the
    engine thread alive."""
    check((scripted.app, scripted.driver), "POST", "/v1/chat/completions", _encode(body))


def test_anthropic_and_responses_strict_tools_take_the_markup(scripted):
    """Anthropic's strict tool use (``strict`` on a tool) and the Responses API's strict functions reach the chat's
    tools: under auto the engine gets the markup's structural tag; a strict that is not a boolean is a 400 naming
    it on each API."""
    import asyncio

    import httpx

    schema = params_of(COUNT)

    async def go(path, body):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=scripted.app), base_url="http://t") as c:
            return await c.post(path, json=body)

    anthropic = {"model": "tiny", "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}],
                 "tools": [{"name": "count", "input_schema": schema, "strict": True}]}
    responses = {"model": "tiny", "max_output_tokens": 3, "input": "hi",
                 "tools": [{"type": "function", "name": "count", "parameters": schema, "strict": True}]}
    for path, body in (("/v1/messages", anthropic), ("/v1/responses", responses)):
        scripted.seen.clear()
        r = asyncio.run(go(path, body))
        assert r.status_code == 200, r.text
        assert scripted.seen and all(json.loads(p.structural_tag)["format"]["type"] == "token_triggered_tags"
                                     for p in scripted.seen), path
        body["tools"][0]["strict"] = "yes"
        r = asyncio.run(go(path, body))
        assert r.status_code == 400 and "'yes'" in r.text, r.text
        assert "tools.0.strict" in json.dumps(r.json()), r.text
