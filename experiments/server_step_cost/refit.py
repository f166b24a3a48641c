"""Replays logged verify steps (``sitecustomize.py``'s JSONL) through the measured cost model
as the engine would, refitting every 64 steps over the last 1,024, and prints each fit: knee
and floor at the batch sizes seen, and what the model says a draft token costs relative to
the step it joins."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from vllm_cllm.policies.cost_model import CostModel
from vllm_cllm.policies.measured_cost import CostMeasurement


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("log", type=Path)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 4, 8, 16, 32])
    args = parser.parse_args()
    steps = [json.loads(line) for line in args.log.read_text().splitlines()]
    cost = CostModel(24, 28)
    measurement = CostMeasurement(cost, print)
    for i, s in enumerate(steps):
        fits = len(measurement.fits)
        measurement.add(s["tokens"], s["forward"], s["rest"], s["batch"])
        if len(measurement.fits) > fits:  # a fit taken at this step
            knees = ", ".join(f"b{b}: {cost.at(b)[0]:.0f}/{cost.at(b)[1]:.0f}"
                              for b in args.batches)
            print(f"  step {i + 1} (batch {s['batch']}): knee/floor at {knees}")
    batch = np.array([s["batch"] for s in steps])
    print("steps by batch size:", dict(zip(*np.unique(batch, return_counts=True), strict=True)))


if __name__ == "__main__":
    main()
