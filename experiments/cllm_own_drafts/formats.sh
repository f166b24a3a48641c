#!/usr/bin/env bash
# The recipe in rounds with both prompt formats (README, "Both formats"): every round's prompts
# alternate between the recipe's instruction and the bare question, so the base model's answers
# to the bare question anchor training too. Round 1: shifted states of the base's greedy answers
# on 300 prompts of seed 3; rounds 2 and 3: the previous model's own pure Jacobi drafts on 150
# prompts (the same prompts each round, new drafts), round 2 beside the shifted states of 150
# pool prompts not yet used. Every step resumes where it stopped. AR_WEIGHT sets ω (the hold of
# the base model's distribution on the clean answers; README, "A stronger hold").
#   [OUT=DIR] [AR_WEIGHT=5] experiments/cllm_own_drafts/formats.sh [LAST_ROUND]
set -euo pipefail
OUT=${OUT:-results/cllm-formats}
BASE=smollm2-135m-instruct
LAST=${1:-3}
DATA=(--seed 3 --exclude-eval 40 --block-size 16 --max-new-tokens 256 --prompt-format both)
TRAIN=(--block-size 16 --lora-rank 32 --lora-alpha 32 --learning-rate 3e-4 --epochs 1
       --grad-accum 4 --ar-weight "${AR_WEIGHT:-5.0}" --anchor base --consistency-window 2
       --save-steps 25 --logging-steps 5)
mkdir -p "$OUT"
pool_slice() {  # the pool's shifted states of prompts [$1, $2) into $3: its cached answers,
  # the same records as in the pool's file
  .venv/bin/vllm-cllm train trajectories --model $BASE --first-prompt "$1" \
      --num-prompts $(($2 - $1)) "${DATA[@]}" --mode shifted --max-states 16 \
      --answers "$OUT/pool.answers.jsonl" --out "$3"
}
if [[ ! -e "$OUT/round1/model/config.json" ]]; then
  .venv/bin/vllm-cllm train trajectories --model $BASE --num-prompts 450 "${DATA[@]}" \
      --mode shifted --max-states 16 --out "$OUT/pool.jsonl"
  pool_slice 0 300 "$OUT/round1-pool.jsonl"
  .venv/bin/vllm-cllm train cllm --model $BASE --data "$OUT/round1-pool.jsonl" \
      --out "$OUT/round1" "${TRAIN[@]}" --seed 0 --max-steps 75
fi
for round in $(seq 2 "$LAST"); do
  previous=round$((round - 1))
  [[ -e "$OUT/round$round/model/config.json" ]] && continue
  # a run leaves its adapter merged into $OUT/$previous/model: vLLM serves it as it is
  .venv/bin/vllm-cllm train trajectories --model "$OUT/$previous/model" --num-prompts 150 \
      "${DATA[@]}" --mode onpolicy --onpolicy-fill tail --max-states 64 \
      --out "$OUT/round$round-drafts.jsonl"
  data=("$OUT/round$round-drafts.jsonl")
  if (( round == 2 )); then  # each file's prompts stay apart: the pool's first
    pool_slice 300 450 "$OUT/round2-pool.jsonl"
    data=("$OUT/round2-pool.jsonl" "${data[@]}")
  fi
  .venv/bin/vllm-cllm train cllm --model $BASE --data "${data[@]}" --out "$OUT/round$round" \
      "${TRAIN[@]}" --seed "$round" --max-steps 75 --init-adapter "$OUT/$previous/adapter"
done
echo "round $LAST: $OUT/round$LAST/model (adapter: $OUT/round$LAST/adapter)"
