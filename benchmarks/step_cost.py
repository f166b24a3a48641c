"""What a verify step costs on this machine, by batch size and draft length: the measurement
behind the adaptive-k cost model (``knee_tokens`` in vllm_cllm/adaptive.py) — run it on a new
machine before choosing ``knee_tokens`` there.

Each draft length K runs in its own engine (``jacobi`` with ``fill: random``, so every
request drafts exactly K tokens every step; K = 0 is no speculation) at batch sizes 1..16,
``ignore_eos`` so that the batch stays full. The per-step time is fitted as
``t = c * (knee + request_tokens * R + N)`` — ``R`` requests, ``N`` query tokens — by least
squares over all points; ``knee`` is the fixed cost and ``request_tokens`` the per-request cost
(attention over the context, sampling, bookkeeping), both in units of one query token.

    .venv/bin/python benchmarks/step_cost.py --out results/step_cost
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def _measure(model: str, k: int, batch_sizes: list[int], max_tokens: int) -> list[dict[str, Any]]:
    """One engine with draft length ``k``: seconds per step at each batch size."""
    from vllm import SamplingParams

    from vllm_cllm.runtime import spec_metrics, with_engine

    spec = None if k == 0 else {"method": "jacobi", "num_speculative_tokens": k,
                                "fill": "random"}

    def run(llm: Any) -> list[dict[str, Any]]:
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        llm.generate([PROMPT] * max(batch_sizes), SamplingParams(max_tokens=8), use_tqdm=False)
        rows = []
        for batch in batch_sizes:
            before = spec_metrics(llm)
            start = time.perf_counter()
            llm.generate([f"{PROMPT} ({i})" for i in range(batch)], params, use_tqdm=False)
            seconds = time.perf_counter() - start
            after = spec_metrics(llm)
            accepted = (after.get("num_accepted_tokens") or 0) - \
                (before.get("num_accepted_tokens") or 0)
            steps = (batch * max_tokens - accepted) / batch  # every request runs every step
            rows.append({"k": k, "batch_size": batch, "steps": steps,
                         "query_tokens": batch * (1 + k), "seconds_per_step": seconds / steps})
        return rows

    return with_engine(model, spec, run)


def fit(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Least squares of ``t = a + b R + c N``; knee = a / c, request_tokens = b / c."""
    design = np.array([[1.0, r["batch_size"], r["query_tokens"]] for r in rows])
    times = np.array([r["seconds_per_step"] for r in rows])
    (a, b, c), *_ = np.linalg.lstsq(design, times, rcond=None)
    predicted = design @ np.array([a, b, c])
    return {"knee_tokens": a / c, "request_tokens": b / c, "seconds_per_token": c,
            "max_relative_error": float(np.max(np.abs(predicted - times) / times))}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--ks", nargs="+", type=int, default=[0, 1, 3, 7, 15])
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 4, 8, 16])
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    from vllm_cllm.models import model_path

    model = str(model_path(args.model))
    if args.worker is not None:  # one engine per process: engines never share state
        print("ROWS " + json.dumps(_measure(model, args.worker, args.batch_sizes,
                                            args.max_tokens)))
        return 0
    rows: list[dict[str, Any]] = []
    for k in args.ks:
        proc = subprocess.run([sys.executable, __file__, *sys.argv[1:], "--worker", str(k)],
                              capture_output=True, text=True, check=True)
        rows += json.loads(next(x for x in proc.stdout.splitlines()[::-1]
                                if x.startswith("ROWS ")).removeprefix("ROWS "))
    result = fit(rows)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"rows": rows, "fit": result}, indent=1))
    print("| k | batch | query tokens | ms/step |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r['k']} | {r['batch_size']} | {r['query_tokens']} | "
              f"{1000 * r['seconds_per_step']:.1f} |")
    print(f"\nfit: knee {result['knee_tokens']:.1f} query tokens, "
          f"{result['request_tokens']:.2f} per request, "
          f"max relative error {result['max_relative_error']:.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
