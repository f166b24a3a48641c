"""vLLM's own serving benchmark on real prompts: plain decoding, vLLM ``suffix`` and this
plugin's ``jacobi`` side by side, at several concurrencies, every text compared.

One ``vllm serve`` per configuration (the documented command; ``--speculative-config`` for
the speculative ones), all up at once and driven in turn by ``vllm bench serve`` at each
concurrency over real prompts:
ShareGPT first turns and grade-school math problems (gsm_symbolic, a seed no recipe trains
on), chat-formatted, greedy, up to ``--output-len`` tokens each (answers end where the model
ends them). Each concurrency gets prompts of its own, and a warm-up set comes first: ``suffix``
and ``jacobi`` keep earlier answers as a draft source, and a prompt answered twice would
flatter them. Every generated text is compared with plain decoding's for the same prompt.
Each concurrency runs ``--rounds`` sets of prompts, every server in turn on each (the
order rotating), and a ratio between configurations is the median of its per-round ratios:
servers measured a few minutes apart see a machine whose speed drifts by more than their
difference.

    .venv/bin/python benchmarks/serve_compare.py --out results/serve_compare
    .venv/bin/python benchmarks/serve_compare.py --out results/serve_compare \
        --configs jacobi --jacobi '{"method": "jacobi", "num_speculative_tokens": 15, \
        "knee_tokens": 100}'   # rows kept, this configuration re-measured
    .venv/bin/python benchmarks/serve_compare.py --out results/serve_margin --concurrency 8 \
        --configs suffix jacobi --variant 'margin 0={"token_margin_pct": 0}'
        # one more server: jacobi with these options on top, named "jacobi margin 0"

Writes ``results.json``, ``table.md`` and ``serve_compare.png`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from vllm_cllm.bench.datasets import sharegpt_questions
from vllm_cllm.runtime.checkpoints import model_path
from vllm_cllm.runtime.server import (
    metric_total,
    read_metrics,
    running_server,
    vllm_executable,
)

#: vLLM's own ``suffix`` as the project's bench runs it.
SUFFIX = {"method": "suffix", "num_speculative_tokens": 16}
JACOBI = {"method": "jacobi", "num_speculative_tokens": 15}
#: gsm_symbolic's seed for these prompts (the recipes train on others).
GSM_SEED = 7070


def prompt_sets(model: str, sizes: dict[str, int]) -> dict[str, list[str]]:
    """Disjoint chat-formatted prompt sets, half ShareGPT first turns, half gsm problems."""
    from transformers import AutoTokenizer

    from vllm_cllm.training.gsm import chat_prompt, gsm_problems

    tokenizer = AutoTokenizer.from_pretrained(model)
    total = sum(sizes.values())
    chat = [tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                          add_generation_prompt=True)
            for q in sharegpt_questions(total, max_chars=600)]
    gsm = [chat_prompt(tokenizer, p["question"]) for p in gsm_problems(total, seed=GSM_SEED)]
    mixed = [p for pair in zip(chat, gsm, strict=True) for p in pair]
    sets, at = {}, 0
    for name, size in sizes.items():
        sets[name], at = mixed[at:at + size], at + size
    return sets


def bench_serve(base: str, model: str, prompts: list[str], concurrency: int, output_len: int,
                result: Path) -> dict[str, Any]:
    """``vllm bench serve`` over ``prompts`` (already chat-formatted); its saved result."""
    dataset = result.with_suffix(".prompts.jsonl")
    dataset.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    cmd = [vllm_executable(), "bench", "serve", "--backend", "openai", "--base-url", base,
           "--model", model, "--served-model-name", "model", "--dataset-name", "custom",
           "--dataset-path", str(dataset), "--skip-chat-template", "--disable-shuffle",
           "--custom-output-len", str(output_len), "--num-prompts", str(len(prompts)),
           "--max-concurrency", str(concurrency), "--temperature", "0",
           "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,90",
           "--save-result", "--save-detailed", "--result-dir", str(result.parent),
           "--result-filename", result.name, "--disable-tqdm"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return json.loads(result.read_text())


def _delta(before: dict[str, float], after: dict[str, float], name: str) -> float:
    """How much the server's counter ``name`` grew between two reads."""
    return metric_total(after, name) - metric_total(before, name)


def counter_deltas(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """The spec-decode counters' growth between two reads: drafts, draft tokens, accepted."""
    return {key: _delta(before, after, f"vllm:spec_decode_{key}_total")
            for key in ("num_drafts", "num_draft_tokens", "num_accepted_tokens")}


def _file(name: str) -> str:
    """A configuration's name as part of a file name."""
    return name.replace(" ", "_")


def run_configs(specs: dict[str, dict[str, Any] | None], model: str,
                sets: dict[str, list[str]], concurrencies: list[int], output_len: int,
                out: Path, rounds: int = 1) -> list[dict[str, Any]]:
    """One server per configuration, all up at once; each warmed up on the warm-up set, then
    each concurrency's sets (``c{concurrency}r{round}``) run on every server in turn (the
    order rotating from set to set), so that the configurations are measured side by side
    on a machine whose load drifts. One row per configuration, concurrency and round."""
    rows = []
    with ExitStack() as stack:
        bases = {}
        for name, spec in specs.items():
            extra = ["--speculative-config", json.dumps(spec)] if spec else []
            bases[name] = stack.enter_context(running_server(
                model, *extra, log_path=str(out / f"{_file(name)}.server.log")))
            bench_serve(bases[name], model, sets["warmup"], 4, output_len,
                        out / f"{_file(name)}.warmup.json")
        names = list(specs)
        sets_in_turn = [(c, r) for c in concurrencies for r in range(rounds)]
        for turn, (concurrency, r) in enumerate(sets_in_turn):
            for name in names[turn % len(names):] + names[:turn % len(names)]:
                base = bases[name]
                before = read_metrics(base)
                run = bench_serve(base, model, sets[f"c{concurrency}r{r}"], concurrency,
                                  output_len, out / f"{_file(name)}.c{concurrency}.r{r}.json")
                after = read_metrics(base)
                rows.append({"config": name, "speculative_config": specs[name],
                             "concurrency": concurrency, "round": r,
                             "requests": run["completed"], "failed": run["failed"],
                             "output_tok_s": run["output_throughput"],
                             "tpot_p50_ms": run["p50_tpot_ms"],
                             "ttft_p50_ms": run["p50_ttft_ms"],
                             **counter_deltas(before, after),
                             "texts": run["generated_texts"]})
                print(f"{name} c{concurrency} round {r}: {run['output_throughput']:.1f} tok/s",
                      flush=True)
    return rows


def compare(rows: list[dict[str, Any]]) -> None:
    """Each row's texts against plain decoding's at the same concurrency and round (same
    prompts)."""
    plain = {(r["concurrency"], r.get("round", 0)): r["texts"] for r in rows
             if r["config"] == "none"}
    for r in rows:
        reference = plain.get((r["concurrency"], r.get("round", 0)))
        r["identical"] = None if reference is None else sum(
            a == b for a, b in zip(r["texts"], reference, strict=True))


def summarise(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per configuration and concurrency over its rounds: the median output
    tokens/s, the medians of its per-round ratios to plain decoding (``speedup``) and to
    vLLM ``suffix`` (``vs_suffix``), tokens per verify step and draft tokens per draft over
    all rounds' counters, requests and identical texts summed."""
    by: dict[tuple[str, int], dict[int, dict[str, Any]]] = {}
    for r in rows:
        by.setdefault((r["config"], r["concurrency"]), {})[r.get("round", 0)] = r
    out = []
    for (name, concurrency), mine in by.items():
        drafts = sum(r.get("num_drafts") or 0 for r in mine.values())
        identical = [r.get("identical") for r in mine.values()]
        out.append({
            "config": name, "concurrency": concurrency, "rounds": len(mine),
            "output_tok_s": statistics.median(r["output_tok_s"] for r in mine.values()),
            "speedup": _median_ratio(mine, by.get(("none", concurrency), {})),
            "vs_suffix": _median_ratio(mine, by.get(("suffix", concurrency), {})),
            "acceptance_length": 1 + sum(r["num_accepted_tokens"] for r in mine.values())
            / drafts if drafts else None,
            "draft_length": sum(r["num_draft_tokens"] for r in mine.values()) / drafts
            if drafts else None,
            "requests": sum(r["requests"] for r in mine.values()),
            "identical": None if None in identical else sum(identical)})
    return out


def _median_ratio(mine: dict[int, dict[str, Any]], theirs: dict[int, dict[str, Any]]
                  ) -> float | None:
    """The median over the rounds both ran (rows by round) of one's output tokens/s over the
    other's; None without a common round."""
    found = [row["output_tok_s"] / theirs[r]["output_tok_s"] for r, row in mine.items()
             if r in theirs]
    return statistics.median(found) if found else None


def report(rows: list[dict[str, Any]], header: str) -> str:
    summary = summarise(rows)
    by = {(r["config"], r["concurrency"]): r for r in summary}
    names = list(dict.fromkeys(r["config"] for r in summary))
    concurrencies = sorted({r["concurrency"] for r in summary})
    lines = [header, "", "| concurrency | " + " | ".join(names) + " | jacobi / suffix |",
             "|---" * (len(names) + 2) + "|"]
    for c in concurrencies:
        plain = by.get(("none", c))
        cells = []
        for name in names:
            r = by.get((name, c))
            if r is None:
                cells.append("")
                continue
            text = f"{r['output_tok_s']:.1f}"
            if plain is not None and name != "none" and r["speedup"] is not None:
                text += f" ({r['speedup']:.2f}x"
                text += f", {r['acceptance_length']:.2f} tok/step" \
                    if r["acceptance_length"] else ""
                text += f", drafts of {r['draft_length']:.1f}" if r.get("draft_length") else ""
                text += f", {r['identical']}/{r['requests']} identical)"
            cells.append(text)
        ratio = ""
        if ("suffix", c) in by:  # each jacobi server's, its name where there are several
            jacobis = [n for n in names if n.startswith("jacobi") and (n, c) in by]
            ratio = "; ".join(
                (f"{n}: " if len(jacobis) > 1 else "") + f"{by[n, c]['vs_suffix']:.2f}x"
                for n in jacobis if by[n, c]["vs_suffix"] is not None)
        lines.append(f"| {c} | " + " | ".join(cells) + f" | {ratio} |")
    rounds = max(r["rounds"] for r in summary)
    lines += ["", "Output tokens/s under `vllm bench serve`"
              + (f" (median of {rounds} rounds; ratios: medians of per-round ratios)"
                 if rounds > 1 else "")
              + "; in brackets: the speed-up over plain decoding, tokens per verify step, "
              "and texts identical to plain decoding's."]
    return "\n".join(lines) + "\n"


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = summarise(rows)
    names = list(dict.fromkeys(r["config"] for r in rows))
    concurrencies = sorted({r["concurrency"] for r in rows})
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / len(names)
    for j, name in enumerate(names):
        values = [next((r["output_tok_s"] for r in rows if r["config"] == name
                        and r["concurrency"] == c), 0) for c in concurrencies]
        ax.bar([i + j * width for i in range(len(concurrencies))], values, width, label=name)
    ax.set_xticks([i + width * (len(names) - 1) / 2 for i in range(len(concurrencies))],
                  [f"concurrency {c}" for c in concurrencies])
    ax.set_ylabel("output tokens/s")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--model", default="smollm2-135m-cllm-gsm")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--num-prompts", type=int, default=32,
                        help="per concurrency and round")
    parser.add_argument("--prompts-at-1", type=int, default=6, help="per round")
    parser.add_argument("--rounds", type=int, default=3,
                        help="prompt sets per concurrency, each run by every server in turn")
    parser.add_argument("--output-len", type=int, default=256)
    parser.add_argument("--configs", nargs="+", default=["none", "suffix", "jacobi"],
                        choices=["none", "suffix", "jacobi"])
    parser.add_argument("--jacobi", default=json.dumps(JACOBI),
                        help="the jacobi speculative config (JSON)")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME=JSON",
                        help="one more server: the jacobi config with these options on top, "
                             "named 'jacobi NAME' (repeatable)")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model = str(model_path(args.model))
    sizes = {"warmup": 8, **{f"c{c}r{r}": args.prompts_at_1 if c == 1 else args.num_prompts
                             for c in args.concurrency for r in range(args.rounds)}}
    sets = prompt_sets(model, sizes)
    specs = {"none": None, "suffix": SUFFIX, "jacobi": json.loads(args.jacobi)}
    chosen = {name: specs[name] for name in args.configs}
    for variant in args.variant:
        label, _, options = variant.partition("=")
        if not label or not options:
            parser.error(f"--variant {variant!r}: expected NAME=JSON")
        chosen[f"jacobi {label}"] = {**json.loads(args.jacobi), **json.loads(options)}
    saved = out / "results.json"
    rows = [r for r in (json.loads(saved.read_text())["rows"] if saved.exists() else [])
            if r["config"] not in chosen]
    rows += run_configs(chosen, model, sets, args.concurrency, args.output_len, out,
                        args.rounds)
    compare(rows)
    header = (f"{args.model}, `vllm bench serve`, {time.strftime('%Y-%m-%d')}: "
              f"{args.rounds} round(s) of {args.prompts_at_1} prompts at concurrency 1 and "
              f"{args.num_prompts} at the others (ShareGPT + gsm), up to {args.output_len} "
              "tokens, greedy; the servers up at once, measured in turn")
    saved.write_text(json.dumps({"header": header, "rows": rows}, indent=1))
    table = report(rows, header)
    (out / "table.md").write_text(table)
    plot(rows, out / "serve_compare.png")
    print(table)


if __name__ == "__main__":
    main()
