#!/usr/bin/env bash
# The recipe on the model's own drafts from the start (README, "Own drafts from the first round"): each
# round records the previous model's pure Jacobi drafts in vLLM on prompts no round used
# before and trains the adapter further on them; the base model anchors every round (its
# distribution on the clean answer, and a margin hinge on its greedy token). Resumable: a
# finished round is skipped, an interrupted one resumes.
#   experiments/cllm_own_drafts/onpolicy.sh [FIRST_ROUND [LAST_ROUND]]
set -euo pipefail
OUT=${OUT:-results/cllm-onpolicy}
BASE=smollm2-135m-instruct
PROMPTS=${PROMPTS:-200}  # per round; 4 per optimizer step, one epoch
TRAIN=(--block-size 16 --lora-rank 32 --lora-alpha 32 --learning-rate 3e-4 --epochs 1
       --grad-accum 4 --ar-weight 5.0 --anchor base --margin-weight 1.0 --margin 2.0
       --consistency-window 2 --save-steps 25 --logging-steps 5)
for round in $(seq "${1:-1}" "${2:-3}"); do
  [[ -e "$OUT/round$round/model/config.json" ]] && continue
  model=$BASE; init=()
  if (( round > 1 )); then
    model="$OUT/round$((round - 1))/model"  # a run leaves its adapter merged there
    init=(--init-adapter "$OUT/round$((round - 1))/adapter")
  fi
  .venv/bin/vllm-cllm train trajectories --model "$model" --mode onpolicy --onpolicy-fill tail \
      --num-prompts "$PROMPTS" --first-prompt $(( (round - 1) * PROMPTS )) --seed 3 \
      --exclude-eval 40 --block-size 16 --max-new-tokens 256 --max-states 48 \
      --out "$OUT/round$round-drafts.jsonl"
  .venv/bin/vllm-cllm train cllm --model $BASE --data "$OUT/round$round-drafts.jsonl" \
      --out "$OUT/round$round" "${TRAIN[@]}" --seed "$round" "${init[@]}"
done
