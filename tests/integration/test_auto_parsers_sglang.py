"""``--reasoning-parser auto`` / ``--tool-call-parser auto`` against SGLang 0.5.23's own detection
(sglang.srt.parser.template_detection: the reasoning mode from the template, then its ordered rules over the template
and the vocabulary), over the families' templates of tests/test_auto_parsers.py: the same reasoning parser, and the
same tool-call parser wherever SGLang's is one this server reads (else none here). One known difference: a DeepSeek-V3.1
template spelled with ``{%-`` (its switch off by default all the same) is ``deepseek-r1`` to SGLang, whose pattern wants
``{% if``, and ``deepseek-v3`` here, where the switch is read by rendering (runtime/auto_parsers.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from sglang_eagle3.runtime.auto_parsers import detect
from sglang_eagle3.server.tools import TOOL_CALL_PARSERS
from tests.test_auto_parsers import DEEPSEEK_SPECIALS, DEEPSEEK_V31, FAMILIES, make_tokenizer

from .conftest import needs_sglang

pytestmark = needs_sglang


def sglang_detects(template: str, specials: tuple[str, ...]) -> tuple[str | None, str | None]:
    from sglang.srt.parser.template_detection import (
        detect_reasoning_parser,
        detect_reasoning_pattern,
        detect_tool_call_parser,
    )

    vocab = SimpleNamespace(get_vocab=lambda: {s: i for i, s in enumerate(specials)} | {"a": 1000, "b": 1001})
    force, mode = detect_reasoning_pattern(template)
    return (detect_reasoning_parser(template, vocab, mode, force),
            detect_tool_call_parser(template, vocab, mode, force))


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_auto_detects_as_sglang_does(family):
    template, specials, _, _ = FAMILIES[family]
    reasoning, tool = sglang_detects(template, specials)
    found = detect(make_tokenizer(template, specials))
    assert found.reasoning_parser == reasoning, (family, found, reasoning)
    assert found.tool_call_parser == (tool if tool in TOOL_CALL_PARSERS else None), (family, found, tool)


def test_the_one_known_difference():
    hyphens = DEEPSEEK_V31.replace("{% if not thinking is defined %}{% set thinking = false %}{% endif %}",
                                   "{%- if not thinking is defined -%}{%- set thinking = false -%}{%- endif -%}")
    assert hyphens != DEEPSEEK_V31
    assert sglang_detects(hyphens, DEEPSEEK_SPECIALS)[0] == "deepseek-r1"
    assert detect(make_tokenizer(hyphens, DEEPSEEK_SPECIALS)).reasoning_parser == "deepseek-v3"
