"""Training curve of a CLLM run: losses from the Trainer log, tokens per step from vLLM.

    .venv/bin/python benchmarks/cllm_training_curve.py --run results/cllm-gsm-noise/run \
        --out docs/results/cllm_gsm

Losses (consistency and AR, per example) and the fixed-point accuracy come from the run's
``log_history.json``. Tokens per verify step is measured for real: every saved Trainer
checkpoint's adapter is merged into the base model and served by vLLM with ``jacobi``
(k = 15, fixed, ``--fill``: ``hybrid``, or ``tail`` for pure Jacobi) on validation problems
(gsm_symbolic seed 999: neither a training nor the eval seed);
step 0 is the base model. Writes curve.json and training_curve.png.

A run that continues an earlier one's checkpoint (``vllm-cllm train cllm --init-adapter``)
is drawn after it: ``--prior OUT/curve.json --prior-step N`` takes the earlier curve up to
step N and numbers this run's steps from N.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from tqdm import tqdm

from vllm_cllm.bench.measure import jacobi_tpf
from vllm_cllm.runtime.checkpoints import merged_checkpoint, model_path
from vllm_cllm.training.gsm import chat_prompt, gsm_problems


def checkpoints(run: Path) -> list[tuple[int, Path]]:
    found = []
    for path in (run / "trainer").glob("checkpoint-*"):
        match = re.fullmatch(r"checkpoint-(\d+)", path.name)
        if match and (path / "adapter_model.safetensors").exists():
            found.append((int(match.group(1)), path))
    return sorted(found)


def plot(history: list[dict], tpf: list[dict], out: Path, k: int, fill: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    logged = [h for h in history if "loss_consistency" in h]
    steps = [h["step"] for h in logged]
    for key, label in (("loss_consistency", "consistency"), ("loss_ar", "AR")):
        left.plot(steps, [h[key] for h in logged], label=label)
    left.set_xlabel("optimizer step")
    left.set_ylabel("loss")
    left.set_yscale("log")
    left.legend()
    twin = left.twinx()
    twin.plot(steps, [h["fixed_point_accuracy"] for h in logged], color="grey",
              linestyle=":", label="fixed-point accuracy")
    twin.set_ylabel("fixed-point accuracy (dotted)")
    right.plot([t["step"] for t in tpf], [t["tpf"] for t in tpf], marker="o")
    right.set_xlabel("optimizer step")
    right.set_ylabel(f"tokens per step (vLLM, jacobi k={k}, fill {fill})")
    right.set_title("measured on validation problems")
    fig.tight_layout()
    fig.savefig(out / "training_curve.png", dpi=90)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", default="results/cllm-gsm-noise/run")
    parser.add_argument("--out", default="docs/results/cllm_gsm")
    parser.add_argument("--base", default="smollm2-135m-instruct")
    parser.add_argument("--num-problems", type=int, default=16)
    parser.add_argument("--seed", type=int, default=999)
    parser.add_argument("--k", type=int, default=15)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--fill", default="hybrid",
                        help="jacobi's fill: hybrid (lookups too) or tail (pure Jacobi)")
    parser.add_argument("--prior", type=Path, default=None,
                        help="curve.json of the run this one continues")
    parser.add_argument("--prior-step", type=int, default=0,
                        help="the step of the prior run this one started from")
    args = parser.parse_args()
    from transformers import AutoTokenizer

    run, out = Path(args.run), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    base = model_path(args.base)
    tokenizer = AutoTokenizer.from_pretrained(base)
    prompts = [chat_prompt(tokenizer, p["question"])
               for p in gsm_problems(args.num_problems, args.seed)]
    offset = args.prior_step
    tpf, history = [], []
    if args.prior:
        prior = json.loads(args.prior.read_text())
        tpf = [t for t in prior["tpf"] if t["step"] <= offset]
        history = [h for h in prior["history"] if h.get("step", 0) <= offset]
    points = [] if args.prior else [(0, None)]
    for step, adapter in tqdm([*points, *checkpoints(run)], desc="checkpoints"):
        with merged_checkpoint(base, adapter) as model_dir:
            tpf.append({"step": offset + step,
                        "tpf": jacobi_tpf(model_dir, prompts, args.k, args.max_tokens,
                                          args.fill)})
        print(tpf[-1])
    history += [{**h, "step": offset + h["step"]} if "step" in h else h
                for h in json.loads((run / "log_history.json").read_text())]
    (out / "curve.json").write_text(json.dumps({"fill": args.fill, "k": args.k, "tpf": tpf,
                                                "history": history}, indent=1))
    plot(history, tpf, out, args.k, args.fill)


if __name__ == "__main__":
    main()
