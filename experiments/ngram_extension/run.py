"""Would ``jacobi`` gain by drafting an n-gram continuation to its end where the chosen draft
agrees with it?

The candidate log of the default at batch 1 shows drafts of a few tokens, accepted whole,
cut short of an n-gram continuation that agreed with them and went on being accepted
(experiments/tail_confidence prints the counterfactual). This study measures the blunt rule
for real: after the adaptive policy has drafted, a draft of at least ``MIN_DRAFT`` tokens
that the request's n-gram continuation (usual or latest occurrence) begins with is replaced by
that continuation, up to the request's room. Engines in lock step (the bench's engine pool):
plain decoding, vLLM ``suffix``, the default and the default with the rule, on both models.

    .venv/bin/python experiments/ngram_extension/run.py --dataset gsm --rounds 4 --out DIR
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

#: The shortest draft the rule extends.
MIN_DRAFT = 3


def extend_ngram_drafts() -> None:
    """In an engine's worker: the adaptive policy's drafts extended along the request's
    n-gram continuation where it begins with them."""
    import numpy as np

    from vllm_cllm.policies.adaptive import Adaptive
    from vllm_cllm.sources.ngram import ngram_continuations

    draft = Adaptive.draft

    def extended(self: Any, step: Any, rows: Any, states: Any, sources: Any) -> Any:
        drafts = draft(self, step, rows, states, sources)
        for j, i in enumerate(rows):
            mine = drafts[j]
            n, room = len(mine), int(step.rooms[i])
            if n < MIN_DRAFT or n >= room:
                continue
            for other in ngram_continuations(step.context(i), 2, 4, room):
                if len(other) > n and np.array_equal(other[:n], mine):
                    drafts[j] = np.asarray(other, dtype=np.int64)
                    break
        return drafts

    Adaptive.draft = extended


def main() -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from interleaved import ADAPTIVE, measure_rounds, summarise

    from vllm_cllm.bench.suite import DATASETS, SUFFIX_SPEC

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", default="gsm", choices=DATASETS)
    parser.add_argument("--models", nargs="+", default=["base", "cllm"])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=2, help="per round")
    parser.add_argument("--offset", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    configs, setups = {}, {}
    for m in args.models:
        configs |= {f"{m} none": (m, None), f"{m} suffix": (m, SUFFIX_SPEC),
                    f"{m} jacobi": (m, ADAPTIVE), f"{m} jacobi extended": (m, ADAPTIVE)}
        setups[f"{m} jacobi extended"] = extend_ngram_drafts
    rounds = measure_rounds(configs, setups, args.dataset, 1, args.prompts, args.rounds,
                            args.offset, args.max_tokens)
    rows = summarise(rounds)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for row in rows:  # against the same model's suffix and default, per round
        model = row["config"].split()[0]
        for ref in ("suffix", "jacobi"):
            row[f"vs_{ref}"] = statistics.median(rd[row["config"]]["tokens_per_s"]
                                                 / rd[f"{model} {ref}"]["tokens_per_s"]
                                                 for rd in rounds)
    (out / "results.json").write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1))
    lines = [f"{args.dataset}, batch 1, {args.rounds} rounds of {args.prompts} prompts, "
             f"{args.max_tokens} tokens, engines in lock step", "",
             "| config | tokens/verify step | draft tokens/step | speed-up | ÷ suffix "
             "| ÷ default | identical |", "|---" * 7 + "|"]
    lines += [f"| {r['config']} | {r['tpf']:.2f} | {r['draft_tokens_per_step']:.2f} | "
              f"{r['speedup']:.2f}x | {r['vs_suffix']:.3f} | {r['vs_jacobi']:.3f} | "
              f"{r['identical']} |" for r in rows]
    (out / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
