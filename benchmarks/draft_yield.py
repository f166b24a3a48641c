"""Whether adaptive ``jacobi``'s estimates hold: the accepted draft tokens it expected against
those vLLM accepted, by the batch size the drafts were made at.

One in-process engine with adaptive ``jacobi`` decodes the bench's prompts of a data set in
closed batches of ``--batch-size`` (greedy, 128 tokens); every step the expected yield of
what the batch rule drafted (the sum of the drafted positions' values) is recorded per
request and set against the tokens accepted in the next step. A ratio near 1 means the
estimates are not optimistic; a batch size with no drafts shows none. Since 2026-11-26 adaptive
k drafts nothing where drafts cost time (batch 8 and more on this CPU); ``--draft-everywhere``
lets it draft there as before, to see what those drafts would yield.

    .venv/bin/python benchmarks/draft_yield.py --dataset sharegpt --out results/draft_yield.json
"""

from __future__ import annotations

import argparse
import collections
from typing import Any

from vllm_cllm.bench.measure import write_json


class YieldLedger:
    """Per batch size: draft tokens, their expected and accepted tokens, and steps."""

    def __init__(self) -> None:
        self.by_batch: dict[int, collections.Counter[str]] = collections.defaultdict(
            collections.Counter)
        self._pending: dict[str, tuple[float, int, int]] = {}  # req -> expected, drafted, batch
        self._last: dict[str, Any] = {}

    def install(self, jacobi_module: Any) -> None:
        lengths, propose = jacobi_module.draft_lengths, jacobi_module.JacobiProposer.propose
        ledger = self

        def draft_lengths(values: Any, rooms: Any, *args: Any, **kwargs: Any) -> list[int]:
            chosen = lengths(values, rooms, *args, **kwargs)
            ledger._last.update(values=values, lengths=chosen)
            return chosen

        def tracked(proposer: Any, sampled: list[list[int]], *args: Any, **kwargs: Any) -> Any:
            req_ids = list(proposer.predictions.req_ids) if proposer.predictions else []
            for i, req_id in enumerate(req_ids[:len(sampled)]):
                if req_id in ledger._pending:
                    expected, drafted, batch = ledger._pending.pop(req_id)
                    ledger.by_batch[batch].update(drafted=drafted, expected=expected,
                                                  accepted=len(sampled[i]) - 1)
            ledger._last.clear()
            drafts = propose(proposer, sampled, *args, **kwargs)
            if "lengths" in ledger._last and req_ids:
                ledger.by_batch[len(req_ids)]["steps"] += 1
                for i, n in enumerate(ledger._last["lengths"]):
                    if n:
                        ledger._pending[req_ids[i]] = (
                            float(sum(ledger._last["values"][i][:n])), n, len(req_ids))
            return drafts

        jacobi_module.draft_lengths = draft_lengths
        jacobi_module.JacobiProposer.propose = tracked


def measure(model: str, dataset: str, batch_size: int, prompts: int,
            draft_everywhere: bool = False) -> dict[str, Any]:
    from vllm_cllm.runtime.engine import apply_cpu_env

    apply_cpu_env()
    from vllm import SamplingParams

    from vllm_cllm.proposers import jacobi
    from vllm_cllm.bench.suite import MODELS, BenchPlan, prompt_sets
    from vllm_cllm.runtime.checkpoints import model_path
    from vllm_cllm.runtime.engine import create_llm

    if draft_everywhere:  # the proposer's test for "drafts cost time", never true
        jacobi.drafts_cost_time = lambda *args: False
    ledger = YieldLedger()
    ledger.install(jacobi)
    llm = create_llm(str(model_path(MODELS[model])),
                     {"method": "jacobi", "num_speculative_tokens": 15, "adaptive": True})
    plan = BenchPlan(datasets=(dataset,), batch_sizes=(batch_size,),
                     prompts_per_batch={batch_size: prompts})
    chosen = prompt_sets(plan, llm.get_tokenizer())[dataset]
    for first in range(0, len(chosen), batch_size):
        llm.generate(chosen[first:first + batch_size],
                     SamplingParams(temperature=0, max_tokens=128), use_tqdm=False)
    return {"model": model, "dataset": dataset, "batch_size": batch_size, "prompts": prompts,
            "draft_everywhere": draft_everywhere,
            "by_batch": {b: dict(c) for b, c in sorted(ledger.by_batch.items())}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="cllm", choices=["base", "cllm"])
    parser.add_argument("--dataset", default="sharegpt",
                        choices=["gsm", "humaneval", "mtbench", "sharegpt"])
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--prompts", type=int, default=96)
    parser.add_argument("--draft-everywhere", action="store_true",
                        help="draft where drafts cost time too (the rule before 2026-11-26)")
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    args = parser.parse_args()
    result = measure(args.model, args.dataset, args.batch_size, args.prompts,
                     args.draft_everywhere)
    print(f"{'batch':>5} {'steps':>6} {'drafted':>8} {'expected':>9} {'accepted':>9} ratio")
    for batch, c in result["by_batch"].items():
        ratio = f"{c['accepted'] / c['expected']:.2f}" if c.get("expected") else "-"
        print(f"{batch:>5} {c.get('steps', 0):>6} {c.get('drafted', 0):>8} "
              f"{c.get('expected', 0):>9.1f} {c.get('accepted', 0):>9} {ratio}")
    write_json(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
