"""Which trajectory states buy more tokens per step per CPU-hour: real Jacobi or noise?

    .venv/bin/python benchmarks/trajectory_modes.py --out results/trajectory_modes

Same prompts, same greedy answers (the demo recipe's answers file), same training settings;
only the states differ: ``jacobi`` (real Jacobi iterates, one forward per iteration) or
``noise`` (Jacobi Forcing's progressive noise, no forward at all). For each: CPU seconds to
build the states and to train, and the tokens per verify step of the result in vLLM
(``jacobi`` k = 15, validation problems from seed 999), beside the untrained base model.
CPU seconds are process CPU time (all threads), so they read as CPU-hours on any machine.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from vllm_cllm.benchmarking import jacobi_tpf
from vllm_cllm.models import merge_adapter, model_path
from vllm_cllm.training.cllm import CllmConfig, train_cllm
from vllm_cllm.training.gsm import chat_prompt, gsm_problems
from vllm_cllm.training.trajectories import MODES, read_trajectories, write_trajectories


def load_answers(path: Path, count: int) -> list[tuple[list[int], list[int]]]:
    rows = [json.loads(line) for line in path.read_text().splitlines()[:count]]
    return [(r["prompt_ids"], r["answer_ids"]) for r in rows]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="results/trajectory_modes")
    parser.add_argument("--answers", default="results/cllm-gsm/trajectories.answers.jsonl")
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--val-problems", type=int, default=16)
    parser.add_argument("--max-states", type=int, default=4)
    args = parser.parse_args()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    base = model_path("smollm2-135m-instruct")
    tokenizer = AutoTokenizer.from_pretrained(base)
    val = [chat_prompt(tokenizer, p["question"]) for p in gsm_problems(args.val_problems, 999)]
    items = load_answers(Path(args.answers), args.num_prompts)
    config = CllmConfig(block_size=16, lora_rank=32, lora_alpha=32, learning_rate=5e-4,
                        grad_accum=2, save_steps=10**6, logging_steps=5)
    rows = [{"mode": "base (untrained)", "tpf": jacobi_tpf(str(base), val, 15, 256)}]
    for mode in MODES:
        data = out / f"{mode}.jsonl"
        data.unlink(missing_ok=True)
        hf = None
        if mode == "jacobi":
            hf = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()
        start = time.process_time()
        write_trajectories(data, items, n=16, mode=mode, seed=1, max_states=args.max_states,
                           model=hf)
        data_cpu = time.process_time() - start
        records = read_trajectories(data)
        start = time.process_time()
        run = out / f"run-{mode}"
        train_cllm(str(base), records, run, config, resume=False)
        train_cpu = time.process_time() - start
        with tempfile.TemporaryDirectory() as tmp:
            merge_adapter(base, run / "adapter", Path(tmp))
            tpf = jacobi_tpf(tmp, val, 15, 256)
        rows.append({"mode": mode, "records": len(records),
                     "states": sum(len(r.states) for r in records),
                     "data_cpu_s": data_cpu, "train_cpu_s": train_cpu, "tpf": tpf,
                     "tpf_gain_per_cpu_hour": (tpf - rows[0]["tpf"]) * 3600
                     / (data_cpu + train_cpu)})
        print(rows[-1])
    lines = [f"{args.num_prompts} training prompts (gsm_symbolic seed 1), k = 15 on "
             f"{args.val_problems} validation problems (seed 999); "
             "`benchmarks/trajectory_modes.py`", "",
             "| states | records | states | data CPU-s | train CPU-s | tokens/step | "
             "gain per CPU-hour |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        if "records" in r:
            lines.append(f"| {r['mode']} | {r['records']} | {r['states']} | "
                         f"{r['data_cpu_s']:.0f} | {r['train_cpu_s']:.0f} | {r['tpf']:.2f} | "
                         f"{r['tpf_gain_per_cpu_hour']:+.2f} |")
        else:
            lines.append(f"| {r['mode']} | | | | | {r['tpf']:.2f} | |")
    table = "\n".join(lines) + "\n"
    (out / "table.md").write_text(table)
    (out / "results.json").write_text(json.dumps(rows, indent=1))
    print(table)


if __name__ == "__main__":
    main()
