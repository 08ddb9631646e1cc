"""JSON schemas as SGLang's xgrammar backend takes them: a constraint xgrammar would compile and then drop is refused
(a 400 naming where it is), never answered by output the schema does not allow; every other schema keyword a client
moving from SGLang sends is kept, with and without speculation.

Checked against: the ``jsonschema`` package (the instance a refused schema's grammar would let through violates the
schema; a finished output satisfies its schema, formats included), xgrammar's own grammar for the schema (it accepts
that violating instance, so the refusal is needed and the list stays honest as xgrammar changes), and plain
decoding (EAGLE-3's output under each schema is plain decoding's).
"""

from __future__ import annotations

import json
import os

import pytest
from conftest import scheduler_of

from sglang_eagle3 import Engine
from sglang_eagle3.engine import EMBEDDED_DIR
from sglang_eagle3.runtime.grammar import (
    GrammarBackend,
    GrammarError,
    GrammarSpec,
    check_json_schema,
    unenforced_json_schema,
)
from sglang_eagle3.runtime.sampling import SamplingParamsError
from sglang_eagle3.server.serving import _sampling_error
from sglang_eagle3.tokenizer import load_tokenizer

xgr = pytest.importorskip("xgrammar")
jsonschema = pytest.importorskip("jsonschema")
TARGET = os.path.join(EMBEDDED_DIR, "target")
pytestmark = [pytest.mark.skipif(not os.path.exists(os.path.join(TARGET, "config.json")),
                                 reason="embedded weights not present"),
              pytest.mark.usefixtures("torch_one_thread")]
INTS = {"a": {"type": "integer"}, "b": {"type": "integer"}}
DRAFT7 = "http://json-schema.org/draft-07/schema#"

# (id, a schema xgrammar compiles but does not hold the output to, an instance that violates it and that xgrammar's
# grammar accepts, the JSON pointer the refusal names)
UNENFORCED = [
    ("contains", {"type": "array", "items": {"type": "integer"}, "contains": {"const": 3}}, [], "#"),
    ("not", {"type": "object", "properties": {"v": {"not": {"type": "string"}}}, "required": ["v"]}, {"v": "a"},
     "#/properties/v"),
    ("if-then", {"if": {"type": "integer"}, "then": {"minimum": 3}}, 1, "#"),
    ("uniqueItems", {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, [1, 1], "#"),
    ("dependentRequired", {"type": "object", "properties": INTS, "dependentRequired": {"a": ["b"]}}, {"a": 1}, "#"),
    ("dependencies", {"$schema": DRAFT7, "type": "object", "properties": INTS, "dependencies": {"a": ["b"]}},
     {"a": 1}, "#"),
    ("multipleOf-number", {"type": "number", "multipleOf": 0.5}, 1.2, "#"),
    ("multipleOf-fraction", {"type": "integer", "multipleOf": 2.5}, 3, "#"),
    ("multipleOf-and-minimum", {"type": "integer", "multipleOf": 7, "minimum": 10}, 11, "#"),
    ("ref-by-uri", {"$id": "http://example.com/s", "type": "object", "required": ["a"],
                    "properties": {"a": {"$ref": "http://example.com/s#/$defs/i"}},
                    "$defs": {"i": {"type": "integer"}}}, {"a": "x"}, "#/properties/a"),
    ("allOf-two", {"allOf": [{"type": "integer"}, {"minimum": 3}]}, 1, "#"),
    ("anyOf-beside-type", {"type": "string", "anyOf": [{"type": "integer"}]}, 1, "#"),
    ("anyOf-beside-required", {"type": "object", "properties": INTS, "required": ["a"],
                               "anyOf": [{"type": "object"}]}, {}, "#"),
    ("enum-beside-minLength", {"type": "string", "enum": ["a", "bb"], "minLength": 2}, "a", "#"),
    ("const-beside-pattern", {"const": "a", "pattern": "b"}, "a", "#"),
    ("required-undeclared", {"type": "object", "properties": INTS, "required": ["a", "c"]}, {"a": 1}, "#"),
    ("format-unknown", {"type": "object", "properties": {"re": {"type": "string", "format": "regex"}}}, {"re": "("},
     "#/properties/re"),
    ("pattern-and-minLength", {"type": "string", "pattern": "^a+$", "minLength": 3}, "a", "#"),
    ("format-and-maxLength", {"type": "string", "format": "date", "maxLength": 5}, "2020-01-01", "#"),
    ("pattern-lookahead", {"type": "string", "pattern": "^(?!b)[a-z]$"}, "b", "#"),
    ("in-defs", {"$defs": {"x~/y": {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}},
                 "$ref": "#/$defs/x~0~1y"}, [1, 1], "#/$defs/x~0~1y"),
]

# Schemas a client moving from SGLang sends, each kept whole by xgrammar (none is refused).
SUPPORTED = {
    "nested": {"type": "object", "additionalProperties": False, "required": ["person"], "properties": {
        "person": {"type": "object", "additionalProperties": False, "required": ["name", "age"], "properties": {
            "name": {"type": "string", "minLength": 1, "maxLength": 12},
            "age": {"type": "integer", "minimum": 0, "maximum": 120}}}}},
    "array-bounds": {"type": "array", "items": {"type": "integer", "minimum": -5, "maximum": 5}, "minItems": 2,
                     "maxItems": 4},
    "enum-const": {"type": "object", "required": ["color", "kind"], "properties": {
        "color": {"enum": ["red", "green", None]}, "kind": {"const": "fox"}}},
    "anyOf-oneOf-ref": {
        "$defs": {"pt": {"type": "object", "required": ["x"], "additionalProperties": False,
                         "properties": {"x": {"type": "number", "exclusiveMinimum": 0, "maximum": 10}}}},
        "type": "object", "required": ["a", "b"], "additionalProperties": False,
        "properties": {"a": {"anyOf": [{"$ref": "#/$defs/pt"}, {"type": "null"}]},
                       "b": {"oneOf": [{"type": "boolean"}, {"type": "string", "pattern": "^[a-z]{1,5}$"}]}}},
    "formats": {"type": "object", "required": ["d", "code"], "properties": {
        "d": {"type": "string", "format": "date"}, "id": {"type": "string", "format": "uuid"},
        "code": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{2}$"}}},
    "additionalProperties-schema": {"type": "object", "additionalProperties": {"type": "integer"},
                                    "maxProperties": 2},
    "integer-multipleOf": {"type": "integer", "multipleOf": 7},
    "pydantic-optional": {"title": "M", "type": "object", "required": ["name"], "properties": {
        "name": {"title": "Name", "type": "string"},
        "nick": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None, "title": "Nick"}}},
    "recursive": {"$defs": {"node": {"type": "object", "required": ["v"], "additionalProperties": False,
                                     "properties": {"v": {"type": "integer"},
                                                    "kids": {"type": "array", "items": {"$ref": "#/$defs/node"},
                                                             "maxItems": 2}}}},
                  "$ref": "#/$defs/node"},
    "true": True,
}


def _validator(schema):
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


@pytest.fixture(scope="module")
def backend():
    tok = load_tokenizer(TARGET)
    return GrammarBackend(tok, tok.vocab_size, [tok.eos_token_id])


@pytest.fixture(scope="module")
def engines():
    # JSON's separators fixed: under any whitespace the embedded model pads with spaces until max_new_tokens.
    plain = Engine(model_path=TARGET, device="cpu", constrained_json_disable_any_whitespace=True)
    spec = Engine(device="cpu", speculative_num_steps=3, constrained_json_disable_any_whitespace=True)
    yield {"plain": plain, "eagle3": spec}
    plain.shutdown()
    spec.shutdown()


@pytest.mark.parametrize("schema,instance,pointer", [c[1:] for c in UNENFORCED], ids=[c[0] for c in UNENFORCED])
def test_a_schema_xgrammar_would_not_enforce_is_refused(backend, schema, instance, pointer):
    assert not _validator(schema).is_valid(instance), "the instance must violate the schema"
    # xgrammar on its own compiles the schema and lets the violation through: the refusal is needed.
    grammar = xgr.Grammar.from_json_schema(json.dumps(schema), any_whitespace=True)
    assert xgr.testing._is_grammar_accept_string(grammar, json.dumps(instance)), "xgrammar enforces it now"
    with pytest.raises(GrammarError) as e:
        backend.compile(GrammarSpec("json_schema", json.dumps(schema)))
    msg = str(e.value)
    assert msg.startswith("json_schema=") and f"is not supported: at {pointer}: " in msg and len(msg) < 500, msg


@pytest.mark.parametrize("name", list(SUPPORTED))
def test_supported_schemas_compile(backend, name):
    assert unenforced_json_schema(SUPPORTED[name]) is None
    backend.compile(GrammarSpec("json_schema", json.dumps(SUPPORTED[name])))


def test_outputs_satisfy_their_schema_with_and_without_speculation(engines):
    """Each supported schema, greedy and seeded sampling: EAGLE-3's output is plain decoding's, and a finished one
    satisfies its schema (jsonschema, formats checked)."""
    names = list(SUPPORTED)
    params = [{"json_schema": json.dumps(SUPPORTED[n]), "max_new_tokens": 64,
               **({"temperature": 0} if i % 2 == 0 else {"temperature": 0.8, "seed": i})}
              for i, n in enumerate(names)]
    prompts = ["Answer in JSON:", "And God said,", "In the beginning", "The king of Israel"]
    prompts = [prompts[i % len(prompts)] for i in range(len(params))]
    plain = engines["plain"].generate(prompts, params)
    spec = engines["eagle3"].generate(prompts, params)
    assert [o["output_ids"] for o in spec] == [o["output_ids"] for o in plain]
    finished = 0
    for name, o in zip(names, plain, strict=True):
        if o["meta_info"]["finish_reason"]["type"] == "stop":
            finished += 1
            errors = list(_validator(SUPPORTED[name]).iter_errors(json.loads(o["text"])))
            assert not errors, (name, o["text"], errors[0].message)
        else:
            assert o["meta_info"]["finish_reason"]["type"] == "length", o["meta_info"]
    assert finished >= len(names) // 2, finished


def test_max_whitespace_cnt_bounds_the_padding(backend):
    """SGLang's constrained_json_max_whitespace_cnt: at most that many whitespace characters in a row."""
    tok = backend.tokenizer
    limited = GrammarBackend(tok, tok.vocab_size, [tok.eos_token_id], max_whitespace_cnt=2)
    schema = json.dumps(SUPPORTED["array-bounds"])
    for b, padded_ok in ((backend, True), (limited, False)):
        m = xgr.GrammarMatcher(b.compile(GrammarSpec("json_schema", schema)))
        assert m.accept_string("[1,  ")  # two spaces: always allowed
        assert m.accept_string(" ") is padded_ok  # a third in a row
    with pytest.raises(GrammarError, match="max_whitespace_cnt=0 must be a positive integer"):
        GrammarBackend(tok, tok.vocab_size, [tok.eos_token_id], max_whitespace_cnt=0)


def test_refusal_leaves_the_engine_serving(engines):
    eng = engines["eagle3"]
    with pytest.raises(SamplingParamsError, match=r"uniqueItems would be ignored"):
        eng.generate(["And", "God"], [{"max_new_tokens": 4},
                                      {"json_schema": json.dumps({"type": "array", "items": {}, "uniqueItems": True})}])
    assert not scheduler_of(eng).running and not scheduler_of(eng).waiting
    out = eng.generate("And", {"json_schema": json.dumps(SUPPORTED["array-bounds"]), "max_new_tokens": 8})
    assert out["output_ids"]


def test_refusal_is_a_400_naming_the_clients_field():
    """The server's reading of the engine's message: the field the client sent (response_format or json_schema)."""
    with pytest.raises(GrammarError) as e:
        check_json_schema(json.dumps({"type": "integer", "not": {"const": 3}}))
    err = _sampling_error(str(e.value), {"json_schema": "response_format"})
    assert err.status == 400 and err.param == "response_format", (err.param, err.message)
    assert "not would be ignored" in err.message and err.message.startswith("response_format="), err.message
    assert _sampling_error(str(e.value), {}).param == "json_schema"


def test_the_engine_and_the_launch_flag_bound_the_padding():
    """EngineArgs.constrained_json_max_whitespace_cnt (SGLang's flag, --constrained-json-max-whitespace-cnt) reaches
    the grammars: under any whitespace the embedded model pads JSON with spaces until max_new_tokens; bounded, no run
    of whitespace is longer than the bound."""
    import re

    from sglang_eagle3.config import ConfigError
    from sglang_eagle3.launch_server import build_parser, engine_kwargs

    kw = engine_kwargs(build_parser().parse_args(["--constrained-json-max-whitespace-cnt", "2"]))
    assert kw["constrained_json_max_whitespace_cnt"] == 2
    with pytest.raises(ConfigError, match="constrained_json_max_whitespace_cnt=0 must be a positive integer"):
        Engine(model_path=TARGET, device="cpu", constrained_json_max_whitespace_cnt=0)
    params = {"json_schema": json.dumps(SUPPORTED["array-bounds"]), "max_new_tokens": 40, "temperature": 0}
    prompts = ["Answer in JSON:", "And God said,", "In the beginning"]
    runs = {}
    for bound in (None, 2):
        with Engine(model_path=TARGET, device="cpu", constrained_json_max_whitespace_cnt=bound) as eng:
            outs = eng.generate(prompts, [params] * len(prompts))
        runs[bound] = max(len(m) for o in outs for m in re.findall(r"\s+", o["text"]) or [""])
    assert runs[2] <= 2 < runs[None], runs  # (unbounded, the model pads: else nothing was tested)


@pytest.mark.parametrize("text,pointer", [
    ('{"type": "integer", "minimum": 1e400}', "#/minimum"),
    ('{"type": "object", "properties": {"x": {"type": "number", "maximum": NaN}}}', "#/properties/x/maximum"),
    ('{"enum": [1, -Infinity]}', "#/enum/1"),
])
def test_a_schema_number_past_floats_is_named(backend, text, pointer):
    """JSON's 1e400 reads as inf (and Python's reader takes NaN / Infinity): xgrammar's error for such a schema was
    "does not compile: RuntimeError", naming neither the keyword nor the value."""
    with pytest.raises(GrammarError) as e:
        backend.compile(GrammarSpec("json_schema", text))
    assert f"at {pointer}: " in str(e.value) and "not a finite number" in str(e.value), str(e.value)
