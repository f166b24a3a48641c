"""Choose between SPACE checkpoints (recipe variants) on the validation seed, never on the
evaluation seed: `space` tokens per verify step of each model directory on the same
gsm_symbolic problems (seed 999 by default; 1000 is the evaluation seed of space_gsm.py),
chat template, side by side in one run, each in its own engine process.

    .venv/bin/python benchmarks/space_validation.py results/variant/run/model \
        ~/.cache/vllm-cllm/models/smollm2-135m-space-gsm --out results/space_validation

Prints one line per model and writes OUT/results.json.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from transformers import AutoTokenizer

from vllm_cllm.bench.measure import measure_in_subprocess
from vllm_cllm.training.gsm import GSM_EVAL_SEED, chat_prompt, gsm_problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="+", help="SPACE model directories")
    parser.add_argument("--seed", type=int, default=999, help="never a training seed")
    parser.add_argument("--problems", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--out", default="results/space_validation")
    args = parser.parse_args()
    if args.seed == GSM_EVAL_SEED:
        parser.error(f"seed {GSM_EVAL_SEED} is the evaluation seed: validate on another one")
    tokenizer = AutoTokenizer.from_pretrained(args.models[0])
    prompts = [chat_prompt(tokenizer, p["question"])
               for p in gsm_problems(args.problems, args.seed)]
    spec = {"method": "space", "num_speculative_tokens": args.k}
    rows = []
    for model in args.models:
        row = measure_in_subprocess(model, spec, {args.batch_size: prompts}, args.max_tokens)[0]
        rows.append({"model": model, "tokens_per_step": row["tokens_per_step"],
                     "tokens_per_s": row["tokens_per_s"], "seed": args.seed,
                     "problems": args.problems, "batch_size": args.batch_size, "k": args.k})
        print(f"{model}: {row['tokens_per_step']:.3f} tokens/step", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
