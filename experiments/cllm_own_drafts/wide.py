"""A proposer's tokens per verify step on more problems than the lock-step evaluation: every
model's pure Jacobi drafting (``fill: tail``, k 15; ``--config space``: ``space`` k 5) on N
unseen problems at once, with the recipe's instruction and with the bare question. Pure Jacobi
drafts per request, so its figure does not depend on the batch; ``space``'s lookup history
holds the other requests' answers too. Steps are counted, not timed, and each request's
prefill step is left out as in the lock-step evaluation. Drafting is lossless, so the answers
are the model's greedy ones: their quality (:func:`evaluate.quality`, plus the share that runs
to the token limit) is reported beside it. Each answer, its verify steps and its NLL under the
base go to ``answers.jsonl`` beside the table, for ``resolution.py``'s intervals.
``--config none`` decodes plainly: the same answers at a fraction of the cost (tokens per
verify step is then 1.0), for the quality figures on many problems.

    .venv/bin/python experiments/cllm_own_drafts/wide.py --out results/own_drafts_wide \\
        --model base=smollm2-135m-instruct --model demo=smollm2-135m-cllm-gsm --problems 32
"""

from __future__ import annotations

import argparse
import json

from evaluate import (  # the sibling script: the same problems and flags
    CONFIGS,
    EVAL_SEED,
    base_nlls,
    common_arguments,
    evaluation_set,
    model_paths,
    prompts,
    quality,
)

from vllm_cllm.bench.measure import measure_in_subprocess


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    common_arguments(parser, problems=32)
    parser.add_argument("--config", default="tail", choices=list(CONFIGS),
                        help="the proposer configuration (evaluate.py's names; none: plain)")
    args = parser.parse_args()
    spec = CONFIGS[args.config]
    base, tokenizer, chosen = evaluation_set(args.problems)
    rows, per_answer = [], []
    for label, path in model_paths(args.model).items():
        for fmt, instructed in (("instruction", True), ("bare", False)):
            batch = prompts(tokenizer, chosen, instructed)
            run = measure_in_subprocess(path, spec, {len(batch): batch}, args.max_tokens)[0]
            answers = run["tokens"]
            nlls = base_nlls(base, tokenizer, batch, answers)
            per_answer += [{"model": label, "prompt": fmt, "problem": i, "steps": steps,
                            "nll": nll, "tokens": tokens}
                           for i, (tokens, steps, nll) in enumerate(zip(
                               answers, run["steps"], nlls, strict=True))]
            rows.append({"model": label, "prompt": fmt,
                         "tokens_per_verify_step": run["tokens_per_verify_step"],
                         **quality(base, tokenizer, batch, answers, chosen, nlls),
                         "at_limit": sum(len(a) >= args.max_tokens for a in answers)
                         / len(answers)})
            print(json.dumps(rows[-1]), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "wide.json").write_text(json.dumps(
        {"problems": args.problems, "seed": EVAL_SEED, "config": args.config, "spec": spec,
         "max_tokens": args.max_tokens, "rows": rows}, indent=1))
    (args.out / "answers.jsonl").write_text("".join(json.dumps(a) + "\n" for a in per_answer))
    table = [f"| model | prompt | {args.config} tokens / verify step | distinct-4 "
             "| NLL under base | answer tokens | at the limit | accuracy |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        table.append(f"| {r['model']} | {r['prompt']} | {r['tokens_per_verify_step']:.2f} | "
                     f"{r['distinct_4']:.3f} | {r['nll_under_base']:.3f} | "
                     f"{r['answer_tokens']:.0f} | {r['at_limit']:.0%} | {r['accuracy']:.0%} |")
    (args.out / "table.md").write_text("\n".join(table) + "\n")
    print("\n".join(table))


if __name__ == "__main__":
    main()
