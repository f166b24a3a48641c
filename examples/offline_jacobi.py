"""Offline Jacobi decoding with vLLM's Python API, and vLLM's own acceptance metrics.

    python examples/offline_jacobi.py [--model PATH] [--k 8] [--fill hybrid]

The plugin is found through its ``vllm.general_plugins`` entry point: selecting
``"method": "jacobi"`` is all it takes.
"""

from __future__ import annotations

import argparse
import json

from vllm_cllm.runtime.engine import apply_cpu_env

apply_cpu_env()  # CPU-friendly defaults (docs/platform-cpu.md); harmless on GPU

PROMPTS = [
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "The three primary colors are",
]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default=None, help="checkpoint dir (default: SmolLM2-135M)")
    parser.add_argument("--k", type=int, default=8, help="num_speculative_tokens")
    parser.add_argument("--fill", default="hybrid")
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()

    from vllm import LLM, SamplingParams

    from vllm_cllm.runtime.checkpoints import model_path

    model = args.model or str(model_path("smollm2-135m-instruct"))
    llm = LLM(model=model, dtype="float32", max_model_len=2048, enforce_eager=True,
              disable_log_stats=False,  # the LLM default hides the spec-decode counters
              speculative_config={"method": "jacobi", "num_speculative_tokens": args.k,
                                  "fill": args.fill})
    outputs = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=args.max_tokens))
    for out in outputs:
        print(repr(out.prompt[:40]), "->", repr(out.outputs[0].text))
    counters = {m.name: getattr(m, "value", None) for m in llm.get_metrics()
                if m.name.startswith("vllm:spec_decode") and hasattr(m, "value")}
    drafts = counters.get("vllm:spec_decode_num_drafts", 0)
    accepted = counters.get("vllm:spec_decode_num_accepted_tokens", 0)
    summary = {"texts": [o.outputs[0].text for o in outputs], "counters": counters,
               "mean_acceptance_length": 1 + accepted / drafts if drafts else 1.0}
    print("RESULT " + json.dumps(summary))


if __name__ == "__main__":  # vLLM may spawn processes: keep the main guard
    main()
