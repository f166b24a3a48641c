"""Does a suffix-tree draft's match length tell how likely its tokens are accepted?

Drives arctic-inference's ``SuffixDecodingCache`` as ``jacobi``'s ``suffix`` source does
(lookup settings of ``vllm_cllm/sources/suffix_trees.py``) over real text, one request after
another: ShareGPT answers after their conversation (``benchmarks/host_cost.py``'s text, the
answer as the "output"), a lookup at every position of every answer, each draft compared
with the text. Per draft position (0, 1+), the tree's estimated probability of the token
(below / at least 0.5) and the draft's match length (the context suffix it continues): how
often a token is accepted given that the tokens before it were.

    .venv/bin/python experiments/suffix_match_length/run.py --out results/suffix_match_length

Writes ``results.json`` and ``table.md`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import host_cost  # noqa: E402  (the benchmark's ShareGPT requests)

from vllm_cllm.sources.suffix_trees import (  # noqa: E402
    MIN_TOKEN_PROB,
    SPEC_FACTOR,
    SPEC_OFFSET,
    TREE_DEPTH,
)


def measure(requests: int, k: int) -> dict[tuple[int, int, int], list[int]]:
    from arctic_inference.suffix_decoding import SuffixDecodingCache

    pool = host_cost.sharegpt_pool(host_cost.Settings())
    cache = SuffixDecodingCache(TREE_DEPTH, 1024)
    counts: dict[tuple[int, int, int], list[int]] = defaultdict(lambda: [0, 0])
    for r in range(requests):
        request = pool[r]
        tokens = request.tokens.astype(np.int32)
        rid = f"r{r}"
        cache.start_request(rid, tokens[:request.prompt_len])
        for pos in range(request.prompt_len, len(tokens) - 1):
            draft = cache.speculate(rid, tokens[max(0, pos - TREE_DEPTH):pos],
                                    max_spec_tokens=k, max_spec_factor=SPEC_FACTOR,
                                    max_spec_offset=SPEC_OFFSET, min_token_prob=MIN_TOKEN_PROB)
            truth = tokens[pos:pos + len(draft.token_ids)]
            for p, (token, prob) in enumerate(zip(draft.token_ids, draft.probs, strict=True)):
                if p >= len(truth):
                    break
                cell = counts[min(p, 1), int(prob >= 0.5), min(draft.match_len, 12)]
                cell[0] += 1
                cell[1] += int(token == truth[p])
                if token != truth[p]:
                    break
            cache.add_active_response(rid, tokens[pos:pos + 1])
        cache.stop_request(rid)
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--requests", type=int, default=150)
    parser.add_argument("--k", type=int, default=15)
    args = parser.parse_args()
    counts = measure(args.requests, args.k)
    rows = [{"position": "0" if p == 0 else "1+", "prob_at_least_half": bool(h),
             "match_len": m if m < 12 else "12+", "tokens": t, "accepted": a / t}
            for (p, h, m), (t, a) in sorted(counts.items()) if t >= 30]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(rows, indent=1))
    lines = ["| position | tree prob ≥ 0.5 | match length | tokens | accepted |",
             "|---|---|---|---|---|"]
    lines += [f"| {r['position']} | {'yes' if r['prob_at_least_half'] else 'no'} | "
              f"{r['match_len']} | {r['tokens']} | {r['accepted']:.2f} |" for r in rows]
    (args.out / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
