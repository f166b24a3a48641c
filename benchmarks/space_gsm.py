"""The demo SPACE checkpoint in vLLM, against the paper's layout and the CLLM demo, in one run.

    .venv/bin/python benchmarks/space_gsm.py --out results/space_gsm

gsm_symbolic problems from a seed never used in training (1000), chat template, greedy,
256 new tokens, fp32. Rows:

* `smollm2-135m-space-gsm` without speculation and with `space` (k = 5; vLLM verifies 10
  draft slots, 5 of them masks) at batch 1 and 8; at batch 8 also its other fills, without
  the history of earlier outputs, and vLLM's `ngram`;
* the paper's auto-correct decoding (k + 1 mask groups, :mod:`vllm_cllm.bench.space_reference`,
  transformers, batch 1) on the same checkpoint and problems: its tokens per step is what the
  vLLM layout gives up against;
* the CLLM demo with `jacobi` k = 15 (and its own no-speculation rows);
* `smollm2-135m-space-cllm-gsm` (SPACE trained on the CLLM demo) with `space` k = 5, unless
  ``--space-cllm ''``;
* quality of the base, SPACE and CLLM models' own answers (accuracy, distinct-4, NLL under
  the base model).

"tokens/step" counts every decode step; for `space` it equals vLLM's acceptance length,
since every step drafts (vLLM's acceptance *rate* counts the mask slots and is halved).
Writes results.json, table.md and speed.png.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from vllm_cllm.bench.gsm import quality, run_configurations, slim, write_report
from vllm_cllm.bench.measure import speedup_bars
from vllm_cllm.runtime.checkpoints import model_path
from vllm_cllm.training.gsm import chat_prompt, gsm_problems

NGRAM = {"method": "ngram", "num_speculative_tokens": 15, "prompt_lookup_min": 2,
         "prompt_lookup_max": 4}


def configurations(k: int, space_cllm: bool) -> list[tuple[str, str, dict | None, bool]]:
    """(model, config name, speculative config, also at batch 1)."""
    space = {"method": "space", "num_speculative_tokens": k}
    extra = [("space-cllm", "none", None, True), ("space-cllm", f"space k={k}", space, True)]
    return [
        ("base", "none", None, False),
        ("space", "none", None, True),
        ("space", f"space k={k}", space, True),
        *[("space", f"space k={k} fill={fill}", {**space, "fill": fill}, False)
          for fill in ("ngram", "masks")],
        ("space", f"space k={k} history_size=0", {**space, "history_size": 0}, False),
        ("space", "vllm ngram k=15", NGRAM, False),
        ("cllm", "none", None, True),
        ("cllm", "jacobi k=15", {"method": "jacobi", "num_speculative_tokens": 15,
                                  "adaptive": False}, True),
        *(extra if space_cllm else []),
    ]


def reference_rows(space_dir: str, prompt_ids: list[list[int]], k: int, max_tokens: int,
                   vllm_tokens: list[list[int]]) -> dict:
    """The paper's layout on the same checkpoint (batch 1), and its agreement with vLLM."""
    import torch
    from tqdm import tqdm
    from transformers import AutoModelForCausalLM

    from vllm_cllm.bench.space_reference import space_generate

    model = AutoModelForCausalLM.from_pretrained(space_dir, dtype=torch.float32).eval()
    mask_id = model.config.mask_token_id
    eos = model.generation_config.eos_token_id
    eos = eos[0] if isinstance(eos, list) else eos
    tokens, steps = 0, 0
    same = 0
    start = time.perf_counter()
    for ids, plain in tqdm(list(zip(prompt_ids, vllm_tokens, strict=True)), desc="reference"):
        result = space_generate(model, ids, mask_id, k, max_tokens, eos)
        tokens += len(result.tokens)
        steps += result.steps
        same += result.tokens == plain
    return {"config": f"paper layout k={k} (transformers)", "tokens_per_step": tokens / steps,
            "problems": len(prompt_ids), "identical_to_vllm_plain": same,
            "seconds": time.perf_counter() - start}


def plot(rows: list[dict], reference: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(15, 5))
    spec = [r for r in rows if r["batch_size"] == 8 and r["config"] != "none"]
    labels = [f"{r['model']}: {r['config']} (vLLM)" for r in spec] + [
        f"space: {reference['config']}"]
    axes[0].barh(labels, [r["tokens_per_step"] for r in spec] + [reference["tokens_per_step"]])
    axes[0].set_title("tokens per decode step (every step counted)")
    axes[0].invert_yaxis()
    timed = [r for r in rows if r["config"] != "none"
             and (r["batch_size"] == 1 or r["config"].startswith(("space", "jacobi")))]
    speedup_bars(axes[1], [f"{r['model']}: {r['config']}, batch {r['batch_size']}"
                           for r in timed], [r["speedup"] for r in timed],
                 "speed-up vs no speculation (same model)")
    fig.tight_layout()
    fig.savefig(out / "speed.png", dpi=90)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="results/space_gsm")
    parser.add_argument("--space", default="smollm2-135m-space-gsm")
    parser.add_argument("--cllm", default="smollm2-135m-cllm-gsm")
    parser.add_argument("--base", default="smollm2-135m-instruct")
    parser.add_argument("--space-cllm", default="smollm2-135m-space-cllm-gsm",
                        help="SPACE trained on the CLLM demo ('' to leave it out)")
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--num-problems", type=int, default=40)
    parser.add_argument("--b1-problems", type=int, default=40)
    parser.add_argument("--seed", type=int, default=1000, help="never a training seed")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--reference-from", default="",
                        help="take the paper-layout rows from this earlier results.json "
                        "instead of recomputing them (30 min here): they depend only on the "
                        "checkpoint, the problems, k and the token budget, which must match")
    args = parser.parse_args()
    from transformers import AutoTokenizer

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dirs = {"base": str(model_path(args.base)), "space": str(model_path(args.space)),
            "cllm": str(model_path(args.cllm)),
            **({"space-cllm": str(model_path(args.space_cllm))} if args.space_cllm else {})}
    tokenizer = AutoTokenizer.from_pretrained(dirs["base"])
    problems = gsm_problems(args.num_problems, args.seed)
    prompts = [chat_prompt(tokenizer, p["question"]) for p in problems]
    prompt_ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    header = (f"{args.space} (SPACE, k={args.k}) vs the paper's layout and {args.cllm}, fp32, "
              f"{args.num_problems} gsm_symbolic problems (seed {args.seed}), chat template, "
              f"{args.max_tokens} new tokens, greedy; batch 1 on the first {args.b1_problems}; "
              f"measured {time.strftime('%Y-%m-%d')} with `benchmarks/space_gsm.py`")
    rows = run_configurations(configurations(args.k, bool(args.space_cllm)), dirs, prompts,
                              args.b1_problems, args.max_tokens,
                              progress=lambda done: write_report(slim(done), [], out, header))
    plain = next(r["tokens"] for r in rows if r["model"] == "space" and r["config"] == "none"
                 and r["batch_size"] == 8)
    settings = {"checkpoint": args.space, "problems": args.num_problems, "seed": args.seed,
                "k": args.k, "max_tokens": args.max_tokens}
    if args.reference_from:
        reference = json.loads(Path(args.reference_from).read_text())["reference"]
        if reference.get("settings") != settings:
            raise SystemExit(f"{args.reference_from} was measured with "
                             f"{reference.get('settings')}, not {settings}")
        reference["from"] = args.reference_from
    else:
        reference = reference_rows(dirs["space"], prompt_ids, args.k, args.max_tokens, plain)
        reference["settings"] = settings
    quality_rows = quality(rows, list(dirs), problems, tokenizer, prompt_ids, dirs["base"])
    lines = ["", "| model | config | batch | tokens/step | identical to vLLM plain |",
             "|---|---|---|---|---|",
             f"| space | {reference['config']} | 1 | {reference['tokens_per_step']:.2f} | "
             f"{reference['identical_to_vllm_plain']}/{reference['problems']} |"]
    print(write_report(slim(rows), quality_rows, out, header, {"reference": reference}, lines))
    plot(slim(rows), reference, out)


if __name__ == "__main__":
    main()
