"""The demo CLLM against its base model, side by side in one run: speed, lossless, collapse.

    .venv/bin/python benchmarks/cllm_gsm.py --out results/cllm_gsm

gsm_symbolic problems from a seed never used in training (1000) — the first 40 whose question
is not also among the training prompts (gsm_symbolic's templates repeat across seeds) —, chat
template, greedy, 256 new tokens. For the CLLM (`smollm2-135m-cllm-gsm`) and its base
(SmolLM2-135M-Instruct):
no speculation, `jacobi` (k = 15 and the other --ks) and vLLM's `ngram` (k = 15, lookup 2-4);
batch 1 (one prompt at a time) and batch 8. "Accept. length" is vLLM's mean acceptance length
(over the steps that drafted, counting drafts accepted past the end of an answer);
"tokens/step" is output tokens over every engine step a request took, the prefill step that
gave its first token included; "tokens/verify step" leaves that step and its token out: output
tokens after the first over the decode steps, also those where a proposer drafted nothing
(``ngram`` without a match), so both compare proposers fairly.
Quality: final-answer accuracy, distinct-4 of the answers, and the answers' mean NLL
under the base model. Writes results.json, table.md and speed.png.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from vllm_cllm.bench.gsm import quality, run_configurations, slim, write_report
from vllm_cllm.bench.measure import speedup_bars
from vllm_cllm.runtime.checkpoints import model_path
from vllm_cllm.training.gsm import chat_prompt, unseen_problems

NGRAM = {"method": "ngram", "num_speculative_tokens": 15, "prompt_lookup_min": 2,
         "prompt_lookup_max": 4}


def configurations(ks: list[int], b1_ks: list[int]) -> list[tuple[str, str, dict | None, bool]]:
    """(model, config name, speculative config, also at batch 1)."""
    jacobi = {k: {"method": "jacobi", "num_speculative_tokens": k, "adaptive": False}
              for k in ks}
    return [
        ("base", "none", None, False),
        ("base", "jacobi k=15", jacobi[15], False),
        ("base", "vllm ngram k=15", NGRAM, False),
        ("cllm", "none", None, True),
        *[("cllm", f"jacobi k={k}", jacobi[k], k in b1_ks) for k in ks],
        ("cllm", "vllm ngram k=15", NGRAM, False),
    ]


def plot(rows: list[dict], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    spec = [r for r in rows if r["config"] != "none"]
    names = list(dict.fromkeys(f"{r['model']}: {r['config']}" for r in spec))
    for offset, batch in ((-0.2, 1), (0.2, 8)):
        value = {f"{r['model']}: {r['config']}": r["tokens_per_verify_step"]
                 for r in spec if r["batch_size"] == batch}
        at = [i + offset for i, name in enumerate(names) if name in value]
        axes[0].barh(at, [value[n] for n in names if n in value], height=0.4,
                     label=f"batch {batch}")
    axes[0].set_yticks(range(len(names)), names)
    axes[0].axvline(3.5, color="black", linestyle="--", linewidth=0.8)
    axes[0].set_title("tokens per verify step (dashed: 3.5)")
    axes[0].invert_yaxis()
    axes[0].legend(loc="lower right")
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
    parser.add_argument("--training-seed", type=int, default=1,
                        help="the CLLM's training prompts (the demo's: seed 1, 400 prompts); "
                        "evaluation problems found among them are skipped")
    parser.add_argument("--training-prompts", type=int, default=400)
    args = parser.parse_args()
    from transformers import AutoTokenizer

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dirs = {"base": str(model_path(args.base)), "cllm": str(model_path(args.cllm))}
    tokenizer = AutoTokenizer.from_pretrained(dirs["base"])
    problems = unseen_problems(args.num_problems, args.seed,
                               [(args.training_seed, args.training_prompts)])
    prompts = [chat_prompt(tokenizer, p["question"]) for p in problems]
    ks = [int(k) for k in args.ks.split(",")]
    b1_ks = [int(k) for k in args.b1_ks.split(",")]
    header = (f"{args.cllm} vs {args.base}, fp32, {args.num_problems} gsm_symbolic problems "
              f"(seed {args.seed}, none verbatim among the first {args.training_prompts} "
              f"of training seed {args.training_seed}), chat template, {args.max_tokens} new "
              "tokens, greedy; "
              f"batch 1 on the first {args.b1_problems}; measured {time.strftime('%Y-%m-%d')} "
              "with `benchmarks/cllm_gsm.py`")
    rows = run_configurations(configurations(ks, b1_ks), dirs, prompts, args.b1_problems,
                              args.max_tokens,
                              progress=lambda done: write_report(slim(done), [], out, header))
    prompt_ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    quality_rows = quality(rows, ["base", "cllm"], problems, tokenizer, prompt_ids,
                           dirs["base"])
    print(write_report(slim(rows), quality_rows, out, header))
    plot(slim(rows), out)


if __name__ == "__main__":
    main()
