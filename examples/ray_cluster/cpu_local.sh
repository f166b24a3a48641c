#!/usr/bin/env bash
# The same deployment on one CPU machine (what tests/test_ray_cpu.py checks): a local Ray
# cluster on 127.0.0.1 with vllm_cpu_worker slots, vLLM's Ray executor, jacobi, TP=2.
set -euo pipefail
cd "$(dirname "$0")/../.."
.venv/bin/ray start --head --node-ip-address 127.0.0.1 --port 6379 --num-cpus 2 \
    --resources '{"vllm_cpu_worker": 2}' --include-dashboard=false --disable-usage-stats
trap '.venv/bin/ray stop --force' EXIT
MODEL=$(.venv/bin/vllm-cllm model-path tiny-random-llama | tail -1)
VLLM_CLLM_RAY_ON_CPU=1 RAY_ADDRESS=127.0.0.1:6379 VLLM_CPU_OMP_THREADS_BIND='0|1' \
VLLM_CPU_KVCACHE_SPACE=1 VLLM_ENABLE_V1_MULTIPROCESSING=0 .venv/bin/python - "$MODEL" <<'PY'
import sys
from vllm import LLM, SamplingParams
llm = LLM(model=sys.argv[1], dtype="float32", enforce_eager=True, max_model_len=512,
          distributed_executor_backend="ray", tensor_parallel_size=2,
          speculative_config={"method": "jacobi", "num_speculative_tokens": 4})
print(llm.generate(["def fibonacci(n):"], SamplingParams(temperature=0, max_tokens=24))[0]
      .outputs[0].text)
PY
