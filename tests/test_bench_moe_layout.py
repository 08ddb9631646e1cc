"""benchmarks/bench_moe_layout.py on CPU: the tiled re-layout puts every word where the probe's tiled addressing
reads it, and the probe kernel (under the Triton interpreter, in a subprocess) reads the same words and scales over
both layouts at every K split, with the scales and without, each program's xor equal to one computed in torch."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def test_moe_layout_probe_tiles_hold_each_programs_run():
    """bench_moe_layout.tiled: (expert, N block)'s run is its chunks in turn, each the block's gate rows then its up
    rows, BLOCK_W words a row: every word where the probe's tiled addressing reads it (irregular small shapes)."""
    from benchmarks.bench_moe_layout import tiled

    e, i, hw, bn, bw = 3, 12, 20, 4, 5
    w = torch.randint(-1000, 1000, (e, 2 * i, hw), dtype=torch.int32)
    t = tiled(w, bn, bw)
    assert t.shape == (e, 2 * i * hw) and torch.equal(t.sort(dim=1).values, w.reshape(e, -1).sort(dim=1).values)
    for ex, nb, c, r, x in [(0, 0, 0, 0, 0), (2, 2, 3, 7, 4), (1, 1, 2, 5, 1), (2, 0, 1, 3, 2)]:
        at = nb * (2 * bn * hw) + c * (2 * bn * bw) + r * bw + x  # the kernel's rows_g / rows_u + chunk + word
        src_row = nb * bn + r if r < bn else i + nb * bn + (r - bn)
        assert t[ex, at] == w[ex, src_row, c * bw + x]


PROBE = """
import functools, sys
import torch
sys.path.insert(0, {repo!r})
from benchmarks.bench_moe_layout import layout_probe_kernel, tiled
E, I, HW, BN, BW, G, T, K = 5, 16, 24, 8, 4, 4, 2, 3
w = torch.randint(-2**31, 2**31 - 1, (E, 2 * I, HW), dtype=torch.int32)
s = torch.randint(-30000, 30000, (E, 2 * I, HW // G), dtype=torch.int16)
ids = torch.randint(0, E, (T * K,), dtype=torch.int32)
for split, scales in ((1, True), (3, True), (6, True), (3, False)):
    outs = {{}}
    for name, wt in (("rows", w.reshape(E, -1)), ("tiled", tiled(w, BN, BW))):
        out = torch.empty(T * K * (I // BN) * split, dtype=torch.int32)
        layout_probe_kernel[(T * K, I // BN, split)](wt, s, ids, out, H_WORDS=HW, I=I, BLOCK_N=BN, BLOCK_W=BW,
                                                      GROUP_WORDS=G, TILED=name == "tiled", SPLIT=split,
                                                      SCALES=scales)
        outs[name] = out
    span = HW // split
    for p in range(T * K):
        for nb in range(I // BN):
            rows = list(range(nb * BN, nb * BN + BN)) + list(range(I + nb * BN, I + nb * BN + BN))
            e = int(ids[p])
            for ks in range(split):
                x = functools.reduce(lambda a, b: a ^ b, w[e, rows, ks * span:(ks + 1) * span].flatten().tolist())
                sl = s[e, rows, ks * span // G:(ks + 1) * span // G]
                y = functools.reduce(lambda a, b: a ^ b, sl.flatten().tolist()) if scales else 0
                at = (p * (I // BN) + nb) * split + ks
                for name in outs:
                    assert int(outs[name][at]) == x ^ y, (name, split, scales, p, nb, ks)
print("ok")
"""


def test_moe_layout_probe_reads_the_same_words_in_both_layouts():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    proc = subprocess.run([sys.executable, "-c", PROBE.format(repo=str(REPO))], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-2000:]
