#!/usr/bin/env bash
# The recipe in rounds of experiments/cllm_own_drafts (README, "Rounds"): shifted states, a
# second round with the learning rate restarted, then rounds on the model's own pure Jacobi
# drafts; `rounds.sh held` adds a fifth round on round 4's drafts with ω 20 (README, "A held
# round after the rounds"). Every step resumes where it stopped; OUT holds everything but the
# artifact.
#   [OUT=DIR] experiments/cllm_own_drafts/rounds.sh [held]
set -euo pipefail
OUT=${OUT:-results/cllm-rounds}
BASE=smollm2-135m-instruct
TRAIN=(--block-size 16 --lora-rank 32 --lora-alpha 32 --learning-rate 3e-4 --epochs 1
       --grad-accum 4 --ar-weight 5.0 --anchor base --consistency-window 2 --save-steps 25
       --logging-steps 5)

# round 1: the base model's greedy answers (600 prompts of seed 3), shifted states; a 100-step
# cosine schedule of which rounds 2 and 3 continue step 75 (300 prompts)
.venv/bin/vllm-cllm train trajectories --model $BASE --num-prompts 600 --seed 3 \
    --exclude-eval 40 --block-size 16 --max-new-tokens 256 --mode shifted --max-states 16 \
    --out "$OUT/trajectories.jsonl"
.venv/bin/vllm-cllm train cllm --model $BASE --data "$OUT/trajectories.jsonl" \
    --out "$OUT/round1" "${TRAIN[@]}" --seed 0 --max-steps 100
# round 2: the same pool in another order, from round 1's adapter
.venv/bin/vllm-cllm train cllm --model $BASE --data "$OUT/trajectories.jsonl" \
    --out "$OUT/round2" "${TRAIN[@]}" --seed 1 --max-steps 75 \
    --init-adapter "$OUT/round1/trainer/checkpoint-75"
# rounds 3 and 4: the previous round's own pure Jacobi drafts on 150 prompts beside the
# shifted states of 150 pool prompts not yet used, 75 steps from the previous round's adapter
PROMPTS=150 STEPS=75
source examples/recipes/onpolicy_round.sh
onpolicy_round round3 round2 150 2
onpolicy_round round4 round3 300 3
echo "round 4: $OUT/round4/model (adapter: $OUT/round4/adapter)"
if [[ "${1:-}" == held ]]; then  # the answers pulled back to the base's, the drafts kept
  onpolicy_round round5 round4 450 4 --ar-weight 20
  echo "round 5: $OUT/round5/model (adapter: $OUT/round5/adapter)"
fi
