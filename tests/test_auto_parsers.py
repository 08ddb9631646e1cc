"""``reasoning_parser="auto"`` / ``--tool-call-parser auto`` (runtime/auto_parsers.py): the parsers read from a chat
template and tokenizer.

Checked against: the families' own parsers (SGLang's names for Kimi-K2 / K2.5, DeepSeek-V3.1, DeepSeek-R1, Qwen3 and
Kimi-VL thinking templates, written here in those checkpoints' forms), templates rewritten in other spellings that
render alike (the switch is read by rendering, so each must detect as its original), and, in
tests/integration/test_auto_parsers_sglang.py, SGLang 0.5.23's own detection over the same templates.
"""

from __future__ import annotations

import random

import pytest

from sglang_eagle3.runtime.auto_parsers import detect, resolve, switch_default
from sglang_eagle3.tokenizer import Tokenizer

KIMI_SPECIALS = ("<|im_user|>", "<|im_assistant|>", "<|im_middle|>", "<|im_end|>", "<|tool_calls_section_begin|>",
                 "<|tool_calls_section_end|>", "<|tool_call_begin|>", "<|tool_call_argument_begin|>",
                 "<|tool_call_end|>", "<think>", "</think>")
DEEPSEEK_SPECIALS = ("<｜begin▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>", "<｜end▁of▁sentence｜>",
                     "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>",
                     "<｜tool▁call▁end｜>", "<think>", "</think>")
QWEN_SPECIALS = ("<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>", "<think>", "</think>")

# The families' templates, cut to what tells them apart (their turns, thinking and tool-call markup), as the
# checkpoints write them.
KIMI_K2 = ("{%- for m in messages -%}{%- if m.role == 'user' -%}<|im_user|>user<|im_middle|>{{ m.content }}<|im_end|>"
           "{%- elif m.role == 'assistant' -%}<|im_assistant|>assistant<|im_middle|>{{ m.content }}"
           "{%- if m.tool_calls -%}<|tool_calls_section_begin|>{%- for c in m.tool_calls -%}<|tool_call_begin|>"
           "{{ c.id }}<|tool_call_argument_begin|>{{ c.function.arguments }}<|tool_call_end|>{%- endfor -%}"
           "<|tool_calls_section_end|>{%- endif -%}<|im_end|>{%- endif -%}{%- endfor -%}"
           "{%- if add_generation_prompt -%}<|im_assistant|>assistant<|im_middle|>{%- endif -%}")
DEEPSEEK_V31 = ("{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif %}"
                "{% if not thinking is defined %}{% set thinking = false %}{% endif %}"
                "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}<｜User｜>{{ m['content'] }}"
                "{% elif m['role'] == 'assistant' %}<｜Assistant｜></think>{{ m['content'] }}"
                "{% if m['tool_calls'] %}<｜tool▁calls▁begin｜>{% for c in m['tool_calls'] %}<｜tool▁call▁begin｜>"
                "{{ c['function']['name'] }}<｜tool▁sep｜>{{ c['function']['arguments'] }}<｜tool▁call▁end｜>"
                "{% endfor %}<｜tool▁calls▁end｜>{% endif %}<｜end▁of▁sentence｜>{% endif %}{% endfor %}"
                "{% if add_generation_prompt %}<｜Assistant｜>{% if thinking %}<think>{% else %}</think>{% endif %}"
                "{% endif %}")
DEEPSEEK_R1 = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}<｜User｜>{{ m['content'] }}"
               "{% elif m['role'] == 'assistant' %}{% set content = m['content'] %}{% if '</think>' in content %}"
               "{% set content = content.split('</think>')[-1] %}{% endif %}<｜Assistant｜>{{ content }}"
               "{% if m['tool_calls'] %}<｜tool▁calls▁begin｜>{% for c in m['tool_calls'] %}<｜tool▁call▁begin｜>"
               "function<｜tool▁sep｜>{{ c['function']['name'] }}<｜tool▁call▁end｜>{% endfor %}"
               "<｜tool▁calls▁end｜>{% endif %}<｜end▁of▁sentence｜>{% endif %}{% endfor %}"
               "{% if add_generation_prompt %}<｜Assistant｜><think>\\n{% endif %}")
DEEPSEEK_V3 = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}<｜User｜>{{ m['content'] }}"
               "{% elif m['role'] == 'assistant' %}<｜Assistant｜>{{ m['content'] }}{% if m['tool_calls'] %}"
               "<｜tool▁calls▁begin｜>{% for c in m['tool_calls'] %}<｜tool▁call▁begin｜>function<｜tool▁sep｜>"
               "{{ c['function']['name'] }}<｜tool▁call▁end｜>{% endfor %}<｜tool▁calls▁end｜>{% endif %}"
               "<｜end▁of▁sentence｜>{% endif %}{% endfor %}{% if add_generation_prompt %}<｜Assistant｜>{% endif %}")
QWEN3 = ("{%- for m in messages %}<|im_start|>{{ m.role }}\\n{{ m.content }}<|im_end|>\\n{%- endfor %}"
         "{%- if add_generation_prompt %}<|im_start|>assistant\\n{%- if enable_thinking is defined and "
         "enable_thinking is false %}<think>\\n\\n</think>\\n\\n{%- endif %}{%- endif %}")
KIMI_VL_THINKING = ("{%- for m in messages -%}<|im_user|>{{ m.content }}<|im_end|>{%- endfor -%}"
                    "{%- if add_generation_prompt -%}<|im_assistant|>◁think▷{%- endif -%}")

# (template, special tokens, reasoning parser, tool-call parser this server reads)
FAMILIES = {
    "kimi-k2.5": (KIMI_K2, KIMI_SPECIALS, "kimi_k2", "kimi_k2"),
    "deepseek-v3.1": (DEEPSEEK_V31, DEEPSEEK_SPECIALS, "deepseek-v3", None),
    "deepseek-r1": (DEEPSEEK_R1, DEEPSEEK_SPECIALS, "deepseek-r1", None),
    "deepseek-v3": (DEEPSEEK_V3, DEEPSEEK_SPECIALS, None, None),
    "qwen3": (QWEN3, QWEN_SPECIALS, "qwen3", None),
    "kimi-vl-thinking": (KIMI_VL_THINKING, ("<|im_user|>", "<|im_assistant|>", "<|im_end|>"), "kimi", None),
}


def make_tokenizer(template: str | None, specials: tuple[str, ...]) -> Tokenizer:
    """A tokenizer whose special tokens are one id each and whose text is its UTF-8 bytes (ids 0..255)."""
    ids = {s: 256 + i for i, s in enumerate(specials)}
    names = {i: s for s, i in ids.items()}

    def encode(text, _special):
        out, i = [], 0
        while i < len(text):
            hit = next((s for s in specials if text.startswith(s, i)), None)
            if hit is not None:
                out.append(ids[hit])
                i += len(hit)
            else:
                out += list(text[i].encode())
                i += 1
        return out

    def decode(tokens, skip):
        text, raw = [], bytearray()
        for t in tokens:
            if t in names:
                text.append(raw.decode(errors="replace") + ("" if skip else names[t]))
                raw = bytearray()
            else:
                raw.append(t)
        return "".join(text) + raw.decode(errors="replace")

    return Tokenizer(encode, decode, 256 + len(specials), None, None, template, special_tokens=ids,
                     bos_token=specials[0], token_bytes=lambda i: bytes([i]) if i < 256 else names[i].encode())


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_each_family_detects_as_its_own_parsers(family):
    template, specials, reasoning, tool = FAMILIES[family]
    found = detect(make_tokenizer(template, specials))
    assert (found.reasoning_parser, found.tool_call_parser) == (reasoning, tool), found


def test_switches_are_read_by_rendering():
    """A switch's default from what the template renders: the same defaults spelled five ways detect alike, and a
    variable that changes nothing is no switch."""
    rng = random.Random()
    default_off = ["{% if not thinking is defined %}{% set thinking = false %}{% endif %}",
                   "{%- if thinking is not defined -%}{%- set thinking = False -%}{%- endif -%}",
                   "{%- set thinking = thinking | default(false) -%}",
                   "{% set thinking = thinking if thinking is defined else false %}",
                   ""]  # (undefined is falsy: an unset switch that is only tested is off by default too)
    body = "<｜User｜>{{ messages[0]['content'] }}<｜Assistant｜>{% if thinking %}<think>{% else %}</think>{% endif %}"
    for head in default_off:
        tok = make_tokenizer(head + body, DEEPSEEK_SPECIALS)
        assert switch_default(tok, "thinking") is False, head
        assert switch_default(tok, "enable_thinking") is None  # not read by this template
        assert detect(tok).reasoning_parser == "deepseek-v3", head
    on = rng.choice(["{%- if enable_thinking is defined and enable_thinking is false %}<think></think>{%- endif %}",
                     "{% if enable_thinking is not defined or enable_thinking %}{% else %}<think></think>{% endif %}",
                     "{%- if not (enable_thinking | default(true)) %}<think></think>{%- endif %}"])
    tok = make_tokenizer("<|im_start|>assistant\\n" + on, QWEN_SPECIALS)
    assert switch_default(tok, "enable_thinking") is True and detect(tok).reasoning_parser == "qwen3"
    # A thinking switch on by default (no DeepSeek-V3 format: its thinking opens only when asked), and a template that
    # cannot render: neither is a deepseek-v3 switch; the <think> they write makes them deepseek-r1.
    tok = make_tokenizer("{% set thinking = thinking | default(true) %}" + body, DEEPSEEK_SPECIALS)
    assert switch_default(tok, "thinking") is True and detect(tok).reasoning_parser == "deepseek-r1"
    for broken in ("{{ raise_exception('no') }}", "{% if thinking %}", "{{ messages[0]['content'] / 2 }}"):
        # (the template's own error, one that does not compile, a TypeError inside it)
        tok = make_tokenizer(broken + "<think>", DEEPSEEK_SPECIALS)
        assert switch_default(tok, "thinking") is None and detect(tok).reasoning_parser == "deepseek-r1", broken


def test_no_template_or_markers_detects_nothing():
    found = detect(make_tokenizer(None, ("<s>",)))  # the default template is not the checkpoint's
    assert (found.reasoning_parser, found.tool_call_parser) == (None, None)
    assert "no chat template of its own" in found.reasoning_why
    # Kimi's call marker only as text (several tokens): not a Kimi-K2 vocabulary
    found = detect(make_tokenizer("{{ '<|tool_calls_section_begin|>' }}", ("<s>",)))
    assert (found.reasoning_parser, found.tool_call_parser) == (None, None)


def test_resolve_replaces_only_auto_and_says_why(caplog):
    tok = make_tokenizer(*FAMILIES["deepseek-v3.1"][:2])
    assert resolve(tok, "qwen3", None, "x") == ("qwen3", None)  # nothing asked: nothing read
    with caplog.at_level("INFO", logger="sglang_eagle3.runtime.auto_parsers"):
        assert resolve(tok, "auto", "auto", "the test's template") == ("deepseek-v3", None)
    text = caplog.text
    assert "reasoning_parser=auto: 'deepseek-v3' detected from the test's template" in text
    assert "tool_call_parser=auto: none detected" in text and "deepseekv31" in text
    assert resolve(tok, "deepseek-r1", "auto", "x") == ("deepseek-r1", None)
    with pytest.raises(ValueError, match="reasoning_parser='auto' reads the chat template, and there is no tokenizer"):
        resolve(None, "auto", None, "x")
