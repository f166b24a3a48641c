"""Export a trained LoRA adapter as the small artifact kept in git (float16 safetensors).

``vllm-cllm model-path <name>`` rebuilds the full checkpoint from the base model plus this
artifact (see :func:`vllm_cllm.runtime.checkpoints.merge_adapter`), so a demo checkpoint
costs megabytes in the repository instead of the model's full size.

    python -m vllm_cllm.training.artifact results/cllm-gsm/round3/adapter \
        vllm_cllm/artifacts/smollm2-135m-cllm-gsm
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from vllm_cllm.training.space import MASK_TOKEN_FILE

ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
#: What an adapter trains: LoRA matrices and peft's trainable token rows (the SPACE mask).
TRAINED_PARTS = ("lora_", "trainable_tokens")


def export_adapter(adapter_dir: Path, out_dir: Path, base: str = "smollm2-135m-instruct"
                   ) -> Path:
    """Copy the adapter's config and its weights cast to float16; returns the weights file.
    ``base`` is the ``vllm-cllm model-path`` name of the checkpoint it was trained on."""
    import torch
    from safetensors.torch import load_file, save_file

    out_dir.mkdir(parents=True, exist_ok=True)
    config = json.loads((adapter_dir / ADAPTER_FILES[0]).read_text())
    config["base_model_name_or_path"] = base  # a vllm-cllm model name
    (out_dir / ADAPTER_FILES[0]).write_text(json.dumps(config, indent=1, sort_keys=True))
    weights = {k: v for k, v in load_file(str(adapter_dir / ADAPTER_FILES[1])).items()
               if any(part in k for part in TRAINED_PARTS)}  # not whole embedding copies
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
    args = parser.parse_args()
    path = export_adapter(args.adapter_dir, args.out_dir, args.base)
    print(f"{path} ({path.stat().st_size / 2**20:.1f} MiB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
