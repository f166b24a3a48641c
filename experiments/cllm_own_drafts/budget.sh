#!/usr/bin/env bash
# The rounds at one prompt per optimizer step (experiments/cllm_own_drafts README, "One prompt
# a step"): the same objective as rounds.sh (LoRA r 32, lr 3e-4, anchor base, ω 5, window 2),
# four times the optimizer steps for the same compute, 8 of each block's 16 states a row.
# Round 1: shifted states, steps 0–375 of a 600-step cosine schedule (`--stop-step`: the run
# ends there); rounds 2 and 3: the previous round's own pure Jacobi drafts on 100 prompts
# beside 100 new pool prompts' shifted states (200 steps each), round 3 at ω 20. Every step
# resumes where it stopped. STATES=0 ROUND1_STEPS=300 SCHEDULE=400 is the earlier run with
# all 16 states a block.
#   [OUT=DIR] [STATES=K] [ROUND1_STEPS=N SCHEDULE=M] experiments/cllm_own_drafts/budget.sh
set -euo pipefail
OUT=${OUT:-results/cllm-budget}
STATES=${STATES:-8} ROUND1_STEPS=${ROUND1_STEPS:-375} SCHEDULE=${SCHEDULE:-600}
BASE=smollm2-135m-instruct
TRAIN=(--block-size 16 --lora-rank 32 --lora-alpha 32 --learning-rate 3e-4 --epochs 1
       --grad-accum 1 --ar-weight 5.0 --anchor base --consistency-window 2 --logging-steps 10
       --states-per-block "$STATES")

# round 1: the base model's greedy answers (600 prompts of seed 3), shifted states
.venv/bin/vllm-cllm train trajectories --model $BASE --num-prompts 600 --seed 3 \
    --exclude-eval 40 --block-size 16 --max-new-tokens 256 --mode shifted --max-states 16 \
    --out "$OUT/trajectories.jsonl"
.venv/bin/vllm-cllm train cllm --model $BASE --data "$OUT/trajectories.jsonl" \
    --out "$OUT/round1" "${TRAIN[@]}" --seed 0 --max-steps "$SCHEDULE" \
    --stop-step "$ROUND1_STEPS" --save-steps 75

# rounds 2 and 3: own drafts on 100 prompts beside 100 new pool prompts, 200 steps each
PROMPTS=100 STEPS=200
source experiments/cllm_own_drafts/onpolicy_round.sh
onpolicy_round round2 round1 400 2 --save-steps 50
onpolicy_round round3 round2 500 4 --save-steps 50 --ar-weight 20
echo "round 3: $OUT/round3/model (adapter: $OUT/round3/adapter)"
