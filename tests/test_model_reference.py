"""Our DeepSeek-V3 target agrees with an independent implementation: transformers' DeepseekV3ForCausalLM.

A transformers model is built from our config (``ModelConfig.to_hf()`` + ``rope_interleave=True``), given
random weights with its own parameter names, written to disk (``save_pretrained``, which writes per-expert
tensors, or its raw state dict with transformers-5 stacked ``experts.gate_up_proj``), and loaded with our
loader. Prompt log-probs from ``Engine.generate(..., return_logprob=True, logprob_start_len=0)`` (the paged
prefill path, two prompts of different lengths in one batch) and full-vocabulary log-probs from our
``forward_dense`` must equal ``log_softmax`` of the transformers logits within 1e-4 absolute, in float32.

Sequences run to 200 positions, past YaRN's original_max_position_embeddings (64 here), so the interpolated
rope frequencies, the cos/sin attention factor (mscale / mscale_all_dim) and the softmax scale all matter.
"""

from __future__ import annotations

import dataclasses
import json
import os

import pytest
import torch
from conftest import small_config

from sglang_eagle3 import Engine
from sglang_eagle3.config import ModelConfig, RopeConfig
from sglang_eagle3.models.loader import load_target
from sglang_eagle3.testing import randomize

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("torch_one_thread")

ATOL = 1e-4


def yarn(mscale: float, mscale_all_dim: float) -> RopeConfig:
    return RopeConfig(theta=10000.0, kind="yarn", factor=4.0, original_max_position_embeddings=64, beta_fast=32.0,
                      beta_slow=1.0, mscale=mscale, mscale_all_dim=mscale_all_dim)


@dataclasses.dataclass(frozen=True)
class RefCase:
    name: str
    overrides: dict
    rope: RopeConfig | None = None
    layout: str = "save_pretrained"  # | "stacked" (raw transformers-5 state dict) | "kimi" (text_config nesting)
    tie: bool = False


CASES = [
    RefCase("qlora-grouped-dense1", dict(q_lora=16, n_group=2, topk_group=1, dense=1)),
    RefCase("noqlora-ungrouped-dense0-stacked", dict(q_lora=None, n_group=1, topk_group=1, dense=0), layout="stacked"),
    RefCase("yarn-qlora-4groups-top2groups", dict(q_lora=16, n_group=4, topk_group=2, experts=8, top_k=3, dense=1),
            rope=yarn(1.0, 1.0)),
    RefCase("yarn-mscale-ratio-noqlora-stacked", dict(q_lora=None, n_group=2, topk_group=1, dense=0),
            rope=yarn(1.0, 0.5), layout="stacked"),
    RefCase("yarn-0.707-tied-ungrouped", dict(q_lora=16, n_group=1, topk_group=1, dense=1, shared=2),
            rope=yarn(0.707, 0.707), tie=True),
    RefCase("kimi-layout", dict(q_lora=16, n_group=2, topk_group=1, dense=1), rope=yarn(1.0, 1.0), layout="kimi"),
]


def our_config(case: RefCase) -> ModelConfig:
    cfg = small_config(vocab=128, max_pos=256, **case.overrides)
    return dataclasses.replace(cfg, rope=case.rope or RopeConfig(theta=10000.0), tie_word_embeddings=case.tie)


def build_hf(cfg: ModelConfig, seed: int):
    hf_cfg = transformers.DeepseekV3Config(**cfg.to_hf(), rope_interleave=True,
                                           num_key_value_heads=cfg.num_attention_heads)
    hf_cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = transformers.DeepseekV3ForCausalLM(hf_cfg).float().eval()
    randomize(model, seed, scale=1.5)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, buf in model.named_buffers():
            if name.endswith("e_score_correction_bias"):  # a buffer in transformers, so randomize skips it
                buf.copy_(0.2 * torch.randn(buf.shape, generator=g))
    if cfg.tie_word_embeddings:
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    return model


def write_checkpoint(model, cfg: ModelConfig, path: str, layout: str) -> None:
    from safetensors.torch import save_file

    if layout == "save_pretrained":
        model.save_pretrained(path)
        return
    os.makedirs(path, exist_ok=True)
    sd = {k: v.contiguous() for k, v in model.state_dict().items() if "rotary_emb" not in k}
    hf_dict = model.config.to_dict()
    if layout == "stacked":
        assert any(k.endswith("mlp.experts.gate_up_proj") for k in sd)
        save_file(sd, os.path.join(path, "model.safetensors"))
        config = hf_dict
    else:  # Kimi-K2.5: the language model under text_config and a language_model. prefix, plus a vision tower
        sd = {"language_model." + k: v for k, v in sd.items()}
        sd["vision_tower.patch_embed.weight"] = torch.zeros(4, 4)
        save_file(sd, os.path.join(path, "model.safetensors"))
        config = {"architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
                  "text_config": hf_dict, "vision_config": {"hidden_size": 4}}
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f)


@pytest.fixture(scope="module", params=CASES, ids=lambda c: c.name)
def ref_case(request, tmp_path_factory):
    case = request.param
    cfg = our_config(case)
    seed = 1000 + CASES.index(case)
    model = build_hf(cfg, seed)
    path = str(tmp_path_factory.mktemp(case.name))
    write_checkpoint(model, cfg, path, case.layout)
    return case, cfg, model, path


def hf_logprobs(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0]
    return torch.log_softmax(logits.double(), -1)  # [S, V]


def prompts_for(seed: int, vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in (200, 37)]


def test_config_read_back(ref_case):
    """What transformers wrote (config.json with rope_parameters, or Kimi's text_config) parses to our config."""
    case, cfg, _, path = ref_case
    got = ModelConfig.from_path(path)
    fields = ("vocab_size", "hidden_size", "q_lora_rank", "kv_lora_rank", "n_group", "topk_group",
              "first_k_dense_replace", "routed_scaling_factor", "tie_word_embeddings", "num_experts_per_tok")
    assert {f: getattr(got, f) for f in fields} == {f: getattr(cfg, f) for f in fields}
    assert got.rope == cfg.rope
    assert got.weight_prefix == ("language_model." if case.layout == "kimi" else "")


def test_prompt_logprobs_match_transformers(ref_case):
    case, cfg, model, path = ref_case
    engine = Engine(model_path=path, device="cpu", dtype="float32", skip_tokenizer_init=True, page_size=16)
    prompts = prompts_for(CASES.index(case), cfg.vocab_size)
    outs = engine.generate(input_ids=prompts, sampling_params={"max_new_tokens": 1, "temperature": 0},
                           return_logprob=True, logprob_start_len=0)
    for ids, out in zip(prompts, outs, strict=True):
        rows = out["meta_info"]["input_token_logprobs"]
        assert rows[0] == [None, ids[0], None]
        assert [r[1] for r in rows] == ids
        ours = torch.tensor([r[0] for r in rows[1:]], dtype=torch.float64)
        ref = hf_logprobs(model, ids)
        theirs = ref[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]
        err = (ours - theirs).abs().max().item()
        assert err < ATOL, f"{case.name}: prompt logprobs differ from transformers by {err:.2e} (len {len(ids)})"
        # The first generated token is the transformers argmax (greedy) unless it is a near-tie.
        top2 = ref[-1].topk(2).values
        if top2[0] - top2[1] > 1e-3:
            assert out["output_ids"] == [int(ref[-1].argmax())]


def test_dense_forward_matches_transformers(ref_case):
    """The cache-free forward (training, references) over the full vocabulary, batched."""
    case, cfg, model, path = ref_case
    ours = load_target(path, dtype=torch.float32)
    ids = prompts_for(CASES.index(case) + 50, cfg.vocab_size)[0][:120]
    batch = torch.tensor([ids, ids[::-1]])
    with torch.no_grad():
        got = torch.log_softmax(ours.forward_dense(batch)[0].double(), -1)
        want = torch.log_softmax(model(batch).logits.double(), -1)
    err = (got - want).abs().max().item()
    assert err < ATOL, f"{case.name}: dense log-probs differ from transformers by {err:.2e}"
