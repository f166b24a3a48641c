#!/usr/bin/env bash
# Recipe for the demo SPACE checkpoint `smollm2-135m-space-gsm` (SmolLM2-135M-Instruct,
# gsm_symbolic training seed 1; the evaluation uses seed 1000). SAR-SFT, k = 5 masks,
# 16 mask groups per answer and forward, LoRA r=32 + the mask token's embedding row.
# Resumable: answers already in the cache are not regenerated, training resumes from the
# last Trainer checkpoint. The answers are the base model's own greedy answers (the same
# 400 prompts as the CLLM demo: OUT/answers.jsonl can be that recipe's answer cache).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-results/space-gsm}
mkdir -p "$OUT"
# 1+2. greedy answers with vLLM (batched, cached), then SAR-SFT on Hugging Face Trainer
.venv/bin/vllm-cllm train space --model smollm2-135m-instruct --num-prompts 400 --seed 1 \
    --max-new-tokens 256 --out "$OUT/run" --answers "$OUT/answers.jsonl" \
    --k 5 --groups 16 --mask-weight 1.0 --lora-rank 32 --lora-alpha 32 --learning-rate 3e-4 \
    --epochs 2 --grad-accum 2 --save-steps 50 --keep-checkpoints 2 --logging-steps 10 --trainer-seed 0
# 3. the artifact: adapter (float16) + mask_token.json, rebuilt by
#    `vllm-cllm model-path smollm2-135m-space-gsm`
.venv/bin/python -m vllm_cllm.training.artifact "$OUT/run/adapter" \
    vllm_cllm/artifacts/smollm2-135m-space-gsm
