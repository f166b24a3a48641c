#!/usr/bin/env bash
# Ray worker node: the same plugin install as the head, then join the cluster.
#   HEAD=10.0.0.1 ./worker.sh
set -euo pipefail
HEAD=${HEAD:?set HEAD to the head node address}
# VLLM_CLLM_SPEC: what pip installs, e.g. "/src/vllm-cllm[cuda,ray]" (this checkout)
pip install "${VLLM_CLLM_SPEC:-vllm-cllm[cuda,ray]}"
ray start --address "$HEAD:6379"
