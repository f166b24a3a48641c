#!/usr/bin/env bash
# Recipe for the demo CLLM `smollm2-135m-cllm-gsm` (SmolLM2-135M-Instruct, gsm_symbolic):
# consistency distillation in three rounds at one prompt per optimizer step, LoRA r 32, lr 2e-3,
# the base model's logits as the anchor, AR weight 5, consistency window 2, 8 of each block's
# 16 states a row. Round 1: shifted states of the base's greedy answers (600 prompts of seed 3),
# steps 0–375 of a 600-step cosine schedule. Round 2: round 1's own pure Jacobi drafts on 100
# prompts beside 100 new pool prompts' shifted states, 200 steps. Round 3, held (AR weight 20
# holds the answers to the base's): round 2's drafts on the same 100 prompts beside 100 more
# pool prompts, with the instruction and as the bare question, trained HELD_RUNS times from
# round 2 in other data orders and averaged exactly; the artifact keeps the average at rank 64.
# About 2 h and 3.7 CPU-hours on 2 CPU cores (docs/training.md); a GPU needs no change.
# Resumable: every step skips what is written and resumes from its last Trainer checkpoint.
# Evaluation seeds are never trained on. Defaults in brackets:
#   [OUT=results/cllm-gsm] [STATES=8] [ROUND1_STEPS=375 SCHEDULE=600] [LR=2e-3]
#   [ROUND2_LR=LR] [ROUND3_LR=LR]
#   [ARTIFACT=vllm_cllm/artifacts/smollm2-135m-cllm-gsm|DIR|'']
#   [ROUND2_DRAFTS=instruction|both] [ROUND2_POOL=instruction|both]
#   [ROUND3_DRAFTS=instruction|both] [ROUND3_POOL=both|instruction] [ROUND3_AR_WEIGHT=20]
#   [ROUND3_MARGIN=W] (round 3's hinge holding the base's greedy token, weight W)
#   [DRAFT_ANSWERS=own|base] (rounds 2 and 3: the drafts along the model's own answers or the base's)
#   [REPEAT_WEIGHT=W] (rounds 2 and 3: weight of the answers' repeated 4-grams the model is
#   surer of than the base)
#   [LORA_TARGETS=q_proj,...] (the linear layers the adapter adapts; default all seven)
#   [SEED=0] (added to each round's Trainer seed: the same data in another order)
#   [HELD_RUNS=3] (N held rounds 3 from round 2 on the same drafts and pool, Trainer seeds
#   SEED+4, SEED+14, ..., averaged exactly into $OUT/held: `vllm-cllm train average`)
#   [ARTIFACT_MAX_RANK=64] (the artifact stores each layer's delta at most at this rank;
#   '': the adapter's own rank)
#   cllm_gsm_demo.sh
# ARTIFACT='' leaves the committed artifact as it is (a variant of the recipe).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-results/cllm-gsm}
SEED=${SEED:-0} STATES=${STATES:-8} ROUND1_STEPS=${ROUND1_STEPS:-375} SCHEDULE=${SCHEDULE:-600} LR=${LR:-2e-3}
ARTIFACT=${ARTIFACT-vllm_cllm/artifacts/smollm2-135m-cllm-gsm}
HELD_RUNS=${HELD_RUNS:-3} ARTIFACT_MAX_RANK=${ARTIFACT_MAX_RANK-64}
need() {  # setting, its value, the pattern it must match, what that means: else stop here
  [[ "$2" =~ $3 ]] || { echo "$1 must be $4, got '$2'" >&2; exit 2; }
}
need SEED "$SEED" '^[0-9]+$' "a whole number"
need HELD_RUNS "$HELD_RUNS" '^[1-9][0-9]*$' "1 or more"
need ARTIFACT_MAX_RANK "$ARTIFACT_MAX_RANK" '^([1-9][0-9]*)?$' "1 or more (or empty)"
BASE=smollm2-135m-instruct
TRAIN=(--block-size 16 --lora-rank 32 --lora-alpha 32 --learning-rate "$LR" --epochs 1
       --grad-accum 1 --ar-weight 5.0 --anchor base --consistency-window 2 --logging-steps 10
       --states-per-block "$STATES" ${LORA_TARGETS:+--lora-targets "$LORA_TARGETS"})

# round 1: the base model's greedy answers (vLLM, batched), shifted states
.venv/bin/vllm-cllm train trajectories --model $BASE --num-prompts 600 --seed 3 \
    --exclude-eval 40 --block-size 16 --max-new-tokens 256 --mode shifted --max-states 16 \
    --out "$OUT/trajectories.jsonl"
.venv/bin/vllm-cllm train cllm --model $BASE --data "$OUT/trajectories.jsonl" \
    --out "$OUT/round1" "${TRAIN[@]}" --seed "$SEED" --max-steps "$SCHEDULE" \
    --stop-step "$ROUND1_STEPS" --save-steps 75

# rounds 2 and 3: own drafts on 100 prompts beside 100 new pool prompts, 200 steps each
PROMPTS=100 STEPS=200
source examples/recipes/onpolicy_round.sh
DRAFTS_FORMAT=${ROUND2_DRAFTS:-} POOL_FORMAT=${ROUND2_POOL:-} \
    onpolicy_round round2 round1 400 $((SEED + 2)) --save-steps 50 --learning-rate "${ROUND2_LR:-$LR}" \
    --repeat-weight "${REPEAT_WEIGHT:-0}"
ROUND3=(--save-steps 50 --ar-weight "${ROUND3_AR_WEIGHT:-20}" --learning-rate "${ROUND3_LR:-$LR}"
        --margin-weight "${ROUND3_MARGIN:-0}" --repeat-weight "${REPEAT_WEIGHT:-0}")
DRAFTS_FORMAT=${ROUND3_DRAFTS:-} POOL_FORMAT=${ROUND3_POOL:-both} \
    onpolicy_round round3 round2 500 $((SEED + 4)) "${ROUND3[@]}"

# held rounds averaged: more held rounds 3 in other data orders, the deltas' mean kept
held=round3
if (( HELD_RUNS > 1 )); then
  members=("$OUT/round3/adapter")
  for i in $(seq 2 "$HELD_RUNS"); do
    [[ -e "$OUT/round3_$i/model/config.json" ]] ||
      train_round round3 "round3_$i" round2 $((SEED + 4 + 10 * (i - 1))) "${ROUND3[@]}"
    members+=("$OUT/round3_$i/adapter")
  done
  [[ -e "$OUT/held/model/config.json" ]] ||
    .venv/bin/vllm-cllm train average --model $BASE --out "$OUT/held" "${members[@]}"
  held=held
fi

# the artifact: the held adapter in float16, rebuilt by
# `vllm-cllm model-path smollm2-135m-cllm-gsm`
if [[ -n "$ARTIFACT" ]]; then
  .venv/bin/python -m vllm_cllm.training.artifact "$OUT/$held/adapter" "$ARTIFACT" \
      ${ARTIFACT_MAX_RANK:+--max-rank "$ARTIFACT_MAX_RANK"}
fi
echo "the recipe's model: $OUT/$held/model (adapter: $OUT/$held/adapter)"
