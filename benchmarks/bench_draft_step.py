"""The EAGLE-3 draft's forward at Kimi-K2.5 TP=8 rank shapes, with its attention on the torch reference and on the
Triton kernel, against the page table's width (a server's graphs are captured at its context limit).

The draft (hidden 7168, 64 heads on 8 kv heads of 128 -> 8 on 1 a rank, intermediate 18432 / 8, draft vocab
32000 / 8; the shape bench_e2e.py --kimi-slice uses) attends over its own paged cache. The torch reference
gathers every slot of the page table and repeats the kv head per query head in float32, so its cost grows with
the table's width whatever the context; the kernel reads a request's own keys. Three parts, each printed and
stored:

- ``attention``: the op alone (decode T=1, an extend of T=4), per context and table width, us per call in a graph
  and the bytes it must read (the context's keys and values).
- ``step``: one draft forward as a CUDA graph (decode: hidden H; extend of 4: the target's three hidden states,
  through fc), ms per replay, and its floor: the weights it reads (fc only when it runs) plus the context's keys
  and values over the copy bandwidth measured in the same run.
- ``sweep`` (with --sweep): the kernel's tuning candidates at each shape; the best by the geometric mean over the
  shapes, as a config-table entry.

    python benchmarks/bench_draft_step.py --out benchmarks/results/h200/draft_step.json [--sweep]
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import sglang_eagle3  # noqa: E402
from benchmarks.bench_kernels import copy_bandwidth, time_graph  # noqa: E402
from sglang_eagle3 import kernels  # noqa: E402
from sglang_eagle3.bench.harness import git_commit  # noqa: E402
from sglang_eagle3.config import DraftConfig  # noqa: E402
from sglang_eagle3.core import ForwardBatch, ForwardMode  # noqa: E402
from sglang_eagle3.distributed.parallel_state import init_tp  # noqa: E402
from sglang_eagle3.kernels import tuning  # noqa: E402
from sglang_eagle3.runtime.kv_cache import make_pool  # noqa: E402

TP = 8
PAGE = 64
HIDDEN, HEADS, KV_HEADS, HEAD_DIM = 7168, 64, 8, 128
VOCAB, DRAFT_VOCAB = 163840, 32000


def kimi_draft_config() -> DraftConfig:
    """The Kimi-shaped EAGLE-3 draft of bench_e2e.py --kimi-slice (random weights there and here)."""
    return DraftConfig(hidden_size=HIDDEN, intermediate_size=18432, num_attention_heads=HEADS,
                       num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM, vocab_size=VOCAB,
                       draft_vocab_size=DRAFT_VOCAB, rms_norm_eps=1e-6, rope_theta=50000.0,
                       max_position_embeddings=262144, aux_layer_ids=(2, 30, 58))


def paged_inputs(ctx: int, width: int, T: int, device) -> dict:
    """One request of ``ctx`` keys (its last T new) in a pool of ``width`` slots, pages in shuffled order."""
    pages = width // PAGE
    g = torch.Generator(device="cpu").manual_seed(ctx + T)
    table = (torch.randperm(pages, generator=g) + 1).to(torch.int32)[None].to(device)
    pos = torch.arange(ctx - T, ctx)
    slots = table[0, (pos // PAGE).to(device)].long() * PAGE + (pos % PAGE).to(device)
    return {"page_table": table, "seq_lens": torch.tensor([ctx], dtype=torch.int32, device=device),
            "positions": pos.to(device), "out_cache_loc": slots, "num_pages": pages + 1}


def attention_case(ctx: int, width: int, T: int, backend: str, device, config: dict | None = None) -> dict:
    inp = paged_inputs(ctx, width, T, device)
    kv = torch.randn(inp["num_pages"] * PAGE, 2, KV_HEADS // TP, HEAD_DIM, device=device, dtype=torch.bfloat16)
    q = torch.randn(T, HEADS // TP, HEAD_DIM, device=device, dtype=torch.bfloat16)
    kw = dict(tokens_per_req=T, page_size=PAGE, sm_scale=HEAD_DIM ** -0.5)
    if backend == "torch":
        call = lambda: kernels.ref_gqa_attention(q, kv, inp["page_table"], inp["seq_lens"], **kw)  # noqa: E731
    else:
        call = lambda: kernels.triton_gqa_attention(q, kv, inp["page_table"], inp["seq_lens"], **kw,  # noqa: E731
                                                    config=config)
    us = time_graph([call], replays=50)
    nbytes = ctx * 2 * (KV_HEADS // TP) * HEAD_DIM * 2 + 2 * q.numel() * 2
    return {"us": round(us, 2), "bytes": nbytes, "gbps": round(nbytes / us / 1e3, 1)}


def draft_bytes(draft, with_fc: bool) -> int:
    """Weights one forward reads: every parameter of the draft (fc only when the target's states come in)."""
    return sum(p.numel() * p.element_size() for n, p in draft.named_parameters() if with_fc or not n.startswith("fc."))


def step_case(draft, embed: torch.Tensor, ctx: int, width: int, T: int, device) -> float:
    """ms per replay of one draft forward (decode with T=1, an extend of T with the target's hidden states)."""
    inp = paged_inputs(ctx, width, T, device)
    pool = make_pool(1, inp["num_pages"], PAGE, (2, KV_HEADS // TP, HEAD_DIM), torch.bfloat16, device)
    pool.layers[0].normal_()
    mode = ForwardMode.DECODE if T == 1 else ForwardMode.DRAFT_EXTEND
    fb = ForwardBatch(mode=mode, kv=pool, page_table=inp["page_table"], seq_lens=inp["seq_lens"],
                      out_cache_loc=inp["out_cache_loc"], tokens_per_req=T)
    ids = torch.randint(0, embed.shape[0], (T,), device=device)
    hidden = torch.randn(T, HIDDEN * (1 if T == 1 else 3), device=device, dtype=torch.bfloat16)
    with torch.inference_mode():
        us = time_graph([lambda: draft(ids, hidden, inp["positions"], fb, embed, draft.lm_head)], replays=30)
    return us / 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--contexts", type=int, nargs="+", default=[1024, 8192, 32768])
    ap.add_argument("--widths", type=int, nargs="+", default=[0, 131072],
                    help="page table slots (0: the context itself, rounded up to a page)")
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--parts", nargs="+", default=["attention", "step"], choices=["attention", "step"])
    ap.add_argument("--sweep", action="store_true", help="time the kernel's tuning candidates too")
    ap.add_argument("--out")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_draft_step.py needs a CUDA GPU")
    device = torch.device("cuda")
    t0 = time.time()
    bw = copy_bandwidth()
    best_bw = max(bw.values())
    out = {"command": " ".join(["python", *sys.argv]), "git_commit": git_commit(), "package": sglang_eagle3.__file__,
           "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": __import__("triton").__version__,
           "python": platform.python_version(), "copy_bw_gbps": bw,
           "kernel_config": tuning.get_config("gqa_attention", device, "rows", 8),
           "workload": f"Kimi-shaped EAGLE-3 draft, one TP={TP} rank: {HEADS // TP} query heads on {KV_HEADS // TP} "
                       f"kv head of {HEAD_DIM}, page {PAGE}, batch 1, random weights",
           "attention": [], "step": [], "sweep": []}
    shapes = [(ctx, w or math.ceil(ctx / PAGE) * PAGE, T) for ctx in a.contexts for w in a.widths for T in a.tokens
              if not w or w >= ctx]

    if "attention" in a.parts:
        print("attention alone, us per call (graph):", flush=True)
        for ctx, width, T in shapes:
            row = {"context": ctx, "width": width, "T": T}
            for backend in ("torch", "triton"):
                r = attention_case(ctx, width, T, backend, device)
                row[backend] = r
            row["torch_over_triton"] = round(row["torch"]["us"] / row["triton"]["us"], 1)
            out["attention"].append(row)
            print(f"  ctx {ctx:6d} width {width:6d} T={T}: torch {row['torch']['us']:9.1f}  triton "
                  f"{row['triton']['us']:7.2f} ({row['triton']['gbps']:6.0f} GB/s)  {row['torch_over_triton']}x",
                  flush=True)

    if "step" in a.parts:
        from benchmarks.bench_verify_graph import randomize_cuda
        from sglang_eagle3.models.eagle3 import Eagle3Draft

        init_tp(0, TP, simulated=True)
        with torch.device(device):
            draft = Eagle3Draft(kimi_draft_config(), dtype=torch.bfloat16)
            embed = torch.randn(VOCAB // TP, HIDDEN, dtype=torch.bfloat16) * 0.02  # the target's embedding slice
        randomize_cuda(draft, 1)
        print("draft forward, ms per replay (graph):", flush=True)
        for ctx, width, T in shapes:
            row = {"context": ctx, "width": width, "T": T}
            floor_bytes = draft_bytes(draft, with_fc=T > 1) + ctx * 2 * (KV_HEADS // TP) * HEAD_DIM * 2
            row["floor_ms"] = round(floor_bytes / (best_bw * 1e9) * 1e3, 4)
            for backend in ("torch", "triton"):
                draft.set_kernel_backends("auto")
                draft.midlayer.self_attn.use_triton = backend == "triton"
                row[f"{backend}_ms"] = round(step_case(draft, embed, ctx, width, T, device), 4)
                torch.cuda.empty_cache()
            row["triton_over_floor"] = round(row["triton_ms"] / row["floor_ms"], 2)
            out["step"].append(row)
            print(f"  ctx {ctx:6d} width {width:6d} T={T}: torch {row['torch_ms']:8.3f}  triton {row['triton_ms']:7.3f}"
                  f"  floor {row['floor_ms']:.3f}  ({row['triton_over_floor']}x floor)", flush=True)
        draft.set_kernel_backends("auto")

    if a.sweep:
        widest = max(w for _, w, _ in shapes)
        sweep_shapes = [(ctx, w, T) for ctx, w, T in shapes if w == widest]  # a server's page table
        print(f"sweep at width {widest} (us per call):", flush=True)
        results = []
        for cand in tuning.CANDIDATES["gqa_attention"]:
            cfg = {**tuning.DEFAULTS["gqa_attention"], **cand}
            try:
                us = [attention_case(ctx, width, T, "triton", device, cfg)["us"] for ctx, width, T in sweep_shapes]
            except Exception as exc:  # a candidate that does not compile or fit is skipped
                print(f"  {cand}: failed ({type(exc).__name__})", flush=True)
                continue
            geo = math.exp(statistics.fmean(math.log(u) for u in us))
            results.append({"config": cand, "us": us, "geomean_us": round(geo, 3)})
            print(f"  {cand}: geomean {geo:.2f} us  {us}", flush=True)
        results.sort(key=lambda r: r["geomean_us"])
        out["sweep"] = {"shapes": [{"context": c, "width": w, "T": t} for c, w, t in sweep_shapes], "results": results,
                        "best": results[0]["config"] if results else None}
        if results:
            print(f"best: {results[0]['config']} ({results[0]['geomean_us']} us geomean; defaults "
                  f"{tuning.DEFAULTS['gqa_attention']})", flush=True)
    out["seconds"] = round(time.time() - t0, 1)
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(out, indent=1) + "\n")
        print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
