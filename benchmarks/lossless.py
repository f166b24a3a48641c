"""The full lossless check: greedy tokens with ``jacobi`` equal the same engine without it.

    .venv/bin/python benchmarks/lossless.py --out results/lossless

SmolLM2-135M-Instruct (fp32): the 164 HumanEval prompts plus the chat prompts, k = 4 and 15,
batched (all prompts in one ``generate``) and one request at a time, and one batch mixing
different max_tokens, stop strings and an immediate-EOS prompt. One engine at a time.
Prints a table and writes results.json; exits non-zero on any mismatch.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from tqdm import tqdm

from vllm_cllm.bench.datasets import IMMEDIATE_EOS_PROMPT, chat_prompts, humaneval_prompts
from vllm_cllm.bench.lossless import compare, generate_tokens
from vllm_cllm.runtime.checkpoints import model_path
from vllm_cllm.runtime.engine import mean_acceptance_length, spec_metrics, with_engine


def mixed_batch(prompts: list[str]):
    """Every request different: lengths, stop strings, stop-string inclusion, immediate EOS."""
    from vllm import SamplingParams

    chosen = prompts[:12] + [IMMEDIATE_EOS_PROMPT]
    params = []
    for i in range(len(chosen)):
        params.append(SamplingParams(
            temperature=0.0, max_tokens=[5, 17, 64, 33][i % 4],
            stop=[["\n\n"], ["return"], [], ["."]][i % 4],
            include_stop_str_in_output=bool(i % 3 == 0)))
    return chosen, params


def run_all(llm, prompts: list[str], max_tokens: int, modes: list[str]) -> dict:
    from vllm import SamplingParams

    greedy = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    before = spec_metrics(llm)
    mixed_prompts, mixed_params = mixed_batch(prompts)
    runs = {
        "batched": lambda: generate_tokens(llm, prompts, greedy),
        "single": lambda: [generate_tokens(llm, [p], greedy)[0]
                           for p in tqdm(prompts, leave=False)],
        "mixed": lambda: generate_tokens(llm, mixed_prompts, mixed_params),
    }
    out = {mode: runs[mode]() for mode in modes}
    out["tpf"] = mean_acceptance_length(before, spec_metrics(llm))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="results/lossless")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--ks", default="4,15")
    parser.add_argument("--limit", type=int, default=None, help="HumanEval prompts (all: 164)")
    parser.add_argument("--modes", default="batched,single,mixed")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model = str(model_path("smollm2-135m-instruct"))
    from transformers import AutoTokenizer

    prompts = humaneval_prompts(args.limit) + chat_prompts(AutoTokenizer.from_pretrained(model))
    started = time.time()
    modes = args.modes.split(",")
    reference = with_engine(model, None, lambda llm: run_all(llm, prompts, args.max_tokens,
                                                             modes))
    rows, failed = [], False
    for k, adaptive in [(int(k), a) for k in args.ks.split(",") for a in (True, False)]:
        spec = {"method": "jacobi", "num_speculative_tokens": k, "adaptive": adaptive}
        result = with_engine(model, spec, lambda llm: run_all(llm, prompts, args.max_tokens,
                                                               modes))
        for mode in modes:
            mismatches = compare(reference[mode], result[mode])
            failed |= bool(mismatches)
            rows.append({"k": k, "adaptive": adaptive, "mode": mode, "requests": len(result[mode]),
                         "tokens": sum(map(len, result[mode])), "mismatches": len(mismatches),
                         "first_mismatch": mismatches[0].__dict__ if mismatches else None,
                         "tpf": result["tpf"]})
    lines = [f"Lossless check, {len(prompts)} prompts ({len(prompts) - 12} HumanEval + 12 chat), "
             f"{args.max_tokens} new tokens, {time.strftime('%Y-%m-%d')}, "
             f"{(time.time() - started) / 60:.0f} min", "",
             "| k | adaptive | mode | requests | tokens | mismatches |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {r['k']} | {r['adaptive']} | {r['mode']} | {r['requests']} | {r['tokens']} "
              f"| {r['mismatches']} |" for r in rows]
    table = "\n".join(lines) + "\n"
    (out / "table.md").write_text(table)
    (out / "results.json").write_text(json.dumps(rows, indent=1))
    print(table)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
