"""OpenAI's ``reasoning_effort`` and SGLang's ``reasoning`` object on /v1/chat/completions (and /v1/tokenize's
messages, which render as chat does), read as SGLang 0.5.23 reads them (protocol.py's normalize_reasoning_inputs,
serving_chat.py's extra template kwargs): the effort reaches the template as ``reasoning_effort``, and ``thinking`` /
``enable_thinking`` default to false for effort "none", true for any other effort or ``reasoning.enabled``; the
client's own chat_template_kwargs win. Checked through a template that writes the three variables, against the text
SGLang's rules give (written out here), and against chat's usage.prompt_tokens."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from sglang_eagle3.server.reasoning import REASONING_FORMATS

from .conftest import asgi_post, served_app, spec_engine
from .test_reasoning import chat_body

MODEL = "tiny"
CHAT = [{"role": "user", "content": "The quick brown fox"}]
TEMPLATE = ("{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}"
            "{% if add_generation_prompt %}[assistant t={{ thinking }} e={{ enable_thinking }} "
            "r={{ reasoning_effort }}]{% endif %}")


@pytest.fixture(scope="module")
def engine(tiny_model):
    with spec_engine(tiny_model, max_running_requests=2) as eng:
        yield eng


@pytest.fixture(scope="module")
def app(engine):
    with served_app(engine, served_model_name=MODEL) as app:
        yield app


@pytest.fixture
def template(engine, monkeypatch):
    tok = engine.tokenizer
    monkeypatch.setattr(tok, "chat_template", TEMPLATE)
    monkeypatch.setattr(tok, "_compiled_template", None)
    return tok


_call = asgi_post


def _rendered(thinking, enable, effort) -> str:
    """The text the template writes (Jinja writes an unset variable as nothing, Python's True as True)."""
    show = ("" if v is None else str(v) for v in (thinking, enable, effort))
    return "[user]The quick brown fox[assistant t={} e={} r={}]".format(*show)


# (request fields, SGLang's (thinking, enable_thinking, reasoning_effort) for the template)
CASES = [
    ({}, (None, None, None)),
    ({"reasoning_effort": "none"}, (False, False, "none")),
    ({"reasoning_effort": "high"}, (True, True, "high")),
    ({"reasoning_effort": "max"}, (True, True, "max")),
    ({"reasoning_effort": 0.5}, (True, True, 0.5)),
    ({"reasoning_effort": "0.25"}, (True, True, 0.25)),  # (SGLang's lax union reads a numeric string)
    ({"reasoning_effort": 0}, (True, True, 0.0)),
    ({"reasoning": {"enabled": True}}, (True, True, None)),
    ({"reasoning": {"enable": "yes"}}, (True, True, None)),
    ({"reasoning": {"enabled": False}}, (None, None, None)),
    ({"reasoning": {"effort": "low"}}, (True, True, "low")),
    ({"reasoning": {"reasoning_effort": "none", "enabled": True}}, (False, False, "none")),  # the effort decides
    ({"reasoning_effort": "high", "reasoning": {"effort": "none"}}, (False, False, "none")),  # reasoning's wins
    ({"reasoning_effort": "none", "chat_template_kwargs": {"thinking": True}}, (True, False, "none")),
    ({"reasoning_effort": "low", "chat_template_kwargs": {"reasoning_effort": "x"}}, (True, True, "x")),
]


@pytest.mark.parametrize("fields,want", CASES, ids=[str(c[0]) for c in CASES])
def test_effort_reaches_the_template_as_sglang_reads_it(app, template, fields, want):
    out = _call(app, "/v1/tokenize", {"messages": CHAT, **fields})
    assert out.status_code == 200, out.text
    assert out.json()["tokens"] == template.encode(_rendered(*want))
    chat = _call(app, "/v1/chat/completions", {"model": MODEL, "messages": CHAT, "max_tokens": 1, **fields})
    assert chat.status_code == 200, chat.text
    assert chat.json()["usage"]["prompt_tokens"] == out.json()["count"]


@pytest.mark.parametrize("fields,param", [
    ({"reasoning_effort": "extreme"}, "reasoning_effort"),
    ({"reasoning_effort": True}, "reasoning_effort"),  # (SGLang: "must not be a boolean")
    ({"reasoning_effort": 1.5}, "reasoning_effort"),
    ({"reasoning_effort": -0.1}, "reasoning_effort"),
    ({"reasoning_effort": [1]}, "reasoning_effort"),
    ({"reasoning": "high"}, "reasoning"),
    ({"reasoning": {"effort": "loud"}}, "reasoning.effort"),
    ({"reasoning": {"reasoning_effort": 2}}, "reasoning.reasoning_effort"),
])
def test_bad_efforts_are_a_400_naming_the_field(app, fields, param):
    for path in ("/v1/chat/completions", "/v1/tokenize"):
        r = _call(app, path, {"model": MODEL, "messages": CHAT, "max_tokens": 1, **fields})
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == param and param in err["message"], err


def test_an_effort_opens_a_switched_reasoning_format():
    """deepseek-v3's template opens the reasoning on thinking: an effort other than "none" (or reasoning.enabled)
    sets it, so the output is read as starting inside the reasoning; "none" leaves it closed."""
    from sglang_eagle3.server.openai_api import _reasoning_format

    serving = SimpleNamespace(config=SimpleNamespace(reasoning_parser="deepseek-v3"), tokenizer=None, engine=None)

    def body(**kw):
        b = chat_body()
        vars(b).update(kw)
        return b

    assert not _reasoning_format(body(), serving, {}).forced
    assert _reasoning_format(body(reasoning_effort="medium"), serving, {}).forced
    assert _reasoning_format(body(reasoning={"enabled": True}), serving, {}).forced
    assert not _reasoning_format(body(reasoning_effort="none"), serving, {}).forced
    assert REASONING_FORMATS["deepseek-v3"].forced_by == "thinking"
