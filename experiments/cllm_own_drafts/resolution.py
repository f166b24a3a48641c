"""How far the evaluation problems resolve a checkpoint's figures: paired bootstrap intervals,
over the problems, of pure Jacobi tokens per verify step and of the quality ratios against the
base (distinct-4, NLL under the base, answer length), and how often each quality bar holds
among the resamples. Reads ``wide.py``'s ``answers.jsonl`` (every model's answers to the same
problems), one of whose models is the base.

    .venv/bin/python experiments/cllm_own_drafts/resolution.py --out results/resolution \\
        results/base_wide results/seed10_wide
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from evaluate import evaluation_set, prompts  # the sibling script: the same problems

from vllm_cllm.training.quality import answer_nlls, distinct_n

#: The issue's quality bars: distinct-4 at least, NLL under the base at most, length within.
BARS = {"distinct_4": 0.9, "nll": 1.25, "length": 0.15}


def per_problem(base: str, tokenizer, chosen: list[dict], rows: list[dict]) -> dict:
    """Per-problem arrays of one model and prompt format, in problem order."""
    rows = sorted(rows, key=lambda r: r["problem"])
    answers = [r["tokens"] for r in rows]
    batch = prompts(tokenizer, [chosen[r["problem"]] for r in rows],
                    rows[0]["prompt"] == "instruction")
    prompt_ids = tokenizer(batch, add_special_tokens=False).input_ids
    decoded = [len(a) - 1 if r["steps"] > 1 else 0 for a, r in zip(answers, rows, strict=True)]
    return {"decoded": np.array(decoded, float),
            "decode_steps": np.array([max(r["steps"] - 1, 0) for r in rows], float),
            "distinct_4": np.array([distinct_n(a, 4) for a in answers]),
            "nll": np.array(answer_nlls(base, prompt_ids, answers)),
            "length": np.array([len(a) for a in answers], float)}


def figures(model: dict, base: dict, idx: np.ndarray) -> dict[str, float]:
    """The figures on the problems ``idx`` (a resample): tokens per verify step and ratios."""
    def pooled_nll(x: dict) -> float:
        return x["nll"][idx].sum() / x["length"][idx].sum()

    return {"tokens_per_verify_step": model["decoded"][idx].sum()
            / max(model["decode_steps"][idx].sum(), 1),
            "distinct_4": model["distinct_4"][idx].mean() / base["distinct_4"][idx].mean(),
            "nll": pooled_nll(model) / pooled_nll(base),
            "length": model["length"][idx].mean() / base["length"][idx].mean() - 1}


def holds(f: dict[str, float]) -> dict[str, bool]:
    return {"distinct_4": f["distinct_4"] >= BARS["distinct_4"], "nll": f["nll"] <= BARS["nll"],
            "length": abs(f["length"]) <= BARS["length"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("wide", nargs="+", type=Path, help="wide.py output folders")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--base-label", default="base")
    parser.add_argument("--resamples", type=int, default=2000)
    args = parser.parse_args()
    answers = [json.loads(line) for d in args.wide
               for line in (d / "answers.jsonl").read_text().splitlines()]
    count = 1 + max(a["problem"] for a in answers)
    base_dir, tokenizer, chosen = evaluation_set(count)
    groups: dict[tuple[str, str], list[dict]] = {}
    for a in answers:
        group = groups.setdefault((a["model"], a["prompt"]), [])
        if any(b["problem"] == a["problem"] for b in group):
            raise SystemExit(f"{a['model']!r} answers problem {a['problem']} twice "
                             f"({a['prompt']}): label each folder's models apart")
        group.append(a)
    if not any(m == args.base_label for m, _ in groups):
        raise SystemExit(f"no answers labelled {args.base_label!r} in {args.wide}")
    arrays = {key: per_problem(base_dir, tokenizer, chosen, rows) for key, rows in groups.items()}
    rng = np.random.default_rng(0)
    resamples = rng.integers(0, count, size=(args.resamples, count))
    every = np.arange(count)
    report = []
    for (model, fmt), arr in arrays.items():
        if model == args.base_label:
            continue
        base = arrays[(args.base_label, fmt)]
        draws = [figures(arr, base, idx) for idx in resamples]
        row = {"model": model, "prompt": fmt, "problems": count,
               "point": figures(arr, base, every)}
        row["interval_90"] = {k: [float(np.percentile([d[k] for d in draws], q)) for q in (5, 95)]
                              for k in row["point"]}
        row["bar_held_share"] = {k: float(np.mean([holds(d)[k] for d in draws]))
                                 for k in BARS}
        row["all_bars_held_share"] = float(np.mean([all(holds(d).values()) for d in draws]))
        report.append(row)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "resolution.json").write_text(json.dumps(
        {"resamples": args.resamples, "bars": BARS, "rows": report}, indent=1))
    lines = ["| model | prompt | pure Jacobi (90 %) | distinct-4 ratio (90 %) | NLL ratio (90 %) "
             "| length (90 %) | all bars held in |", "|---|---|---|---|---|---|---:|"]
    for r in report:
        p, iv = r["point"], r["interval_90"]
        cells = [f"{p[k]:.2f} ({iv[k][0]:.2f}–{iv[k][1]:.2f})"
                 for k in ("tokens_per_verify_step", "distinct_4", "nll")]
        cells.append(f"{p['length']:+.0%} ({iv['length'][0]:+.0%} to {iv['length'][1]:+.0%})")
        lines.append(f"| {r['model']} | {r['prompt']} | " + " | ".join(cells)
                     + f" | {r['all_bars_held_share']:.0%} |")
    (args.out / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
