"""SPACE semi-autoregressive SFT (SAR-SFT), in the layout the ``space`` proposer uses in vLLM.

In vLLM a verify step schedules ``[t0, c_1..c_m, M_1..M_k]`` with plain causal attention.
When every candidate is accepted, mask ``M_j`` sits at position ``p + j`` (``p`` = position of
``c_m``), sees the real tokens up to ``c_m`` and ``M_1..M_{j-1}``, and must predict the token
``j`` places after the bonus token (the bonus is what ``c_m``'s own logits predict). That is
SPACE's training target ("the k tokens after the next one").

Training rows pack that view efficiently, as SPACE's ``mask_efficient_train``: the clean
sequence (prompt + the model's own greedy answer, causal attention, AR loss) followed by G
mask groups; group g, for a split point ``s_g`` in the answer, has k masks at positions
``s_g + 1 .. s_g + k`` that see the clean tokens ``0..s_g`` and earlier masks of their group
only, with labels ``y[s_g + 2 .. s_g + k + 1]``. One forward trains G split points.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from vllm_cllm.runtime.mask_token import MASK_TOKEN, add_mask_token, write_mask_token_file
from vllm_cllm.training.batching import pad_packed_rows
from vllm_cllm.training.losses import anchored_answer, ar_loss
from vllm_cllm.training.trainer import ANCHORS, base_logits


@dataclass
class SarExample:
    """One packed row: clean sequence then mask groups (see the module docstring)."""

    input_ids: torch.Tensor  # [n]
    position_ids: torch.Tensor  # [n]
    attention: torch.Tensor  # [n, n] bool, True = may attend
    ar_labels: torch.Tensor  # [n], -100 except the answer tokens of the clean part
    mask_index: torch.Tensor  # [m] row positions of mask slots with a label
    mask_target: torch.Tensor  # [m] the token each of those slots must predict
    mask_offset: torch.Tensor  # [m] j - 1 for slot M_j (per-position accuracy)
    clean_len: int  # prompt + answer: the row's clean part, before the mask groups


def split_points(prompt_len: int, length: int, groups: int, rng: np.random.Generator
                 ) -> np.ndarray:
    """Distinct indices s of the last real token: in the answer, with a bonus token after it."""
    candidates = np.arange(prompt_len - 1, length - 2)  # y[s + 2] must exist
    if len(candidates) == 0:
        return candidates
    return np.sort(rng.choice(candidates, size=min(groups, len(candidates)), replace=False))


def build_sar_example(prompt_ids: list[int], answer_ids: list[int], mask_id: int, k: int,
                      groups: int, rng: np.random.Generator) -> SarExample:
    """Pack prompt + answer with ``groups`` mask groups of ``k`` masks at random split points."""
    clean = list(prompt_ids) + list(answer_ids)
    length = len(clean)
    splits = split_points(len(prompt_ids), length, groups, rng)
    size = length + len(splits) * k
    input_ids = torch.tensor(clean + [mask_id] * (len(splits) * k), dtype=torch.long)
    positions = torch.empty(size, dtype=torch.long)
    positions[:length] = torch.arange(length)
    attention = torch.zeros((size, size), dtype=torch.bool)
    attention[:length, :length] = torch.ones((length, length), dtype=torch.bool).tril()
    ar_labels = torch.full((size,), -100, dtype=torch.long)
    ar_labels[len(prompt_ids):length] = torch.tensor(answer_ids, dtype=torch.long)
    index, target, offset = [], [], []
    for g, s in enumerate(splits.tolist()):
        start = length + g * k
        for j in range(k):
            row = start + j
            positions[row] = s + 1 + j
            attention[row, :s + 1] = True
            attention[row, start:row + 1] = True
            label = s + 2 + j
            if label < length:
                index.append(row)
                target.append(clean[label])
                offset.append(j)
    return SarExample(input_ids, positions, attention, ar_labels,
                      torch.tensor(index, dtype=torch.long), torch.tensor(target, dtype=torch.long),
                      torch.tensor(offset, dtype=torch.long), length)


class SarDataset(torch.utils.data.Dataset):
    """One packed row per (prompt, answer); split points seeded per item (reproducible)."""

    def __init__(self, items: list[tuple[list[int], list[int]]], mask_id: int, k: int,
                 groups: int, seed: int = 0) -> None:
        self.items = [(p, a) for p, a in items if len(a) >= 3]
        self.mask_id, self.k, self.groups, self.seed = mask_id, k, groups, seed

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, idx: int) -> SarExample:
        rng = np.random.default_rng([self.seed, idx, 0])
        prompt, answer = self.items[idx]
        return build_sar_example(prompt, answer, self.mask_id, self.k, self.groups, rng)


def collate_sar(examples: list[SarExample], pad_id: int = 0) -> dict[str, torch.Tensor]:
    """Pad rows to the longest; mask indices become flat indices into [B*L]."""
    batch, width = pad_packed_rows([(e.input_ids, e.position_ids, e.ar_labels, e.attention)
                                    for e in examples], pad_id)
    return {**batch, "clean_width": torch.tensor(max(e.clean_len for e in examples)),
            "mask_index": torch.cat([e.mask_index + b * width for b, e in enumerate(examples)]),
            "mask_target": torch.cat([e.mask_target for e in examples]),
            "mask_offset": torch.cat([e.mask_offset for e in examples])}


def sar_loss(model: Any, batch: dict[str, torch.Tensor], mask_weight: float,
             anchor: str = "self", ar_weight: float = 1.0, base: Any = None
             ) -> tuple[torch.Tensor, dict[str, float]]:
    """``ar_weight`` × AR term on the clean answer + ``mask_weight`` × cross-entropy at the
    mask slots.

    The AR term is, with ``anchor`` "self" (SPACE's SAR-SFT), cross-entropy on the answer; with
    "base", KL(base || model) on the answer's next-token distributions, the base being ``base``
    or, for a LoRA model, the same weights with the adapter off. The mask slots learn to guess
    what the model will say; the base anchor keeps what it says the base's, so that the
    guesses learnt on the base's answers stay right on unseen prompts.

    Also returns the parts, and ``mask_accuracy`` (top-1 at the first mask slot): how often
    the first candidate SPACE drafts after a fully accepted step is right.
    """
    logits = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"],
                   attention_mask=batch["attention_mask"]).logits
    parts: dict[str, float] = {}
    if anchor == "base":
        anchored = anchored_answer(logits, base_logits(model, batch, base), batch["labels"])
        ar, parts["greedy_agreement"] = anchored.loss, anchored.greedy_agreement
    else:
        ar = ar_loss(logits, batch["labels"])
    at_masks = logits.reshape(-1, logits.shape[-1])[batch["mask_index"]].float()
    mask = F.cross_entropy(at_masks, batch["mask_target"]) if len(at_masks) else ar * 0
    with torch.no_grad():
        first = batch["mask_offset"] == 0
        hits = (at_masks.argmax(-1) == batch["mask_target"]) & first
        accuracy = hits.sum() / first.sum().clamp_min(1)
    return ar_weight * ar + mask_weight * mask, {
        **parts, "ar": float(ar.detach()), "mask": float(mask.detach()),
        "mask_accuracy": float(accuracy)}


@dataclass
class SpaceConfig:
    k: int = 5  # masks per group = candidates the proposer drafts
    groups: int = 16  # split points (mask groups) per answer and forward
    mask_weight: float = 1.0
    anchor: str = "self"  # the AR term: "self" (SAR-SFT's cross-entropy) or "base" (see sar_loss)
    ar_weight: float = 1.0  # ω, the AR term's weight
    learning_rate: float = 2e-4
    epochs: float = 1.0
    batch_size: int = 1
    grad_accum: int = 4
    lora_rank: int = 32  # 0: full fine-tune (the whole embedding then trains too)
    lora_alpha: int = 32
    max_steps: int = -1
    stop_step: int = 0  # >0: end the run after this step of the max_steps schedule
    logging_steps: int = 10
    save_steps: int = 50
    keep_checkpoints: int = 2
    seed: int = 0
    precision: str = "fp32"  # or "bf16": mixed precision (a GPU's fast path)
    data_workers: int = 0  # DataLoader processes that pack rows while the device computes


def check_space_config(config: SpaceConfig) -> None:
    """Refuses a config that cannot train, before any model loads."""
    if config.anchor not in ANCHORS:
        raise ValueError(f"anchor must be one of {ANCHORS}; got {config.anchor!r}")
    if config.ar_weight < 0 or config.mask_weight < 0:
        raise ValueError(f"ar_weight and mask_weight must be >= 0; got {config.ar_weight} "
                         f"and {config.mask_weight}")


def train_space(base_model: str, items: list[tuple[list[int], list[int]]], out_dir: str | Path,
                config: SpaceConfig, *, resume: bool = True) -> Path:
    """SAR-SFT of ``base_model`` on (prompt_ids, answer_ids); saves a vLLM-loadable checkpoint.

    With LoRA, only the adapter and the mask token's embedding row train (peft's
    ``trainable_token_indices``); ``out_dir/adapter`` is the small artifact, merged on save.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from vllm_cllm.training.trainer import (
        logging_trainer_class,
        train_and_save,
        training_arguments,
        with_lora,
    )

    check_space_config(config)
    torch.manual_seed(config.seed)
    out = Path(out_dir)
    tokenizer = AutoTokenizer.from_pretrained(base_model)
    model = AutoModelForCausalLM.from_pretrained(base_model, dtype=torch.float32)
    mask_id = add_mask_token(model, tokenizer)
    base = None
    if config.anchor == "base" and not config.lora_rank:  # full fine-tune: a frozen copy, its
        # mask row the model's own (the resize draws the new row at random)
        base = copy.deepcopy(model).eval().requires_grad_(False)
    if config.lora_rank:  # the adapter + the mask token's embedding row
        model = with_lora(model, config.lora_rank, config.lora_alpha,
                          trainable_token_indices=[mask_id])
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    trainer_cls = logging_trainer_class(lambda m, batch: sar_loss(
        m, batch, config.mask_weight, config.anchor, config.ar_weight, base))
    trainer = trainer_cls(model=model, args=training_arguments(out, config),
                          train_dataset=SarDataset(items, mask_id, config.k, config.groups,
                                                   config.seed),
                          data_collator=lambda rows: collate_sar(rows, pad_id))
    if config.lora_rank:  # every saved checkpoint merges as the final adapter does
        trainer.add_callback(_mask_token_recorder(mask_id, config.k))
    # the saved config carries mask_token_id (set by add_mask_token)
    saved = train_and_save(trainer, model, tokenizer, out, lora=bool(config.lora_rank),
                           resume=resume, stop_step=config.stop_step)
    if config.lora_rank:
        write_mask_token_file(out / "adapter", MASK_TOKEN, mask_id, config.k)
    return saved


def _mask_token_recorder(mask_id: int, k: int):
    """A callback that writes ``mask_token.json`` into each Trainer checkpoint it saves, so
    ``merge_adapter`` builds a servable model from any of them."""
    from transformers import TrainerCallback

    class RecordMaskToken(TrainerCallback):
        def on_save(self, args, state, control, **kwargs):
            folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            write_mask_token_file(folder, MASK_TOKEN, mask_id, k)
            return control

    return RecordMaskToken()
