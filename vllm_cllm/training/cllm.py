"""CLLM consistency distillation on Hugging Face Trainer (accelerate/FSDP need no code change).

Each training example is one trajectory state: the student sees context + noisy block, the
teacher (same model, stop-gradient) sees context + fixed point. Loss per example:
``consistency (global: noisy state vs fixed point; local: vs the next state) + ω · AR``,
where the AR loss is next-token cross-entropy on the greedy answer (CLLM's collapse guard).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from vllm_cllm.training.losses import ar_loss, block_mask, consistency_loss
from vllm_cllm.training.trajectories import TrajectoryRecord


@dataclass
class CllmConfig:
    block_size: int = 16
    ar_weight: float = 1.0  # ω; CLLM's code uses 10 with label smoothing, see README
    consistency: str = "global"  # or "local"
    learning_rate: float = 1e-4
    epochs: float = 1.0
    batch_size: int = 1
    grad_accum: int = 4
    lora_rank: int = 0  # 0: full fine-tune
    lora_alpha: int = 32
    max_steps: int = -1
    logging_steps: int = 10
    save_steps: int = 200
    seed: int = 0


class TrajectoryDataset(torch.utils.data.Dataset):
    """One item per (record, state): student/teacher token ids and AR labels."""

    def __init__(self, records: list[TrajectoryRecord], consistency: str = "global") -> None:
        self.items: list[dict[str, Any]] = []
        for r in records:
            for i, state in enumerate(r.states):
                target = r.fixed_point if consistency == "global" or i + 1 >= len(r.states) \
                    else r.states[i + 1]
                self.items.append({"context": r.context_ids, "state": state, "target": target,
                                   "prompt_len": r.prompt_len, "answer": r.answer_ids})

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, idx: int) -> dict[str, Any]:
        return self.items[idx]


def collate(items: list[dict[str, Any]], pad_id: int = 0) -> dict[str, torch.Tensor]:
    """Pad to the batch's longest sequence; remember where each block starts."""
    def pad(seqs: list[list[int]], value: int) -> torch.Tensor:
        width = max(len(s) for s in seqs)
        return torch.tensor([s + [value] * (width - len(s)) for s in seqs], dtype=torch.long)

    student = [it["context"] + it["state"] for it in items]
    teacher = [it["context"] + it["target"] for it in items]
    clean = [it["context"][:it["prompt_len"]] + it["answer"] for it in items]
    labels = [[-100] * it["prompt_len"] + it["answer"] for it in items]
    return {
        "student_ids": pad(student, pad_id),
        "student_mask": pad([[1] * len(s) for s in student], 0),
        "teacher_ids": pad(teacher, pad_id),
        "teacher_mask": pad([[1] * len(s) for s in teacher], 0),
        "clean_ids": pad(clean, pad_id),
        "clean_mask": pad([[1] * len(s) for s in clean], 0),
        "labels": pad(labels, -100),
        "block_start": torch.tensor([len(it["context"]) for it in items]),
        "states": torch.tensor([it["state"] for it in items]),
        "targets": torch.tensor([it["target"] for it in items]),
    }


def block_logits(logits: torch.Tensor, block_start: torch.Tensor, n: int) -> torch.Tensor:
    """Logits that predict the n block tokens: positions start-1 .. start+n-2 of each row."""
    index = block_start.unsqueeze(-1) - 1 + torch.arange(n, device=logits.device)
    return torch.gather(logits, 1, index.unsqueeze(-1).expand(-1, -1, logits.shape[-1]))


def cllm_loss(model: Any, batch: dict[str, torch.Tensor], ar_weight: float
              ) -> tuple[torch.Tensor, dict[str, float]]:
    """Consistency + ω·AR for one batch; also returns the parts for logging."""
    n = batch["states"].shape[-1]
    student = model(input_ids=batch["student_ids"], attention_mask=batch["student_mask"]).logits
    with torch.no_grad():
        teacher = model(input_ids=batch["teacher_ids"],
                        attention_mask=batch["teacher_mask"]).logits
    mask = block_mask(batch["states"], batch["targets"])
    consistency = consistency_loss(block_logits(student, batch["block_start"], n),
                                   block_logits(teacher, batch["block_start"], n), mask)
    clean = model(input_ids=batch["clean_ids"], attention_mask=batch["clean_mask"]).logits
    ar = ar_loss(clean, batch["labels"])
    total = consistency + ar_weight * ar
    return total, {"consistency": float(consistency.detach()), "ar": float(ar.detach())}


def _trainer_class():
    from transformers import Trainer

    class CllmTrainer(Trainer):
        """HF Trainer whose loss is the CLLM objective (no labels column needed)."""

        ar_weight: float = 1.0

        def compute_loss(self, model, inputs, return_outputs=False, **kwargs):
            loss, parts = cllm_loss(model, inputs, self.ar_weight)
            if self.state.global_step % max(self.args.logging_steps, 1) == 0 and \
                    model.training:
                self.log({f"loss_{k}": v for k, v in parts.items()})
            return (loss, None) if return_outputs else loss

    return CllmTrainer


def train_cllm(base_model: str, records: list[TrajectoryRecord], out_dir: str | Path,
               config: CllmConfig, *, resume: bool = True) -> Path:
    """Fine-tune ``base_model`` on the records; saves a vLLM-loadable checkpoint in out_dir.

    With ``lora_rank > 0`` only a LoRA adapter trains; it is saved under ``out_dir/adapter``
    (the small artifact to keep) and merged into the saved full checkpoint.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainingArguments

    random.seed(config.seed)
    torch.manual_seed(config.seed)
    out = Path(out_dir)
    tokenizer = AutoTokenizer.from_pretrained(base_model)
    model = AutoModelForCausalLM.from_pretrained(base_model, dtype=torch.float32)
    if config.lora_rank:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(
            r=config.lora_rank, lora_alpha=config.lora_alpha, lora_dropout=0.0,
            target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                            "down_proj"], task_type="CAUSAL_LM"))
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    args = TrainingArguments(
        output_dir=str(out / "trainer"), per_device_train_batch_size=config.batch_size,
        gradient_accumulation_steps=config.grad_accum, learning_rate=config.learning_rate,
        num_train_epochs=config.epochs, max_steps=config.max_steps, lr_scheduler_type="cosine",
        warmup_steps=0.03, logging_steps=config.logging_steps, save_steps=config.save_steps,
        save_total_limit=2, report_to=[], seed=config.seed, remove_unused_columns=False,
        dataloader_num_workers=0, use_cpu=not torch.cuda.is_available())
    trainer_cls = _trainer_class()
    trainer_cls.ar_weight = config.ar_weight
    trainer = trainer_cls(model=model, args=args,
                          train_dataset=TrajectoryDataset(records, config.consistency),
                          data_collator=lambda items: collate(items, pad_id))
    checkpoints = sorted((out / "trainer").glob("checkpoint-*")) if resume else []
    trainer.train(resume_from_checkpoint=str(checkpoints[-1]) if checkpoints else None)
    if config.lora_rank:
        model.save_pretrained(out / "adapter")
        model = model.merge_and_unload()
    model.save_pretrained(out / "model")
    tokenizer.save_pretrained(out / "model")
    (out / "log_history.json").write_text(__import__("json").dumps(trainer.state.log_history))
    return out / "model"
