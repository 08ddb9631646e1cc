"""Findings of an audit of /v1/chat/completions' request ``messages`` against SGLang 0.5.23's Jinja path
(sglang/srt/entrypoints/openai/serving_chat.py ``_apply_jinja_template``, ``_handle_last_assistant_message``,
``_validate_media_content``, ``_validate_request``; protocol.py's message models; parser/jinja_template_utils.py's
``detect_jinja_template_content_format`` and ``process_content_for_template_format``), as a client written for SGLang
meets it. The expected prompts are built here by SGLang's rules from the template, never from our own output:

- A list of text parts reached every template as their texts joined by a newline. SGLang joins them by a space for a
  template that reads a string, and hands the parts themselves to one that loops over a message's content (detected
  from the template's source); a tool message's parts are always joined by a space.
- An image, audio or video part was a 400 that only said "expected one of str, list[TextPart]"; now it names the
  part and says the model takes text only (SGLang: "Model only supports text input"). Thinking parts, which
  SGLang's Jinja path drops unread, are a 400 pointing to ``reasoning_content``.
- continue_final_message: the continued text was encoded together with the rendered prompt; SGLang encodes it on its
  own and appends its ids (a leading BOS dropped), which differs where the generation prompt ends in a space.
- A history tool call's ``function.arguments`` (JSON text) reached the template as text: a template writing
  ``arguments | tojson`` (Llama 3.1's) escaped it a second time. SGLang parses it into the object it holds, and
  refuses arguments that are not a JSON object (now a 400 naming them).
- ``chat_template_kwargs.chat_template`` was passed as a variable no template reads: the request rendered with the
  server's template without a word. SGLang refuses it (without --trust-request-chat-template); now a 400.
- ``name``, ``tool_call_id`` and ``reasoning_content`` of any JSON type went to the template; SGLang's messages
  take strings. Now a 400 naming the field.
"""

from __future__ import annotations

import json

import pytest

from sglang_eagle3.tokenizer import chat_content_format

from .conftest import CONTEXT, asgi_post, served_app, spec_engine

MODEL = "tiny"
CHAT = [{"role": "user", "content": "The quick brown fox"}]

# A template that reads content parts (it loops over message['content']) as Llama 4's or Gemma 3's do.
PARTS_TEMPLATE = ("{% for message in messages %}<|{{ message['role'] }}|>"
                  "{% if message['content'] is string %}{{ message['content'] }}"
                  "{% else %}{% for part in message['content'] %}[{{ part['type'] }}:{{ part['text'] }}]{% endfor %}"
                  "{% endif %}{{ '\\n' }}{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
# A generation prompt that ends in a space ("ASSISTANT: "-style templates).
SPACE_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }}\n{% endfor %}"
                  "{% if add_generation_prompt %}<|assistant|> {% endif %}")
# Writes a history call's arguments with tojson (Llama 3.1's way) and the message's name.
CALLS_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}{% if m.name is defined %}:{{ m.name }}{% endif %}|>"
                  "{% if m.tool_calls is defined %}{% for tc in m.tool_calls %}{{ tc.function.name }}"
                  "{{ tc.function.arguments | tojson }}{% endfor %}{% endif %}{{ m['content'] }}\n{% endfor %}"
                  "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")


@pytest.fixture(scope="module")
def engine(tiny_model):
    with spec_engine(tiny_model, max_running_requests=4) as eng:
        yield eng


@pytest.fixture
def app(engine):
    with served_app(engine, served_model_name=MODEL) as app:
        yield app


@pytest.fixture
def use_template(engine):
    """Sets the tokenizer's chat template for one test (restored after)."""
    tok = engine.tokenizer
    saved = (tok.chat_template, tok.has_own_chat_template, tok.named_chat_templates)
    yield tok.set_chat_template
    tok.chat_template, tok.has_own_chat_template, tok.named_chat_templates = saved


_call = asgi_post


def _tokens(app, body: dict) -> list[int]:
    r = _call(app, "/v1/tokenize", {"model": MODEL, **body})
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


def _prompt_tokens(app, body: dict) -> int:
    r = _call(app, "/v1/chat/completions", {"model": MODEL, "max_tokens": 1, **body})
    assert r.status_code == 200, r.text
    return r.json()["usage"]["prompt_tokens"]


def _error(app, path: str, body: dict) -> dict:
    r = _call(app, path, {"model": MODEL, "max_tokens": 1, **body} if "chat" in path else {"model": MODEL, **body})
    assert r.status_code == 400, (r.status_code, r.text)
    return r.json()["error"]


def _both_refuse(app, body: dict, param: str, *words: str) -> None:
    for path in ("/v1/chat/completions", "/v1/tokenize"):
        err = _error(app, path, body)
        assert err["param"] == param, (path, err)
        assert all(w in err["message"] for w in words), (path, err)


def _parts(*texts: str) -> list[dict]:
    return [{"type": "text", "text": t} for t in texts]


# -- content parts: the form the template reads -------------------------------------------------------------------

def test_content_format_is_detected_as_sglang_does():
    """SGLang's rule: "openai" for a template with a loop over ``message``/``msg``/``m``'s content (through filters,
    tests and slices), or that names image, audio, video or vision anywhere; "string" otherwise and for a template
    that does not parse."""
    assert chat_content_format(PARTS_TEMPLATE) == "openai"
    assert chat_content_format("{% for m in messages %}{% for c in m.content %}{{ c.text }}{% endfor %}"
                               "{% endfor %}") == "openai"
    assert chat_content_format("{% for msg in messages %}{% for c in msg['content'] | selectattr('type') %}"
                               "{% endfor %}{% endfor %}") == "openai"
    assert chat_content_format("{% for c in message.content[1:] %}{% endfor %}") == "openai"
    assert chat_content_format("{% for m in messages %}{{ m.content }}<image>{% endfor %}") == "openai"
    for template in (SPACE_TEMPLATE, CALLS_TEMPLATE, "{% for c in turn.content %}{% endfor %}",
                     "{% for c in messages[0].content %}{% endfor %}", "{% for m in messages %"):
        assert chat_content_format(template) == "string", template


def test_text_parts_reach_a_string_template_joined_by_a_space(app, engine):
    """A template that reads content as a string (the model's default here) gets the parts' texts joined by a space,
    as SGLang flattens them; they were joined by a newline."""
    tok = engine.tokenizer
    assert chat_content_format(tok.chat_template) == "string"
    msgs = [{"role": "system", "content": _parts("Be", "brief.")},
            {"role": "user", "content": _parts("The quick", "fox")}]
    want = tok.encode(tok.apply_chat_template([{"role": "system", "content": "Be brief."},
                                               {"role": "user", "content": "The quick fox"}], True))
    assert _tokens(app, {"messages": msgs}) == want
    assert _prompt_tokens(app, {"messages": msgs}) == len(want)


def test_text_parts_reach_a_parts_template_as_parts(app, engine, use_template):
    """A template that loops over the content gets the parts themselves ({"type": "text", "text"}), a string content
    stays a string, and a tool message's parts are joined by a space (SGLang's normalize_tool_content)."""
    use_template(PARTS_TEMPLATE)
    tok = engine.tokenizer
    msgs = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "The quick", "cache_control": {"x": 1}},
                                         {"type": "text", "text": "fox"}]},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c0", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c0", "content": _parts("4", "2")}]
    text = ("<|system|>Be brief.\n<|user|>[text:The quick][text:fox]\n<|assistant|>\n<|tool|>4 2\n"
            "<|assistant|>\n")
    assert _tokens(app, {"messages": msgs}) == tok.encode(text)
    assert _prompt_tokens(app, {"messages": msgs}) == len(tok.encode(text))


# -- content parts a text-only model refuses ---------------------------------------------------------------------

@pytest.mark.parametrize("part", [
    {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
    {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
    {"type": "audio_url", "audio_url": {"url": "https://example.com/a.wav"}},
    {"type": "video_url", "video_url": {"url": "https://example.com/a.mp4"}},
])
def test_media_parts_are_a_400_naming_the_part(app, part):
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "What is this?"}, part]}]}
    _both_refuse(app, body, "messages.0.content.1.type", repr(part["type"]), "text input only")


def test_other_parts_are_a_400_naming_them(app):
    thinking = [*CHAT, {"role": "assistant", "content": [{"type": "thinking", "thinking": "hmm"}, *_parts("ok")]},
                *CHAT]
    _both_refuse(app, {"messages": thinking}, "messages.1.content.0.type", "'thinking'", "reasoning_content")
    for part, param in (({"type": "bogus"}, "messages.0.content.0.type"), ("hi", "messages.0.content.0.type"),
                        ({"text": "hi"}, "messages.0.content.0.type"),
                        ({"type": "text", "text": 5}, "messages.0.content.0.text")):
        _both_refuse(app, {"messages": [{"role": "user", "content": [part]}]}, param)


# -- continue_final_message ------------------------------------------------------------------------------------------

def test_continue_final_message_appends_the_texts_own_ids(app, engine, use_template):
    """SGLang renders the messages before the last (with the generation prompt), then appends the ids of the
    continued text encoded alone (a leading BOS dropped). Where the generation prompt ends in a space the two differ
    from one text's ids (" " + "quick", not " quick")."""
    use_template(SPACE_TEMPLATE)
    tok = engine.tokenizer
    partial = "quick brown fox"
    rendered = tok.apply_chat_template(CHAT, True)
    more = tok.encode(partial, add_special_tokens=True)
    if more and more[0] == tok.bos_token_id:
        more = more[1:]
    want = tok.encode(rendered) + more
    assert want != tok.encode(rendered + partial)  # (the case tells the two apart)
    body = {"messages": [*CHAT, {"role": "assistant", "content": partial}], "continue_final_message": True}
    assert _tokens(app, body) == want
    r = _call(app, "/v1/chat/completions", {"model": MODEL, **body, "max_tokens": 4, "temperature": 0})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == len(want)
    gen = _call(app, "/generate", {"input_ids": want, "sampling_params": {"max_new_tokens": 4, "temperature": 0}})
    assert gen.status_code == 200, gen.text
    assert r.json()["choices"][0]["message"]["content"] == gen.json()["text"]
    # Text parts continued: their texts joined by a space, as SGLang flattens them for a string template.
    parts = {**body, "messages": [*CHAT, {"role": "assistant", "content": _parts("quick", "brown fox")}]}
    assert _tokens(app, parts) == want


# -- tool calls in the history ---------------------------------------------------------------------------------------

def _with_call(arguments) -> list[dict]:
    call = {"id": "c0", "type": "function", "function": {"name": "f", "arguments": arguments}}
    return [*CHAT, {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c0", "content": "done"}]


def test_history_tool_call_arguments_reach_the_template_as_an_object(app, engine, use_template):
    """SGLang parses function.arguments (JSON text) into the object it holds; a template writing ``| tojson``
    (Hugging Face's, transformers' tojson: no sorting, non-ASCII kept) writes that object, not the text escaped."""
    use_template(CALLS_TEMPLATE)
    tok = engine.tokenizer
    args = '{"city":"Tromsø","n":[1, 2]}'
    written = json.dumps(json.loads(args), ensure_ascii=False)
    text = (f"<|user|>The quick brown fox\n<|assistant|>f{written}\n<|tool|>done\n<|assistant|>\n")
    assert _tokens(app, {"messages": _with_call(args)}) == tok.encode(text)
    # arguments already an object: as given
    assert _tokens(app, {"messages": _with_call(json.loads(args))}) == tok.encode(text)


@pytest.mark.parametrize("arguments", ["{", "", "[1, 2]", '"x"', '{"a": NaN}'])
def test_history_tool_call_arguments_not_a_json_object_are_a_400(app, arguments):
    _both_refuse(app, {"messages": _with_call(arguments)}, "messages.1.tool_calls.0.function.arguments",
                 "JSON")


# -- chat_template_kwargs, typed fields -----------------------------------------------------------------------------

def test_a_request_chat_template_is_a_400(app):
    body = {"messages": CHAT, "chat_template_kwargs": {"chat_template": "{{ messages }}"}}
    _both_refuse(app, body, "chat_template_kwargs.chat_template", "chat template")
    # other variables pass
    assert _call(app, "/v1/tokenize", {"model": MODEL, "messages": CHAT,
                                       "chat_template_kwargs": {"thinking": True}}).status_code == 200


@pytest.mark.parametrize("field,value", [("name", {"first": "a"}), ("name", 5), ("tool_call_id", 7),
                                         ("reasoning_content", ["a"])])
def test_string_fields_of_a_message_are_checked(app, field, value):
    _both_refuse(app, {"messages": [{"role": "user", "content": "hi", field: value}]}, f"messages.0.{field}")


def test_name_reaches_the_template(app, engine, use_template):
    use_template(CALLS_TEMPLATE)
    msgs = [{"role": "user", "content": "hi", "name": "ann"}]
    assert _tokens(app, {"messages": msgs}) == engine.tokenizer.encode("<|user:ann|>hi\n<|assistant|>\n")


# -- malformed messages: a 400 naming the field, never a 500 ----------------------------------------------------------

@pytest.mark.parametrize("messages,param", [
    ([], "messages"), ("hi", "messages"), (["hi"], "messages.0"), ([5], "messages.0"),
    ([{"content": "hi"}], "messages.0.role"), ([{"role": "bot", "content": "hi"}], "messages.0.role"),
    ([{"role": "user", "content": 5}], "messages.0.content"), ([{"role": "user"}], "messages.0.content"),
    ([{"role": "user", "content": []}], "messages.0.content"),
    ([{"role": "assistant", "content": None}], "messages.0.content"),
])
def test_malformed_messages_are_a_400_naming_the_field(app, messages, param):
    _both_refuse(app, {"messages": messages}, param)


def test_a_conversation_past_the_context_is_a_400(app):
    msgs = [{"role": "user" if i % 2 == 0 else "assistant", "content": "The quick brown fox jumps."}
            for i in range(CONTEXT // 4)]
    err = _error(app, "/v1/chat/completions", {"messages": msgs})
    assert err["code"] == "context_length_exceeded" and err["param"] == "messages", err
