"""A user's audit of ``python -m sglang_eagle3.train_draft``: each test failed before its fix (but for the
reproducibility guard, which held already). Expected values come from the inputs (the target's config.json, the
tokenizer, the files' bytes, a model of SGLang's capture loop), never from the trainer's own output."""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import subprocess

import pytest
import torch

import sglang_eagle3.models.loader
from sglang_eagle3 import train_draft
from sglang_eagle3.config import ModelConfig
from sglang_eagle3.engine import EMBEDDED_DIR
from tests.train.test_train_draft_cli import ctrl_c_at_step

pytestmark = pytest.mark.usefixtures("torch_one_thread")

TARGET = os.path.join(EMBEDDED_DIR, "target")
with open(os.path.join(TARGET, "config.json")) as _f:
    TARGET_HF = json.load(_f)
LAYERS, VOCAB = TARGET_HF["num_hidden_layers"], TARGET_HF["vocab_size"]
TEXT = ("In the beginning God made the heaven and the earth. And the earth was waste and without form; and it "
        "was dark on the face of the deep: and the Spirit of God was moving on the face of the waters.\n") * 4
needs_weights = pytest.mark.skipif(not os.path.exists(os.path.join(TARGET, "model.safetensors")),
                                   reason="embedded weights absent")


class TargetLoaded(Exception):
    pass


@pytest.fixture
def no_load(monkeypatch):
    """The checks must all run before the target loads: reaching the load means a bad input got through."""
    def refuse(*args, **kwargs):
        raise TargetLoaded("the target was loaded: the flags passed every check")

    monkeypatch.setattr(sglang_eagle3.models.loader, "load_target", refuse)


@pytest.fixture
def data(tmp_path):
    path = tmp_path / "data.txt"
    path.write_text(TEXT)
    return path


def _argv(data, out, *extra, target=TARGET):
    return ["--target-model-path", str(target), "--data", str(data), "--output", str(out), "--device", "cpu",
            "--prompt-tokens", "8", *extra]


def _tiny(data, out, *extra):
    """A real run of a second or two: tiny draft, two regenerated sequences, a few steps."""
    return _argv(data, out, "--batch-size", "2", "--ttt-steps", "2", "--num-sequences", "2", "--gen-tokens", "4",
                 "--draft-vocab-size", "64", "--num-heads", "2", "--head-dim", "32", "--intermediate-size", "64",
                 *extra)


def _refused(argv, capsys, *expect):
    with pytest.raises(SystemExit) as e:
        train_draft.main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2, err
    assert "Traceback" not in err and all(x in err for x in expect), err
    return err


def _sglang_captures(ids, num_layers):
    """SGLang 0.5.23's deepseek_v2 capture loop: for each layer i in order, the residual stream entering it is
    appended once when i is in layers_to_capture. fc receives these, in this order."""
    return [i for i in range(num_layers) if i in ids]


# -- the draft SGLang would run: aux layer ids and vocabulary ----------------------------------------------------
@pytest.mark.parametrize("ids, expect", [
    # Layer L is never captured by SGLang: the draft's fc would get two states.
    (f"2,3,{LAYERS}", f"aux layer id {LAYERS} out of range"),
    # A repeated layer is captured once (was only a warning).
    ("2,3,3", "repeat a layer"),
    # SGLang concatenates in layer order; our trainer had fed fc in the written order.
    ("5,3,2", "not ascending"),
])
def test_aux_layer_ids_sglang_cannot_run_are_refused(no_load, data, tmp_path, capsys, ids, expect):
    parsed = [int(x) for x in ids.split(",")]
    assert _sglang_captures(parsed, LAYERS) != parsed  # what makes them wrong, independently of the trainer
    _refused(_argv(data, tmp_path / "d", "--aux-layer-ids", ids), capsys, "--aux-layer-ids", expect)


@pytest.mark.parametrize("num_layers", range(3, 70))
def test_default_aux_layer_ids_are_what_sglang_captures(num_layers):
    ids = list(train_draft.pick_aux_ids(None, num_layers))
    assert _sglang_captures(ids, num_layers) == ids and len(ids) == 3 and ids[0] != 1, ids
    sglang_default = [2, num_layers // 2, num_layers - 3]
    if _sglang_captures(sglang_default, num_layers) == sglang_default:
        assert ids == sglang_default  # SGLang's own default wherever it works


def test_draft_vocab_larger_than_the_targets_is_refused(no_load, data, tmp_path, capsys):
    # It was clamped to the target's vocabulary without a word.
    _refused(_argv(data, tmp_path / "d", "--draft-vocab-size", str(VOCAB + 1)), capsys,
             f"--draft-vocab-size {VOCAB + 1}", f"vocab_size={VOCAB}")
    with pytest.raises(TargetLoaded):
        train_draft.main(_argv(data, tmp_path / "d", "--draft-vocab-size", str(VOCAB)))


def test_odd_head_dim_is_refused(no_load, data, tmp_path, capsys):
    # Was a RuntimeError in the rotary embedding after the target had loaded and generated the data.
    _refused(_argv(data, tmp_path / "d", "--head-dim", "33", "--num-heads", "2"), capsys, "--head-dim", "33",
             "even")


# -- inputs ----------------------------------------------------------------------------------------------------
def test_a_json_file_is_not_read_as_lines_of_text(no_load, data, tmp_path, capsys):
    # A ShareGPT-style .json was trained on as one "document" per line of JSON.
    dump = tmp_path / "chats.json"
    dump.write_text(json.dumps([{"conversations": [{"from": "human", "value": TEXT}]}], indent=2))
    _refused(_argv(dump, tmp_path / "d"), capsys, f"--data {str(dump)!r}", ".txt or .jsonl")
    _refused(_argv(data, tmp_path / "d", "--eval-data", str(dump)), capsys, "--eval-data", ".txt or .jsonl")


def test_a_tokenizer_beyond_the_config_vocab_is_refused(no_load, data, tmp_path, capsys):
    # A tokenizer.json of another model beside the config: an IndexError in the embedding after loading.
    from tokenizers import Tokenizer

    top = max(Tokenizer.from_file(os.path.join(TARGET, "tokenizer.json")).encode(TEXT, add_special_tokens=False).ids)
    target = tmp_path / "target"
    target.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(os.path.join(TARGET, name), target / name)
    (target / "config.json").write_text(json.dumps({**TARGET_HF, "vocab_size": top}))
    _refused(_argv(data, tmp_path / "d", "--draft-vocab-size", "16", target=target), capsys,
             "--target-model-path", f"token id {top}", f"vocab_size={top}")


@pytest.mark.parametrize("extra, expect", [
    (["--seq-len", "100"], "--seq-len 100 applies only with --gen-tokens 0"),  # silently ignored
    (["--gen-tokens", "0", "--seq-len", "64"], "--prompt-tokens 8 applies only to regeneration"),
    (["--gen-tokens", "0", "--seq-len", "64", "--gen-batch-size", "4"], "applies only to regeneration"),
])
def test_flags_of_the_other_data_mode_are_refused(no_load, data, tmp_path, capsys, extra, expect):
    _refused(_argv(data, tmp_path / "d", *extra), capsys, expect)


def test_eval_notes_fewer_prompts_and_training_text(no_load, data, tmp_path, capsys):
    heldout = tmp_path / "heldout.txt"
    long_docs = [f"Document {i}: " + "words of held-out text " * 8 for i in range(3)]
    heldout.write_text("\n".join(long_docs + ["short one"]) + "\n")
    assert sum(len(d) >= 100 for d in long_docs) == 3
    with pytest.raises(TargetLoaded):
        train_draft.main(_argv(data, tmp_path / "d", "--eval-data", str(heldout), "--eval-prompts", "8"))
    assert "3 prompts, not --eval-prompts 8" in capsys.readouterr().err
    long_text = tmp_path / "long.txt"
    long_text.write_text("\n".join(long_docs) + "\n")
    with pytest.raises(TargetLoaded):
        train_draft.main(_argv(long_text, tmp_path / "d", "--eval-data", str(long_text)))
    assert "is --data's text" in capsys.readouterr().err


# -- where the results go ------------------------------------------------------------------------------------------
def test_unwritable_output_and_report_are_refused_before_training(no_load, data, tmp_path, capsys):
    # os.access says yes to root everywhere: /proc/<new> looked writable and failed after training.
    try:
        os.close(os.open("/proc/train_draft_probe", os.O_CREAT | os.O_WRONLY))
        pytest.skip("/proc takes new files here")
    except OSError:
        pass
    _refused(_argv(data, "/proc/draft_out"), capsys, "--output '/proc/draft_out'", "cannot create")
    _refused(_argv(data, tmp_path / "d", "--report", "/proc/report.json"), capsys, "--report '/proc/report.json'")


def test_report_may_not_overwrite_an_input(no_load, data, tmp_path, capsys):
    target = tmp_path / "target"
    target.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(os.path.join(TARGET, name), target / name)
    _refused(_argv(data, tmp_path / "d", "--report", str(data), target=target), capsys, "is a --data file")
    _refused(_argv(data, tmp_path / "d", "--report", str(target / "config.json"), target=target), capsys,
             "a file of --target-model-path")
    assert (target / "config.json").read_bytes() == open(os.path.join(TARGET, "config.json"), "rb").read()


# -- real runs -----------------------------------------------------------------------------------------------------
@needs_weights
def test_default_aux_ids_draft_is_whole_for_sglang_and_our_loader(data, tmp_path):
    from sglang_eagle3.models.loader import check_draft, load_draft

    out = tmp_path / "draft"
    train_draft.main(_tiny(data, out, "--steps", "2"))
    cfg = json.loads((out / "config.json").read_text())
    ids = cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    assert _sglang_captures(ids, LAYERS) == ids and len(ids) == 3, ids  # [2, 3, 3] before: two states captured
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["draft_vocab_size"] == 64
    tcfg = ModelConfig.from_path(TARGET)
    check_draft(str(out), tcfg)
    draft = load_draft(str(out), tcfg, dtype=torch.float32)
    assert int(draft.t2d.sum()) == 64 and bool(draft.t2d[torch.arange(64) + draft.d2t].all())


@needs_weights
def test_progress_within_a_generation_batch_and_during_evaluation(data, tmp_path, capsys, monkeypatch):
    # One batch (2 prompts < --gen-batch-size) of 4 tokens reported once, at its end; the evaluation said nothing.
    monkeypatch.setattr(train_draft, "LOG_INTERVAL_S", 1e-9)
    gen_tokens = 4
    train_draft.main(_tiny(data, tmp_path / "draft", "--steps", "1", "--eval-data", str(data), "--eval-prompts", "1",
                           "--eval-new-tokens", "3"))
    err = capsys.readouterr().err.splitlines()
    lines = [line for line in err if line.startswith("generate:")]
    assert len(lines) == gen_tokens, lines
    assert [int(line.split("(")[1].split("/")[0]) for line in lines] == [2 * t for t in range(1, gen_tokens + 1)]
    assert all("tok/s" in line and "ETA" in line for line in lines), lines
    assert len([line for line in err if line.startswith("eval generate:")]) == 3
    assert any(line.startswith("eval: drafting") for line in err), err


@needs_weights
def test_provenance_in_the_report_and_config(data, tmp_path, monkeypatch):
    monkeypatch.delenv("GIT_COMMIT", raising=False)
    out, report_path = tmp_path / "draft", tmp_path / "report.json"
    argv = _tiny(data, out, "--steps", "2", "--seed", "7", "--report", str(report_path))
    train_draft.main(argv)
    prov = json.loads(report_path.read_text())["provenance"]
    assert shlex.split(prov["command"]) == ["python", "-m", "sglang_eagle3.train_draft", *argv]
    data_sha = hashlib.sha256(data.read_bytes()).hexdigest()
    assert prov["data"]["files"] == [{"file": "data.txt", "bytes": len(data.read_bytes()), "sha256": data_sha}]
    with open(os.path.join(TARGET, "config.json"), "rb") as f:
        assert prov["target"]["sha256"]["config.json"] == hashlib.sha256(f.read()).hexdigest()
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=os.path.dirname(os.path.dirname(train_draft.__file__)),
                          capture_output=True, text=True).stdout.strip()
    if len(head) == 40:
        assert prov["git_commit"].split("-")[0] == head
    assert prov["settings"]["seed"] == 7 and prov["settings"]["dtype"] == "float32"
    record = json.loads((out / "config.json").read_text())[train_draft.PROVENANCE_KEY]
    assert record["command"] == prov["command"] and record["seed"] == 7
    assert record["data_sha256"] == prov["data"]["sha256"] and record["git_commit"] == prov["git_commit"]
    assert (record["steps_done"], record["steps_planned"], record["interrupted"]) == (2, 2, False)


@needs_weights
def test_ctrl_c_marks_the_partial_draft_in_its_config(data, tmp_path, monkeypatch):
    stop_at = int(torch.randint(1, 4, ()))
    calls = ctrl_c_at_step(monkeypatch, stop_at)
    out = tmp_path / "draft"
    with pytest.raises(SystemExit) as e:
        train_draft.main(_tiny(data, out, "--steps", "50"))  # no --report: config.json is the only record
    assert e.value.code == 130
    record = json.loads((out / "config.json").read_text())[train_draft.PROVENANCE_KEY]
    assert (record["interrupted"], record["steps_done"], record["steps_planned"]) == (True, len(calls), 50)


@needs_weights
def test_a_stale_report_does_not_survive_beside_a_new_draft(data, tmp_path, monkeypatch, capsys):
    # Ctrl-C during the evaluation left the previous run's --report beside the new draft.
    report_path = tmp_path / "report.json"
    report_path.write_text(json.dumps({"stale": True, "steps_done": 999}))

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(train_draft, "evaluate", interrupted)
    with pytest.raises(SystemExit) as e:
        train_draft.main(_tiny(data, tmp_path / "draft", "--steps", "2", "--eval-data", str(data),
                               "--report", str(report_path)))
    assert e.value.code == 130
    report = json.loads(report_path.read_text())
    assert "stale" not in report and report["steps_done"] == 2 and report["eval"] == "pending"
    assert "the --report" in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == ["data.txt", "draft", "report.json"]  # no temporary file left


@needs_weights
def test_same_seed_same_draft_other_seed_another(data, tmp_path):
    """A guard (this held before the audit): one command twice writes the same bytes, config.json's record
    included; another seed other weights."""
    out = tmp_path / "draft"
    written = []
    for seed in ("3", "3", "4"):
        train_draft.main(_tiny(data, out, "--steps", "3", "--seed", seed))
        written.append({name: (out / name).read_bytes() for name in ("config.json", "model.safetensors")})
    assert written[0] == written[1]
    assert written[0]["model.safetensors"] != written[2]["model.safetensors"]
