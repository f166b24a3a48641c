"""Drafting skill apart from what a model says: each model's pure Jacobi drafts (``fill:
tail``, k 15, replayed in transformers) verified against the *base model's* greedy answer
instead of its own (``--own``: beside the same replay on its own answer). A model whose
answers drift into loops drafts its own text more easily; on the base's text only what it
learned to predict counts.

    .venv/bin/python experiments/cllm_own_drafts/fixed_text.py --problems 24 \\
        --model base=smollm2-135m-instruct --model demo=smollm2-135m-cllm-gsm
"""

from __future__ import annotations

import argparse
import json

import torch
from evaluate import (  # the sibling script: the same problems and flags
    EVAL_SEED,
    common_arguments,
    evaluation_set,
    model_paths,
    prompts,
)
from first_draft_token import replay
from tqdm import tqdm


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    common_arguments(parser, problems=24)
    parser.add_argument("--k", type=int, default=15)
    parser.add_argument("--own", action="store_true",
                        help="also replay each model on its own answer (twice the time)")
    args = parser.parse_args()
    from transformers import AutoModelForCausalLM

    base_path, tokenizer, chosen = evaluation_set(args.problems)
    formats = {"instruction": True, "bare": False}
    ids = {fmt: tokenizer(prompts(tokenizer, chosen, instructed), add_special_tokens=False
                          ).input_ids for fmt, instructed in formats.items()}

    def load(path: str):
        return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()

    base = load(base_path)
    reference = {fmt: [replay(base, p, args.k, args.max_tokens)[0]
                       for p in tqdm(ids[fmt], desc=f"base answers, {fmt}")] for fmt in formats}
    rows = []
    for label, path in model_paths(args.model).items():
        model = load(path)
        for fmt in formats:
            own, base_text = [0, 0], [0, 0]  # [tokens, verify steps]
            for p, answer in tqdm(list(zip(ids[fmt], reference[fmt], strict=True)),
                                  desc=f"{label}, {fmt}"):
                replays = [(base_text, answer)] + ([(own, None)] if args.own else [])
                for counts, text in replays:
                    committed, _, steps = replay(model, p, args.k, args.max_tokens,
                                                 reference=text)
                    counts[0] += len(committed) - 1  # the prefill's token is not drafted
                    counts[1] += steps
            rows.append({"model": label, "prompt": fmt, "base_answer": base_text[0] / base_text[1],
                         **({"own_answer": own[0] / own[1]} if args.own else {})})
            print(json.dumps(rows[-1]), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "fixed_text.json").write_text(json.dumps(
        {"problems": args.problems, "seed": EVAL_SEED, "k": args.k, "fill": "tail",
         "max_tokens": args.max_tokens, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
