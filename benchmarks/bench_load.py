"""Checkpoint loading benchmark (CPU): seconds and peak RSS for a multi-shard checkpoint of a few GB.

Generates a Kimi-K2.5-shaped slice on the fly (``KimiK25ForConditionalGeneration`` config with text_config,
tensors under ``language_model.``, hidden 7168, MLA dims, 2048-wide experts: layer 0 dense, the rest MoE with
fewer experts and a smaller vocab than the real model so that it fits a few GB), random bf16, written shard by
shard (the writer itself never holds more than one shard). Then, each in a fresh process so that peak RSS
belongs to that load alone:

  stream  ``models.loader.load_target`` (one shard mapped at a time, lazy slices)
  naive   a whole-model dict: every shard read with safetensors.torch.load_file, then copied into the model

and reports, per mode (the fastest of --repeat fresh processes): seconds, GB/s, baseline RSS (after imports),
peak RSS, the model's own bytes, and the overhead = peak - baseline - model bytes, next to the largest shard.
The page cache is warm (the checkpoint was just written): this measures the loader, not the disk. The host may
be shared: the 1-minute load average is recorded with the results.

    python benchmarks/bench_load.py --out benchmarks/results/cpu/load.json [--int4] [--shard-mb 512]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from sglang_eagle3.bench.harness import git_commit

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sglang_eagle3.config import ModelConfig, RopeConfig  # noqa: E402
from sglang_eagle3.kernels.quant import PACK_FACTOR  # noqa: E402

PREFIX = "language_model."


def kimi_slice_config(layers: int, experts: int, vocab: int) -> ModelConfig:
    """Kimi-K2.5's per-layer shapes (REFERENCE.md) with fewer layers and experts and a smaller vocab."""
    return ModelConfig(
        vocab_size=vocab, hidden_size=7168, intermediate_size=18432, moe_intermediate_size=2048,
        num_hidden_layers=layers, num_attention_heads=64, q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128,
        qk_rope_head_dim=64, v_head_dim=128, n_routed_experts=experts, num_experts_per_tok=min(8, experts),
        n_shared_experts=1, first_k_dense_replace=1, n_group=1, topk_group=1, norm_topk_prob=True,
        routed_scaling_factor=2.827, scoring_func="sigmoid", topk_method="noaux_tc", rms_norm_eps=1e-6,
        max_position_embeddings=4096, rope=RopeConfig(theta=50000.0))


def checkpoint_layout(cfg: ModelConfig, int4: bool) -> list[tuple[str, tuple[int, ...], torch.dtype]]:
    """(name, shape, dtype) of every tensor, from a meta-device model and the loader's own HF naming."""
    from sglang_eagle3.models.deepseek_v3 import DeepseekV3ForCausalLM
    from sglang_eagle3.models.loader import hf_state_dict

    with torch.device("meta"):
        model = DeepseekV3ForCausalLM(cfg, dtype=torch.bfloat16, int4_experts=int4)
    out = []
    for name, t in hf_state_dict(model).items():
        dtype = torch.float32 if name.endswith("e_score_correction_bias") else t.dtype
        out.append((PREFIX + name, tuple(t.shape), torch.int64 if name.endswith("weight_shape") else dtype))
    return out


def quant_config() -> dict:
    return {"quant_method": "compressed-tensors", "format": "pack-quantized",
            "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": None, "output_activations": None,
                                          "weights": {"num_bits": 4, "type": "int", "symmetric": True,
                                                      "strategy": "group", "group_size": 32}}},
            "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*",
                       r"re:.*mlp\.(gate|up|gate_up|down)_proj.*", "re:.*vision_tower.*", "re:.*mm_projector.*"]}


def random_tensor(name: str, shape, dtype, g: torch.Generator) -> torch.Tensor:
    if dtype == torch.int32:
        return torch.randint(-2**31, 2**31 - 1, shape, generator=g, dtype=torch.int32)
    if "norm" in name:
        return torch.ones(shape, dtype=dtype)
    return (torch.randn(shape, generator=g, dtype=torch.float32) * 0.02).to(dtype)


def generate(path: str, cfg: ModelConfig, int4: bool, shard_bytes: int) -> dict:
    """Writes shards of at most shard_bytes (+ index + config) without holding more than one shard."""
    from safetensors.torch import save_file

    os.makedirs(path, exist_ok=True)
    layout = checkpoint_layout(cfg, int4)
    shapes = {n: s for n, s, _ in layout}
    sizes = [(n, s, d, torch.Size(s).numel() * d.itemsize) for n, s, d in layout]
    groups, cur, size = [], [], 0
    for item in sizes:
        if cur and size + item[3] > shard_bytes:
            groups.append(cur)
            cur, size = [], 0
        cur.append(item)
        size += item[3]
    groups.append(cur)
    g = torch.Generator().manual_seed(0)
    weight_map, shard_sizes = {}, []
    for i, group in enumerate(groups):
        fname = f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
        shard = {}
        for name, shape, dtype, _ in group:
            if name.endswith("weight_shape"):  # compressed-tensors metadata: the unpacked [out, in]
                packed = shapes[name[: -len("shape")] + "packed"]
                shard[name] = torch.tensor([packed[0], packed[1] * PACK_FACTOR], dtype=torch.int64)
            else:
                shard[name] = random_tensor(name, shape, dtype, g)
        save_file(shard, os.path.join(path, fname))
        shard_sizes.append(os.path.getsize(os.path.join(path, fname)))
        weight_map.update({k: fname for k in shard})
        del shard
    text = cfg.to_hf()
    text["model_type"] = "kimi_k2"
    config = {"architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25", "text_config": text}
    if int4:
        config["quantization_config"] = quant_config()
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)
    return {"shards": len(groups), "bytes": sum(shard_sizes), "largest_shard_bytes": max(shard_sizes),
            "tensors": len(layout)}


def rss_now() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def measure(path: str, mode: str) -> dict:
    """Runs in a fresh process: one load, then peak RSS from getrusage (KB on Linux)."""
    import logging

    from sglang_eagle3.models.deepseek_v3 import DeepseekV3ForCausalLM
    from sglang_eagle3.models.loader import hf_state_dict, load_target

    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
    baseline = rss_now()
    t0 = time.perf_counter()
    report = {}
    if mode == "stream":
        model = load_target(path, dtype=torch.bfloat16, report=report)
    else:
        from safetensors.torch import load_file

        from sglang_eagle3.models.loader import checkpoint_files

        cfg = ModelConfig.from_path(path)
        sd = {}
        for f in checkpoint_files(path):
            sd.update(load_file(f))  # the whole checkpoint as one dict (each shard stays mapped)
        # This benchmark's checkpoints carry a quantization_config only with --int4.
        model = DeepseekV3ForCausalLM(cfg, dtype=torch.bfloat16, int4_experts=bool(cfg.quantization))
        views = hf_state_dict(model)  # views into the model's parameters, by checkpoint name
        with torch.no_grad():
            for k, v in sd.items():
                k = k.removeprefix(PREFIX)
                if not k.endswith("weight_shape"):
                    views[k].copy_(v)
        del sd, views
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    model_bytes = sum(t.numel() * t.element_size() for t in list(model.parameters()) + list(model.buffers()))
    return {"seconds": round(seconds, 3), "baseline_rss_bytes": baseline, "peak_rss_bytes": peak,
            "model_bytes": model_bytes, "overhead_bytes": peak - baseline - model_bytes,
            "bytes_read": report.get("bytes_read")}


def run_child(path: str, mode: str) -> dict:
    out = subprocess.run([sys.executable, __file__, "--measure", path, "--mode", mode], check=True,
                         capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(REPO / "benchmarks/results/cpu/load.json"))
    ap.add_argument("--dir", default=None, help="where to write the checkpoint (default: a temp dir, removed)")
    ap.add_argument("--reuse", action="store_true", help="load the checkpoint already in --dir (no generation)")
    ap.add_argument("--layers", type=int, default=2, help="layer 0 dense, the rest MoE")
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=32768)
    ap.add_argument("--shard-mb", type=int, default=512)
    ap.add_argument("--int4", action="store_true", help="routed experts pack-quantized INT4, as Kimi-K2.5 ships")
    ap.add_argument("--modes", default="stream,naive")
    ap.add_argument("--repeat", type=int, default=2, help="fresh processes per mode; the fastest is reported")
    ap.add_argument("--measure", help=argparse.SUPPRESS)
    ap.add_argument("--mode", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure, args.mode)))
        return

    cfg = kimi_slice_config(args.layers, args.experts, args.vocab)
    root = args.dir or tempfile.mkdtemp(prefix="bench_load_")
    try:
        t0 = time.perf_counter()
        if args.reuse:
            files = sorted(f for f in os.listdir(root) if f.endswith(".safetensors"))
            sizes = [os.path.getsize(os.path.join(root, f)) for f in files]
            ckpt = {"shards": len(files), "bytes": sum(sizes), "largest_shard_bytes": max(sizes)}
            cfg = ModelConfig.from_path(root)
        else:
            ckpt = generate(root, cfg, args.int4, args.shard_mb << 20)
            ckpt["generate_seconds"] = round(time.perf_counter() - t0, 1)
        results = {}
        for mode in args.modes.split(","):
            runs = [run_child(root, mode) for _ in range(args.repeat)]
            r = dict(min(runs, key=lambda x: x["seconds"]))
            r["all_seconds"] = [x["seconds"] for x in runs]
            r["peak_rss_bytes_max_over_runs"] = max(x["peak_rss_bytes"] for x in runs)
            r["GB_per_s"] = round(ckpt["bytes"] / 1e9 / r["seconds"], 3)
            r["overhead_vs_largest_shard"] = round(r["overhead_bytes"] / ckpt["largest_shard_bytes"], 2)
            results[mode] = r
            gb = {k: r[k] / 1e9 for k in ("peak_rss_bytes", "baseline_rss_bytes", "model_bytes", "overhead_bytes")}
            print(f"{mode:>6}: {r['seconds']:.2f} s ({r['GB_per_s']:.2f} GB/s), peak RSS {gb['peak_rss_bytes']:.2f} GB"
                  f" = baseline {gb['baseline_rss_bytes']:.2f} + model {gb['model_bytes']:.2f} + overhead "
                  f"{gb['overhead_bytes']:.2f} GB ({r['overhead_vs_largest_shard']}x the largest shard, "
                  f"{ckpt['largest_shard_bytes'] / 1e9:.2f} GB)")
    finally:
        if not args.dir:
            shutil.rmtree(root, ignore_errors=True)
    commit = git_commit()
    doc = {
        "command": "python " + " ".join([os.path.relpath(__file__, REPO)] + sys.argv[1:]),
        "git_commit": commit,
        "load_average_1m_at_end": round(os.getloadavg()[0], 2),  # a shared host: other work slows the loads
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
                    "torch": torch.__version__,
                    "mem_total_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")},
        "checkpoint": {**ckpt, "layout": "KimiK25ForConditionalGeneration, language_model.* tensors",
                       "experts": "INT4 pack-quantized" if args.int4 else "bf16",
                       "shape": {"hidden": cfg.hidden_size, "layers": cfg.num_hidden_layers,
                                 "routed_experts": cfg.n_routed_experts, "moe_intermediate": cfg.moe_intermediate_size,
                                 "dense_intermediate": cfg.intermediate_size, "vocab": cfg.vocab_size}},
        "notes": "peak RSS from getrusage in a fresh process per mode; overhead = peak - baseline - model bytes; "
                 "warm page cache (checkpoint just written)",
        "results": results,
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
