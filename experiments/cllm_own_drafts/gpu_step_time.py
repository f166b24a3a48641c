"""Seconds per CLLM training step on a GPU for the settings ``gpu_rounds.py`` can take:
float32 with the rows packed in the training process (the measured run's), bfloat16 mixed
precision with DataLoader workers, and the same at 4 prompts a step.

The model has the base's architecture and random weights (a step's time does not depend on
their values), so only its ``config.json`` and tokenizer travel; the data are shifted-state
records (``vllm-cllm train trajectories --mode shifted``) of the real answers.

    python experiments/cllm_own_drafts/gpu_step_time.py --arch BASE_DIR \\
        --data trajectories.jsonl --out OUT [--steps 25]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch
from gpu_rounds import recipe_config, train_with  # the sibling script: the same settings

from vllm_cllm.training.trajectories import read_trajectories

#: (precision, DataLoader workers, prompts per step)
SETTINGS = (("fp32", 0, 8), ("bf16", 8, 8), ("bf16", 8, 4))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--arch", required=True, help="a directory with the base's "
                        "config.json and tokenizer")
    parser.add_argument("--data", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--steps", type=int, default=25)
    parser.add_argument("--profile", action="store_true",
                        help="also print each setting's top operators over 3 steps after 5")
    args = parser.parse_args()
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, TrainerCallback

    torch.set_float32_matmul_precision("high")
    base = args.out / "random-base"
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(args.arch)).save_pretrained(base)
    AutoTokenizer.from_pretrained(args.arch).save_pretrained(base)
    records = read_trajectories(args.data)

    class Clock(TrainerCallback):
        """Step end times; with ``profiler`` it also advances a torch profiler's schedule."""

        def __init__(self, ends: list[float], profiler: Any = None) -> None:
            self.ends, self.profiler = ends, profiler

        def on_train_begin(self, *args, **kwargs):
            if self.profiler is not None:
                self.profiler.start()

        def on_step_end(self, *args, **kwargs):
            self.ends.append(time.time())
            if self.profiler is not None:
                self.profiler.step()

        def on_train_end(self, *args, **kwargs):
            if self.profiler is not None:
                self.profiler.stop()

    for precision, workers, batch in SETTINGS:
        ends: list[float] = []
        profiler = torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU]
            + ([torch.profiler.ProfilerActivity.CUDA] if torch.cuda.is_available() else []),
            schedule=torch.profiler.schedule(wait=4, warmup=1, active=3),
        ) if args.profile else None
        config = recipe_config(batch_size=batch, logging_steps=10**6, max_steps=args.steps,
                               precision=precision, data_workers=workers)
        train_with(Clock(ends, profiler), str(base), records,
                   args.out / f"{precision}-{workers}-{batch}", config)
        warm = 5  # the first steps include the kernels' warm-up
        per_step = (ends[-1] - ends[warm - 1]) / (len(ends) - warm)
        print(json.dumps({"precision": precision, "data_workers": workers,
                          "prompts_per_step": batch, "s_per_step": round(per_step, 3),
                          "s_per_prompt": round(per_step / batch, 4)}), flush=True)
        if profiler is not None:
            averages = profiler.key_averages()
            print(averages.table(sort_by="self_cpu_time_total", row_limit=12))
            if torch.cuda.is_available():
                print(averages.table(sort_by="self_device_time_total", row_limit=12))


if __name__ == "__main__":
    main()
