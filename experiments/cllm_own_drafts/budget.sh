#!/usr/bin/env bash
# The rounds at one prompt per optimizer step (experiments/cllm_own_drafts README, "One prompt
# a step"): the same objective as rounds.sh (LoRA r 32, lr 3e-4, anchor base, ω 5, window 2),
# four times the optimizer steps for the same compute. Round 1: shifted states, steps 0–300 of
# a 400-step cosine schedule (the run is ended at its step-300 checkpoint); rounds 2 and 3:
# the previous round's own pure Jacobi drafts on 100 prompts beside 100 new pool prompts'
# shifted states (200 steps each), round 3 at ω 20. Every step resumes where it stopped.
#   [OUT=DIR] experiments/cllm_own_drafts/budget.sh
set -euo pipefail
OUT=${OUT:-results/cllm-budget}
BASE=smollm2-135m-instruct
TRAIN=(--block-size 16 --lora-rank 32 --lora-alpha 32 --learning-rate 3e-4 --epochs 1
       --grad-accum 1 --ar-weight 5.0 --anchor base --consistency-window 2 --logging-steps 10)

# round 1: the base model's greedy answers (600 prompts of seed 3), shifted states
.venv/bin/vllm-cllm train trajectories --model $BASE --num-prompts 600 --seed 3 \
    --exclude-eval 40 --block-size 16 --max-new-tokens 256 --mode shifted --max-states 16 \
    --out "$OUT/trajectories.jsonl"
ROUND1=$OUT/round1/trainer/checkpoint-300
if [[ ! -f $ROUND1/trainer_state.json ]]; then
  .venv/bin/vllm-cllm train cllm --model $BASE --data "$OUT/trajectories.jsonl" \
      --out "$OUT/round1" "${TRAIN[@]}" --seed 0 --max-steps 400 --save-steps 75 &
  trainer=$!
  until [[ -f $ROUND1/trainer_state.json ]]; do  # a checkpoint's state is written last
    kill -0 $trainer 2>/dev/null || { wait $trainer; exit 1; }
    sleep 10
  done
  kill $trainer
  wait $trainer || true
fi
# round 1's step-300 adapter and its merged model, where the next round looks for them
mkdir -p "$OUT/round1/adapter"
cp "$ROUND1"/adapter_config.json "$ROUND1"/adapter_model.safetensors "$OUT/round1/adapter/"
[[ -f $OUT/round1/model/config.json ]] || .venv/bin/python -c "
import sys
from pathlib import Path
from vllm_cllm.runtime.checkpoints import merge_adapter, model_path
merge_adapter(Path(model_path('$BASE')), Path(sys.argv[1]), Path(sys.argv[2]))" \
    "$OUT/round1/adapter" "$OUT/round1/model"

# rounds 2 and 3: own drafts on 100 prompts beside 100 new pool prompts, 200 steps each
PROMPTS=100 STEPS=200
source experiments/cllm_own_drafts/onpolicy_round.sh
onpolicy_round round2 round1 400 2 --save-steps 50
onpolicy_round round3 round2 500 4 --save-steps 50 --ar-weight 20
echo "round 3: $OUT/round3/model (adapter: $OUT/round3/adapter)"
