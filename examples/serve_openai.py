"""Serve with Jacobi decoding and query it with the OpenAI client.

Starts the documented command (the design card's spelling)

    vllm serve MODEL --speculative-model "[jacobi]" --num-speculative-tokens 8

on 127.0.0.1, sends a completion and a chat completion, prints the spec-decode counters
from ``/metrics``, then stops the server. Equivalent modern spelling:
``--speculative-config '{"method": "jacobi", "num_speculative_tokens": 8}'``.

    python examples/serve_openai.py [--model PATH]
"""

from __future__ import annotations

import argparse
import json

from openai import OpenAI

from vllm_cllm.runtime.server import read_metrics, running_server


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default=None, help="checkpoint dir (default: SmolLM2-135M)")
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--log", default=None, help="write the server log here")
    args = parser.parse_args()

    from vllm_cllm.runtime.checkpoints import model_path

    model = args.model or str(model_path("smollm2-135m-instruct"))
    flags = ["--speculative-model", "[jacobi]", "--num-speculative-tokens", str(args.k)]
    with running_server(model, *flags, log_path=args.log) as base_url:
        client = OpenAI(base_url=base_url + "/v1", api_key="unused")
        completion = client.completions.create(
            model="model", prompt="def add(a, b):\n", max_tokens=48, temperature=0.0)
        chat = client.chat.completions.create(
            model="model", max_tokens=48, temperature=0.0,
            messages=[{"role": "user", "content": "What is the capital of France?"}])
        metrics = read_metrics(base_url)
    print("completion:", repr(completion.choices[0].text))
    print("chat:", repr(chat.choices[0].message.content))
    print("RESULT " + json.dumps({"completion": completion.choices[0].text,
                                  "chat": chat.choices[0].message.content, "metrics": metrics}))


if __name__ == "__main__":
    main()
