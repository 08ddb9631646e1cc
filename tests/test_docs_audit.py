"""The user docs against the code: every environment variable they name is in env.py's registry (and every one the
package reads is named there or in the registry), every flag they give a command exists in that command's parser,
docs/SERVER.md's flag table lists the launcher's flags with their defaults, the overlay's patch table is PATCHES,
and the files and modules they point at exist. Everything is read from the files, nothing is a snapshot."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import re
import shlex
from pathlib import Path

import pytest

from sglang_eagle3 import env

ROOT = Path(__file__).resolve().parents[1]
DOCS = ("README.md", "docs/SERVER.md", "docs/SGLANG_OVERLAY.md", "docs/CHECKPOINTS.md", "docs/EMBEDDED_MODEL.md",
        "benchmarks/README.md")
# Paths the docs name as history (files since moved), not as files to open.
HISTORICAL_PATHS = {"benchmarks/run_*.sh"}
# Flags the docs name that belong to other programs (pip's `pip download --no-deps`) or to every parser.
FOREIGN_FLAGS = {"--help", "--no-deps"}

_FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
_ENV_NAME = re.compile(r"\bSGLANG_EAGLE3_[A-Z0-9_]*[A-Z0-9]\b")


def _doc(path: str) -> str:
    return (ROOT / path).read_text()


def _existing_docs() -> list[str]:
    return [d for d in DOCS if (ROOT / d).exists()]


# -- environment variables ------------------------------------------------------------------------------------------

def test_every_env_variable_the_docs_name_is_registered():
    registered = {k.name for k in env.ALL}
    unknown = {f"{d}: {name}" for d in _existing_docs() for name in _ENV_NAME.findall(_doc(d))
               if name not in registered}
    assert not unknown, f"named in the docs but not in sglang_eagle3/env.py's ALL: {sorted(unknown)}"


def test_every_env_variable_the_package_reads_is_registered_and_documented():
    registered = {k.name for k in env.ALL}
    in_code = set()
    for path in (ROOT / "sglang_eagle3").rglob("*.py"):
        in_code |= {(name, path.relative_to(ROOT).as_posix()) for name in _ENV_NAME.findall(path.read_text())}
    unregistered = sorted(f"{p}: {n}" for n, p in in_code if n not in registered)
    assert not unregistered, f"read by the package but not in env.ALL: {unregistered}"
    docs = "\n".join(_doc(d) for d in _existing_docs())
    undocumented = sorted(k.name for k in env.ALL if k.name.startswith("SGLANG_EAGLE3_") and k.name not in docs)
    assert not undocumented, f"in env.ALL but named in none of {DOCS}: {undocumented}"


# -- command-line flags -------------------------------------------------------------------------------------------

def _options(parser) -> set[str]:
    return {s for a in parser._actions for s in a.option_strings}


def _bench_options(sub: str) -> set[str]:
    from sglang_eagle3.bench.__main__ import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        main([sub, "--help"])
    usage = out.getvalue().split("\n\n")[0]  # the usage lines hold every flag unbroken
    return set(_FLAG.findall(usage))


@pytest.fixture(scope="module")
def parsers() -> dict[str, set[str]]:
    from sglang_eagle3 import generate, launch_server, selfcheck, train_draft

    found = {f"sglang_eagle3.{m.__name__.rsplit('.', 1)[1]}": _options(m.build_parser())
             for m in (generate, launch_server, selfcheck, train_draft)}
    found.update({f"sglang_eagle3.bench {sub}": _bench_options(sub) for sub in ("run", "sweep", "compare")})
    return found


def _script_flags(path: Path) -> set[str]:
    """The flags a script (benchmarks/, scripts/) defines: the "--..." string literals of its source and of the
    benchmarks modules it imports (shared helpers such as bench_kernels.add_kernels_from_arg); no import, since
    some need a GPU stack."""
    text = path.read_text()
    flags = set(re.findall(r"[\"'](--[a-z][a-z0-9-]*)[\"']", text))
    for module in set(re.findall(r"^\s*(?:from|import) benchmarks\.(\w+)", text, flags=re.M)):
        helper = ROOT / "benchmarks" / f"{module}.py"
        if helper.is_file() and helper != path:
            flags |= set(re.findall(r"[\"'](--[a-z][a-z0-9-]*)[\"']", helper.read_text()))
    return flags


_COMMAND = re.compile(r"python3? -m sglang_eagle3\.(\w+)(?: (run|sweep|compare)\b)?"
                      r"|(?:python3? )?(?:PYTHONPATH=\S+ )?((?:benchmarks|scripts)/\w+\.py|(?<![\w/])\w+\.py(?= --))")


def _spans(text: str) -> list[str]:
    """Inline code spans and the logical lines of fenced blocks (backslash continuations joined)."""
    spans = []
    for block in re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.S):
        spans += block.replace("\\\n", " ").splitlines()
    spans += re.findall(r"`([^`\n]+(?:\n[^`\n]+)?)`", re.sub(r"```.*?```", "", text, flags=re.S))
    return spans


def _commands(span: str) -> list[tuple[str, str]]:
    """(command, the span's text up to the next command) for each command in a span."""
    ms = list(_COMMAND.finditer(span))
    out = []
    for i, m in enumerate(ms):
        end = ms[i + 1].start() if i + 1 < len(ms) else len(span)
        if m.group(1):
            cmd = f"sglang_eagle3.{m.group(1)}" + (f" {m.group(2)}" if m.group(2) else "")
        else:
            cmd = m.group(3)
        out.append((cmd, span[m.end():end]))
    return out


def _script_path(name: str) -> Path | None:
    for cand in (ROOT / name, ROOT / "benchmarks" / name, ROOT / "scripts" / name):
        if cand.is_file():
            return cand
    return None


def _words(text: str) -> list[str]:
    try:
        return shlex.split(text)
    except ValueError:
        return text.split()


def test_every_flag_given_to_a_command_in_the_docs_exists(parsers):
    problems, checked = [], 0
    for d in _existing_docs():
        for span in _spans(_doc(d)):
            for cmd, rest in _commands(span):
                checked += 1
                if cmd.startswith("sglang_eagle3."):
                    known = parsers.get(cmd)
                    if known is None:
                        if cmd != "sglang_eagle3.bench":  # the bare group, e.g. "python -m sglang_eagle3.bench"
                            problems.append(f"{d}: no command python -m {cmd}")
                        continue
                else:
                    path = _script_path(cmd)
                    if path is None:
                        problems.append(f"{d}: no script {cmd}")
                        continue
                    known = _script_flags(path)
                for word in _words(rest):
                    if " " in word and cmd == "sglang_eagle3.bench sweep" and "=" in word:
                        # a --config "NAME=FLAGS" value: the flags go to launch_server
                        problems += [f"{d}: {cmd} --config: launch_server has no {f}" for f in _FLAG.findall(word)
                                     if f not in parsers["sglang_eagle3.launch_server"]]
                        continue
                    flag = word.split("=", 1)[0]
                    if _FLAG.fullmatch(flag) and flag not in known | FOREIGN_FLAGS:
                        problems.append(f"{d}: {cmd} has no {flag} (in `{span.strip()[:80]}`)")
    assert checked >= 20, f"only {checked} commands found in the docs: has the way they are written changed?"
    assert not problems, "\n".join(problems)


def test_every_flag_the_docs_name_exists_somewhere(parsers):
    """A flag named in prose (no command before it) must still be one of ours, a script's or SGLang's as the
    package names it (SGLANG_OVERLAY.md, about SGLang's own flags, is left out)."""
    known = set().union(*parsers.values()) | FOREIGN_FLAGS
    for path in [*(ROOT / "benchmarks").glob("*.py"), *(ROOT / "scripts").glob("*.py"),
                 *(ROOT / "sglang_eagle3").rglob("*.py")]:
        known |= _script_flags(path)
    unknown = sorted({f"{d}: {f}" for d in _existing_docs() if d != "docs/SGLANG_OVERLAY.md"
                      for f in _FLAG.findall(_doc(d)) if f not in known})
    assert not unknown, f"flags the docs name that no parser defines: {unknown}"


def _server_table() -> list[tuple[list[str], str, str]]:
    """docs/SERVER.md's flag table: (the row's flags, its default cell, its meaning)."""
    text = _doc("docs/SERVER.md").split("## Flags", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and cells[0].startswith("`--"):
            rows.append((_FLAG.findall(cells[0]), cells[1], "|".join(cells[2:])))
    return rows


def test_server_flag_table_lists_every_launcher_flag(parsers):
    rows = _server_table()
    documented = {f for flags, _, _ in rows for f in flags}
    named = documented | {f for _, _, meaning in rows for f in _FLAG.findall(meaning)}  # aliases in the meaning
    flags = parsers["sglang_eagle3.launch_server"] - {"-h", "--help"}
    assert flags - named == set(), f"launch_server flags missing from docs/SERVER.md's table: {flags - named}"
    assert documented - flags == set(), f"docs/SERVER.md's table names flags launch_server lacks: {documented - flags}"


def _literal(cell: str) -> list[str]:
    """The default cell's values when it is plain literals (`64`, `auto`, "16777216 (16 MiB)", "`127.0.0.1`,
    `30000`"); [] when it is prose."""
    values = [v.strip() for v in cell.split(",")] if cell.count("`") >= 4 else [cell]
    out = []
    for v in values:
        m = re.fullmatch(r"`?([\w.,]+)`?(?: \([^)]*\))?", v)
        if not m:
            return []
        out.append(m.group(1))
    return out


def test_server_flag_table_defaults_match_the_code(parsers):
    from sglang_eagle3.engine import EngineArgs
    from sglang_eagle3.launch_server import build_parser
    from sglang_eagle3.server.config import ServerConfig

    engine = {f.name: f.default for f in dataclasses.fields(EngineArgs)}
    server = {f.name: f.default for f in dataclasses.fields(ServerConfig)}
    parsed = vars(build_parser().parse_args([]))
    problems, checked = [], 0
    for flags, cell, _ in _server_table():
        values = _literal(cell)
        if not values:
            continue
        if len(values) != len(flags):  # one value for several flags (`--attention-backend`, `--moe-runner-backend`)
            if len(values) != 1:
                continue
            values = values * len(flags)
        for flag, doc_value in zip(flags, values, strict=True):
            dest = flag[2:].replace("-", "_")
            if dest not in parsed:  # an alias (--tp): its canonical flag is in the row too
                continue
            code = parsed[dest]
            if code is None or (code is False and (dest in engine or dest in server)):
                code = engine.get(dest, server.get(dest))
            if code is None:  # resolved later (num_steps() and the like) or off
                if doc_value not in ("off", "none"):
                    continue
                code = doc_value
            if code is False:
                code = "off"
            elif code == ():
                code = "none"
            elif isinstance(code, tuple):
                code = ",".join(map(str, code))
            same = str(code) == doc_value
            with contextlib.suppress(ValueError):
                same = same or float(code) == float(doc_value)
            checked += 1
            if not same:
                problems.append(f"{flag}: docs/SERVER.md says {doc_value}, the code {code!r}")
    assert checked >= 15, f"only {checked} defaults read from docs/SERVER.md's table: has its layout changed?"
    assert not problems, "\n".join(problems)


# -- the overlay's patch table ---------------------------------------------------------------------------------------

def test_overlay_patch_table_is_patches():
    from sglang_eagle3.integration.sglang_overlay import PATCHES

    text = _doc("docs/SGLANG_OVERLAY.md").split("## Patched symbols", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"^\| ([a-z_]+\.[a-z_]+) \|", text, flags=re.M))
    assert documented == {p.key for p in PATCHES}


# -- files and modules -----------------------------------------------------------------------------------------------

def test_every_repository_path_the_docs_name_exists():
    """Paths under the package, benchmarks/, tests/, docs/ and scripts/ (written from the repository root, or from
    the package for its subfolders, as the docs write them)."""
    top = r"(?:sglang_eagle3|benchmarks|tests|scripts|docs)"
    sub = r"(?:runtime|server|kernels|models|layers|integration|train|bench|distributed)"
    pattern = re.compile(rf"(?<![\w/.-])((?:{top}|{sub})/[\w./*-]*[\w*])")
    missing = []
    for d in _existing_docs():
        for p in sorted(set(pattern.findall(_doc(d))) - HISTORICAL_PATHS):
            # placeholders (run_*.sh, run_sessionN_round.sh) match any file of that form
            glob = re.sub(r"(?<=[a-z])[A-Z]+(?=[_.])", "*", p)
            if not any(next(iter((ROOT / base).glob(glob)), None) for base in ("", "sglang_eagle3")):
                missing.append(f"{d}: {p}")
    assert not missing, f"paths the docs name that do not exist: {missing}"


def test_every_python_module_the_docs_run_exists():
    import importlib.util

    missing = sorted({f"{d}: {m}" for d in _existing_docs()
                      for m in re.findall(r"python3? -m (sglang_eagle3(?:\.\w+)*)", _doc(d))
                      if importlib.util.find_spec(m) is None})
    assert not missing, missing


# Files the docs name that live outside this repository (inside the pythonbible wheels scripts/build_corpus.py reads;
# the remote code that DeepSeek-V3's and Kimi's checkpoints ship, which docs/CHECKPOINTS.md follows).
FOREIGN_FILES = {"plain_text_readers_bible.py", "configuration_deepseek.py", "tokenization_kimi.py"}


def test_every_python_file_the_docs_name_exists():
    """Bare file names (`test_limits.py`, `sampling.py`) as well: each is some file of the repository."""
    names = {p.name for p in ROOT.rglob("*.py") if ".git" not in p.parts}
    missing = sorted({f"{d}: {f}" for d in _existing_docs()
                      for f in re.findall(r"(?<![\w/])(\w+\.py)\b", _doc(d)) if f not in names | FOREIGN_FILES})
    assert not missing, f"Python files the docs name that the repository does not have: {missing}"
