"""What adaptive ``hybrid`` learned: its acceptance table after a run (vllm_cllm/sizing/acceptance.py).

One in-process engine with ``jacobi`` (adaptive, k = 15) on gsm_symbolic problems of a
validation seed, one request at a time, greedy; then the proposer's table — per candidate
source, draft position, agreement with the other candidates and how the request's previous
draft fared: how many tokens were seen and what share was accepted (the prior taken
out) — and how often each source was drafted.

    .venv/bin/python benchmarks/acceptance_cells.py --problems 16 --out results/cells.json
"""

from __future__ import annotations

import argparse
import collections
from typing import Any

import numpy as np

from vllm_cllm.sizing.acceptance import HIT, MISSED, PRIOR_RATE, PRIOR_TRIALS, UNDRAFTED
from vllm_cllm.bench.measure import write_json

PREVIOUS = {MISSED: "missed", HIT: "hit", UNDRAFTED: "none drafted"}


def run(model: str, problems: int, seed: int, max_tokens: int) -> dict[str, Any]:
    from vllm import SamplingParams

    from vllm_cllm.proposers import jacobi
    from vllm_cllm.runtime.checkpoints import model_path
    from vllm_cllm.runtime.engine import create_llm, drafter_of
    from vllm_cllm.training.gsm import chat_prompt, gsm_problems

    chosen: collections.Counter[str] = collections.Counter()
    original = jacobi.JacobiProposer._propose_learned

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        drafts = original(self, *args, **kwargs)
        for state, draft in zip(args[2], drafts, strict=True):
            if state is not None:
                chosen[next((name for name, c in state.candidates.items()
                             if len(draft) and list(c[:len(draft)]) == list(draft)), "none")] += 1
        return drafts

    jacobi.JacobiProposer._propose_learned = counted
    llm = create_llm(str(model_path(model)), {"method": "jacobi", "num_speculative_tokens": 15,
                                              "adaptive": True})
    tokenizer = llm.get_tokenizer()
    greedy = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    for problem in gsm_problems(problems, seed):
        llm.generate([chat_prompt(tokenizer, problem["question"])], greedy, use_tqdm=False)
    table = drafter_of(llm).acceptance
    cells = []
    for s, p, v, o in np.ndindex(table.trials.shape):
        seen = table.trials[s, p, v, o] - PRIOR_TRIALS
        if seen >= 1:
            accepted = table.accepted[s, p, v, o] - PRIOR_TRIALS * PRIOR_RATE
            cells.append({"source": table.sources[s], "position": p, "agreeing": v,
                          "previous": PREVIOUS[o], "seen": round(float(seen), 1),
                          "accepted": round(float(accepted / seen), 3)})
    return {"model": model, "problems": problems, "seed": seed, "cells": cells,
            "drafted_source": dict(chosen)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-cllm-gsm")
    parser.add_argument("--problems", type=int, default=16)
    parser.add_argument("--seed", type=int, default=999, help="gsm_symbolic validation seed")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    result = run(args.model, args.problems, args.seed, args.max_tokens)
    print(f"{args.model}, {args.problems} gsm problems of seed {args.seed}; drafted source "
          f"per step: {result['drafted_source']}")
    print("| source | position | agreeing candidates | previous draft | tokens seen | accepted |")
    print("|---|---|---|---|---|---|")
    for c in result["cells"]:
        if c["position"] == 0 and c["seen"] >= 10:
            print(f"| {c['source']} | {c['position']} | {c['agreeing']} | {c['previous']} | "
                  f"{c['seen']:.0f} | {c['accepted']:.2f} |")
    write_json(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
