"""Tool calls and reasoning as a client that runs against SGLang sees them (server/tools.py, server/reasoning.py).

The expected values are written here from SGLang 0.5.23's behaviour on the same model-output strings (its
kimi_k2 tool-call detector and kimi_k2 reasoning parser, driven with these texts during the audit), not from our
parsers: a call whose id is a bare counter (``<|tool_call_begin|>3<|tool_call_argument_begin|>...``) is a call, its
function read from its arguments; arguments that are not a JSON object make no call; Kimi-K2.5's chat template
opens the thinking in the generation prompt (``...<|im_middle|><think>``), so its output is
``thoughts</think>answer`` and reads as reasoning, then content. Streams are cut at every offset and must give
what the whole output gives.
"""

from __future__ import annotations

import json

import pytest

from sglang_eagle3.server.reasoning import REASONING_FORMATS, ReasoningSplitter, ReasoningStream, opened_by_prompt

from .test_tools import (
    ADD,
    MODEL,
    SB,
    SE,
    WEATHER,
    ask,
    call,
    fn,
    obj,
    plan_for,
    scripted_app,
    streamed_message,
)

THINK, END = "<think>", "</think>"
KIMI = REASONING_FORMATS["kimi_k2"]


def calls_of(msg: dict) -> list[tuple[str, dict, str]]:
    return [(c["function"]["name"], json.loads(c["function"]["arguments"]), c["id"])
            for c in msg.get("tool_calls", [])]


def streamed_at_every_cut(plan, text: str) -> tuple[str, list[dict], bool]:
    """ToolStream fed ``text`` grown one character at a time (every chunk boundary there is)."""
    s = plan.streamer()
    deltas = []
    for i in range(len(text) + 1):
        deltas += s.feed(text[:i], i == len(text))
    content = "".join(d.get("content", "") for d in deltas)
    return content, [c for d in deltas for c in d.get("tool_calls", [])], s.any_calls


def check_stream_equals_whole(plan, text: str) -> None:
    msg, reason = plan.message(text, "stop")
    content, calls, any_calls = streamed_at_every_cut(plan, text)
    assert content == (msg["content"] or ""), (text, content, msg)
    assert calls == [{"index": i, **c} for i, c in enumerate(msg.get("tool_calls", []))], (text, calls)
    assert (reason == "tool_calls") == any_calls


# -- tool calls: bare-counter ids ------------------------------------------------------------------------------------

def test_bare_counter_id_is_read_from_the_arguments():
    """SGLang: ``3`` as the id names no function; the one tool offered, else the tool whose properties best cover
    the arguments' keys, is the call's function, and its id is Kimi's ``functions.NAME:IDX`` as for any call."""
    plan = plan_for([WEATHER, ADD])
    text = ("Checking. " + SB + call("0", '{"a": 1, "b": 2}') + call("1", '{"city": "Oslo"}')
            + call("functions.add:2", '{"a": 3, "b": 4}') + SE)
    msg, reason = plan.message(text, "stop")
    assert reason == "tool_calls" and msg["content"] == "Checking. ", msg
    assert calls_of(msg) == [("add", {"a": 1, "b": 2}, "functions.add:0"),
                             ("get_weather", {"city": "Oslo"}, "functions.get_weather:1"),
                             ("add", {"a": 3, "b": 4}, "functions.add:2")]
    check_stream_equals_whole(plan, text)
    # One tool offered: it, whatever the arguments.
    msg, _ = plan_for([ADD]).message(SB + call("7", '{"x": 1}') + SE, "stop")
    assert calls_of(msg) == [("add", {"x": 1}, "functions.add:0")]


def test_bare_counter_scores_ties_and_unions():
    both = fn("both", obj({"a": {"type": "integer"}, "b": {"type": "integer"}}))
    union = fn("union", {"anyOf": [obj({"q": {"type": "string"}}), obj({"page": {"type": "integer"}})]})
    noprops = fn("noprops")
    plan = plan_for([noprops, ADD, both, WEATHER, union])
    for args, want in (('{"a": 1, "b": 2}', "add"),  # a tie (add and both): the first offered
                       ('{"city": "x"}', "get_weather"),
                       ('{"city": "x", "a": 1}', "add"),  # 1 - 1 = 0 for add, both and get_weather: the first
                       ('{"page": 2}', "union"),  # properties of anyOf branches
                       ('{}', "add"),  # no keys: every tool with properties scores 0; the first
                       ('{"zz": 1, "yy": 2}', None)):  # below zero everywhere: no function, no call
        msg, reason = plan.message(SB + call("4", args) + SE, "stop")
        assert [c[0] for c in calls_of(msg)] == ([want] if want else []), (args, msg)
        assert reason == ("tool_calls" if want else "stop")


# -- tool calls: arguments that are not a JSON object ------------------------------------------------------------

@pytest.mark.parametrize("args", ["[1, 2]", '"x"', "not json", '{"a": 1', "", "null", "3"])
def test_arguments_not_a_json_object_make_no_call(args):
    """SGLang's kimi_k2 reads a call's arguments only as ``{...}``; an OpenAI client parses function.arguments as
    a JSON object, so a call without one is dropped (the other calls stay; none left: the reason stays "stop")."""
    plan = plan_for([WEATHER, ADD])
    good = call("functions.get_weather:1", '{"city": "Rome"}')
    text = "ok" + SB + call("functions.add:0", args) + good + SE
    msg, reason = plan.message(text, "stop")
    assert calls_of(msg) == [("get_weather", {"city": "Rome"}, "functions.get_weather:0")] and msg["content"] == "ok"
    assert reason == "tool_calls"
    check_stream_equals_whole(plan, text)
    msg, reason = plan.message("ok" + SB + call("functions.add:0", args) + SE, "stop")
    assert msg == {"role": "assistant", "content": "ok"} and reason == "stop"


def test_arguments_are_handed_on_as_written():
    """A JSON object (pretty-printed) is the model's own text, except that a raw control character inside a string
    is escaped (SGLang hands it on raw, which a strict parser refuses: json.loads below, JavaScript's JSON.parse)."""
    plan = plan_for([WEATHER])
    args = '{\n  "city": "a\tb\\"\x01"\n}'
    with pytest.raises(ValueError):
        json.loads(args)
    msg, _ = plan.message(SB + call("functions.get_weather:0", args) + SE, "stop")
    got = msg["tool_calls"][0]["function"]["arguments"]
    assert json.loads(got) == json.loads(args, strict=False) == {"city": 'a\tb"\x01'}
    assert got == args.replace("\t", "\\t").replace("\x01", "\\u0001")  # (the rest as written)


# -- reasoning: a template that opens the thinking ----------------------------------------------------------------

def test_opened_by_prompt():
    for end, forced in (("<|im_assistant|>assistant<|im_middle|>" + THINK, True), ("x" + THINK + "\n", True),
                        ("<|im_middle|>" + THINK + END, False), ("<|im_middle|>", False), ("", False)):
        assert opened_by_prompt(KIMI, end).forced is forced, end
    assert opened_by_prompt(KIMI, "plain") is KIMI
    forced = REASONING_FORMATS["deepseek-r1"]
    assert opened_by_prompt(forced, "") is forced


# What SGLang's kimi_k2 reasoning parser gives for Kimi-K2.5's output (its force_reasoning on: thinking not false),
# with our whitespace rule (the reasoning stripped, the content's start after the end marker stripped).
K25_CASES = [
    ("I should check.</think>\n\nThe answer.", "I should check.", "The answer."),
    (THINK + "also opened again</think>ok", "also opened again", "ok"),
    ("cut short inside", "cut short inside", ""),
    ("to the tools" + SB + "x" + SE, "to the tools", SB + "x" + SE),
    ("</think>at once", "", "at once"),
]


@pytest.mark.parametrize("text,reasoning,content", K25_CASES)
def test_kimi_k25_output_split_and_streamed_at_every_cut(text, reasoning, content):
    fmt = opened_by_prompt(KIMI, "<|im_middle|>" + THINK)
    assert ReasoningSplitter(fmt).split(text) == (reasoning, content)
    for stream_reasoning in (True, False):
        s, thoughts, last = ReasoningStream(fmt, stream_reasoning), [], ""
        for i in range(len(text) + 1):
            delta, got = s.feed(text[:i], i == len(text))
            thoughts.append(delta)
            assert got.startswith(last), (text, i)
            last = got
        assert ("".join(thoughts), last) == (reasoning, content), (text, stream_reasoning)


# A Kimi-K2.5-like chat template: the generation prompt opens the thinking unless chat_template_kwargs' thinking is
# false (then it writes an empty block); the tools by name.
K25_TEMPLATE = ("{% if tools %}<|tools|>{% for t in tools %} {{ t['function']['name'] }}{% endfor %}\n{% endif %}"
                "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
                "{% if add_generation_prompt %}<|assistant|>\n"
                "{% if thinking is defined and thinking is false %}<think></think>{% else %}<think>{% endif %}"
                "{% endif %}")


@pytest.fixture(scope="module")
def k25(tiny_model, tmp_path_factory, torch_one_thread):
    for app in scripted_app(tiny_model, str(tmp_path_factory.mktemp("k25_model")), (THINK, END),
                            tool_call_parser="kimi_k2", reasoning_parser="kimi_k2"):
        app.tokenizer.set_chat_template(K25_TEMPLATE)
        yield app


def _reasoning_streamed(chunks: list[dict]) -> str:
    return "".join(c["choices"][0]["delta"].get("reasoning_content") or "" for c in chunks)


def test_kimi_k25_template_opens_the_reasoning_end_to_end(k25):
    thought = "The user wants the weather; I should call the tool."
    script = thought + END + "\n\nLet me look. " + SB + call("functions.get_weather:0", '{"city": "Oslo"}') + SE
    room = len(k25.tokenizer.encode(script)) + 2
    whole, chunks = ask(k25, script, {"tools": [WEATHER, ADD], "max_tokens": room, "temperature": 0})
    ch = whole["choices"][0]
    assert ch["message"]["reasoning_content"] == thought and ch["message"]["content"] == "Let me look. ", ch
    assert ch["finish_reason"] == "tool_calls"
    assert calls_of(ch["message"]) == [("get_weather", {"city": "Oslo"}, "functions.get_weather:0")]
    content, calls, reason, _ = streamed_message(chunks)
    assert (_reasoning_streamed(chunks), content, reason) == (thought, "Let me look. ", "tool_calls")
    assert [c["function"] for c in calls] == [c["function"] for c in ch["message"]["tool_calls"]]
    # Cut by max_tokens inside the thinking: all of it is reasoning.
    cut = len(k25.tokenizer.encode(thought[:20]))
    whole, chunks = ask(k25, script, {"max_tokens": cut, "temperature": 0})
    msg = whole["choices"][0]["message"]
    assert msg["content"] == "" and msg["reasoning_content"] and thought.startswith(msg["reasoning_content"]), msg
    assert _reasoning_streamed(chunks) == msg["reasoning_content"]


def test_kimi_k25_thinking_off_is_all_content(k25):
    """chat_template_kwargs thinking false: the template closes the block itself; the output is the answer."""
    whole, chunks = ask(k25, "Just text.", {"max_tokens": 20, "temperature": 0, "model": MODEL,
                                            "chat_template_kwargs": {"thinking": False}})
    assert whole["choices"][0]["message"] == {"role": "assistant", "content": "Just text.", "reasoning_content": None}
    assert _reasoning_streamed(chunks) == ""



def test_a_forced_call_refuses_parameters_xgrammar_would_not_enforce():
    """A forced call's grammar comes from the tools' parameter schemas; a constraint xgrammar compiles but drops
    (uniqueItems here) let calls through that break the schema. It is a 400 naming the function, as json_schema's
    requests are refused; a schema it keeps still compiles."""
    from sglang_eagle3.server.protocol import APIError
    from tests.server.test_tools import plan_for

    def tool(name, params):
        return {"type": "function", "function": {"name": name, "parameters": params}}

    kept = tool("ok", {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]})
    dropped = tool("tags", {"type": "object", "properties": {"t": {"type": "array", "uniqueItems": True}}})
    assert plan_for([kept], tool_choice="required", parser=None).grammar()
    for choice in ("required", {"type": "function", "function": {"name": "tags"}}):
        with pytest.raises(APIError) as e:
            plan_for([kept, dropped], tool_choice=choice, parser=None).grammar()
        assert e.value.status == 400 and e.value.param == "tools"
        assert "function 'tags'" in e.value.message and "uniqueItems would be ignored" in e.value.message
