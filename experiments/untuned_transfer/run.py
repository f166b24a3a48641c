"""Does the measured step cost transfer? The default ``jacobi`` (cost measured while serving)
beside the hand-tuned cost model, started from the wrong (GPU) parameters, and plain decoding,
side by side in lock step on the demo CLLM (the bench's engine pool and prompts).

    .venv/bin/python experiments/untuned_transfer/run.py --out results/transfer
    VLLM_CPU_OMP_THREADS_BIND=0 .venv/bin/python experiments/untuned_transfer/run.py \
        --out results/transfer_1thread --tuned 20 24      # a 1-thread engine, its own fit

``--tuned KNEE FLOOR``: the hand-tuned setting (default: the CPU platform's fit, 24 / 28).
Writes ``results.json`` and ``table.md`` to ``--out`` (an interrupted run resumes); a ratio is
the median over rounds of the two configurations' tokens/s in the same round.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path

from vllm_cllm.bench.suite import MODELS, BenchConfig, BenchPlan, run
from vllm_cllm.runtime.checkpoints import model_path

K = 15


def configs(knee: int, floor: int) -> list[BenchConfig]:
    jacobi = {"method": "jacobi", "num_speculative_tokens": K}
    return [BenchConfig("cllm", "none"),
            BenchConfig("cllm", "hand-tuned", {**jacobi, "knee_tokens": knee,
                                               "floor_tokens": floor}),
            BenchConfig("cllm", "default", jacobi),
            BenchConfig("cllm", "from GPU defaults", {**jacobi, "knee_tokens": 256,
                                                      "floor_tokens": 0,
                                                      "measure_cost": True})]


def _rounds(row: dict) -> list[float]:
    """A row's tokens/s per round (a one-round run may not list its rounds)."""
    return row.get("tokens_per_s_rounds") or [row["tokens_per_s"]]


def paired(row: dict, base: dict) -> float:
    """The median over rounds of ``row``'s tokens/s ÷ ``base``'s in the same round (engines
    in lock step), as the bench's speed-ups are taken."""
    return statistics.median(a / b for a, b in zip(_rounds(row), _rounds(base), strict=True))


def table(rows: list[dict], header: str) -> str:
    """Median tokens/s per configuration; the ratios are medians of per-round ratios."""
    by = {(r["method"], r["dataset"], r["batch_size"]): r for r in rows}
    cells = sorted({(r["dataset"], r["batch_size"]) for r in rows})
    lines = [header, "", "| data set | batch | plain tok/s | hand-tuned | default | "
             "from GPU defaults | default / tuned | GPU start / tuned | default / plain |",
             "|---|---|---|---|---|---|---|---|---|"]
    for d, b in cells:
        plain, tuned = by["none", d, b], by["hand-tuned", d, b]
        default, gpu = by["default", d, b], by["from GPU defaults", d, b]

        def cell(r: dict) -> str:
            same = "" if r["identical"] else ", NOT identical"
            return f"{r['tokens_per_s']:.1f} ({r['tpf']:.2f} tok/step{same})"

        lines.append(f"| {d} | {b} | {plain['tokens_per_s']:.1f} | {cell(tuned)} | "
                     f"{cell(default)} | {cell(gpu)} | "
                     f"{paired(default, tuned):.3f}x | {paired(gpu, tuned):.3f}x | "
                     f"{default['speedup']:.3f}x |")  # the bench's own, against plain
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tuned", type=int, nargs=2, default=(24, 28),
                        metavar=("KNEE", "FLOOR"))
    parser.add_argument("--datasets", nargs="+", default=["gsm", "sharegpt"])
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    plan = BenchPlan(datasets=tuple(args.datasets), batch_sizes=(1, 4, 16),
                     prompts_per_batch={1: 4, 4: 8, 16: 16}, max_tokens=128,
                     rounds=args.rounds)
    dirs = {m: str(model_path(name)) for m, name in MODELS.items() if m in ("base", "cllm")}
    rows = run(plan, args.out, dirs, configs(*args.tuned))
    threads = os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "all cores")
    header = (f"Demo CLLM, k {K}, {plan.max_tokens} tokens, hand-tuned knee/floor "
              f"{args.tuned[0]}/{args.tuned[1]}, VLLM_CPU_OMP_THREADS_BIND={threads}; "
              "engines in lock step")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps({"header": header, "rows": rows},
                                                      indent=1))
    text = table(rows, header)
    (args.out / "table.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
