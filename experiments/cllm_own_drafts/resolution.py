"""How far the evaluation problems resolve a checkpoint's figures: paired bootstrap intervals,
over the problems, of pure Jacobi tokens per verify step and of the quality ratios against the
base (distinct-4, NLL under the base, answer length), and how often each quality bar holds
among the resamples. Reads ``wide.py``'s ``answers.jsonl`` (every model's answers to the same
problems, each with its verify steps and its NLL under the base), one of whose models is the
base. A folder decoded plainly (``wide.py --config none``) gives the quality figures only.

    .venv/bin/python experiments/cllm_own_drafts/resolution.py --out results/resolution \\
        results/base_wide results/seed10_wide
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from vllm_cllm.bench.measure import tokens_per_verify_step
from vllm_cllm.training.quality import distinct_n, pooled_nll

#: The issue's quality bars: distinct-4 at least, NLL under the base at most, length within.
BARS = {"distinct_4": 0.9, "nll": 1.25, "length": 0.15}


def figures(model: list[dict], base: list[dict], idx: np.ndarray, drafted: bool
            ) -> dict[str, float]:
    """The figures on the problems ``idx`` (a resample) from each problem's answer record (its
    tokens, verify steps, NLL under the base and distinct-4): tokens per verify step (where the
    model ``drafted``) and the ratios against the base's answers to the same problems."""
    def pick(answers: list[dict], key: str) -> list:
        return [answers[i][key] for i in idx]

    def mean(values: list[float]) -> float:
        return sum(values) / len(values)

    def distinct(answers: list[dict]) -> float:
        return mean(pick(answers, "distinct_4"))

    def nll(answers: list[dict]) -> float:
        return pooled_nll(pick(answers, "nll"), pick(answers, "tokens"))

    def length(answers: list[dict]) -> float:
        return mean([len(t) for t in pick(answers, "tokens")])

    ratios = {"distinct_4": distinct(model) / distinct(base), "nll": nll(model) / nll(base),
              "length": length(model) / length(base) - 1}
    if not drafted:
        return ratios
    return {"tokens_per_verify_step": tokens_per_verify_step(pick(model, "tokens"),
                                                             pick(model, "steps")), **ratios}


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
    groups: dict[tuple[str, str], dict[int, dict]] = {}
    drafted: dict[str, bool] = {}
    for folder in args.wide:
        config = json.loads((folder / "wide.json").read_text())["config"]
        for line in (folder / "answers.jsonl").read_text().splitlines():
            a = json.loads(line)
            drafted[a["model"]] = config != "none"
            group = groups.setdefault((a["model"], a["prompt"]), {})
            if a["problem"] in group:
                raise SystemExit(f"{a['model']!r} answers problem {a['problem']} twice "
                                 f"({a['prompt']}): label each folder's models apart")
            group[a["problem"]] = {**a, "distinct_4": distinct_n(a["tokens"], 4)}
    if not any(m == args.base_label for m, _ in groups):
        raise SystemExit(f"no answers labelled {args.base_label!r} in {args.wide}")
    problems = {tuple(sorted(group)) for group in groups.values()}
    if len(problems) != 1:
        raise SystemExit("the folders' models answer different problems: resample the same ones")
    ordered = {key: [group[i] for i in sorted(group)] for key, group in groups.items()}
    count = len(problems.pop())
    resamples = np.random.default_rng(0).integers(0, count, size=(args.resamples, count))
    report = []
    for (model, fmt), records in ordered.items():
        if model == args.base_label:
            continue
        base = ordered[(args.base_label, fmt)]
        draws = [figures(records, base, idx, drafted[model]) for idx in resamples]
        held = [holds(d) for d in draws]
        row = {"model": model, "prompt": fmt, "problems": count,
               "point": figures(records, base, np.arange(count), drafted[model])}
        row["interval_90"] = {k: [float(np.percentile([d[k] for d in draws], q)) for q in (5, 95)]
                              for k in row["point"]}
        row["bar_held_share"] = {k: float(np.mean([h[k] for h in held])) for k in BARS}
        row["all_bars_held_share"] = float(np.mean([all(h.values()) for h in held]))
        report.append(row)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "resolution.json").write_text(json.dumps(
        {"resamples": args.resamples, "bars": BARS, "rows": report}, indent=1))
    lines = ["| model | prompt | pure Jacobi (90 %) | distinct-4 ratio (90 %) | NLL ratio (90 %) "
             "| length (90 %) | all bars held in |", "|---|---|---|---|---|---|---:|"]
    for r in report:
        p, iv = r["point"], r["interval_90"]
        cells = [f"{p[k]:.2f} ({iv[k][0]:.2f}–{iv[k][1]:.2f})" if k in p else "—"
                 for k in ("tokens_per_verify_step", "distinct_4", "nll")]
        cells.append(f"{p['length']:+.0%} ({iv['length'][0]:+.0%} to {iv['length'][1]:+.0%})")
        lines.append(f"| {r['model']} | {r['prompt']} | " + " | ".join(cells)
                     + f" | {r['all_bars_held_share']:.0%} |")
    (args.out / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
