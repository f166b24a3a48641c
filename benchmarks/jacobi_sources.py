"""Which of `hybrid`'s draft sources guesses right: per source, how often it has a draft, how
often its first token is the one committed, its mean run, how often `jacobi` drafts it — and
tokens per step, on the bench's batch-1 prompts (one request at a time, 128 new tokens).

    .venv/bin/python benchmarks/jacobi_sources.py --datasets gsm --prompts 16
    .venv/bin/python benchmarks/jacobi_sources.py --datasets humaneval mtbench sharegpt --prompts 6

The sources are recorded in-process around ``HybridState.first_in_order`` and scored against
the request's final output, so "first token right" and "mean run" say what each source would
have given had it been drafted that step (the model's later tails depend on what was drafted:
a first-order estimate). "best source" is that estimate with the best source every step.

The replay (first order too) asks what limits batch 1 on this CPU. Each step's draft as made is
sized four ways — in full, by the adaptive rule (its acceptance estimate replayed on the
outcomes), to exactly the tokens that will be accepted (an oracle), and replaced by what vLLM's
``suffix`` would have drafted from the same tokens (``arctic-inference``'s cache, fed the same
requests in the same order) — and scored as tokens per step and tokens per step cost under the
adaptive rule's cost model (``--knee``/``--floor``), relative to plain decoding.
"""

from __future__ import annotations

import argparse
import collections
import json
from typing import Any

import numpy as np

from vllm_cllm.proposers import jacobi
from vllm_cllm.sizing.cost_model import (
    SPEC_STEP_OVERHEAD_PER_REQUEST,
    AcceptanceRate,
    draft_lengths,
    step_cost,
)
from vllm_cllm.bench.suite import SUFFIX_SPEC, BenchPlan, groups, prompt_sets, suffix_available
from vllm_cllm.runtime.checkpoints import model_path
from vllm_cllm.runtime.engine import create_llm, generate_counting_steps

Step = dict[str, Any]


class SuffixShadow:
    """What vLLM's ``suffix`` would draft from the same committed tokens: arctic-inference's
    cache driven as vLLM 0.32's proposer drives it, with ``SpeculativeConfig``'s defaults and
    the bench's k, one request at a time."""

    def __init__(self) -> None:
        from arctic_inference.suffix_decoding import SuffixDecodingCache
        from vllm.config import SpeculativeConfig

        defaults = {name: f.default for name, f in SpeculativeConfig.__dataclass_fields__.items()
                    if name.startswith("suffix_decoding_")}
        self.depth = defaults["suffix_decoding_max_tree_depth"]
        self.speculate_options = {
            "max_spec_tokens": SUFFIX_SPEC["num_speculative_tokens"],
            "max_spec_factor": defaults["suffix_decoding_max_spec_factor"],
            "min_token_prob": defaults["suffix_decoding_min_token_prob"]}
        self.cache = SuffixDecodingCache(self.depth,
                                         defaults["suffix_decoding_max_cached_requests"])
        self.request, self.seen = 0, 0

    def next_request(self) -> None:
        if self.seen:
            self.cache.stop_request(str(self.request))
        self.request, self.seen = self.request + 1, 0

    def draft(self, context: np.ndarray) -> np.ndarray:
        rid = str(self.request)
        if not self.seen:  # first decode step: the prompt, then its first token
            self.cache.start_request(rid, context[:-1])
            self.seen = len(context) - 1
        self.cache.add_active_response(rid, context[self.seen:].tolist())
        self.seen = len(context)
        out = self.cache.speculate(rid, context[-self.depth:], **self.speculate_options)
        return np.asarray(out.token_ids, dtype=np.int64)


def record_sources(steps: list[Step], shadow: SuffixShadow | None = None) -> None:
    """Record each step's candidates and the drafted one (``context`` length to align them)."""
    original = jacobi.HybridState.draft

    def draft(self: jacobi.HybridState, model: np.ndarray, ngram: np.ndarray,
              context: np.ndarray, *args: Any, **kwargs: Any) -> np.ndarray:
        out = original(self, model, ngram, context, *args, **kwargs)
        steps.append({"at": len(context), "drafted": out,
                      "candidates": {k: v for k, v in self.proposed.items() if len(v)},
                      "suffix": shadow.draft(context) if shadow else None})
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


def replay(runs: list[tuple[list[int], list[Step]]], knee: float, floor: float
           ) -> dict[str, dict[str, float]]:
    """Tokens per step and tokens per step cost (plain decoding = 1) of each sizing (see the
    module docstring), first order: later drafts as recorded whatever was verified."""
    def cost(drafted: int) -> float:  # relative to a plain step
        overhead = SPEC_STEP_OVERHEAD_PER_REQUEST if drafted else 0.0
        return step_cost(1 + drafted + overhead, knee, floor) / step_cost(1, knee, floor)

    def sized(step: Step, rate: AcceptanceRate, truth: list[int]) -> dict[str, np.ndarray]:
        made = step["drafted"]
        n = draft_lengths([rate.values(len(made))], [len(made)], knee, floor)[0]
        out = {"as made, in full": made, "adaptive rule": made[:n],
               "oracle length": made[:jacobi.matched_prefix(made, truth)]}
        if step["suffix"] is not None:
            out["suffix's draft instead"] = step["suffix"]
        return out

    totals: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for tokens, records in runs:
        rate = AcceptanceRate()
        for step in records:
            truth = tokens[step["at"]:]
            if not truth:
                continue
            for name, draft in sized(step, rate, truth).items():
                accepted = jacobi.matched_prefix(draft, truth)
                totals[name].update(tokens=1 + accepted, cost=cost(len(draft)), steps=1,
                                    drafted=len(draft))
                if name == "adaptive rule":
                    rate.last_drafted = len(draft)
                    rate.observe(accepted)
    return {name: {"tokens_per_step": t["tokens"] / t["steps"],
                   "speedup_by_cost_model": t["tokens"] / t["cost"],
                   "drafted_per_step": t["drafted"] / t["steps"]} for name, t in totals.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-cllm-gsm")
    parser.add_argument("--datasets", nargs="+", default=["gsm"])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--k", type=int, default=15)
    parser.add_argument("--out", default=None, help="write the summary as JSON here")
    parser.add_argument("--offset", type=int, default=0,
                        help="skip this many of the data set's prompts (fresh problems)")
    parser.add_argument("--knee", type=float, default=24, help="replay cost model: knee tokens")
    parser.add_argument("--floor", type=float, default=28, help="replay cost model: floor")
    args = parser.parse_args()
    from vllm import SamplingParams

    steps: list[Step] = []
    shadow = SuffixShadow() if suffix_available() is None else None
    record_sources(steps, shadow)
    llm = create_llm(str(model_path(args.model)),
                     {"method": "jacobi", "num_speculative_tokens": args.k})
    plan = BenchPlan(datasets=tuple(args.datasets), batch_sizes=(1,),
                     prompts_per_batch={1: args.offset + args.prompts}, max_tokens=128)
    greedy = SamplingParams(temperature=0.0, max_tokens=128)
    summary = {}
    for group in groups(plan, prompt_sets(plan, llm.get_tokenizer())):
        llm.generate(group["warmup"], SamplingParams(temperature=0.0, max_tokens=16),
                     use_tqdm=False)
        runs, generated, engine_steps = [], 0, 0
        for prompt in group["prompts"][args.offset:]:
            steps.clear()
            if shadow:
                shadow.next_request()
            out = generate_counting_steps(llm, [prompt], greedy)
            generated += len(out.tokens[0])
            engine_steps += out.steps[0]
            runs.append((out.prompt_tokens[0] + out.tokens[0], list(steps)))
        name = group["tags"]["dataset"]
        summary[name] = {"tokens_per_step": generated / engine_steps, **summarise(runs),
                         "replay": replay(runs, args.knee, args.floor)}
        result = summary[name]
        print(f"\n{name}: tokens/step {result['tokens_per_step']:.2f}, best source every step "
              f"{result['best_source_tokens_per_step']:.2f} (first order)")
        print("| source | has a draft | first token right | mean run | drafted |")
        print("|---|---|---|---|---|")
        for source, s in result["sources"].items():
            print(f"| {source} | {s['present']:.2f} | {s['first_token_right']:.2f} | "
                  f"{s['mean_run']:.2f} | {s['drafted']:.2f} |")
        print(f"\nreplay (first order; cost model knee {args.knee:g}, floor {args.floor:g})")
        print("| draft | tokens per step | drafted per step | speed-up by the cost model |")
        print("|---|---|---|---|")
        for sizing, r in result["replay"].items():
            print(f"| {sizing} | {r['tokens_per_step']:.2f} | {r['drafted_per_step']:.2f} | "
                  f"{r['speedup_by_cost_model']:.2f} |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(summary, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
