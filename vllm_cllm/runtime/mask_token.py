"""The SPACE mask token: how a checkpoint gains it and how an adapter records it.

Training adds the token before fine-tuning; building a checkpoint from a SPACE adapter adds
it again, identically, before the adapter loads. Both sides use this module, so the token,
its id and the file that records them cannot disagree.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

MASK_TOKEN = "<|mask|>"
#: Written next to a SPACE adapter: the merge adds the mask token before loading it.
MASK_TOKEN_FILE = "mask_token.json"


def add_mask_token(model: Any, tokenizer: Any, token: str = MASK_TOKEN) -> int:
    """Add ``token`` to the tokenizer (as its mask token) and the embeddings; returns its id.

    The embedding matrix grows to exactly the tokenizer's size (no padding rows that the
    model could ever predict); the new row starts at the mean embedding (transformers'
    default). ``config.mask_token_id`` records the id, where the ``space`` proposer (and vLLM's
    own parallel drafting) looks for it.
    """
    if token not in tokenizer.get_vocab():
        tokenizer.add_special_tokens({"mask_token": token})
    else:
        tokenizer.mask_token = token
    mask_id = tokenizer.convert_tokens_to_ids(token)
    if model.get_input_embeddings().weight.shape[0] <= mask_id:
        model.resize_token_embeddings(len(tokenizer))
    model.config.mask_token_id = mask_id
    return mask_id


def write_mask_token_file(folder: Path, token: str, mask_id: int, k: int) -> None:
    """Record the adapter's mask token, its id and the k it was trained for."""
    (folder / MASK_TOKEN_FILE).write_text(json.dumps(
        {"mask_token": token, "mask_token_id": mask_id, "k": k}, indent=1))


def read_mask_token_file(folder: Path) -> dict[str, Any] | None:
    """The record :func:`write_mask_token_file` left in ``folder``; None for a plain adapter."""
    path = Path(folder) / MASK_TOKEN_FILE
    return json.loads(path.read_text()) if path.exists() else None
