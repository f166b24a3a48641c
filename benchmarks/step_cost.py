"""What a verify step costs on this machine, by batch size and draft length: the measurement
behind the adaptive cost model (``knee_tokens``, ``floor_tokens``: vllm_cllm/sizing/cost_model.py)
— run it on a new machine before choosing them there.

Each draft length K runs in its own engine (``jacobi`` with ``fill: random``, so every
request drafts exactly K tokens every step; K = 0 is no speculation) at batch sizes 1..16,
``ignore_eos`` so that the batch stays full. The per-step time is fitted as
``t = c * max(floor, knee + request_tokens * R + N)`` — ``R`` requests, ``N`` query tokens —
minimising the relative error over all points: ``knee`` is the fixed cost, ``request_tokens``
the per-request cost (attention over the context, sampling, bookkeeping), and ``floor`` what
any step costs (below it the device waits on reading the weights, and extra query tokens come
free), all in units of one query token. The adaptive rule's ``knee_tokens`` and
``floor_tokens`` are the first and last.

    .venv/bin/python benchmarks/step_cost.py --out results/step_cost
    .venv/bin/python benchmarks/step_cost.py --out results/step_cost --refit  # rows kept
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

    from vllm_cllm.runtime.engine import generate_counting_steps, with_engine

    spec = None if k == 0 else {"method": "jacobi", "num_speculative_tokens": k,
                                "fill": "random"}

    def run(llm: Any) -> list[dict[str, Any]]:
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        llm.generate([PROMPT] * max(batch_sizes), SamplingParams(max_tokens=8), use_tqdm=False)
        rows = []
        for batch in batch_sizes:
            start = time.perf_counter()
            counted = generate_counting_steps(llm, [f"{PROMPT} ({i})" for i in range(batch)],
                                              params)
            seconds = time.perf_counter() - start
            steps = max(counted.steps)  # the requests start together and run every step
            rows.append({"k": k, "batch_size": batch, "steps": steps,
                         "query_tokens": batch * (1 + k), "seconds_per_step": seconds / steps})
        return rows

    return with_engine(model, spec, run)


def fit(rows: list[dict[str, Any]]) -> dict[str, float]:
    """``t = c * max(floor, knee + request_tokens * R + N)`` by grid search over knee, floor
    and request_tokens, ``c`` in closed form for each (least squares of the relative error)."""
    batch = np.array([r["batch_size"] for r in rows], dtype=float)
    tokens = np.array([r["query_tokens"] for r in rows], dtype=float)
    times = np.array([r["seconds_per_step"] for r in rows])
    floors = np.arange(0.0, 128.5, 0.5)[:, None]
    best: dict[str, float] = {}
    for knee in np.arange(0.0, 64.5, 0.5):
        for request_tokens in (0.0, 0.25, 0.5, 1.0, 2.0):
            units = np.maximum(floors, knee + request_tokens * batch + tokens) / times
            scale = units.sum(axis=1) / (units ** 2).sum(axis=1)
            error = ((scale[:, None] * units - 1) ** 2).mean(axis=1)
            i = int(error.argmin())
            if not best or error[i] < best["mean_squared_relative_error"]:
                best = {"knee_tokens": float(knee), "floor_tokens": float(floors[i, 0]),
                        "request_tokens": request_tokens, "seconds_per_token": float(scale[i]),
                        "mean_squared_relative_error": float(error[i]),
                        "max_relative_error": float(np.abs(scale[i] * units[i] - 1).max())}
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--ks", nargs="+", type=int, default=[0, 1, 3, 7, 15])
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 4, 8, 16])
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--refit", action="store_true",
                        help="fit OUT/results.json's rows again instead of measuring")
    parser.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    from vllm_cllm.runtime.checkpoints import model_path

    model = str(model_path(args.model))
    if args.worker is not None:  # one engine per process: engines never share state
        print("ROWS " + json.dumps(_measure(model, args.worker, args.batch_sizes,
                                            args.max_tokens)))
        return 0
    out = Path(args.out)
    rows: list[dict[str, Any]] = []
    if args.refit:
        rows = json.loads((out / "results.json").read_text())["rows"]
    for k in [] if args.refit else args.ks:
        proc = subprocess.run([sys.executable, __file__, *sys.argv[1:], "--worker", str(k)],
                              capture_output=True, text=True, check=True)
        rows += json.loads(next(x for x in proc.stdout.splitlines()[::-1]
                                if x.startswith("ROWS ")).removeprefix("ROWS "))
    result = fit(rows)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"rows": rows, "fit": result}, indent=1))
    print("| k | batch | query tokens | ms/step |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r['k']} | {r['batch_size']} | {r['query_tokens']} | "
              f"{1000 * r['seconds_per_step']:.1f} |")
    print(f"\nfit: knee {result['knee_tokens']:.1f} query tokens, floor "
          f"{result['floor_tokens']:.1f}, {result['request_tokens']:.2f} per request, "
          f"max relative error {result['max_relative_error']:.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
