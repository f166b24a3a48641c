"""Where a decode step's time goes, per proposer: the model runner's forward, sampling and
verification, the proposer, and the forward's time by the number of draft tokens it verified.

Wall-clock timers around vLLM's ``GPUModelRunner`` methods (the CPU runner inherits them) and
this project's capture and proposer, in one in-process engine on the CLLM demo, greedy, on
the bench's prompts of ``--dataset`` (gsm: its evaluation seed), one at a time or
``--batch-size`` together. Each proposer runs in its own process, one after another, so compare
the per-step components within a run, not the totals across runs (this machine drifts); the
JSON (``--out``) keeps every decode step's requests, drafting requests, draft tokens and times.

    .venv/bin/python benchmarks/step_profile.py --methods jacobi suffix --prompts 4
    .venv/bin/python benchmarks/step_profile.py --methods "jacobi gpu costs" --dataset sharegpt \
        --batch-size 16 --prompts 32 --out step_profile.json
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from interleaved import verify_with_vllms_sampler

from vllm_cllm.bench.suite import DATASETS, NEVER_DRAFTING, SUFFIX_SPEC

FORWARD = "forward (execute_model)"
#: Printed in this order; the indented ones are parts of the one above them.
#: vLLM 0.32 runs the proposer inside ``sample_tokens``, after sampling and verification.
LABELS = (FORWARD, "sampling, verification, proposing (sample_tokens)",
          "  of which jacobi's capture", "  of which the proposer (propose_draft_token_ids)",
          "    of which jacobi's propose")
SPECS: dict[str, dict[str, Any] | None] = {
    "none": None,
    "suffix": SUFFIX_SPEC,
    "jacobi": {"method": "jacobi", "num_speculative_tokens": 15},  # the default: adaptive
    "jacobi fixed k": {"method": "jacobi", "num_speculative_tokens": 15, "adaptive": False},
    # the proposer and the speculative path without drafts: what drafting must pay back
    "jacobi no drafts": {"method": "jacobi", "num_speculative_tokens": 15, **NEVER_DRAFTING},
    # the default with every verify step through vLLM's rejection sampler (SETUPS)
    "jacobi vllm verify": {"method": "jacobi", "num_speculative_tokens": 15},
    # the GPU cost model, unmeasured: drafts of every size at any batch on this CPU
    "jacobi gpu costs": {"method": "jacobi", "num_speculative_tokens": 15,
                         "knee_tokens": 256, "floor_tokens": 0},
}

#: What a method's process runs before its engine is built.
SETUPS: dict[str, Callable[[], None]] = {"jacobi vllm verify": verify_with_vllms_sampler}


class Timers:
    """Seconds spent in each wrapped function, and each decode step's own times."""

    def __init__(self) -> None:
        self.seconds: collections.Counter[str] = collections.Counter()
        #: Per decode step: requests, requests with drafts, draft tokens, milliseconds of the
        #: forward and of each wrapped function that ran after it in the same step.
        self.decode_steps: list[dict[str, float]] = []
        self.current: dict[str, float] | None = None  # the decode step now running

    def wrap(self, owner: Any, name: str, label: str) -> None:
        original = getattr(owner, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                seconds = time.perf_counter() - start
                self.seconds[label] += seconds
                if self.current is not None:
                    self.current[label] = self.current.get(label, 0.0) + 1000 * seconds

        setattr(owner, name, timed)

    def wrap_forward(self, runner_class: Any) -> None:
        original = runner_class.execute_model

        def execute_model(runner: Any, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            self.current = None
            try:
                return original(runner, scheduler_output, *args, **kwargs)
            finally:
                seconds = time.perf_counter() - start
                self.seconds[FORWARD] += seconds
                spec = scheduler_output.scheduled_spec_decode_tokens or {}
                drafts = sum(len(d) for d in spec.values())
                requests = len(scheduler_output.num_scheduled_tokens)
                if scheduler_output.total_num_scheduled_tokens <= requests + drafts:  # decode
                    self.current = {"requests": requests,
                                    "drafting_requests": sum(1 for d in spec.values() if d),
                                    "draft_tokens": drafts, "forward_ms": 1000 * seconds}
                    self.decode_steps.append(self.current)

        runner_class.execute_model = execute_model


def profile(method: str, prompts: int, offset: int, max_tokens: int,
            batch_size: int = 1, dataset: str = "gsm") -> dict[str, Any]:
    """One engine with ``method``: per-step milliseconds of each component, ``prompts``
    prompts of ``dataset`` in batches of ``batch_size`` (a step is one engine step of the
    whole batch)."""
    from vllm_cllm.runtime.engine import apply_cpu_env

    apply_cpu_env()
    if method in SETUPS:
        SETUPS[method]()
    from vllm import SamplingParams
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    from vllm_cllm.bench.suite import BenchPlan, prompt_sets
    from vllm_cllm.proposers import base
    from vllm_cllm.runtime.checkpoints import model_path
    from vllm_cllm.runtime.engine import StepCounter, create_llm

    timers = Timers()
    timers.wrap_forward(GPUModelRunner)
    for owner, name, label in zip(
            (GPUModelRunner, base.SelfDraftingProposer, GPUModelRunner,
             base.SelfDraftingProposer),
            ("sample_tokens", "observe_verification", "propose_draft_token_ids", "propose"),
            LABELS[1:], strict=True):
        timers.wrap(owner, name, label)
    llm = create_llm(str(model_path("smollm2-135m-cllm-gsm")), SPECS[method])
    plan = BenchPlan(datasets=(dataset,), batch_sizes=(1,),
                     prompts_per_batch={1: offset + prompts}, max_tokens=max_tokens)
    chosen = prompt_sets(plan, llm.get_tokenizer())[dataset][offset:]
    llm.generate(chosen[:1], SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)
    timers.seconds.clear()
    timers.decode_steps.clear()
    tokens = steps = 0
    start = time.perf_counter()
    for first in range(0, len(chosen), batch_size):
        stepping = StepCounter(llm, chosen[first:first + batch_size],
                               SamplingParams(temperature=0, max_tokens=max_tokens))
        while stepping.step():
            steps += 1
        tokens += sum(len(t) for t in stepping.result().tokens)
    wall = time.perf_counter() - start
    return {"method": method, "dataset": dataset, "batch_size": batch_size, "tokens": tokens,
            "steps": steps, "tokens_per_step": tokens / steps,
            "ms_per_step": 1000 * wall / steps,
            "components_ms_per_step": {k: 1000 * v / steps for k, v in timers.seconds.items()},
            "forward_ms_by_drafts": forward_ms_by_drafts(timers.decode_steps),
            "decode_steps": timers.decode_steps}


def forward_ms_by_drafts(decode_steps: list[dict[str, float]]) -> dict[int, dict[str, float]]:
    """Per number of draft tokens verified: decode steps and their median forward time."""
    by_drafts: dict[int, list[float]] = collections.defaultdict(list)
    for step in decode_steps:
        by_drafts[int(step["draft_tokens"])].append(step["forward_ms"])
    return {d: {"steps": len(v), "median_ms": statistics.median(v)}
            for d, v in sorted(by_drafts.items())}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--methods", nargs="+", default=["none", "suffix", "jacobi"],
                        choices=list(SPECS))
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--dataset", default="gsm", choices=DATASETS)
    parser.add_argument("--offset", type=int, default=32, help="first prompt used")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=1,
                        help="prompts decoded together (a step is the whole batch's)")
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)  # child process
    args = parser.parse_args()
    if args.one:
        print(json.dumps(profile(args.one, args.prompts, args.offset, args.max_tokens,
                                 args.batch_size, args.dataset)))
        return 0
    results = []
    for method in args.methods:  # one process each: in-process engines share global state
        child = subprocess.run([sys.executable, __file__, "--one", method, "--prompts",
                                str(args.prompts), "--offset", str(args.offset),
                                "--max-tokens", str(args.max_tokens),
                                "--batch-size", str(args.batch_size),
                                "--dataset", args.dataset],
                               capture_output=True, text=True, check=True)
        results.append(json.loads(child.stdout.strip().splitlines()[-1]))
    for r in results:
        print(f"\n{r['method']}: {r['tokens_per_step']:.2f} tokens/step, "
              f"{r['ms_per_step']:.1f} ms/step")
        for name in LABELS:
            if name in r["components_ms_per_step"]:
                print(f"  {name}: {r['components_ms_per_step'][name]:.2f} ms/step")
        print("  forward by draft tokens: " + ", ".join(
            f"{d}: {v['median_ms']:.0f} ms ({v['steps']})"
            for d, v in r["forward_ms_by_drafts"].items()))
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
