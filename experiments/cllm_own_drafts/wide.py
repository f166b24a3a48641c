"""Pure Jacobi tokens per verify step on more problems than the lock-step evaluation: every
model's ``fill: tail`` drafting (k 15) on N unseen problems at once, with the recipe's
instruction and with the bare question (drafting is per request, so the figure does not
depend on the batch; steps are counted, not timed).

    .venv/bin/python experiments/cllm_own_drafts/wide.py --out results/own_drafts_wide \\
        --model base=smollm2-135m-instruct --model demo=smollm2-135m-cllm-gsm --problems 32
"""

from __future__ import annotations

import argparse
import json

from evaluate import (  # the sibling script: the same problems and flags
    EVAL_SEED,
    TRAINING_SETS,
    common_arguments,
    model_paths,
    prompts,
)

from vllm_cllm.bench.measure import jacobi_tpf
from vllm_cllm.runtime.checkpoints import model_path
from vllm_cllm.training.gsm import unseen_problems


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    common_arguments(parser, problems=32)
    args = parser.parse_args()
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path("smollm2-135m-instruct"))
    chosen = unseen_problems(args.problems, EVAL_SEED, TRAINING_SETS)
    rows = []
    for label, path in model_paths(args.model).items():
        for fmt, instructed in (("instruction", True), ("bare", False)):
            tpf = jacobi_tpf(path, prompts(tokenizer, chosen, instructed), 15, args.max_tokens,
                             "tail")
            rows.append({"model": label, "prompt": fmt, "tokens_per_verify_step": tpf})
            print(f"{label} {fmt} {tpf:.2f}", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "wide.json").write_text(json.dumps(
        {"problems": args.problems, "seed": EVAL_SEED, "k": 15, "fill": "tail",
         "max_tokens": args.max_tokens, "rows": rows}, indent=1))
    table = ["| model | instruction | bare question |", "|---|---:|---:|"]
    for label in dict.fromkeys(r["model"] for r in rows):
        got = {r["prompt"]: r["tokens_per_verify_step"] for r in rows if r["model"] == label}
        table.append(f"| {label} | {got['instruction']:.2f} | {got['bare']:.2f} |")
    (args.out / "table.md").write_text("\n".join(table) + "\n")
    print("\n".join(table))


if __name__ == "__main__":
    main()
