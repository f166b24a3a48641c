"""Which trajectory states buy more tokens per step per CPU-hour: noise, Jacobi or on-policy?

    .venv/bin/python benchmarks/trajectory_modes.py --out results/trajectory_modes

Same prompts, same greedy answers (the demo recipe's answers file), same training settings;
only the states differ: ``jacobi`` (real Jacobi iterates, one forward per iteration),
``noise`` (Jacobi Forcing's progressive noise, no forward at all) or ``onpolicy`` (the drafts
``jacobi`` verifies when the model runs in vLLM). For each: CPU seconds to
build the states and to train, and the tokens per verify step of the result in vLLM
(``jacobi`` k = 15, validation problems from seed 999), beside the untrained base model,
with the distinct-4 ratio of those outputs: a model that collapsed into repeating itself
drafts "well" and is reported as collapsed (distinct-4 below 0.8x the base), not as a gain.
CPU seconds are process CPU time (all threads), so they read as CPU-hours on any machine.
Data files are kept with their CPU time (``MODE.cpu.json``) and reused by a re-run, so
training settings can be compared without rebuilding the states.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from vllm_cllm.bench.measure import measure_in_subprocess
from vllm_cllm.runtime.checkpoints import merged_checkpoint, model_path
from vllm_cllm.training.cllm import CllmConfig, train_cllm
from vllm_cllm.training.gsm import chat_prompt, gsm_problems
from vllm_cllm.training.onpolicy import write_onpolicy
from vllm_cllm.training.quality import mean_distinct_n
from vllm_cllm.training.trajectories import MODES, read_trajectories, write_trajectories


def load_answers(path: Path, count: int) -> list[dict]:
    """The answer cache's rows: ``prompt`` (text), ``prompt_ids``, ``answer_ids``."""
    return [json.loads(line) for line in path.read_text().splitlines()[:count]]


def speed_and_diversity(model_dir: str, prompts: list[str]) -> dict:
    """tokens/step (vLLM's figure and every step counted) and distinct-4 of the outputs."""
    spec = {"method": "jacobi", "num_speculative_tokens": 15}
    row = measure_in_subprocess(model_dir, spec, {len(prompts): prompts}, 256)[0]
    return {"tpf": row["tpf"], "tokens_per_step": row["tokens_per_step"],
            "distinct_4": mean_distinct_n(row["tokens"], 4)}


def build_states(out: Path, mode: str, rows: list[dict], max_states: int, base: Path,
                 onpolicy_states: int) -> float:
    """Write ``MODE.jsonl`` unless a finished one exists; returns the CPU seconds it took
    (``onpolicy``: the in-process vLLM engine's start and decoding included)."""
    import torch
    from transformers import AutoModelForCausalLM

    data, cost = out / f"{mode}.jsonl", out / f"{mode}.cpu.json"
    if data.exists() and cost.exists():
        return json.loads(cost.read_text())["data_cpu_s"]
    data.unlink(missing_ok=True)
    start = time.process_time()
    if mode == "onpolicy":
        write_onpolicy(data, str(base), [r["prompt"] for r in rows], n=16, k=15,
                       max_new_tokens=256, max_per_prompt=onpolicy_states, seed=1)
    else:
        hf = None
        if mode == "jacobi":
            hf = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()
        items = [(r["prompt_ids"], r["answer_ids"]) for r in rows]
        write_trajectories(data, items, n=16, mode=mode, seed=1, max_states=max_states,
                           model=hf)
    seconds = time.process_time() - start
    cost.write_text(json.dumps({"data_cpu_s": seconds}))
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="results/trajectory_modes")
    parser.add_argument("--answers", default="results/cllm-gsm/trajectories.answers.jsonl")
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--val-problems", type=int, default=16)
    parser.add_argument("--max-states", type=int, default=4)
    parser.add_argument("--learning-rate", type=float, default=1e-4)
    parser.add_argument("--modes", nargs="+", default=[*MODES, "onpolicy"],
                        choices=[*MODES, "onpolicy"])
    parser.add_argument("--onpolicy-states", type=int, default=24,
                        help="on-policy states kept per prompt")
    args = parser.parse_args()
    from transformers import AutoTokenizer

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    base = model_path("smollm2-135m-instruct")
    tokenizer = AutoTokenizer.from_pretrained(base)
    val = [chat_prompt(tokenizer, p["question"]) for p in gsm_problems(args.val_problems, 999)]
    items = load_answers(Path(args.answers), args.num_prompts)
    config = CllmConfig(block_size=16, lora_rank=32, lora_alpha=32,
                        learning_rate=args.learning_rate, grad_accum=2, save_steps=10**6,
                        logging_steps=5)
    rows = [{"mode": "base (untrained)", **speed_and_diversity(str(base), val)}]
    print(rows[-1], flush=True)
    for mode in args.modes:
        data_cpu = build_states(out, mode, items, args.max_states, base, args.onpolicy_states)
        records = read_trajectories(out / f"{mode}.jsonl")
        start = time.process_time()
        run = out / f"run-{mode}"
        train_cllm(str(base), records, run, config, resume=False)
        train_cpu = time.process_time() - start
        with merged_checkpoint(base, run / "adapter") as model_dir:
            measured = speed_and_diversity(model_dir, val)
        collapsed = measured["distinct_4"] < 0.8 * rows[0]["distinct_4"]
        gain = measured["tokens_per_step"] - rows[0]["tokens_per_step"]
        rows.append({"mode": mode, "records": len(records),
                     "states": sum(len(r.states) for r in records),
                     "data_cpu_s": data_cpu, "train_cpu_s": train_cpu, **measured,
                     "collapsed": collapsed,
                     "gain_per_cpu_hour": None if collapsed
                     else gain * 3600 / (data_cpu + train_cpu)})
        print(rows[-1], flush=True)
    lines = [f"{args.num_prompts} training prompts (gsm_symbolic seed 1), LoRA r 32, lr "
             f"{args.learning_rate:g}; `jacobi` k = 15 on {args.val_problems} validation "
             "problems (seed 999); `benchmarks/trajectory_modes.py`", "",
             "| trajectory states | records | states | data CPU-s | train CPU-s | accept. length | "
             "tokens/step | distinct-4 | tokens/step gain per CPU-hour |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        speed = (f"{r['tpf']:.2f} | {r['tokens_per_step']:.2f} | {r['distinct_4']:.3f}")
        if "records" not in r:
            lines.append(f"| {r['mode']} | | | | | {speed} | |")
            continue
        gain = ("collapsed" if r["collapsed"] else f"{r['gain_per_cpu_hour']:+.2f}")
        lines.append(f"| {r['mode']} | {r['records']} | {r['states']} | {r['data_cpu_s']:.0f} | "
                     f"{r['train_cpu_s']:.0f} | {speed} | {gain} |")
    table = "\n".join(lines) + "\n"
    (out / "table.md").write_text(table)
    (out / "results.json").write_text(json.dumps(rows, indent=1))
    print(table)


if __name__ == "__main__":
    main()
