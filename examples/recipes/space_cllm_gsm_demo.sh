#!/usr/bin/env bash
# Recipe for `smollm2-135m-space-cllm-gsm`: SPACE SAR-SFT on top of the progressive-noise
# CLLM (`smollm2-135m-cllm-gsm-noise`, cllm_gsm_noise.sh), same settings as space_gsm_demo.sh,
# trained on the CLLM's own greedy answers (gsm_symbolic seed 1; evaluation seed 1000).
# Resumable like the others.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-results/space-cllm}
mkdir -p "$OUT"
.venv/bin/vllm-cllm train space --model smollm2-135m-cllm-gsm-noise --num-prompts 400 --seed 1 \
    --max-new-tokens 256 --out "$OUT/run" --answers "$OUT/answers.jsonl" \
    --k 5 --groups 16 --mask-weight 1.0 --lora-rank 32 --lora-alpha 32 --learning-rate 3e-4 \
    --epochs 2 --grad-accum 2 --save-steps 100 --keep-checkpoints 2 --logging-steps 10 --trainer-seed 0
# the artifact names its base, so `vllm-cllm model-path smollm2-135m-space-cllm-gsm` builds the
# noise CLLM first, then adds the mask token and merges this adapter
.venv/bin/python -m vllm_cllm.training.artifact "$OUT/run/adapter" \
    vllm_cllm/artifacts/smollm2-135m-space-cllm-gsm --base smollm2-135m-cllm-gsm-noise
