#!/usr/bin/env bash
# A held round after rounds.sh (README, "A held round after the rounds"): round 4's own pure
# Jacobi drafts on the same 150 prompts beside the shifted states of the pool's last 150,
# trained from round 4's adapter with ω 20 instead of 5. Every step resumes where it stopped.
#   [OUT=DIR] experiments/cllm_own_drafts/held_round.sh
set -euo pipefail
OUT=${OUT:-results/cllm-rounds}
.venv/bin/vllm-cllm train trajectories --model "$OUT/round4/model" --num-prompts 150 --seed 3 \
    --exclude-eval 40 --block-size 16 --max-new-tokens 256 --mode onpolicy \
    --onpolicy-fill tail --max-states 64 --out "$OUT/round5-drafts.jsonl"
.venv/bin/python experiments/cllm_own_drafts/pool_slice.py 450 600 \
    < "$OUT/trajectories.jsonl" > "$OUT/round5-pool.jsonl"
.venv/bin/vllm-cllm train cllm --model smollm2-135m-instruct \
    --data "$OUT/round5-pool.jsonl" "$OUT/round5-drafts.jsonl" --out "$OUT/round5" \
    --block-size 16 --lora-rank 32 --lora-alpha 32 --learning-rate 3e-4 --epochs 1 \
    --grad-accum 4 --ar-weight 20 --anchor base --consistency-window 2 --save-steps 25 \
    --logging-steps 5 --seed 4 --max-steps 75 --init-adapter "$OUT/round4/adapter"
echo "round 5: $OUT/round5/model (adapter: $OUT/round5/adapter)"
