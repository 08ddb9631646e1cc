from setuptools import find_packages, setup

# NOTE: torch is pinned to the CPU build that lies on the CI machines' disk; an unpinned torch
# pulls several GB of CUDA wheels. GPU machines bring their own torch (2.11+ works).
CPU_TORCH = "torch==2.13.0"
# Structured output (runtime/grammar.py); it needs torch, so it is an extra like torch itself.
GRAMMAR = "xgrammar>=0.1.19"

setup(
    name="sglang_eagle3",
    version="0.1.0",
    description="EAGLE-3 speculative decoding for DeepSeek-V3-family MoE models (Kimi-K2.5), "
    "with CUDA-graph verify, Triton kernels and an SGLang overlay",
    packages=find_packages(include=["sglang_eagle3", "sglang_eagle3.*"]),
    package_data={"sglang_eagle3": ["assets/embedded/*/*", "kernels/configs/*.json"]},
    # SGLang runs this plugin at the start of each of its processes; it re-applies the overlay only where an
    # ancestor called sglang_eagle3.apply() (sglang_eagle3/integration/plugin.py). Changing it needs a reinstall.
    entry_points={"sglang.srt.plugins": ["sglang_eagle3 = sglang_eagle3.integration.plugin:load"]},
    python_requires=">=3.10",
    install_requires=[
        "numpy",
        "safetensors",
        "tqdm",
        "tokenizers",
        "fastapi",
        "uvicorn",
        "pydantic>=2",
        "jinja2",
        "pyyaml",  # launch_server --config FILE.yaml
    ],
    extras_require={
        "cpu": [CPU_TORCH, "triton==3.6.0"],
        "test": [
            CPU_TORCH,
            "triton==3.6.0",
            "pytest",
            "pytest-timeout",
            "pytest-benchmark",
            "hypothesis",  # tests/server/test_http_fuzz.py
            "jsonschema",  # an independent reading of JSON schemas (tests/test_structural_tag.py)
            "transformers>=4.57",
            "openai",
            "anthropic",  # tests/server/test_anthropic_api.py: its SDK reads our /v1/messages answers and streams
            "httpx",
            "ruff",
            "tiktoken",
            # The INT4 packing peer (tests/loaders/test_int4_peer.py): the library that wrote Kimi-K2.5's experts.
            "compressed-tensors",
            GRAMMAR,
        ],
        "tiktoken": ["tiktoken"],
        # Structured output (json_schema / regex / ebnf, OpenAI's response_format): SGLang's default backend.
        "grammar": [GRAMMAR],
    },
)
