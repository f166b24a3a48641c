"""The demo CLLM against its base model, side by side in one run: speed, lossless, collapse.

    .venv/bin/python benchmarks/cllm_gsm.py --out results/cllm_gsm

gsm_symbolic problems from a seed never used in training (1000), chat template, greedy,
256 new tokens. For the CLLM (`smollm2-135m-cllm-gsm`) and its base (SmolLM2-135M-Instruct):
no speculation, `jacobi` (k = 15 and the other --ks) and vLLM's `ngram` (k = 15, lookup 2-4);
batch 1 (one prompt at a time) and batch 8. "Accept. length" is vLLM's mean acceptance length
(over the steps that drafted); "tokens/step" counts every decode step, also those where a
proposer drafted nothing (``ngram`` without a match), so it compares proposers fairly.
Quality: final-answer accuracy, distinct-4 of the answers, and the answers' mean NLL
under the base model. Writes results.json, table.md and speed.png.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from tqdm import tqdm

from vllm_cllm.benchmarking import against_baseline, measure_in_subprocess, speedup_bars
from vllm_cllm.models import model_path
from vllm_cllm.training.gsm import chat_prompt, gsm_problems
from vllm_cllm.training.quality import accuracy, mean_distinct_n, mean_nll

NGRAM = {"method": "ngram", "num_speculative_tokens": 15, "prompt_lookup_min": 2,
         "prompt_lookup_max": 4}


def configurations(ks: list[int], b1_ks: list[int]) -> list[tuple[str, str, dict | None, bool]]:
    """(model, config name, speculative config, also at batch 1)."""
    jacobi = {k: {"method": "jacobi", "num_speculative_tokens": k} for k in ks}
    return [
        ("base", "none", None, False),
        ("base", "jacobi k=15", jacobi[15], False),
        ("base", "vllm ngram k=15", NGRAM, False),
        ("cllm", "none", None, True),
        *[("cllm", f"jacobi k={k}", jacobi[k], k in b1_ks) for k in ks],
        ("cllm", "vllm ngram k=15", NGRAM, False),
    ]


def quality(rows: list[dict], problems: list[dict], tokenizer: Any, prompt_ids: list[list[int]],
            base_dir: str) -> list[dict]:
    out = []
    for label in ("base", "cllm"):
        tokens = next(r["tokens"] for r in rows if r["model"] == label and r["config"] == "none"
                      and r["batch_size"] == 8)
        texts = tokenizer.batch_decode(tokens, skip_special_tokens=True)
        out.append({"model": label,
                    "accuracy": accuracy(texts, [p["answer"] for p in problems]),
                    "distinct_4": mean_distinct_n(tokens, 4),
                    "nll_under_base": mean_nll(base_dir, prompt_ids, tokens),
                    "mean_answer_tokens": sum(len(t) for t in tokens) / len(tokens)})
    return out


def write_report(rows: list[dict], quality_rows: list[dict], out: Path, header: str) -> str:
    lines = [header, "", "| model | config | batch | accept. length (vLLM) | tokens/step | "
             "tokens/s | speed-up | identical |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['config']} | {r['batch_size']} | {r['tpf']:.2f} | "
                     f"{r['tokens_per_step']:.2f} | {r['tokens_per_s']:.1f} | "
                     f"{r['speedup']:.2f}x | {r['identical']} |")
    if quality_rows:
        lines += ["", "| model | accuracy | distinct-4 | NLL under base | answer tokens |",
                  "|---|---|---|---|---|"]
        for q in quality_rows:
            lines.append(f"| {q['model']} | {q['accuracy']:.3f} | {q['distinct_4']:.3f} | "
                         f"{q['nll_under_base']:.3f} | {q['mean_answer_tokens']:.0f} |")
    table = "\n".join(lines) + "\n"
    (out / "table.md").write_text(table)
    (out / "results.json").write_text(json.dumps({"rows": rows, "quality": quality_rows},
                                                 indent=1))
    return table


def plot(rows: list[dict], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    sel = [r for r in rows if r["batch_size"] == 8 and r["config"] != "none"]
    axes[0].barh([f"{r['model']}: {r['config']}" for r in sel],
                 [r["tokens_per_step"] for r in sel])
    axes[0].set_title("tokens per decode step, every step counted (batch 8)")
    axes[0].invert_yaxis()
    b1 = [r for r in rows if r["batch_size"] == 1]
    speedup_bars(axes[1], [f"{r['model']}: {r['config']}" for r in b1],
                 [r["speedup"] for r in b1],
                 "decode speed-up vs no speculation, same model (batch 1)")
    fig.tight_layout()
    fig.savefig(out / "speed.png", dpi=90)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="results/cllm_gsm")
    parser.add_argument("--cllm", default="smollm2-135m-cllm-gsm")
    parser.add_argument("--base", default="smollm2-135m-instruct")
    parser.add_argument("--num-problems", type=int, default=40)
    parser.add_argument("--seed", type=int, default=1000, help="never a training seed")
    parser.add_argument("--ks", default="15,8,24", help="jacobi k for the CLLM (15 required)")
    parser.add_argument("--b1-ks", default="15,8", help="of those, also measured at batch 1")
    parser.add_argument("--b1-problems", type=int, default=40)
    parser.add_argument("--max-tokens", type=int, default=256)
    args = parser.parse_args()
    from transformers import AutoTokenizer

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dirs = {"base": str(model_path(args.base)), "cllm": str(model_path(args.cllm))}
    tokenizer = AutoTokenizer.from_pretrained(dirs["base"])
    problems = gsm_problems(args.num_problems, args.seed)
    prompts = [chat_prompt(tokenizer, p["question"]) for p in problems]
    ks = [int(k) for k in args.ks.split(",")]
    b1_ks = [int(k) for k in args.b1_ks.split(",")]
    rows: list[dict] = []
    baseline: dict[tuple[str, int], dict] = {}
    header = (f"{args.cllm} vs {args.base}, fp32, {args.num_problems} gsm_symbolic problems "
              f"(seed {args.seed}), chat template, {args.max_tokens} new tokens, greedy; "
              f"batch 1 on the first {args.b1_problems}; measured {time.strftime('%Y-%m-%d')} "
              "with `benchmarks/cllm_gsm.py`")
    for label, name, spec, at_b1 in tqdm(configurations(ks, b1_ks), desc="configs"):
        by_batch = {8: prompts, **({1: prompts[:args.b1_problems]} if at_b1 else {})}
        for row in measure_in_subprocess(dirs[label], spec, by_batch, args.max_tokens):
            key = (label, row["batch_size"])
            if spec is None:
                baseline.setdefault(key, row)
            rows.append(against_baseline(row, baseline[key]))
            row.update(model=label, config=name)
        write_report([{k: v for k, v in r.items() if k != "tokens"} for r in rows], [], out,
                     header)
    prompt_ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    quality_rows = quality(rows, problems, tokenizer, prompt_ids, dirs["base"])
    slim = [{k: v for k, v in r.items() if k != "tokens"} for r in rows]
    print(write_report(slim, quality_rows, out, header))
    plot(slim, out)


if __name__ == "__main__":
    main()
