"""Jacobi fill policies and k against no speculation and vLLM's ngram, side by side.

    .venv/bin/python benchmarks/jacobi_speed.py --out results/jacobi_speed

SmolLM2-135M-Instruct, float32, HumanEval prompts, greedy, 256 new tokens; batch 1 (prompts
one at a time) and batch 8. For every configuration: tokens per verify step (vLLM's mean
acceptance length, over the steps that drafted), tokens per decode step (every step counted,
also those where a proposer drafted nothing), output tokens/s, its ratio to no speculation at
the same batch size, and whether the tokens are identical to no speculation. Writes
results.json, table.md and a plot.
"""

from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path

from tqdm import tqdm

from vllm_cllm.bench.measure import against_baseline, measure_in_subprocess, speedup_bars
from vllm_cllm.bench.datasets import humaneval_prompts
from vllm_cllm.runtime.checkpoints import model_path

FILLS = ("hybrid", "ngram", "tail", "random")


def configurations(ks: list[int]) -> list[tuple[str, dict | None]]:
    configs: list[tuple[str, dict | None]] = [("none", None)]
    for k in ks:
        for fill in FILLS:
            configs.append((f"jacobi fill={fill} k={k}",
                            {"method": "jacobi", "num_speculative_tokens": k, "fill": fill}))
    for k, lo, hi in ((4, 2, 4), (8, 2, 4), (15, 2, 4), (4, 3, 5)):
        configs.append((f"vllm ngram k={k} n={lo}-{hi}",
                        {"method": "ngram", "num_speculative_tokens": k,
                         "prompt_lookup_min": lo, "prompt_lookup_max": hi}))
    configs.append(("none (again, drift check)", None))
    return configs


def write_report(rows: list[dict], out: Path, header: str) -> str:
    lines = [header, "", "| config | batch | accept. length (vLLM) | tokens/step | tokens/s | "
             "speed-up | identical |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['config']} | {r['batch_size']} | {r['tpf']:.2f} | "
                     f"{r['tokens_per_step']:.2f} | {r['tokens_per_s']:.1f} | "
                     f"{r['speedup']:.2f}x | {r['identical']} |")
    table = "\n".join(lines) + "\n"
    (out / "table.md").write_text(table)
    (out / "results.json").write_text(json.dumps(rows, indent=1))
    return table


def plot(rows: list[dict], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    batch_sizes = sorted({r["batch_size"] for r in rows})
    fig, axes = plt.subplots(1, len(batch_sizes), figsize=(7 * len(batch_sizes), 7))
    for ax, bs in zip(axes, batch_sizes, strict=True):
        sel = [r for r in rows if r["batch_size"] == bs]
        speedup_bars(ax, [r["config"] for r in sel], [r["speedup"] for r in sel],
                     f"batch {bs}: speed-up vs no speculation")
    fig.tight_layout()
    fig.savefig(out / "speedup.png", dpi=90)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="results/jacobi_speed")
    parser.add_argument("--ks", default="4,8,15")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--b1-prompts", type=int, default=4)
    parser.add_argument("--b8-prompts", type=int, default=16)
    parser.add_argument("--quick", action="store_true", help="k=4 only, 32 tokens")
    parser.add_argument("--only", default=None,
                        help="regex: run only matching configurations (baselines always run)")
    args = parser.parse_args()
    if args.quick:
        args.ks, args.max_tokens, args.b1_prompts, args.b8_prompts = "4", 32, 2, 8
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model = str(model_path("smollm2-135m-instruct"))
    prompts = humaneval_prompts()
    by_batch = {1: prompts[:args.b1_prompts], 8: prompts[:args.b8_prompts]}
    rows: list[dict] = []
    baseline: dict[int, dict] = {}
    configs = configurations([int(k) for k in args.ks.split(",")])
    if args.only:
        configs = [(n, s) for n, s in configs if s is None or re.search(args.only, n)]
    for name, spec in tqdm(configs, desc="configs"):
        for row in measure_in_subprocess(model, spec, by_batch, args.max_tokens):
            bs = row["batch_size"]
            if spec is None and bs not in baseline:
                baseline[bs] = row
            against_baseline(row, baseline[bs])["config"] = name
            rows.append({k: v for k, v in row.items() if k != "tokens"})
        write_report(rows, out, "")
    header = (f"SmolLM2-135M-Instruct fp32, HumanEval prompts, {args.max_tokens} new tokens, "
              f"greedy; measured {time.strftime('%Y-%m-%d')} with `benchmarks/jacobi_speed.py`")
    print(write_report(rows, out, header))
    plot(rows, out)


if __name__ == "__main__":
    main()
