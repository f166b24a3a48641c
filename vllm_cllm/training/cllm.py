"""CLLM consistency distillation on Hugging Face Trainer (accelerate/FSDP need no code change).

Each training example is one prompt: its greedy answer and the noisy states of every block,
packed into one forward (:mod:`.packing`). The student sees context + noisy block, the
teacher (same model, stop-gradient) context + fixed point. Loss:
``consistency (global: noisy state vs fixed point; local: vs the next state) + ω · AR``,
where the AR loss is next-token cross-entropy on the greedy answer (CLLM's collapse guard).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from vllm_cllm.training.batching import pad_packed_rows
from vllm_cllm.training.losses import ar_loss, consistency_loss
from vllm_cllm.training.packing import PackedExample, group_by_prompt, pack_prompt
from vllm_cllm.training.trainer import (
    logging_trainer_class,
    train_and_save,
    training_arguments,
    with_lora,
)
from vllm_cllm.training.trajectories import TrajectoryRecord


@dataclass
class CllmConfig:
    block_size: int = 16
    ar_weight: float = 1.0  # ω; CLLM's code uses 10 with label smoothing, see README
    consistency: str = "global"  # or "local"
    consistency_window: int = 0  # >0: loss on the first w positions after a state diverges
    learning_rate: float = 1e-4
    epochs: float = 1.0
    batch_size: int = 1  # prompts per device step (each is one packed row)
    states_per_block: int = 0  # 0: every state of a block; k: k of them, seeded
    grad_accum: int = 4
    lora_rank: int = 0  # 0: full fine-tune
    lora_alpha: int = 32
    max_steps: int = -1
    logging_steps: int = 10
    save_steps: int = 200
    keep_checkpoints: int = 0  # 0: keep every Trainer checkpoint (the training curve uses them)
    seed: int = 0


class TrajectoryDataset(torch.utils.data.Dataset):
    """One item per prompt: all its records packed into one row (see :mod:`.packing`)."""

    def __init__(self, records: list[TrajectoryRecord], consistency: str = "global",
                 states_per_block: int = 0, seed: int = 0, window: int = 0) -> None:
        self.groups = group_by_prompt(records)
        self.options = {"consistency": consistency, "states_per_block": states_per_block,
                        "seed": seed, "window": window}

    def __len__(self) -> int:
        return len(self.groups)

    def __getitem__(self, idx: int) -> PackedExample:
        return pack_prompt(self.groups[idx], **self.options)


def collate(examples: list[PackedExample], pad_id: int = 0) -> dict[str, torch.Tensor]:
    """Pad packed rows to the longest; loss indices become flat indices into [B*L]."""
    rows = []
    for e in examples:
        labels = torch.full_like(e.input_ids, -100)
        labels[e.answer_start:e.clean_len] = e.input_ids[e.answer_start:e.clean_len]
        rows.append((e.input_ids, e.position_ids, labels, e.attention))
    batch, width = pad_packed_rows(rows, pad_id)
    return {**batch,
            "student_index": torch.cat([e.student_index + b * width
                                        for b, e in enumerate(examples)]),
            "teacher_index": torch.cat([e.teacher_index + b * width
                                        for b, e in enumerate(examples)]),
            "loss_mask": torch.cat([e.loss_mask for e in examples])}


def cllm_loss(model: Any, batch: dict[str, torch.Tensor], ar_weight: float
              ) -> tuple[torch.Tensor, dict[str, float]]:
    """Consistency + ω·AR from one packed forward; also returns the parts for logging.

    ``fixed_point_accuracy`` is the share of loss positions where the student's argmax on a
    noisy state already is the fixed-point token: what a Jacobi step on such a state accepts.
    """
    logits = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"],
                   attention_mask=batch["attention_mask"]).logits
    flat = logits.reshape(-1, logits.shape[-1])
    student = flat[batch["student_index"]]
    teacher = flat[batch["teacher_index"]]
    mask = batch["loss_mask"]
    consistency = consistency_loss(student, teacher, mask)
    ar = ar_loss(logits, batch["labels"])
    total = consistency + ar_weight * ar
    with torch.no_grad():
        hits = (student.argmax(-1) == teacher.argmax(-1)) & mask
        accuracy = hits.sum() / mask.sum().clamp_min(1)
    return total, {"consistency": float(consistency.detach()), "ar": float(ar.detach()),
                   "fixed_point_accuracy": float(accuracy)}


def train_cllm(base_model: str, records: list[TrajectoryRecord], out_dir: str | Path,
               config: CllmConfig, *, resume: bool = True) -> Path:
    """Fine-tune ``base_model`` on the records; saves a vLLM-loadable checkpoint in out_dir.

    With ``lora_rank > 0`` only a LoRA adapter trains; it is saved under ``out_dir/adapter``
    (the small artifact to keep) and merged into the saved full checkpoint.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    random.seed(config.seed)
    torch.manual_seed(config.seed)
    out = Path(out_dir)
    tokenizer = AutoTokenizer.from_pretrained(base_model)
    model = AutoModelForCausalLM.from_pretrained(base_model, dtype=torch.float32)
    if config.lora_rank:
        model = with_lora(model, config.lora_rank, config.lora_alpha)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    trainer_cls = logging_trainer_class(lambda m, batch: cllm_loss(m, batch, config.ar_weight))
    trainer = trainer_cls(model=model, args=training_arguments(out, config),
                          train_dataset=TrajectoryDataset(records, config.consistency,
                                                        config.states_per_block, config.seed,
                                                        config.consistency_window),
                          data_collator=lambda items: collate(items, pad_id))
    return train_and_save(trainer, model, tokenizer, out, lora=bool(config.lora_rank),
                          resume=resume)
