"""Export a trained LoRA adapter as the small artifact kept in git (float16 safetensors), and
average adapters trained from one starting adapter into one.

``vllm-cllm model-path <name>`` rebuilds the full checkpoint from the base model plus this
artifact (see :func:`vllm_cllm.runtime.checkpoints.merge_adapter`), so a demo checkpoint
costs megabytes in the repository instead of the model's full size. An average of n rank-r
adapters is exact at rank n * r; ``--max-rank`` keeps the artifact's size bounded by storing
each layer's best low-rank approximation of the delta instead (truncated SVD).

    python -m vllm_cllm.training.artifact results/cllm-gsm/round3/adapter \
        vllm_cllm/artifacts/smollm2-135m-cllm-gsm [--max-rank 64]
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from vllm_cllm.runtime.mask_token import MASK_TOKEN_FILE

if TYPE_CHECKING:
    import torch

ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
#: What an adapter trains: LoRA matrices and peft's trainable token rows (the SPACE mask).
TRAINED_PARTS = ("lora_", "trainable_tokens")


def _plain_lora(config: dict, where: Path | str) -> float:
    """The adapter's scaling alpha / r; only one rank and alpha for every layer is handled."""
    if config.get("use_rslora") or config.get("rank_pattern") or config.get("alpha_pattern"):
        raise ValueError(f"{where}: rsLoRA or per-layer ranks are not supported here")
    return config["lora_alpha"] / config["r"]


def average_adapters(adapters: list[Path], out: Path) -> int:
    """Write the equal-weight mean of ``adapters``' deltas as one LoRA adapter of their summed
    rank to ``out``; returns that rank. The mean of the deltas s_i B_i A_i / n is
    [B_1 .. B_n] [A_1; ..; A_n] with sqrt(s_i / n) on each factor, so the result has
    alpha = r and rebuilds the averaged weights exactly; a further round can train on from it."""
    import torch
    from safetensors.torch import load_file, save_file

    if len(adapters) < 2:
        raise ValueError("an average needs at least two adapters")
    configs = [json.loads((a / ADAPTER_FILES[0]).read_text()) for a in adapters]
    states = [load_file(str(a / ADAPTER_FILES[1])) for a in adapters]
    factors = [math.sqrt(_plain_lora(c, a)) / math.sqrt(len(adapters))
               for c, a in zip(configs, adapters, strict=True)]
    for adapter, state in zip(adapters[1:], states[1:], strict=True):
        if set(state) != set(states[0]):
            raise ValueError(f"{adapter} adapts other layers than {adapters[0]}")
    mean = {}
    for name in states[0]:
        if "lora_A" not in name and "lora_B" not in name:
            raise ValueError(f"{name}: only LoRA A and B matrices can be averaged")
        dim = 0 if "lora_A" in name else 1  # A stacks its rows, B its columns
        mean[name] = torch.cat([s[name] * f for s, f in zip(states, factors, strict=True)],
                               dim).contiguous()
    out.mkdir(parents=True, exist_ok=True)
    for item in adapters[0].iterdir():
        if item.is_file() and item.name not in ADAPTER_FILES:
            shutil.copy(item, out / item.name)
    rank = sum(c["r"] for c in configs)
    (out / ADAPTER_FILES[0]).write_text(json.dumps({**configs[0], "r": rank, "lora_alpha": rank},
                                                   indent=2))
    save_file(mean, str(out / ADAPTER_FILES[1]), metadata={"format": "pt"})
    return rank


def truncate_rank(weights: dict[str, torch.Tensor], scaling: float, max_rank: int
                  ) -> tuple[dict[str, torch.Tensor], float]:
    """Each layer's delta ``scaling * B @ A`` as its best rank-``max_rank`` approximation
    (Eckart-Young), with the scaling folded in (the result has alpha = r = ``max_rank``).
    Returns the new weights and the relative Frobenius norm of what was dropped, over all
    layers. The SVD runs on the r x r core of QR factorisations, never on a full matrix."""
    import torch

    out = dict(weights)
    dropped = total = 0.0
    for name_a in [n for n in weights if "lora_A" in n]:
        name_b = name_a.replace("lora_A", "lora_B")
        a, b = weights[name_a].double(), weights[name_b].double()
        q_b, r_b = torch.linalg.qr(b)              # B = Qb Rb
        q_a, r_a = torch.linalg.qr(a.T)            # A^T = Qa Ra
        u, s, vh = torch.linalg.svd(scaling * r_b @ r_a.T)
        keep = min(max_rank, s.numel())
        root = s[:keep].sqrt()
        out[name_b] = ((q_b @ u[:, :keep]) * root).to(weights[name_b].dtype).contiguous()
        out[name_a] = (root[:, None] * (vh[:keep] @ q_a.T)).to(weights[name_a].dtype).contiguous()
        dropped += float((s[keep:] ** 2).sum())
        total += float((s ** 2).sum())
    return out, math.sqrt(dropped / total) if total else 0.0


def export_adapter(adapter_dir: Path, out_dir: Path, base: str = "smollm2-135m-instruct",
                   max_rank: int | None = None) -> Path:
    """Copy the adapter's config and its weights cast to float16; returns the weights file.
    ``base`` is the ``vllm-cllm model-path`` name of the checkpoint it was trained on. With
    ``max_rank`` below the adapter's rank each layer's delta is stored at that rank
    (:func:`truncate_rank`)."""
    import torch
    from safetensors.torch import load_file, save_file

    config = json.loads((adapter_dir / ADAPTER_FILES[0]).read_text())
    weights = {k: v for k, v in load_file(str(adapter_dir / ADAPTER_FILES[1])).items()
               if any(part in k for part in TRAINED_PARTS)}  # not whole embedding copies
    if max_rank is not None and max_rank < config["r"]:
        weights, dropped = truncate_rank(weights, _plain_lora(config, adapter_dir), max_rank)
        config.update(r=max_rank, lora_alpha=max_rank)
        print(f"rank {max_rank} of {adapter_dir}'s deltas: {dropped:.2%} of their norm dropped")
    config["base_model_name_or_path"] = base  # a vllm-cllm model name
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / ADAPTER_FILES[0]).write_text(json.dumps(config, indent=1, sort_keys=True))
    save_file({k: v.to(torch.float16).contiguous() for k, v in weights.items()},
              str(out_dir / ADAPTER_FILES[1]))
    if (adapter_dir / MASK_TOKEN_FILE).exists():  # a SPACE adapter: the merge adds the token
        shutil.copy(adapter_dir / MASK_TOKEN_FILE, out_dir / MASK_TOKEN_FILE)
    return out_dir / ADAPTER_FILES[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("adapter_dir", type=Path)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--base", default="smollm2-135m-instruct",
                        help="vllm-cllm model name the adapter was trained on")
    parser.add_argument("--max-rank", type=int, default=None,
                        help="store each layer's delta at most at this rank (truncated SVD)")
    args = parser.parse_args()
    if args.max_rank is not None and args.max_rank < 1:
        parser.error(f"--max-rank must be at least 1, got {args.max_rank}")
    path = export_adapter(args.adapter_dir, args.out_dir, args.base, args.max_rank)
    print(f"{path} ({path.stat().st_size / 2**20:.1f} MiB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
