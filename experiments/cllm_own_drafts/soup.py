"""A weight-space average ("model soup") of merged checkpoints that share an ancestor: every
tensor the (weighted) mean of the models' tensors, the rest of the first model's folder copied
beside it. Checkpoints fine-tuned from one round drift in different directions (one prompt
format gains, the other loses); the average asks whether their skills add up where their drift
cancels. With the base model as the second model and weights ``a, 1 - a`` it scales the
fine-tuned delta by ``a`` (a LoRA adapter scaled the same way rebuilds it). LoRA adapters
average exactly, as one adapter a further round trains on from, with ``vllm-cllm train average``.

    .venv/bin/python experiments/cllm_own_drafts/soup.py --out results/soup/ce \\
        results/lr1e3c/round3/model results/lr1e3e/round3/model
    .venv/bin/python experiments/cllm_own_drafts/soup.py --out results/soup/a08 \\
        --weights 0.8,0.2 results/lr2e3/round3/model ~/.cache/vllm-cllm/models/smollm2-135m-instruct
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from safetensors.torch import load_file, save_file

WEIGHTS = "model.safetensors"


def soup(models: list[Path], out: Path, weights: list[float] | None = None) -> int:
    """Write the mean of ``models``' weights (weighted by ``weights``, which sum to 1; equal when
    None) to ``out``; returns the number of tensors."""
    weights = weights or [1 / len(models)] * len(models)
    if len(weights) != len(models) or abs(sum(weights) - 1) > 1e-6:
        raise SystemExit(f"{len(models)} models need as many weights summing to 1, got {weights}")
    states = [load_file(str(m / WEIGHTS)) for m in models]
    names = set(states[0])
    for model, state in zip(models[1:], states[1:], strict=True):
        if set(state) != names:
            raise SystemExit(f"{model} holds other tensors than {models[0]}: not one architecture")
    out.mkdir(parents=True, exist_ok=True)
    for item in models[0].iterdir():
        if item.is_file() and item.name != WEIGHTS:
            shutil.copy(item, out / item.name)
    mean = {name: sum(w * s[name].float() for w, s in zip(weights, states, strict=True))
            .to(states[0][name].dtype).contiguous() for name in names}
    save_file(mean, str(out / WEIGHTS), metadata={"format": "pt"})
    return len(mean)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("models", nargs="+", type=Path, help="merged model folders")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--weights", type=lambda s: [float(w) for w in s.split(",")],
                        help="one weight per model, comma-separated, summing to 1 "
                        "(default: equal)")
    args = parser.parse_args()
    if len(args.models) < 2:
        parser.error("a soup needs at least two models")
    print(f"{soup(args.models, args.out, args.weights)} tensors averaged into {args.out}")


if __name__ == "__main__":
    main()
