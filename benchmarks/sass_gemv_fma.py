"""The CUDA-core GEMV forms' SASS without a GPU: instructions, registers and the ops that show where a program's
issue slots go, per form (tests/kernels/compile_checks.py fma_gemv_cases: q_b with its norm, W_UV per head, the
router + shared pair, the q_a + kv_a plain pair at a Kimi TP=8 rank's shapes), rows of x a program and weight-tile
order (kernels/gemv.py lanes_first), compiled by Triton's own ptxas for sm_90 (H200) and sm_120 (RTX PRO 6000
Blackwell).

Above one row the forms are issue-bound (docs/BENCHMARKS.md, thirty-fourth session), so these counts are the
first thing a change to them moves; a GPU run (bench_gemv_launches.py, bench_verify_graph.py --paired) says what
they are worth. With --base REF the rows-first (default) kernels are also compiled from REF's
sglang_eagle3/kernels/triton/gemv.py and compared instruction by instruction (register names aside): "identical"
means the change leaves the default's code as it was.

    python benchmarks/sass_gemv_fma.py [--arch 90 120] [--rows 1 2 4 8] [--base REF] [--out OUT.json]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import triton

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "kernels"))

from compile_checks import _instructions, _opcodes, compile_fma_case, fma_gemv_cases, sass_of  # noqa: E402

from sglang_eagle3.bench.harness import git_commit  # noqa: E402

OPS = ("FFMA", "FMUL", "FADD", "PRMT", "SHF", "BAR", "LDS", "STS", "SHFL")


def counts(kernel) -> tuple[dict, list[str]]:
    """({instructions, registers, and OPS' counts}, the instructions with register names blanked) of a kernel."""
    sass, res = sass_of(kernel)
    ins = _instructions(sass)
    ops = _opcodes(ins)
    row = {"instructions": len(ins), "registers": int(re.search(r"REG:(\d+)", res).group(1)),
           **{op: ops[op] for op in OPS}}
    return row, [re.sub(r"\b(U?R|U?P)\d+\b", "r", line) for line in ins]


def with_proxy(cases: list[tuple]) -> list[tuple]:
    """fma_gemv_cases plus one matrix through gemv_fma_kernel at the pair's config and K: a pair program's work
    without the second kind of program's tail, which the pair's static count carries too."""
    q_b, pair = cases[0], cases[2]
    return cases + [("one_matrix_at_pair_config", q_b[1], q_b[2], pair[3], pair[4], {"NORM": False},
                     [a for a in q_b[6] if a != "nw_ptr"])]


def base_kernels(ref: str, folder: str):
    """REF's kernels/triton/gemv.py as a module of its own (written to ``folder``: Triton reads a kernel's source)."""
    src = subprocess.run(["git", "show", f"{ref}:sglang_eagle3/kernels/triton/gemv.py"], cwd=REPO,
                         capture_output=True, text=True)
    if src.returncode:
        raise SystemExit(f"--base {ref!r}: {src.stderr.strip()}")
    path = Path(folder) / "gemv_base.py"
    path.write_text(src.stdout)
    spec = importlib.util.spec_from_file_location("gemv_base", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", type=int, nargs="+", default=[90, 120], choices=[90, 120])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4], choices=[1, 2, 4, 8])
    ap.add_argument("--base", help="a git ref: compare the default (rows-first) kernels with that commit's")
    ap.add_argument("--out")
    args = ap.parse_args()
    rows_out = []
    with tempfile.TemporaryDirectory() as folder:
        base = with_proxy(fma_gemv_cases(base_kernels(args.base, folder))) if args.base else None
        for arch in args.arch:
            for i, case in enumerate(with_proxy(fma_gemv_cases())):
                for rows in args.rows:
                    default, default_ins = counts(compile_fma_case(case, rows, arch, LF=False))
                    lanes, _ = counts(compile_fma_case(case, rows, arch, LF=True))
                    row = {"arch": arch, "form": case[0], "rows": rows, "rows_first": default, "lanes_first": lanes}
                    if base:
                        row["identical_to_base"] = counts(compile_fma_case(base[i], rows, arch))[1] == default_ins
                    rows_out.append(row)
                    same = "" if not base else f"  as {args.base}: {row['identical_to_base']}"
                    print(f"sm_{arch} {case[0]:25s} rows={rows}: rows first {default['instructions']:5d} instr "
                          f"{default['registers']:3d} reg | lanes first {lanes['instructions']:5d} instr "
                          f"{lanes['registers']:3d} reg{same}", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"command": " ".join(["python", *sys.argv]), "git_commit": git_commit(),
                                              "triton": triton.__version__, "base": args.base, "rows": rows_out},
                                             indent=1))
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
