"""The demo benchmarks on grade-school math (CLLM and SPACE share this): configurations run
side by side in one run, each in its own engine process, then a table, JSON and quality.

A configuration is ``(model label, name, speculative config, also at batch 1)``; every row
is compared with the same model's no-speculation row at the same batch size (speed-up and
token identity). "Accept. length" is vLLM's mean acceptance length (over steps that
drafted); "tokens/step" divides by every engine step each request took, counted
(:func:`vllm_cllm.runtime.engine.generate_counting_steps`); "tokens/verify step" leaves out each
request's prefill step and the one token it gave.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tqdm import tqdm

from vllm_cllm.bench.measure import against_baseline, measure_in_subprocess
from vllm_cllm.training.quality import accuracy, mean_distinct_n, mean_nll

Config = tuple[str, str, dict | None, bool]


def slim(rows: list[dict]) -> list[dict]:
    """Rows without their token lists (for JSON and tables)."""
    return [{k: v for k, v in r.items() if k != "tokens"} for r in rows]


def run_configurations(configs: list[Config], dirs: dict[str, str], prompts: list[str],
                       b1_prompts: int, max_tokens: int,
                       progress: Callable[[list[dict]], None] | None = None) -> list[dict]:
    """Measure every configuration at batch 8 (all prompts) and, if asked, batch 1."""
    rows: list[dict] = []
    baseline: dict[tuple[str, int], dict] = {}
    for label, name, spec, at_b1 in tqdm(configs, desc="configs"):
        by_batch = {8: prompts, **({1: prompts[:b1_prompts]} if at_b1 else {})}
        for row in measure_in_subprocess(dirs[label], spec, by_batch, max_tokens):
            key = (label, row["batch_size"])
            if spec is None:
                baseline.setdefault(key, row)
            rows.append(against_baseline(row, baseline[key]))
            row.update(model=label, config=name)
        if progress is not None:
            progress(rows)
    return rows


def quality(rows: list[dict], labels: list[str], problems: list[dict], tokenizer: Any,
            prompt_ids: list[list[int]], base_dir: str) -> list[dict]:
    """Collapse check per model: accuracy, distinct-4, NLL under the base model, length."""
    out = []
    for label in labels:
        tokens = next(r["tokens"] for r in rows if r["model"] == label and r["config"] == "none"
                      and r["batch_size"] == 8)
        texts = tokenizer.batch_decode(tokens, skip_special_tokens=True)
        out.append({"model": label,
                    "accuracy": accuracy(texts, [p["answer"] for p in problems]),
                    "distinct_4": mean_distinct_n(tokens, 4),
                    "nll_under_base": mean_nll(base_dir, prompt_ids, tokens),
                    "mean_answer_tokens": sum(len(t) for t in tokens) / len(tokens)})
    return out


def write_report(rows: list[dict], quality_rows: list[dict], out: Path, header: str,
                 extra: dict[str, Any] | None = None, extra_lines: list[str] | None = None
                 ) -> str:
    """table.md (speed rows, then quality, then ``extra_lines``) and results.json."""
    lines = [header, "", "| model | config | batch | accept. length (vLLM) | tokens/step | "
             "tokens/verify step | tokens/s | speed-up | identical |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['config']} | {r['batch_size']} | {r['tpf']:.2f} | "
                     f"{r['tokens_per_step']:.2f} | {r['tokens_per_verify_step']:.2f} | "
                     f"{r['tokens_per_s']:.1f} | "
                     f"{r['speedup']:.2f}x | {r['identical']} |")
    if quality_rows:
        lines += ["", "| model | accuracy | distinct-4 | NLL under base | answer tokens |",
                  "|---|---|---|---|---|"]
        for q in quality_rows:
            lines.append(f"| {q['model']} | {q['accuracy']:.3f} | {q['distinct_4']:.3f} | "
                         f"{q['nll_under_base']:.3f} | {q['mean_answer_tokens']:.0f} |")
    lines += extra_lines or []
    table = "\n".join(lines) + "\n"
    (out / "table.md").write_text(table)
    (out / "results.json").write_text(json.dumps(
        {"rows": rows, "quality": quality_rows, **(extra or {})}, indent=1))
    return table
