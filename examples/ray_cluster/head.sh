#!/usr/bin/env bash
# Ray head node: install the plugin (every node needs it: vLLM loads it in every Ray worker),
# start Ray, then serve with jacobi across the cluster.
#   TP=4 PP=2 MODEL=/models/my-cllm ./head.sh
set -euo pipefail
MODEL=${MODEL:?set MODEL to a CLLM checkpoint path visible on every node}
TP=${TP:-4}; PP=${PP:-1}; K=${K:-15}
# VLLM_CLLM_SPEC: what pip installs, e.g. "/src/vllm-cllm[cuda,ray]" (this checkout)
pip install "${VLLM_CLLM_SPEC:-vllm-cllm[cuda,ray]}"
ray start --head --port 6379
# ... start the workers now (worker.sh on each node), then:
vllm serve "$MODEL" \
    --distributed-executor-backend ray \
    --tensor-parallel-size "$TP" --pipeline-parallel-size "$PP" \
    --speculative-config "{\"method\": \"jacobi\", \"num_speculative_tokens\": $K}"
