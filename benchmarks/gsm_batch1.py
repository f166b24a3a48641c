"""gsm_symbolic at batch 1 with more problems than `vllm-cllm bench` uses: the CLLM demo's
`jacobi` (k = 15 and adaptive) against vLLM's `ngram` and `suffix` (on the base model, as in
the bench, and on the CLLM), each against its own model without speculation, in one run.

    .venv/bin/python benchmarks/gsm_batch1.py --problems 16 --max-tokens 128 --history-size 0 \
        --out results/gsm_b1
    .venv/bin/python benchmarks/gsm_batch1.py --rounds 3 --out results/gsm_b1_rounds

With ``--rounds R`` every configuration runs once per round, interleaved, and a row's speed-up
is the median of its per-round ratios to its own baseline of that round (the speed-up column
then lists every round's ratio too): on this shared 2-core machine single sittings of the
same configuration differ by up to ±10 %.

Uses the bench's machinery (`vllm_cllm.bench.suite.run`: one engine per configuration, results
cached under OUT/raw, evaluation seed 1000) and prints one line per configuration.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from vllm_cllm.bench.suite import MODELS, BenchConfig, BenchPlan, configurations, run
from vllm_cllm.runtime.checkpoints import model_path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--problems", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--history-size", type=int, default=None,
                        help="also run jacobi with this history_size")
    parser.add_argument("--rounds", type=int, default=1, help="interleaved rounds")
    parser.add_argument("--out", default="results/gsm_b1")
    args = parser.parse_args()
    plan = BenchPlan(datasets=("gsm",), batch_sizes=(1,), prompts_per_batch={1: args.problems},
                     max_tokens=args.max_tokens, rounds=args.rounds)
    configs = [c for c in configurations(plan.k) if c.model in ("base", "cllm")
               and not (c.model == "base" and c.method.startswith("jacobi"))]
    if args.history_size is not None:  # beside the default, not instead of it
        configs += [BenchConfig(c.model, f"{c.method} history_size={args.history_size}",
                                {**c.spec, "history_size": args.history_size})
                    for c in configs if c.method.startswith("jacobi k")]
    configs.append(BenchConfig("cllm", "suffix", {"method": "suffix",
                                                  "num_speculative_tokens": 16}))
    rows = run(plan, Path(args.out), {k: str(model_path(v)) for k, v in MODELS.items()}, configs)
    lines = ["| model | method | tokens/step | tokens/s | speed-up | identical |",
             "|---|---|---|---|---|---|"] + [
        f"| {r['model']} | {r['method']} | {r['tpf']:.2f} | {r['tokens_per_s']:.1f} | "
        f"{r['speedup']:.2f}x{_rounds(r)} | {r['identical']} |" for r in rows]
    (Path(args.out) / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    slim = [{k: v for k, v in r.items() if k != "tokens"} for r in rows]
    (Path(args.out) / "results.json").write_text(json.dumps(slim, indent=1))
    return 0


def _rounds(row: dict) -> str:
    """`` (1.90, 2.01, 1.95)``: the per-round speed-ups behind a median, if there were rounds."""
    ratios = row.get("speedup_rounds")
    return f" ({', '.join(f'{x:.2f}' for x in ratios)})" if ratios and len(ratios) > 1 else ""


if __name__ == "__main__":
    raise SystemExit(main())
