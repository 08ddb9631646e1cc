"""Structural tags (SGLang's ``structural_tag`` sampling parameter and OpenAI ``response_format``): free text in which
a trigger opens a tagged JSON value (the legacy shape), or xgrammar's nested formats. Exact with speculation.

Checked against: the output text read back by Python (``json.JSONDecoder.raw_decode`` and ``jsonschema`` for each
tagged value, the begin / end strings around it), plain decoding (EAGLE-3 with the embedded pair's draft must give
the same tokens), and refusals naming the part of the tag at fault. On the embedded pair (a real tokenizer and eos).
"""

from __future__ import annotations

import json
import os

import jsonschema
import pytest

from sglang_eagle3 import Engine
from sglang_eagle3.engine import EMBEDDED_DIR
from sglang_eagle3.runtime.grammar import GrammarError, structural_tag_grammar
from sglang_eagle3.runtime.sampling import SamplingParamsError

xgr = pytest.importorskip("xgrammar")
TARGET = os.path.join(EMBEDDED_DIR, "target")
pytestmark = [pytest.mark.skipif(not os.path.exists(os.path.join(TARGET, "config.json")),
                                 reason="embedded weights not present"),
              pytest.mark.usefixtures("torch_one_thread")]
PROMPTS = ["And God said,", "In the beginning", "The king of Israel", "And he answered"]
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}, "old": {"type": "boolean"}},
          "required": ["name", "old"], "additionalProperties": False}


def sequence_tag(schema: dict) -> dict:
    """xgrammar's shape: "Answer: <a>", a JSON value, "</a>", then the end."""
    return {"type": "structural_tag", "format": {"type": "sequence", "elements": [
        {"type": "const_string", "value": "Answer: "},
        {"type": "tag", "begin": "<a>", "content": {"type": "json_schema", "json_schema": schema}, "end": "</a>"}]}}


def legacy_tag(schema: dict | None, at_least_one: bool = False) -> dict:
    """The legacy shape: wherever the text writes "And " a JSON value follows, then "." (the embedded pair, a Bible
    reader, writes "And " often)."""
    return {"structures": [{"begin": "And ", "schema": schema, "end": "."}], "triggers": ["And "],
            "at_least_one": at_least_one}


@pytest.fixture(scope="module")
def engines():
    # A whitespace bound: the small model pads JSON with spaces until max_new_tokens otherwise (as with json_schema).
    return {"plain": Engine(model_path=TARGET, device="cpu", constrained_json_max_whitespace_cnt=1),
            "eagle3": Engine(device="cpu", speculative_num_steps=3, constrained_json_max_whitespace_cnt=1)}


def _both(engines, prompt: str, tag: dict, max_new: int = 48) -> dict:
    """The plain output, after checking EAGLE-3's is the same tokens."""
    sp = {"max_new_tokens": max_new, "temperature": 0, "structural_tag": json.dumps(tag)}
    plain = engines["plain"].generate(prompt, sp)
    spec = engines["eagle3"].generate(prompt, sp)
    assert spec["output_ids"] == plain["output_ids"], (prompt, plain["text"], spec["text"])
    return plain


def _tagged(text: str, begin: str, end: str, schema: dict | None, cut: bool) -> int:
    """Checks that every ``begin`` in ``text`` opens a JSON value satisfying ``schema`` and closed by ``end`` (the
    last one may be cut short where the output was); returns how many are complete."""
    done, at = 0, text.find(begin)
    while at >= 0:
        rest = text[at + len(begin):]
        try:
            value, n = json.JSONDecoder().raw_decode(rest.lstrip(" "))
        except json.JSONDecodeError:
            assert cut and text.rfind(begin) == at, (text, at)
            return done
        n += len(rest) - len(rest.lstrip(" "))
        if schema is not None:
            jsonschema.validate(value, schema)
        if not rest[n:].lstrip(" ").startswith(end):
            assert cut and text.rfind(begin) == at and end.startswith(rest[n:].lstrip(" ")), (text, at)
            return done
        done += 1
        at = text.find(begin, at + len(begin) + n)
    return done


def test_sequence_format_output_and_speculation(engines):
    """xgrammar's shape: every output is "Answer: <a>{...}</a>" with the schema kept, ended there (the eos the
    only token left), and EAGLE-3's tokens are plain decoding's."""
    for prompt in PROMPTS:
        out = _both(engines, prompt, sequence_tag(PERSON))
        assert out["meta_info"]["finish_reason"]["type"] == "stop", out
        text = out["text"]
        assert text.startswith("Answer: <a>") and text.endswith("</a>"), text
        jsonschema.validate(json.loads(text[len("Answer: <a>"):-len("</a>")]), PERSON)


@pytest.mark.parametrize("at_least_one", [False, True])
def test_legacy_triggers_open_tagged_values(engines, at_least_one):
    """The legacy shape: each "And " the output writes opens a value of the schema closed by "."; with
    at_least_one the output holds one at least (the model, left free, writes "And," instead)."""
    found = 0
    for prompt in PROMPTS:
        out = _both(engines, prompt, legacy_tag(PERSON, at_least_one))
        text, cut = out["text"], out["meta_info"]["finish_reason"]["type"] == "length"
        found += _tagged(text, "And ", ".", PERSON, cut)
        if at_least_one:
            assert "And " in text, text
    assert not at_least_one or found > 0


def test_legacy_structure_without_schema_takes_any_json(engines):
    """A structure without a schema (SGLang's protocol allows it) takes any JSON value there."""
    out = _both(engines, PROMPTS[0], legacy_tag(None, at_least_one=True))
    assert "And " in out["text"]
    _tagged(out["text"], "And ", ".", None, out["meta_info"]["finish_reason"]["type"] == "length")


def test_whitespace_bound_reaches_each_tagged_value():
    """constrained_json_max_whitespace_cnt bounds the tags' JSON values (a format's own bound kept)."""
    legacy = structural_tag_grammar(json.dumps(legacy_tag(PERSON)), xgr, 2)[0]
    assert [t.content.max_whitespace_cnt for t in legacy.format.tags] == [2]
    tag = sequence_tag(PERSON)
    tag["format"]["elements"].append({"type": "json_schema", "json_schema": PERSON, "max_whitespace_cnt": 5})
    got = json.loads(structural_tag_grammar(json.dumps(tag), xgr, 2)[0])["format"]["elements"]
    assert got[1]["content"]["max_whitespace_cnt"] == 2 and got[2]["max_whitespace_cnt"] == 5
    assert "max_whitespace_cnt" not in json.loads(structural_tag_grammar(json.dumps(tag), xgr)[0])["format"][
        "elements"][1]["content"]


_NOT = {"type": "object", "properties": {"a": {"not": {"type": "string"}}}}
BAD = [
    ("not-json", "{structures", ["is not JSON"]),
    ("a-list", "[1]", ["must be a JSON object"]),
    ("neither", json.dumps({"type": "structural_tag"}), ["neither structures", "format"]),
    ("no-triggers", json.dumps({"structures": [{"begin": "<a>", "end": "</a>"}]}), ["triggers=None"]),
    ("empty-trigger", json.dumps({**legacy_tag(PERSON), "triggers": [""]}), ["triggers=['']"]),
    ("no-structures", json.dumps({"structures": [], "triggers": ["<"]}), ["structures"]),
    ("no-begin", json.dumps({"structures": [{"end": "x"}], "triggers": ["<"]}), ["structures[0]=", "begin"]),
    ("schema-string", json.dumps({"structures": [{"begin": "<a>", "schema": "int", "end": "x"}], "triggers": ["<"]}),
     ["structures[0].schema='int'"]),
    ("at_least_one-string", json.dumps({**legacy_tag(PERSON), "at_least_one": "yes"}), ["at_least_one='yes'"]),
    # xgrammar would drop "not" without a word: refused as for json_schema
    ("legacy-unenforced", json.dumps(legacy_tag(_NOT)), ["structures[0].schema", "not would be ignored"]),
    ("format-unenforced", json.dumps(sequence_tag(_NOT)),
     ["format.elements[1].content.json_schema", "not would be ignored"]),
    ("format-nan", json.dumps(sequence_tag({"type": "number", "maximum": float("nan")})),
     ["format.elements[1].content.json_schema", "not a finite number"]),
    # xgrammar's own refusals, its C++ log prefix cut
    ("format-type", json.dumps({"format": {"type": "nope"}}), ["does not compile", "nope"]),
    ("trigger-not-a-begin", json.dumps({"structures": [{"begin": "<a>", "schema": {}, "end": "x"}],
                                        "triggers": ["<b"]}), ["does not compile"]),
]


@pytest.mark.parametrize("text,words", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_tags_are_refused_naming_the_part(engines, text, words):
    """A tag that is not one, or holds a schema xgrammar would keep only in part, is refused before any token, the
    message naming the parameter and the part at fault; the engine serves on."""
    with pytest.raises(GrammarError) as e:
        engines["plain"].generate(PROMPTS[0], {"max_new_tokens": 4, "structural_tag": text})
    msg = str(e.value)
    assert msg.startswith("structural_tag=") and all(w in msg for w in words), msg
    assert "[" not in msg.split(":")[0] or "Check failed" not in msg  # (no C++ log prefix)
    assert engines["plain"].generate(PROMPTS[0], {"max_new_tokens": 2})["meta_info"]["completion_tokens"] == 2


def test_one_grammar_a_request(engines):
    with pytest.raises(SamplingParamsError, match="regex and structural_tag are given"):
        engines["plain"].generate(PROMPTS[0], {"regex": "a+", "structural_tag": json.dumps(legacy_tag(PERSON))})
    with pytest.raises(SamplingParamsError, match="structural_tag=.*must be a string .the tag serialized as JSON"):
        engines["plain"].generate(PROMPTS[0], {"structural_tag": legacy_tag(PERSON)})
    # SGLang's unset values
    for unset in (None, ""):
        out = engines["plain"].generate(PROMPTS[0], {"max_new_tokens": 3, "temperature": 0, "structural_tag": unset})
        assert out["meta_info"]["completion_tokens"] == 3
