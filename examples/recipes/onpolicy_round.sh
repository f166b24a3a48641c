# One round on the previous round's own pure Jacobi drafts, sourced by cllm_gsm_demo.sh (and the
# experiments' rounds): the previous model's drafts on PROMPTS prompts (the same prompts each
# round, new drafts), beside the shifted states of PROMPTS pool prompts not yet used (the pool
# is $OUT/trajectories.jsonl: the base's answers to seed 3, eval problems excluded; each file's
# prompts kept apart), STEPS steps from the previous round's adapter.
# DRAFTS_FORMAT and POOL_FORMAT, where set, are each set's train trajectories --prompt-format;
# DRAFT_ANSWERS=base records the drafts along the base's answers instead of the model's own
# (`--mode guided`: the model's noise, the base's fixed points).
# Needs OUT, BASE, TRAIN, PROMPTS, STEPS.
onpolicy_round() {  # round, previous round, first pool prompt, Trainer seed, [training flags]
  local round=$1 previous=$2 first=$3 seed=$4
  shift 4  # the rest overrides the shared training flags (a later flag wins)
  # a run leaves its adapter merged into $OUT/$previous/model: vLLM serves it as it is
  local course=(--mode onpolicy --onpolicy-fill tail)
  if [[ "${DRAFT_ANSWERS:-own}" == base ]]; then  # its drafts along the base's cached answers
    course=(--mode guided --answer-model "$BASE" --answers "$OUT/trajectories.answers.jsonl")
  fi
  .venv/bin/vllm-cllm train trajectories --model "$OUT/$previous/model" --num-prompts "$PROMPTS" \
      --seed 3 --exclude-eval 40 --block-size 16 --max-new-tokens 256 "${course[@]}" \
      ${DRAFTS_FORMAT:+--prompt-format "$DRAFTS_FORMAT"} \
      --max-states 64 --out "$OUT/$round-drafts.jsonl"
  # the pool's shifted states of prompts [first, first + PROMPTS): its cached answers, the
  # same records as in the pool's file
  .venv/bin/vllm-cllm train trajectories --model "$BASE" --num-prompts "$PROMPTS" \
      --first-prompt "$first" --seed 3 --exclude-eval 40 --block-size 16 --max-new-tokens 256 \
      --mode shifted --max-states 16 --answers "$OUT/trajectories.answers.jsonl" \
      ${POOL_FORMAT:+--prompt-format "$POOL_FORMAT"} \
      --out "$OUT/$round-pool.jsonl"
  train_round "$round" "$round" "$previous" "$seed" "$@"
}

train_round() {  # data round, output folder, previous round, Trainer seed, [training flags]
  local data=$1 out=$2 previous=$3 seed=$4
  shift 4
  # two files: each one's prompts stay apart (the pool's first, then its own answers)
  .venv/bin/vllm-cllm train cllm --model "$BASE" \
      --data "$OUT/$data-pool.jsonl" "$OUT/$data-drafts.jsonl" \
      --out "$OUT/$out" "${TRAIN[@]}" --seed "$seed" --max-steps "$STEPS" \
      --init-adapter "$OUT/$previous/adapter" "$@"
}
