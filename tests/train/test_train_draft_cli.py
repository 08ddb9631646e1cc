"""``python -m sglang_eagle3.train_draft``'s checks: every bad flag, path or text is one line naming the flag
(exit code 2) before the target loads and before --output exists; the draft directory is written whole or not
at all; the trainers' configs refuse bad values with ValueError (asserts vanish under ``python -O``)."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch

import sglang_eagle3.config
import sglang_eagle3.models.loader
from sglang_eagle3 import train_draft
from sglang_eagle3.engine import EMBEDDED_DIR
from sglang_eagle3.train.draft import DraftTrainConfig, generate_greedy
from sglang_eagle3.train.draft import train_draft as train_draft_loop
from sglang_eagle3.train.target import TargetTrainConfig

pytestmark = pytest.mark.usefixtures("torch_one_thread")

TARGET = os.path.join(EMBEDDED_DIR, "target")  # 6 layers, hidden 256 (4 default draft heads of 64)
TEXT = ("In the beginning God made the heaven and the earth. And the earth was waste and without form; and it "
        "was dark on the face of the deep: and the Spirit of God was moving on the face of the waters.\n") * 4


class TargetLoaded(Exception):
    pass


@pytest.fixture
def files(tmp_path, monkeypatch):
    def refuse(*args, **kwargs):
        raise TargetLoaded("the target was loaded before the flags were checked")

    monkeypatch.setattr(sglang_eagle3.models.loader, "load_target", refuse)
    data = tmp_path / "data.txt"
    data.write_text(TEXT)
    return {"data": str(data), "output": str(tmp_path / "out" / "draft"), "tmp": tmp_path}


def _argv(files, *extra):
    return ["--target-model-path", TARGET, "--data", files["data"], "--output", files["output"],
            "--device", "cpu", "--prompt-tokens", "8", *extra]


@pytest.mark.parametrize("extra, expect", [
    (["--steps", "0"], "--steps: 0 must be >= 1"),
    (["--batch-size", "0"], "--batch-size: 0 must be >= 1"),
    (["--ttt-steps", "0"], "--ttt-steps: 0 must be >= 1"),
    (["--lr", "-1"], "--lr: -1.0 must be"),
    (["--lr", "nan"], "--lr: nan must be"),
    (["--draft-vocab-size", "0"], "--draft-vocab-size: 0 must be >= 1"),
    (["--gen-batch-size", "0"], "--gen-batch-size: 0 must be >= 1"),
    (["--time-limit", "-1"], "--time-limit: -1.0 must be"),
    (["--gen-tokens", "-1"], "--gen-tokens: -1 must be >= 0"),
    (["--aux-layer-ids", "a,b"], "--aux-layer-ids: 'a,b' is not a comma-separated list"),
    (["--aux-layer-ids", "2,3"], "--aux-layer-ids: '2,3' must be 3 layer ids"),
    (["--aux-layer-ids", "2,3,99"], "--aux-layer-ids: aux layer id 99 out of range"),
    (["--aux-layer-ids", "1,2,3"], "--aux-layer-ids: aux layer ids [1, 2, 3]: a first id of 1"),
    (["--num-kv-heads", "3"], "--num-kv-heads"),
    (["--eval-data", "/nonexistent/heldout.txt"], "--eval-data '/nonexistent/heldout.txt' does not exist"),
    (["--gen-tokens", "0", "--seq-len", "1000"], "fewer than one --seq-len=1000 window"),
    (["--prompt-tokens", "1000"], "not more than --prompt-tokens=1000"),
    (["--num-sequences", "0"], "--num-sequences 0 (all windows) needs --gen-tokens 0"),
    (["--device", "tpu"], "--device 'tpu'"),
    (["--report", "/nonexistent/dir/report.json"], "--report '/nonexistent/dir/report.json'"),
])
def test_bad_flags_stop_before_the_target_loads(files, capsys, extra, expect):
    with pytest.raises(SystemExit) as e:
        train_draft.main(_argv(files, *extra))
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert expect in err and "Traceback" not in err, err
    assert not os.path.exists(os.path.dirname(files["output"])), "--output's parent created before any check"


def test_bad_paths_stop_before_the_target_loads(files, capsys):
    bad_jsonl = files["tmp"] / "bad.jsonl"
    bad_jsonl.write_text('{"title": "no text"}\n')
    empty_dir = files["tmp"] / "empty"
    empty_dir.mkdir()
    no_tokenizer = files["tmp"] / "no_tokenizer"
    no_tokenizer.mkdir()
    shutil.copyfile(os.path.join(TARGET, "config.json"), no_tokenizer / "config.json")
    cases = [
        ("--target-model-path", "/nonexistent/target", "--target-model-path '/nonexistent/target' is not a dir"),
        ("--target-model-path", os.path.join(EMBEDDED_DIR, "draft"), "is an EAGLE-3 draft, not a target"),
        ("--target-model-path", str(no_tokenizer), "tokenizer.json not found"),
        ("--data", "/nonexistent/data.txt", "--data '/nonexistent/data.txt' does not exist"),
        ("--data", str(bad_jsonl), "a JSONL row needs 'text'"),
        ("--data", str(empty_dir), "no .txt/.jsonl files under"),
    ]
    for flag, value, expect in cases:
        argv = _argv(files)
        argv[argv.index(flag) + 1] = value
        with pytest.raises(SystemExit) as e:
            train_draft.main(argv)
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert flag in err and expect in err and "Traceback" not in err, (flag, value, err)


def test_output_must_be_new_empty_or_a_previous_draft(files, capsys):
    out = files["tmp"] / "taken"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(SystemExit):
        train_draft.main(_argv(files) + ["--output", str(out)])
    assert "holds files a draft does not write (notes.txt)" in capsys.readouterr().err
    assert os.listdir(out) == ["notes.txt"]
    afile = files["tmp"] / "afile"
    afile.write_text("")
    with pytest.raises(SystemExit):
        train_draft.main(_argv(files) + ["--output", str(afile)])
    assert "is a file" in capsys.readouterr().err
    # A previous draft's files (and the report written beside them) pass the checks and reach the target load.
    (out / "notes.txt").unlink()
    for name in ("config.json", "model.safetensors", "report.json"):
        (out / name).write_text("old")
    with pytest.raises(TargetLoaded):
        train_draft.main(_argv(files) + ["--output", str(out), "--report", str(out / "report.json")])


def test_a_failed_write_leaves_nothing(tmp_path, monkeypatch):
    def broken_save(draft, out_dir, dtype):
        with open(os.path.join(out_dir, "config.json"), "w") as f:
            f.write("{}")
        raise OSError("disk full")

    monkeypatch.setattr(train_draft, "save_draft", broken_save)
    fresh = tmp_path / "fresh"
    with pytest.raises(OSError, match="disk full"):
        train_draft.write_draft(None, str(fresh), torch.bfloat16)
    assert os.listdir(tmp_path) == []  # no draft, no hidden partial directory
    previous = tmp_path / "previous"
    previous.mkdir()
    (previous / "config.json").write_text("old")
    with pytest.raises(OSError, match="disk full"):
        train_draft.write_draft(None, str(previous), torch.bfloat16)
    assert os.listdir(tmp_path) == ["previous"] and (previous / "config.json").read_text() == "old"


@pytest.mark.skipif(not os.path.exists(os.path.join(TARGET, "model.safetensors")), reason="embedded weights absent")
def test_tiny_run_writes_the_draft_whole_and_replaces_a_previous_one(tmp_path, monkeypatch):
    data = tmp_path / "data.txt"
    data.write_text(TEXT)
    out = tmp_path / "draft"
    argv = ["--target-model-path", TARGET, "--data", str(data), "--output", str(out), "--device", "cpu",
            "--steps", "2", "--batch-size", "2", "--ttt-steps", "2", "--num-sequences", "2", "--prompt-tokens", "8",
            "--gen-tokens", "4", "--draft-vocab-size", "64", "--aux-layer-ids", "2,3,5", "--num-heads", "2",
            "--head-dim", "32", "--intermediate-size", "64", "--eval-data", str(data), "--eval-prompts", "1",
            "--eval-new-tokens", "4", "--report", str(out / "report.json")]
    train_draft.main(argv)
    assert sorted(os.listdir(out)) == ["config.json", "model.safetensors", "report.json"]
    with open(out / "config.json") as f:
        assert json.load(f)["draft_vocab_size"] == 64
    (out / "config.json").write_text("stale")
    report = train_draft.main(argv)  # into the previous draft's directory: replaced
    assert sorted(os.listdir(tmp_path)) == ["data.txt", "draft"]
    assert json.loads((out / "config.json").read_text())["architectures"] == ["LlamaForCausalLMEagle3"]
    assert report["steps_done"] == 2 and "eval" in report


@pytest.mark.parametrize("kwargs, field", [
    ({"steps": 0}, "steps=0"), ({"batch_size": 0}, "batch_size=0"), ({"ttt_steps": 0}, "ttt_steps=0"),
    ({"lr": -1.0}, "lr=-1.0"), ({"lr": float("nan")}, "lr=nan"), ({"warmup_steps": 5, "steps": 5}, "warmup_steps=5"),
    ({"time_limit_s": -1.0}, "time_limit_s=-1.0"),
])
def test_train_configs_raise_value_error(kwargs, field):
    with pytest.raises(ValueError, match=field):
        DraftTrainConfig(**kwargs)
    if "ttt_steps" not in kwargs:
        with pytest.raises(ValueError, match=field):
            TargetTrainConfig(**kwargs)
    with pytest.raises(ValueError, match="seq_len=1"):
        TargetTrainConfig(seq_len=1)


def test_generate_greedy_refuses_a_zero_batch():
    with pytest.raises(ValueError, match="batch_size=0"):
        generate_greedy(None, [[1, 2]], 4, 0, torch.device("cpu"))


def test_train_draft_refuses_no_sequences():
    # --gen-tokens 0 on text shorter than one window gave 0 sequences and torch's "random_ expects 'from' < 'to'".
    with pytest.raises(ValueError, match=r"sequences \[N >= 1, S >= 2\], got \[0, 8\]"):
        train_draft_loop(None, None, torch.zeros(0, 8, dtype=torch.long), None, (2, 3, 5), DraftTrainConfig(),
                         torch.device("cpu"))


# -- the audit's findings: each test failed before its fix ------------------------------------------------------
@pytest.mark.parametrize("line, expect", [
    ("not json", "not JSON"),
    ('"a bare string"', "not a JSON object"),  # was TypeError: string indices must be integers
    ("5", "not a JSON object"),  # was TypeError: argument of type 'int' is not iterable
    ('{"text": null}', "'text' must be a string"),  # was a TypeError deep in the tokenizer
    ('{"prompt": "a", "completion": 5}', "'completion' must be a string"),
])
def test_malformed_jsonl_names_the_file_and_line(files, capsys, line, expect):
    bad = files["tmp"] / "bad.jsonl"
    bad.write_text('{"text": "a good first row"}\n\n' + line + "\n")
    argv = _argv(files)
    argv[argv.index("--data") + 1] = str(bad)
    with pytest.raises(SystemExit) as e:
        train_draft.main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"--data {str(bad)!r}" in err and f"{bad}:3:" in err and expect in err and "Traceback" not in err, err


def test_text_that_is_not_utf8_names_the_file(files, capsys):
    folder = files["tmp"] / "corpus"
    folder.mkdir()
    (folder / "a.txt").write_text(TEXT)
    (folder / "b.txt").write_bytes(b"caf\xe9 latin-1\n")
    argv = _argv(files)
    argv[argv.index("--data") + 1] = str(folder)
    with pytest.raises(SystemExit):
        train_draft.main(argv)
    err = capsys.readouterr().err
    assert f"{folder / 'b.txt'}" in err and "UTF-8" in err, err


@pytest.mark.parametrize("extra, expect", [
    # Was a numpy/torch ValueError after the target had loaded.
    (["--seed", "-1"], "--seed: -1 must be"),
    (["--seed", str(2 ** 64)], f"--seed: {2 ** 64} must be"),
    # Sequences past the target's positions were an IndexError in the rope table after loading (and generating).
    (["--gen-tokens", "2100"], "max_position_embeddings=2048"),
    (["--gen-tokens", "0", "--seq-len", "2048"], "max_position_embeddings=2048"),
    (["--eval-data", "DATA", "--eval-new-tokens", "2040"], "--eval-new-tokens"),
    # A --report named like a draft file inside --output overwrote the draft's config.json after it was written.
    (["--report", "OUT/config.json"], "would overwrite the draft's config.json"),
    # Were silently ignored without --eval-data.
    (["--eval-prompts", "8"], "--eval-prompts given without --eval-data"),
    (["--eval-new-tokens", "8"], "--eval-new-tokens given without --eval-data"),
])
def test_more_bad_flags_stop_before_the_target_loads(files, capsys, extra, expect):
    extra = [x.replace("DATA", files["data"]).replace("OUT", files["output"]) for x in extra]
    with pytest.raises(SystemExit) as e:
        train_draft.main(_argv(files, *extra))
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert expect in err and "Traceback" not in err, err


def test_position_limit_is_the_real_one():
    """``positions_needed`` against the models: a batch of exactly the allowed length trains and simulates, one
    token more runs past the rope tables (drawn sizes, a tiny target with 24 positions)."""
    from sglang_eagle3.models.deepseek_v3 import DeepseekV3ForCausalLM
    from sglang_eagle3.models.eagle3 import Eagle3Draft
    from sglang_eagle3.testing import randomize, tiny_config, tiny_draft_config
    from sglang_eagle3.train.draft import chain_proposals, target_features, ttt_loss
    from sglang_eagle3.train.modules import reference_kernels, training_mode

    cfg = tiny_config(max_pos=24)
    target = randomize(DeepseekV3ForCausalLM(cfg, dtype=torch.float32), 0)
    draft = randomize(Eagle3Draft(tiny_draft_config(cfg, aux_ids=(0, 2, 3)), dtype=torch.float32), 1)
    embed = target.model.embed_tokens.weight
    gen = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))
    with torch.no_grad(), training_mode(target), reference_kernels(draft):
        for steps in (1, 2, int(torch.randint(3, 8, (), generator=gen))):
            limit = cfg.max_position_embeddings
            longest = max(S for S in range(2, 40) if train_draft.positions_needed(S, steps) <= limit)
            for S, fits in ((longest, True), (longest + 1, False)):
                ids = torch.randint(0, cfg.vocab_size, (2, S), generator=gen)

                def run(ids=ids, steps=steps):
                    logits, fc_in = target_features(target, ids, (0, 2, 3), None)
                    ttt_loss(draft, embed, ids, fc_in, logits, torch.arange(cfg.vocab_size), steps, 0.8)
                    chain_proposals(draft, embed, ids, fc_in, steps)

                if fits:
                    run()
                else:
                    with pytest.raises(IndexError):
                        run()


def _tiny_argv(data, out, *extra):
    return ["--target-model-path", TARGET, "--data", str(data), "--output", str(out), "--device", "cpu",
            "--batch-size", "2", "--ttt-steps", "2", "--num-sequences", "2", "--prompt-tokens", "8",
            "--gen-tokens", "4", "--draft-vocab-size", "64", "--aux-layer-ids", "2,3,5", "--num-heads", "2",
            "--head-dim", "32", "--intermediate-size", "64", *extra]


needs_weights = pytest.mark.skipif(not os.path.exists(os.path.join(TARGET, "model.safetensors")),
                                   reason="embedded weights absent")


@needs_weights
def test_progress_goes_to_stderr_with_throughput_and_eta(tmp_path, capsys):
    data = tmp_path / "data.txt"
    data.write_text(TEXT)
    steps = int(torch.randint(3, 7, ()))
    train_draft.main(_tiny_argv(data, tmp_path / "draft", "--steps", str(steps)))
    out, err = capsys.readouterr()
    assert "draft step" not in out and "generate:" not in out, out  # stdout: results only
    lines = [line for line in err.splitlines() if line.startswith("draft step")]
    assert len(lines) == steps  # log_every is 1 for fewer than 20 steps
    assert all("tok/s" in line and "ETA" in line for line in lines), lines
    assert f"draft step {steps}/{steps}" in lines[-1]
    assert "draft written to" in out


def ctrl_c_at_step(monkeypatch, n: int) -> list[int]:
    """Sends this process SIGINT (what Ctrl-C sends; the trainer handles it between steps) from the draft loss of
    training step n; one entry per loss computed."""
    import signal

    import sglang_eagle3.train.draft as draft_module

    real_loss, calls = draft_module.ttt_loss, []

    def loss_then_ctrl_c(*args, **kwargs):
        calls.append(1)
        if len(calls) == n:
            os.kill(os.getpid(), signal.SIGINT)
        return real_loss(*args, **kwargs)

    monkeypatch.setattr(draft_module, "ttt_loss", loss_then_ctrl_c)
    return calls


@needs_weights
def test_ctrl_c_during_training_writes_the_draft_so_far(tmp_path, monkeypatch, capsys):
    import signal

    from sglang_eagle3.models.loader import load_draft

    stop_at = int(torch.randint(1, 4, ()))
    calls = ctrl_c_at_step(monkeypatch, stop_at)
    data = tmp_path / "data.txt"
    data.write_text(TEXT)
    out = tmp_path / "draft"
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(SystemExit) as e:
        train_draft.main(_tiny_argv(data, out, "--steps", "50", "--report", str(out / "report.json"),
                                    "--eval-data", str(data)))
    assert e.value.code == 130
    assert signal.getsignal(signal.SIGINT) is before
    assert len(calls) == stop_at  # stopped after the step that was running
    err = capsys.readouterr().err
    assert f"interrupted at step {stop_at} of 50" in err and "Traceback" not in err, err
    report = json.loads((out / "report.json").read_text())
    assert report["interrupted"] and report["steps_done"] == stop_at and "eval" not in report
    tcfg = sglang_eagle3.config.ModelConfig.from_path(TARGET)
    load_draft(str(out), tcfg, dtype=torch.float32)  # a whole draft the engine loads
    assert sorted(os.listdir(tmp_path)) == ["data.txt", "draft"]


def test_ctrl_c_before_training_says_nothing_was_written(files, monkeypatch, capsys):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(sglang_eagle3.models.loader, "load_target", interrupted)
    with pytest.raises(SystemExit) as e:
        train_draft.main(_argv(files))
    assert e.value.code == 130
    err = capsys.readouterr().err
    assert "nothing was written" in err and files["output"] in err and "Traceback" not in err, err
    assert not os.path.exists(files["output"])
