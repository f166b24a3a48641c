"""What a checkpoint drafts by itself: pure Jacobi decoding (``fill: tail``, k 15) at batch 1
on gsm_symbolic problems of a seed no recipe uses, with the recipe's instruction and with the
bare question; beside it the checkpoint's default ``jacobi`` and plain decoding, and the
answers' quality (distinct-4, NLL under the base model, length, accuracy).

    .venv/bin/python experiments/cllm_own_drafts/evaluate.py --out results/own_drafts \\
        --model base=smollm2-135m-instruct --model demo=smollm2-135m-cllm-gsm \\
        --model full=results/cllm-full/run/model --problems 12
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from vllm_cllm.bench.measure import measure_in_subprocess
from vllm_cllm.runtime.checkpoints import model_path
from vllm_cllm.training.gsm import GSM_EVAL_SEED, chat_prompt, unseen_problems
from vllm_cllm.training.quality import accuracy, mean_distinct_n, mean_nll

TAIL = {"method": "jacobi", "num_speculative_tokens": 15, "fill": "tail"}
DEFAULT = {"method": "jacobi", "num_speculative_tokens": 15}
CONFIGS = {"none": None, "tail": TAIL, "default": DEFAULT}


def prompts(tokenizer, problems: list[dict], instructed: bool) -> list[str]:
    if instructed:
        return [chat_prompt(tokenizer, p["question"]) for p in problems]
    return [tokenizer.apply_chat_template([{"role": "user", "content": p["question"]}],
                                          tokenize=False, add_generation_prompt=True)
            for p in problems]


def quality(base: str, tokenizer, batch: list[str], answers: list[list[int]],
            problems: list[dict]) -> dict[str, float]:
    """Accuracy, distinct-4, NLL under the base model and mean length of the answers."""
    prompt_ids = tokenizer(batch, add_special_tokens=False).input_ids
    texts = tokenizer.batch_decode(answers, skip_special_tokens=True)
    return {"accuracy": accuracy(texts, [p["answer"] for p in problems]),
            "distinct_4": mean_distinct_n(answers, 4),
            "nll_under_base": mean_nll(base, prompt_ids, answers),
            "answer_tokens": sum(map(len, answers)) / len(answers)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--model", action="append", required=True, help="label=name-or-path")
    parser.add_argument("--problems", type=int, default=12)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--configs", default="none,tail,default",
                        help="of none (plain decoding), tail (pure Jacobi), default")
    args = parser.parse_args()
    from transformers import AutoTokenizer

    models = dict(m.split("=", 1) for m in args.model)
    paths = {label: str(model_path(name)) if not Path(name).exists() else name
             for label, name in models.items()}
    base = paths.get("base") or str(model_path("smollm2-135m-instruct"))
    tokenizer = AutoTokenizer.from_pretrained(base)
    problems = unseen_problems(args.problems, GSM_EVAL_SEED + 7, 1000, 1)
    rows = []
    for instructed in (True, False):
        batch = prompts(tokenizer, problems, instructed)
        for label, path in paths.items():
            for config, spec in [(c, CONFIGS[c]) for c in args.configs.split(",")]:
                row = measure_in_subprocess(path, spec, {1: batch}, args.max_tokens)[0]
                row.update(model=label, config=config, instructed=instructed)
                if config == "none":
                    row["quality"] = quality(base, tokenizer, batch, row["tokens"], problems)
                rows.append(row)
                print(label, config, "instructed" if instructed else "bare",
                      f"{row['tokens_per_verify_step']:.2f}", flush=True)
    for row in rows:  # lossless: each speculative row against its plain decoding
        plain = next(r for r in rows if r["model"] == row["model"] and r["config"] == "none"
                     and r["instructed"] == row["instructed"])
        row["identical"] = row["tokens"] == plain["tokens"]
        row["speedup"] = row["tokens_per_s"] / plain["tokens_per_s"]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(rows, indent=1))
    lines = ["| model | prompt | config | tokens/verify step | speed-up | identical |",
             "|---|---|---|---:|---:|---|"]
    lines += [f"| {r['model']} | {'instruction' if r['instructed'] else 'bare'} | "
              f"{r['config']} | {r['tokens_per_verify_step']:.2f} | {r['speedup']:.2f}x | "
              f"{r['identical']} |" for r in rows]
    lines += ["", "| model | prompt | distinct-4 | NLL under base | answer tokens | accuracy |",
              "|---|---|---:|---:|---:|---:|"]
    lines += [f"| {r['model']} | {'instruction' if r['instructed'] else 'bare'} | "
              f"{r['quality'].get('distinct_4', float('nan')):.3f} | "
              f"{r['quality'].get('nll_under_base', float('nan')):.3f} | "
              f"{r['quality'].get('answer_tokens', float('nan')):.0f} | "
              f"{r['quality'].get('accuracy', float('nan')):.3f} |"
              for r in rows if r["config"] == "none"]
    (args.out / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
