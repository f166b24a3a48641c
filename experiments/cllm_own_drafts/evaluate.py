"""What a checkpoint drafts by itself: pure Jacobi decoding (``fill: tail``, k 15) at batch 1
on gsm_symbolic problems of a seed no recipe uses, with the recipe's instruction and with the
bare question; beside it the checkpoint's default ``jacobi``, vLLM's ``suffix`` and ``ngram``,
``space`` k 5 (for a SPACE checkpoint) and plain decoding, all engines in lock step (one
problem per round); and the answers' quality (distinct-4, NLL under the base model, length,
accuracy). A last round runs every problem at once: batched output must be token-identical too.

    .venv/bin/python experiments/cllm_own_drafts/evaluate.py --out results/own_drafts \\
        --model base=smollm2-135m-instruct --model demo=smollm2-135m-cllm-gsm --problems 12
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from vllm_cllm.bench.engine_pool import EnginePool
from vllm_cllm.bench.measure import WARMUP_PROMPT, tokens_per_verify_step
from vllm_cllm.bench.suite import NGRAM_SPEC, SUFFIX_SPEC
from vllm_cllm.runtime.checkpoints import model_path, resolve_model
from vllm_cllm.training.gsm import GSM_EVAL_SEED, chat_prompt, unseen_problems
from vllm_cllm.training.quality import accuracy, answer_nlls, mean_distinct_n, pooled_nll

TAIL = {"method": "jacobi", "num_speculative_tokens": 15, "fill": "tail"}
DEFAULT = {"method": "jacobi", "num_speculative_tokens": 15}
#: The default with a cost model without a floor: every draft token costs a share of the step
#: (``benchmarks/step_cost.py`` on a CPU where even one draft token slows the forward).
NO_FLOOR = {**DEFAULT, "knee_tokens": 30, "floor_tokens": 0}
SPACE = {"method": "space", "num_speculative_tokens": 5}
CONFIGS = {"none": None, "tail": TAIL, "default": DEFAULT, "no_floor": NO_FLOOR,
           "suffix": SUFFIX_SPEC, "ngram": NGRAM_SPEC, "space": SPACE}
EVAL_SEED = GSM_EVAL_SEED + 7
#: (seed, count) of every training set the evaluated checkpoints saw
TRAINING_SETS = ((1, 1000), (3, 800), (5, 3000))


def prompts(tokenizer, chosen: list[dict], instructed: bool) -> list[str]:
    return [chat_prompt(tokenizer, p["question"], instructed) for p in chosen]


def base_nlls(base: str, tokenizer, batch: list[str], answers: list[list[int]]) -> list[float]:
    """Each answer's summed NLL under the base model, after its prompt."""
    return answer_nlls(base, tokenizer(batch, add_special_tokens=False).input_ids, answers)


def quality(base: str, tokenizer, batch: list[str], answers: list[list[int]],
            chosen: list[dict], nlls: list[float] | None = None) -> dict[str, float]:
    """Accuracy, distinct-4, NLL under the base model and mean length of the answers
    (``nlls``: :func:`base_nlls` where the caller has them already)."""
    if nlls is None:
        nlls = base_nlls(base, tokenizer, batch, answers)
    texts = tokenizer.batch_decode(answers, skip_special_tokens=True)
    return {"accuracy": accuracy(texts, [p["answer"] for p in chosen]),
            "distinct_4": mean_distinct_n(answers, 4),
            "nll_under_base": pooled_nll(nlls, answers),
            "answer_tokens": sum(map(len, answers)) / len(answers)}


def run_pool(path: str, configs: list[str], batch: list[str], max_tokens: int
             ) -> dict[str, dict[str, Any]]:
    """Every config on one model in lock step: one prompt per round, then all at once."""
    rounds, batched = [], {}
    with EnginePool({c: (path, CONFIGS[c]) for c in configs}) as pool:
        for prompt in batch:
            rounds.append(pool.measure({"batch_size": 1, "warmup": [WARMUP_PROMPT],
                                        "prompts": [prompt]}, max_tokens))
        batched = pool.measure({"batch_size": len(batch), "warmup": [WARMUP_PROMPT],
                                "prompts": batch}, max_tokens)
    out = {}
    for c in configs:
        tokens = [r[c]["tokens"][0] for r in rounds]
        steps = [r[c]["steps"][0] for r in rounds]
        out[c] = {"tokens_per_verify_step": tokens_per_verify_step(tokens, steps),
                  "tokens_per_s": sum(map(len, tokens)) / sum(r[c]["seconds"] for r in rounds),
                  "speedup_rounds": [r[c]["tokens_per_s"] / r["none"]["tokens_per_s"]
                                     for r in rounds],
                  "identical": tokens == [r["none"]["tokens"][0] for r in rounds],
                  "identical_batched": batched[c]["tokens"] == batched["none"]["tokens"],
                  "tokens": tokens}
        out[c]["speedup"] = statistics.median(out[c]["speedup_rounds"])
    return out


def common_arguments(parser: argparse.ArgumentParser, problems: int) -> None:
    """The flags this script and its siblings share: output, models, problems, length."""
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--model", action="append", required=True, help="label=name-or-path")
    parser.add_argument("--problems", type=int, default=problems)
    parser.add_argument("--max-tokens", type=int, default=256)


def evaluation_set(count: int) -> tuple[str, Any, list[dict]]:
    """The base model's path, its tokenizer and the first ``count`` evaluation problems (seed
    :data:`EVAL_SEED`, none verbatim in :data:`TRAINING_SETS`): what every script here shares."""
    from transformers import AutoTokenizer

    base = str(model_path("smollm2-135m-instruct"))
    return (base, AutoTokenizer.from_pretrained(base),
            unseen_problems(count, EVAL_SEED, TRAINING_SETS))


def model_paths(labelled: list[str]) -> dict[str, str]:
    """``label=name-or-path`` arguments as {label: local path} (a checkpoint name is built)."""
    return {label: resolve_model(name) for label, name in (m.split("=", 1) for m in labelled)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    common_arguments(parser, problems=12)
    parser.add_argument("--configs", default="none,tail,default,suffix,ngram",
                        help=f"of {', '.join(CONFIGS)} (none is always run)")
    args = parser.parse_args()
    configs = ["none"] + [c for c in args.configs.split(",") if c != "none"]
    paths = model_paths(args.model)
    base, tokenizer, chosen = evaluation_set(args.problems)
    rows = []
    for instructed in (True, False):
        batch = prompts(tokenizer, chosen, instructed)
        for label, path in paths.items():
            measured = run_pool(path, configs, batch, args.max_tokens)
            answers = measured["none"]["tokens"]
            q = quality(base, tokenizer, batch, answers, chosen)
            for config, row in measured.items():
                row = {k: v for k, v in row.items() if k != "tokens"}
                rows.append({"model": label, "instructed": instructed, "config": config, **row,
                             **({"quality": q} if config == "none" else {})})
                print(label, config, "instructed" if instructed else "bare",
                      f"{row['tokens_per_verify_step']:.2f} {row['speedup']:.2f}x", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(
        {"args": {k: str(v) for k, v in vars(args).items()}, "rows": rows}, indent=1))
    fmt = {True: "instruction", False: "bare"}
    lines = [f"{args.problems} problems of seed {EVAL_SEED}, batch 1, k 15, {args.max_tokens} "
             "tokens, engines in lock step; speed-up: median over problems of tokens/s "
             "against plain decoding in the same round", "",
             "| model | prompt | config | tokens/verify step | speed-up | identical "
             "(batch 1 / all at once) |", "|---|---|---|---:|---:|---|"]
    lines += [f"| {r['model']} | {fmt[r['instructed']]} | {r['config']} | "
              f"{r['tokens_per_verify_step']:.2f} | {r['speedup']:.2f}x | "
              f"{r['identical']} / {r['identical_batched']} |" for r in rows]
    lines += ["", "| model | prompt | distinct-4 | NLL under base | answer tokens | accuracy |",
              "|---|---|---:|---:|---:|---:|"]
    lines += [f"| {r['model']} | {fmt[r['instructed']]} | {r['quality']['distinct_4']:.3f} | "
              f"{r['quality']['nll_under_base']:.3f} | {r['quality']['answer_tokens']:.0f} | "
              f"{r['quality']['accuracy']:.3f} |" for r in rows if r["config"] == "none"]
    (args.out / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
