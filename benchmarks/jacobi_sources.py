"""Which of `hybrid`'s draft sources guesses right: per source, how often it has a draft, how
often its first token is the one committed, its mean run, how often `jacobi` drafts it — and
tokens per step, on the bench's batch-1 prompts (one request at a time, 128 new tokens).

    .venv/bin/python benchmarks/jacobi_sources.py --datasets gsm --prompts 16
    .venv/bin/python benchmarks/jacobi_sources.py --datasets humaneval mtbench sharegpt --prompts 6

The sources are recorded in-process around ``HybridState.first_in_order`` and scored against
the request's final output, so "first token right" and "mean run" say what each source would
have given had it been drafted that step (the model's later tails depend on what was drafted:
a first-order estimate). "best source" is that estimate with the best source every step.
"""

from __future__ import annotations

import argparse
import collections
import json
from typing import Any

import numpy as np

from vllm_cllm import jacobi
from vllm_cllm.bench import BenchPlan, groups, prompt_sets
from vllm_cllm.models import model_path
from vllm_cllm.runtime import create_llm, generate_counting_steps

Step = dict[str, Any]


def record_sources(steps: list[Step]) -> None:
    """Record each step's candidates and the drafted one (``context`` length to align them)."""
    original = jacobi.HybridState.draft

    def draft(self: jacobi.HybridState, model: np.ndarray, ngram: np.ndarray,
              context: np.ndarray, *args: Any, **kwargs: Any) -> np.ndarray:
        out = original(self, model, ngram, context, *args, **kwargs)
        steps.append({"at": len(context), "drafted": out,
                      "candidates": {k: v for k, v in self.proposed.items() if len(v)}})
        return out

    jacobi.HybridState.draft = draft


def summarise(runs: list[tuple[list[int], list[Step]]]) -> dict[str, Any]:
    """Per-source statistics over every recorded step of every request."""
    present, first, run, chosen = (collections.Counter() for _ in range(4))
    steps = best = 0
    for tokens, records in runs:
        for step in records:
            truth = tokens[step["at"]:]
            if not truth:
                continue
            steps += 1
            runs_by_source = {name: jacobi.matched_prefix(draft, truth)
                              for name, draft in step["candidates"].items()}
            best += 1 + max(runs_by_source.values(), default=0)
            for name, length in runs_by_source.items():
                present[name] += 1
                first[name] += length > 0
                run[name] += length
                drafted = step["drafted"]
                chosen[name] += len(drafted) > 0 and np.array_equal(
                    step["candidates"][name][:len(drafted)], drafted)
    return {"steps": steps, "best_source_tokens_per_step": best / steps if steps else 0.0,
            "sources": {name: {"present": present[name] / steps,
                               "first_token_right": first[name] / present[name],
                               "mean_run": run[name] / present[name],
                               "drafted": chosen[name] / steps} for name in present}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-cllm-gsm")
    parser.add_argument("--datasets", nargs="+", default=["gsm"])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--k", type=int, default=15)
    parser.add_argument("--out", default=None, help="write the summary as JSON here")
    args = parser.parse_args()
    from vllm import SamplingParams

    steps: list[Step] = []
    record_sources(steps)
    llm = create_llm(str(model_path(args.model)),
                     {"method": "jacobi", "num_speculative_tokens": args.k})
    plan = BenchPlan(datasets=tuple(args.datasets), batch_sizes=(1,),
                     prompts_per_batch={1: args.prompts}, max_tokens=128)
    greedy = SamplingParams(temperature=0.0, max_tokens=128)
    summary = {}
    for group in groups(plan, prompt_sets(plan, llm.get_tokenizer())):
        llm.generate(group["warmup"], SamplingParams(temperature=0.0, max_tokens=16),
                     use_tqdm=False)
        runs, generated, engine_steps = [], 0, 0
        for prompt in group["prompts"]:
            steps.clear()
            out = generate_counting_steps(llm, [prompt], greedy)
            generated += len(out.tokens[0])
            engine_steps += out.steps[0]
            runs.append((out.prompt_tokens[0] + out.tokens[0], list(steps)))
        name = group["tags"]["dataset"]
        summary[name] = {"tokens_per_step": generated / engine_steps, **summarise(runs)}
        result = summary[name]
        print(f"\n{name}: tokens/step {result['tokens_per_step']:.2f}, best source every step "
              f"{result['best_source_tokens_per_step']:.2f} (first order)")
        print("| source | has a draft | first token right | mean run | drafted |")
        print("|---|---|---|---|---|")
        for source, s in result["sources"].items():
            print(f"| {source} | {s['present']:.2f} | {s['first_token_right']:.2f} | "
                  f"{s['mean_run']:.2f} | {s['drafted']:.2f} |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(summary, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
