"""What a full batch-16 step costs by how many of its requests draft and how many tokens each:
the check behind the adaptive cost model's per-request overhead (vllm_cllm/adaptive.py).

One in-process engine on the CLLM demo runs ``jacobi`` (``fill: random``, so a request
always has k tokens to offer) on 16 ShareGPT questions, ``ignore_eos`` so the batch stays full;
the proposer's drafts are cut to the shape under test (the first ``r`` requests draft ``d``
tokens, the rest none). Shapes take turns, ``--repeats`` times, so the machine's drift spreads
over all of them. Per shape: the median of each part of a full-batch decode step (the
forward, the rest of ``execute_model``, ``sample_tokens``), and their sum relative to the
undrafted shape measured in the same repeat.

    .venv/bin/python benchmarks/draft_shape.py --out results/draft_shape.json
"""

from __future__ import annotations

import argparse
import collections
import statistics
import time
from typing import Any

from vllm_cllm.benchmarking import write_json

BATCH = 16
SHAPES = ("0x0", "1x1", "1x3", "1x8", "2x3", "4x1", "4x3", "16x1")


class ShapedSteps:
    """Cuts the proposer's drafts to ``r`` requests of ``d`` tokens and times each full-batch
    decode step's parts."""

    def __init__(self) -> None:
        self.drafting, self.tokens = 0, 0
        self.steps: list[dict[str, float]] = []
        self._current: dict[str, float] | None = None

    def install(self, proposer_class: Any, runner_class: Any) -> None:
        propose, execute = proposer_class.propose, runner_class.execute_model

        def cut(proposer: Any, *args: Any, **kwargs: Any) -> list[list[int]]:
            drafts = propose(proposer, *args, **kwargs)
            return [d[:self.tokens] if i < self.drafting else []
                    for i, d in enumerate(drafts)]

        def execute_model(runner: Any, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
            self._current = {}
            try:
                return execute(runner, scheduler_output, *args, **kwargs)
            finally:
                spec = scheduler_output.scheduled_spec_decode_tokens or {}
                requests = len(scheduler_output.num_scheduled_tokens)
                drafts = sum(len(d) for d in spec.values())
                if requests == BATCH and drafts == self.drafting * self.tokens and \
                        scheduler_output.total_num_scheduled_tokens == requests + drafts:
                    self.steps.append(self._current)
                else:
                    self._current = None

        proposer_class.propose = cut
        runner_class.execute_model = self._timed(execute_model, "execute_model")
        runner_class._model_forward = self._timed(runner_class._model_forward, "forward")
        runner_class.sample_tokens = self._timed(runner_class.sample_tokens, "sample_tokens")

    def _timed(self, method: Any, name: str) -> Any:
        """``method`` adding its milliseconds to the current step's part ``name``."""

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                self._part(name, start)

        return timed

    def _part(self, name: str, start: float) -> None:
        if self._current is not None:
            self._current[name] = self._current.get(name, 0.0) + 1000 * (
                time.perf_counter() - start)


def measure(shapes: list[str], repeats: int, max_tokens: int) -> dict[str, Any]:
    from vllm_cllm.runtime import apply_cpu_env

    apply_cpu_env()
    from vllm import SamplingParams
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    from vllm_cllm.datasets import chat_template, sharegpt_questions
    from vllm_cllm.jacobi import JacobiProposer
    from vllm_cllm.models import model_path
    from vllm_cllm.runtime import create_llm

    llm = create_llm(str(model_path("smollm2-135m-cllm-gsm")),
                     {"method": "jacobi", "num_speculative_tokens": 15, "fill": "random"})
    shaped = ShapedSteps()
    shaped.install(JacobiProposer, GPUModelRunner)  # after the engine's patch probes
    prompts = chat_template(llm.get_tokenizer(), sharegpt_questions(BATCH))
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    llm.generate(prompts, params, use_tqdm=False)  # warm-up: every shape's kernels
    parts: dict[str, dict[str, list[float]]] = collections.defaultdict(
        lambda: collections.defaultdict(list))
    relative: dict[str, list[float]] = collections.defaultdict(list)
    for _ in range(repeats):
        step_ms = {}
        for shape in shapes:
            shaped.drafting, shaped.tokens = (int(x) for x in shape.split("x"))
            shaped.steps.clear()
            llm.generate(prompts, params, use_tqdm=False)
            for step in shaped.steps:
                for name, ms in step.items():
                    parts[shape][name].append(ms)
            step_ms[shape] = statistics.median(
                s["execute_model"] + s.get("sample_tokens", 0.0) for s in shaped.steps)
        for shape in shapes:
            relative[shape].append(step_ms[shape] / step_ms[shapes[0]])
    return {"batch_size": BATCH, "max_tokens": max_tokens, "repeats": repeats,
            "shapes": {shape: {"steps": len(parts[shape]["execute_model"]),
                               **{f"{name}_ms": statistics.median(v)
                                  for name, v in parts[shape].items()},
                               "step_vs_undrafted": relative[shape]}
                       for shape in shapes}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES),
                        help="RxD: R requests draft D tokens each (the first is the reference)")
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=40)
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    args = parser.parse_args()
    result = measure(args.shapes, args.repeats, args.max_tokens)
    print(f"{'shape':>6} {'steps':>6} {'forward':>8} {'execute':>8} {'sample':>8}  step vs "
          f"{args.shapes[0]} (per repeat)")
    for shape, row in result["shapes"].items():
        print(f"{shape:>6} {row['steps']:>6} {row.get('forward_ms', 0):8.1f} "
              f"{row['execute_model_ms']:8.1f} {row.get('sample_tokens_ms', 0):8.2f}  "
              + " ".join(f"{r:.3f}" for r in row["step_vs_undrafted"]))
    write_json(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
