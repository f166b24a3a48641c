#!/usr/bin/env bash
# Recipe for `smollm2-135m-cllm-gsm-noise` (SmolLM2-135M-Instruct, gsm_symbolic): one run of
# consistency distillation on progressive-noise states, the base of `smollm2-135m-space-cllm-gsm`
# (the demo CLLM is cllm_gsm_demo.sh's). About 1 hour on 2 CPU cores (5 min answers, 55 min
# training); a GPU needs no change.
# Resumable: re-running skips prompts already in the trajectory file and resumes training
# from the last Trainer checkpoint. Training seed 1 for the prompts (the eval uses 1000).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-results/cllm-gsm-noise}
mkdir -p "$OUT"
# 1. greedy answers with vLLM (batched) + progressive-noise states (4 levels per 16-token block)
.venv/bin/vllm-cllm train trajectories --model smollm2-135m-instruct --num-prompts 400 \
    --seed 1 --block-size 16 --max-new-tokens 256 --mode noise --max-states 4 \
    --out "$OUT/trajectories.jsonl"
# 2. consistency distillation + AR loss, LoRA r=32 (the adapter is the artifact kept in git)
.venv/bin/vllm-cllm train cllm --model smollm2-135m-instruct --data "$OUT/trajectories.jsonl" \
    --out "$OUT/run" --block-size 16 --lora-rank 32 --lora-alpha 32 --learning-rate 5e-4 \
    --epochs 1 --grad-accum 2 --ar-weight 1.0 --states-per-block 0 --save-steps 50 \
    --logging-steps 5 --seed 0
# 3. the artifact: the adapter in float16, rebuilt by
#    `vllm-cllm model-path smollm2-135m-cllm-gsm-noise`
.venv/bin/python -m vllm_cllm.training.artifact "$OUT/run/adapter" \
    vllm_cllm/artifacts/smollm2-135m-cllm-gsm-noise
