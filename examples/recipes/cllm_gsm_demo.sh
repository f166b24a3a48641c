#!/usr/bin/env bash
# Recipe for the demo CLLM `smollm2-135m-cllm-gsm` (SmolLM2-135M-Instruct, gsm_symbolic).
# STATUS: the pieces are tested on the tiny model (tests/test_training.py); this full run has
# not been made yet, and the demo checkpoint name is not registered yet.
# Resumable: re-running skips prompts already in the trajectory file and resumes training
# from the last Trainer checkpoint.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-results/cllm-gsm}
mkdir -p "$OUT"
# 1. greedy answers with vLLM (batched) + trajectory states; training seed 1 (eval uses 1000)
.venv/bin/vllm-cllm train trajectories --model smollm2-135m-instruct --num-prompts 400 \
    --seed 1 --block-size 16 --max-new-tokens 256 --mode noise --max-states 4 \
    --out "$OUT/trajectories.jsonl"
# 2. consistency distillation, LoRA (the adapter is the small artifact to keep in git)
.venv/bin/vllm-cllm train cllm --model smollm2-135m-instruct --data "$OUT/trajectories.jsonl" \
    --out "$OUT/run" --block-size 16 --lora-rank 16 --learning-rate 2e-4 --epochs 1 \
    --grad-accum 4 --ar-weight 1.0
