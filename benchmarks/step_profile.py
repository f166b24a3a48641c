"""Where a decode step's time goes, per proposer: the model runner's forward, sampling and
verification, the proposer, and the forward's time by the number of draft tokens it verified.

Wall-clock timers around vLLM's ``GPUModelRunner`` methods (the CPU runner inherits them) and
this project's capture and proposer, in one in-process engine on the CLLM demo, batch 1,
greedy, on gsm prompts of the bench's evaluation seed. Each proposer runs in its own process,
one after another, so compare the per-step components within a run, not the totals across runs
(this machine drifts).

    .venv/bin/python benchmarks/step_profile.py --methods "jacobi adaptive" suffix --prompts 4
"""

from __future__ import annotations

import argparse
import collections
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from vllm_cllm.bench import SUFFIX_SPEC

FORWARD = "forward (execute_model)"
#: Printed in this order; the indented ones are parts of the one above them.
LABELS = (FORWARD, "sampling and verification (sample_tokens)", "  of which jacobi's capture",
          "proposer (propose_draft_token_ids)", "  of which jacobi's propose")
SPECS: dict[str, dict[str, Any] | None] = {
    "none": None,
    "suffix": SUFFIX_SPEC,
    "jacobi": {"method": "jacobi", "num_speculative_tokens": 15},
    "jacobi adaptive": {"method": "jacobi", "num_speculative_tokens": 15, "adaptive": True},
}


class Timers:
    """Seconds spent in each wrapped function, and forward time by draft tokens verified."""

    def __init__(self) -> None:
        self.seconds: collections.Counter[str] = collections.Counter()
        self.forward_by_drafts: dict[int, list[float]] = collections.defaultdict(list)

    def wrap(self, owner: Any, name: str, label: str) -> None:
        original = getattr(owner, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.seconds[label] += time.perf_counter() - start

        setattr(owner, name, timed)

    def wrap_forward(self, runner_class: Any) -> None:
        original = runner_class.execute_model

        def execute_model(runner: Any, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return original(runner, scheduler_output, *args, **kwargs)
            finally:
                seconds = time.perf_counter() - start
                self.seconds[FORWARD] += seconds
                drafts = sum(len(d) for d in
                             (scheduler_output.scheduled_spec_decode_tokens or {}).values())
                if scheduler_output.total_num_scheduled_tokens <= 1 + drafts:  # not a prefill
                    self.forward_by_drafts[drafts].append(seconds)

        runner_class.execute_model = execute_model


def profile(method: str, prompts: int, offset: int, max_tokens: int) -> dict[str, Any]:
    """One engine with ``method``: per-step milliseconds of each component."""
    from vllm_cllm.runtime import apply_cpu_env

    apply_cpu_env()
    from vllm import SamplingParams
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    from vllm_cllm import capture, jacobi
    from vllm_cllm.bench import BenchPlan, prompt_sets
    from vllm_cllm.models import model_path
    from vllm_cllm.runtime import create_llm, generate_counting_steps

    timers = Timers()
    timers.wrap_forward(GPUModelRunner)
    for owner, name, label in zip(
            (GPUModelRunner, capture.VerifyObserver, GPUModelRunner, jacobi.JacobiProposer),
            ("sample_tokens", "observe_verification", "propose_draft_token_ids", "propose"),
            LABELS[1:], strict=True):
        timers.wrap(owner, name, label)
    llm = create_llm(str(model_path("smollm2-135m-cllm-gsm")), SPECS[method])
    plan = BenchPlan(datasets=("gsm",), batch_sizes=(1,),
                     prompts_per_batch={1: offset + prompts}, max_tokens=max_tokens)
    chosen = prompt_sets(plan, llm.get_tokenizer())["gsm"][offset:]
    llm.generate(chosen[:1], SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)
    timers.seconds.clear()
    timers.forward_by_drafts.clear()
    tokens = steps = 0
    start = time.perf_counter()
    for prompt in chosen:
        out = generate_counting_steps(llm, [prompt],
                                      SamplingParams(temperature=0, max_tokens=max_tokens))
        tokens, steps = tokens + len(out.tokens[0]), steps + out.steps[0]
    wall = time.perf_counter() - start
    return {"method": method, "tokens": tokens, "steps": steps, "tokens_per_step": tokens / steps,
            "ms_per_step": 1000 * wall / steps,
            "components_ms_per_step": {k: 1000 * v / steps for k, v in timers.seconds.items()},
            "forward_ms_by_drafts": {
                d: {"steps": len(v), "median_ms": 1000 * sorted(v)[len(v) // 2]}
                for d, v in sorted(timers.forward_by_drafts.items())}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--methods", nargs="+", default=["none", "suffix", "jacobi adaptive"],
                        choices=list(SPECS))
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--offset", type=int, default=32, help="first gsm prompt used")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)  # child process
    args = parser.parse_args()
    if args.one:
        print(json.dumps(profile(args.one, args.prompts, args.offset, args.max_tokens)))
        return 0
    results = []
    for method in args.methods:  # one process each: in-process engines share global state
        child = subprocess.run([sys.executable, __file__, "--one", method, "--prompts",
                                str(args.prompts), "--offset", str(args.offset),
                                "--max-tokens", str(args.max_tokens)],
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
