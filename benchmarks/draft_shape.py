"""What a full batch-16 step costs by how many of its requests draft and how many tokens each:
the check behind the adaptive cost model's per-request overhead (vllm_cllm/sizing/cost_model.py).

One in-process engine on the CLLM demo runs ``jacobi`` (``fill: random``, so a request
always has k tokens to offer) on 16 ShareGPT questions, ``ignore_eos`` so the batch stays full;
the proposer's drafts are cut to the shape under test (the first ``r`` requests draft ``d``
tokens, the rest none). Shapes take turns, ``--repeats`` times, so the machine's drift spreads
over all of them. Each decode step is timed by ``benchmarks/step_profile.py``'s timers
(``execute_model``, then ``sample_tokens``); per shape, the median of each over the full-batch
steps of that shape, and their sum relative to the undrafted shape in the same repeat.

    .venv/bin/python benchmarks/draft_shape.py --out results/draft_shape.json
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from step_profile import Timers  # noqa: E402

from vllm_cllm.bench.measure import write_json  # noqa: E402

BATCH = 16
SHAPES = ("0x0", "1x1", "1x3", "1x8", "2x3", "4x1", "4x3", "16x1")
SAMPLE = "sample_tokens"


def cut_drafts(proposer_class: Any, shape: dict[str, int]) -> None:
    """The proposer's drafts cut to ``shape``: its first ``r`` requests draft ``d`` tokens."""
    propose = proposer_class.propose

    def cut(proposer: Any, *args: Any, **kwargs: Any) -> list[list[int]]:
        drafts = propose(proposer, *args, **kwargs)
        return [d[:shape["d"]] if i < shape["r"] else [] for i, d in enumerate(drafts)]

    proposer_class.propose = cut


def measure(shapes: list[str], repeats: int, max_tokens: int) -> dict[str, Any]:
    from vllm_cllm.runtime.engine import apply_cpu_env

    apply_cpu_env()
    from vllm import SamplingParams
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    from vllm_cllm.bench.datasets import chat_template, sharegpt_questions
    from vllm_cllm.proposers.jacobi import JacobiProposer
    from vllm_cllm.runtime.checkpoints import model_path
    from vllm_cllm.runtime.engine import create_llm

    llm = create_llm(str(model_path("smollm2-135m-cllm-gsm")),
                     {"method": "jacobi", "num_speculative_tokens": 15, "fill": "random"})
    shape = {"r": 0, "d": 0}
    cut_drafts(JacobiProposer, shape)  # after the engine's patch probes
    timers = Timers()
    timers.wrap_forward(GPUModelRunner)
    timers.wrap(GPUModelRunner, "sample_tokens", SAMPLE)
    prompts = chat_template(llm.get_tokenizer(), sharegpt_questions(BATCH))
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    llm.generate(prompts, params, use_tqdm=False)  # warm-up: every shape's kernels
    parts: dict[str, dict[str, list[float]]] = collections.defaultdict(
        lambda: collections.defaultdict(list))
    relative: dict[str, list[float]] = collections.defaultdict(list)
    for _ in range(repeats):
        step_ms = {}
        for name in shapes:
            shape["r"], shape["d"] = (int(x) for x in name.split("x"))
            timers.decode_steps.clear()
            llm.generate(prompts, params, use_tqdm=False)
            steps = [s for s in timers.decode_steps if s["requests"] == BATCH
                     and s["draft_tokens"] == shape["r"] * shape["d"]]
            for step in steps:
                parts[name]["execute_model"].append(step["forward_ms"])
                parts[name][SAMPLE].append(step.get(SAMPLE, 0.0))
            step_ms[name] = statistics.median(s["forward_ms"] + s.get(SAMPLE, 0.0)
                                              for s in steps)
        for name in shapes:
            relative[name].append(step_ms[name] / step_ms[shapes[0]])
    return {"batch_size": BATCH, "max_tokens": max_tokens, "repeats": repeats,
            "shapes": {name: {"steps": len(parts[name]["execute_model"]),
                              **{f"{part}_ms": statistics.median(v)
                                 for part, v in parts[name].items()},
                              "step_vs_undrafted": relative[name]}
                       for name in shapes}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES),
                        help="RxD: R requests draft D tokens each (the first is the reference)")
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=40)
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    args = parser.parse_args()
    result = measure(args.shapes, args.repeats, args.max_tokens)
    print(f"{'shape':>6} {'steps':>6} {'execute':>8} {'sample':>8}  step vs "
          f"{args.shapes[0]} (per repeat)")
    for shape, row in result["shapes"].items():
        print(f"{shape:>6} {row['steps']:>6} {row['execute_model_ms']:8.1f} "
              f"{row['sample_tokens_ms']:8.2f}  "
              + " ".join(f"{r:.3f}" for r in row["step_vs_undrafted"]))
    write_json(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
