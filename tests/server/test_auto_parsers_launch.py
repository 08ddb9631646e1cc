"""``reasoning_parser="auto"`` in the Engine and ``--reasoning-parser auto`` / ``--tool-call-parser auto`` at launch
(runtime/auto_parsers.py; detection itself: tests/test_auto_parsers.py, against SGLang's in tests/integration).

Checked against: the parsers the tiny pairs' tokenizers call for (Kimi's call markers as special tokens: kimi_k2; none:
nothing), the same engine with the parser named (strict thinking's output equal), ``--chat-template`` deciding over
the checkpoint's template, and the errors where ``auto`` has nothing to read or strict thinking finds no format.
"""

from __future__ import annotations

import logging
import random

import pytest

from sglang_eagle3 import Engine
from sglang_eagle3.config import ConfigError
from sglang_eagle3.launch_server import build_parser, main, resolve_auto_parsers, server_config

from .test_reasoning import thinking_model  # noqa: F401  (the tiny pair with the markers as tokens: a fixture)

pytestmark = pytest.mark.usefixtures("torch_one_thread")


def test_engine_auto_is_the_named_parser(thinking_model):  # noqa: F811
    target, _ = thinking_model
    budget = random.randint(1, 5)
    outs = []
    for parser in ("auto", "kimi_k2"):
        eng = Engine(model_path=target, device="cpu", log_level="warning", reasoning_parser=parser,
                     enable_strict_thinking=True)
        assert eng.args.reasoning_parser == "kimi_k2"
        assert eng.get_server_info()["args"]["reasoning_parser"] == "kimi_k2"
        [think], [end] = eng.tokenizer.encode("<think>"), eng.tokenizer.encode("</think>")
        sp = {"temperature": 0, "max_new_tokens": budget + 4, "logit_bias": {think: 100.0, end: -100.0},
              "custom_params": {"thinking_budget": budget}}
        outs.append(eng.generate("Pack my box", sp)["output_ids"])
        eng.shutdown()
    assert outs[0] == outs[1] and outs[0][budget + 1] == end, outs


def test_engine_auto_without_a_format(tiny_model, caplog):
    with caplog.at_level(logging.WARNING, logger="sglang_eagle3.runtime.auto_parsers"):
        eng = Engine(model_path=tiny_model.target, device="cpu", log_level="warning", reasoning_parser="auto")
    assert eng.args.reasoning_parser is None and "reasoning_parser=auto: none detected" in caplog.text
    eng.shutdown()
    with pytest.raises(ConfigError, match="strict thinking with reasoning_parser='auto': no reasoning format was "
                                          "found in the tokenizer's chat template"):
        Engine(model_path=tiny_model.target, device="cpu", reasoning_parser="auto", enable_strict_thinking=True)
    with pytest.raises(ConfigError, match="reasoning_parser='auto' reads the chat template, and there is no tokenizer"):
        Engine(model_path=tiny_model.target, device="cpu", reasoning_parser="auto", skip_tokenizer_init=True)
    with pytest.raises(ConfigError, match="reasoning_parser='r1' must be one of .* or auto"):
        Engine(model_path=tiny_model.target, device="cpu", reasoning_parser="r1")


def test_launch_resolves_auto_before_the_engine(thinking_model, tiny_model, tmp_path):  # noqa: F811
    target, _ = thinking_model
    args = build_parser().parse_args(["--model-path", target, "--reasoning-parser", "auto", "--tool-call-parser",
                                      "auto"])
    resolve_auto_parsers(args)
    assert (args.reasoning_parser, args.tool_call_parser) == ("kimi_k2", "kimi_k2")
    config = server_config(args)
    assert (config.reasoning_parser, config.tool_call_parser) == ("kimi_k2", "kimi_k2")
    # --chat-template's template decides the reasoning format; the calls' marker is still one token of the vocabulary
    template = tmp_path / "kimi_vl.jinja"
    template.write_text("{% for m in messages %}{{ m.content }}{% endfor %}◁think▷")
    args = build_parser().parse_args(["--model-path", target, "--reasoning-parser", "auto", "--tool-call-parser",
                                      "auto", "--chat-template", str(template)])
    resolve_auto_parsers(args)
    assert (args.reasoning_parser, args.tool_call_parser) == ("kimi", "kimi_k2")
    # named parsers are left as they are, nothing read
    args = build_parser().parse_args(["--model-path", target, "--reasoning-parser", "qwen3"])
    resolve_auto_parsers(args)
    assert (args.reasoning_parser, args.tool_call_parser) == ("qwen3", None)
    # a checkpoint without a format: none; with strict thinking, an error before the engine loads
    args = build_parser().parse_args(["--model-path", tiny_model.target, "--reasoning-parser", "auto"])
    resolve_auto_parsers(args)
    assert args.reasoning_parser is None
    args = build_parser().parse_args(["--model-path", tiny_model.target, "--reasoning-parser", "auto",
                                      "--enable-strict-thinking"])
    with pytest.raises(ValueError, match="strict thinking with reasoning_parser='auto': no reasoning format was "
                                         "found in the checkpoint's chat template"):
        resolve_auto_parsers(args)


def test_launch_auto_errors_exit_before_the_engine(tiny_model, capfd):
    assert main(["--model-path", tiny_model.target, "--reasoning-parser", "auto", "--skip-tokenizer-init"]) == 2
    assert main(["--model-path", tiny_model.target, "--tool-call-parser", "auto", "--chat-template",
                 "/nonexistent/template.jinja"]) == 2
    err = capfd.readouterr().err
    assert "reasoning_parser='auto' reads the chat template, and there is no tokenizer" in err
    assert "No such file or directory: '/nonexistent/template.jinja'" in err
