"""Does a verify compute each token exactly as decode does? Kimi-K2.5 TP=8 rank slice, batch 1, one GPU.

Greedy speculation is exactly lossless only if the target's logits for a token are the same bits whether the
token is decoded alone (T=1, the plain engine) or verified inside a batch of k+1 (the speculative engine). Any
op whose rounding depends on how many rows it is given breaks that at near-ties of the top logits.

For each context and verify width T, the probe verifies T tokens at positions ctx .. ctx+T-1 (eager, with forward
hooks on every module of the first layers), then decodes the same tokens one at a time at those positions (each
decode writes its own KV, as a plain engine would), and reports:
- per row, whether the logits are bit-identical, their largest difference and whether the argmax moved;
- the modules that break it: those whose input row is bit-identical in both runs but whose output row is not
  (the first layers' modules, in execution order), i.e. where the first difference enters;
- the same for the CUDA graphs the engine replays (logits only: hooks do not fire in a replay).
Plus lm_head's GEMM alone (torch F.linear, bf16) at T rows against one row.

    python benchmarks/probe_invariance.py --layers 3 --contexts 1024 8192 --out $OUT/invariance.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout's package

from benchmarks.bench_kernels import ab_tag, add_kernels_from_arg, kernels_from  # noqa: E402
from benchmarks.bench_verify_graph import kimi_config, randomize_cuda  # noqa: E402
from sglang_eagle3 import kernels  # noqa: E402
from sglang_eagle3.bench.harness import git_commit  # noqa: E402
from sglang_eagle3.distributed.parallel_state import init_tp  # noqa: E402
from sglang_eagle3.models.deepseek_v3 import DeepseekV3ForCausalLM  # noqa: E402
from sglang_eagle3.runtime.model_runner import ModelRunner  # noqa: E402


def first_tensor(x):
    if isinstance(x, torch.Tensor):
        return x
    if isinstance(x, (tuple, list)) and x and isinstance(x[0], torch.Tensor):
        return x[0]
    return None


class Recorder:
    """Forward hooks on the modules of the first `layers` decoder layers (and the final norm / lm_head): each
    call's first input and first output tensor, copied, in call order."""

    def __init__(self, model, layers: int):
        self.calls: list[tuple[str, torch.Tensor | None, torch.Tensor | None]] = []
        self.on = False
        names = [f"model.layers.{i}." for i in range(layers)] + ["model.norm", "lm_head"]
        self.hooks = [m.register_forward_hook(self._hook(name)) for name, m in model.named_modules()
                      if any(name.startswith(p) or name == p.rstrip(".") for p in names)]

    def _hook(self, name):
        def hook(module, args, out):
            if self.on:
                a, o = first_tensor(args), first_tensor(out)
                self.calls.append((name, None if a is None else a.detach().clone(),
                                   None if o is None else o.detach().clone()))
        return hook

    def take(self):
        calls, self.calls = self.calls, []
        return calls


def row(t: torch.Tensor | None, i: int, T: int):
    """Row i of a [T, ...] (or [T*x, ...] with x rows a token, e.g. heads) tensor; None if not row-shaped."""
    if t is None or t.dim() == 0 or t.shape[0] % T:
        return None
    per = t.shape[0] // T
    return t[i * per:(i + 1) * per]


def culprits(verify_calls, decode_calls, i: int, T: int) -> list[dict]:
    """Modules whose input row i matches between the verify and the decode of token i but whose output does not
    (calls paired by name and order), leaving out those that only contain such a module."""
    out, seen = [], {}
    by_name = {}
    for name, a, o in decode_calls:
        by_name.setdefault(name, []).append((a, o))
    for name, a, o in verify_calls:
        n = seen.get(name, 0)
        seen[name] = n + 1
        if n >= len(by_name.get(name, [])):
            continue
        da, do = by_name[name][n]
        va, vo = row(a, i, T), row(o, i, T)
        if va is None or vo is None or da is None or do is None or va.shape != da.shape or vo.shape != do.shape:
            continue
        if torch.equal(va, da) and not torch.equal(vo, do):
            out.append({"module": name, "max_abs_diff": (vo.float() - do.float()).abs().max().item()})
    # a module whose difference comes from a submodule's is not a culprit of its own
    return [c for c in out if not any(o["module"].startswith(c["module"] + ".") for o in out)]


def lm_head_probe(vocab_slice: int, hidden: int, max_T: int) -> list[dict]:
    g = torch.Generator(device="cuda").manual_seed(3)
    w = (torch.randn(vocab_slice, hidden, generator=g, device="cuda") / hidden ** 0.5).bfloat16()
    h = torch.randn(max_T, hidden, generator=g, device="cuda").bfloat16()
    alone = [F.linear(h[i:i + 1], w) for i in range(max_T)]
    res = []
    for T in range(2, max_T + 1):
        batch = F.linear(h[:T], w)
        bad = [i for i in range(T) if not torch.equal(batch[i], alone[i][0])]
        res.append({"T": T, "rows_differing": bad,
                    "max_abs_diff": max(((batch[i].float() - alone[i][0].float()).abs().max().item() for i in bad),
                                        default=0.0)})
    return res


def probe(runner: ModelRunner, rec: Recorder, contexts: list[int], widths: list[int], pages: list[int],
          graphs: bool = True) -> list[dict]:
    """The verify-vs-decode comparison of the module docstring for each context and width (eager with hooks, then
    the graphs when ``graphs``)."""
    sync = torch.cuda.synchronize if runner.device.type == "cuda" else (lambda: None)
    cases = []
    for ctx in contexts:
        for T in widths:
            toks = [(1000 + 37 * i) % runner.target.config.vocab_size for i in range(T)]
            kinds = {}
            for kind in ("eager", "graph") if graphs else ("eager",):
                def forward(bt, n, kind=kind):
                    # (a copy: a replay's outputs are the graph pool's memory, which the next replay may reuse)
                    if kind == "graph":
                        return runner.target_uniform(bt, n, verify=n > 1)[0].float().clone()
                    fn = (runner.target_verify if n > 1 else runner.target_decode).fn
                    return fn(input_ids=bt.input_ids, positions=bt.positions, page_table=bt.page_table,
                              seq_lens=bt.seq_lens, out_cache_loc=bt.out_cache_loc, tokens_per_req=n)[0].float().clone()

                rec.on = kind == "eager"
                verify = forward(runner.build([(toks, ctx, pages)]), T)
                sync()
                v_calls, decode, d_calls = rec.take(), [], []
                for i in range(T):  # each decode writes its own KV at ctx + i, as a plain engine would
                    decode.append(forward(runner.build([([toks[i]], ctx + i, pages)]), 1)[0])
                    sync()
                    d_calls.append(rec.take())
                rec.on = False
                rows = []
                for i in range(T):
                    same = torch.equal(verify[i], decode[i])
                    r = {"row": i, "identical": same, "max_abs_diff": (verify[i] - decode[i]).abs().max().item(),
                         "argmax_moved": int(verify[i].argmax()) != int(decode[i].argmax())}
                    if kind == "eager" and not same:
                        r["culprits"] = culprits(v_calls, d_calls[i], i, T)[:12]
                    rows.append(r)
                kinds[kind] = rows
                print(f"ctx {ctx} T {T} {kind}: identical rows {[r['identical'] for r in rows]}; culprits "
                      f"{[[c['module'] for c in r.get('culprits', [])] for r in rows]}", flush=True)
            cases.append({"context": ctx, "T": T, **kinds})
    return cases


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--hook-layers", type=int, default=2, help="layers whose modules are hooked")
    ap.add_argument("--contexts", type=int, nargs="+", default=[1024, 8192])
    ap.add_argument("--widths", type=int, nargs="+", default=[2, 4, 8])
    add_kernels_from_arg(ap, "the eager probe again with each (results under 'cases [a+b]')")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    assert torch.cuda.is_available(), "needs a CUDA GPU"
    init_tp(0, 8, simulated=True)
    cfg = kimi_config(args.layers, 384)
    with torch.device("cuda"):
        model = DeepseekV3ForCausalLM(cfg, dtype=torch.bfloat16, int4_experts=True)
    randomize_cuda(model, 0)
    page_size, max_T = 64, max(args.widths)
    max_ctx = max(args.contexts) + max_T + page_size
    runner = ModelRunner(model, None, aux_layer_ids=(), num_pages=max_ctx // page_size + 4, page_size=page_size,
                         max_context=max_ctx, device=torch.device("cuda"), dtype=torch.bfloat16,
                         use_cuda_graph=True, cuda_graph_max_bs=1, verify_widths=tuple(range(2, max_T + 1)),
                         attention_backend="triton", moe_backend="triton")
    g = torch.Generator(device="cuda").manual_seed(1)
    for kv in runner.target_kv.layers:
        kv.normal_(generator=g)
    runner.capture_graphs()
    results = {"command": " ".join(["python"] + sys.argv), "git_commit": git_commit(),
               "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
               "triton": __import__("triton").__version__, "layers": args.layers,
               "kernel_report": kernels.kernel_report(),  # the table and GPU the launches followed (emulated too)
               "lm_head_gemm": lm_head_probe(cfg.vocab_size // 8, cfg.hidden_size, max_T)}
    print("lm_head F.linear, rows differing from one-row calls:",
          {r["T"]: r["rows_differing"] for r in results["lm_head_gemm"]}, flush=True)
    rec, pages = Recorder(model, args.hook_layers), list(range(1, 1 + max_ctx // page_size))
    results["cases"] = probe(runner, rec, args.contexts, args.widths, pages)
    for paths in args.kernels_from:
        print(f"--- eager, with the kernels of {paths}", flush=True)
        with kernels_from(paths)():
            results["cases" + ab_tag(paths)] = probe(runner, rec, args.contexts, args.widths, pages, graphs=False)
    if args.out:
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
