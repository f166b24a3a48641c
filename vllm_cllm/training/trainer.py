"""Hugging Face Trainer pieces both recipes (CLLM, SPACE) share."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch


def logging_trainer_class(loss_fn: Callable[[Any, dict[str, torch.Tensor]],
                                             tuple[torch.Tensor, dict[str, float]]]):
    """A ``transformers.Trainer`` whose loss is ``loss_fn(model, batch) -> (loss, parts)``.

    The parts (e.g. consistency and AR losses) are averaged over the steps of each log line
    and logged next to the loss, as ``loss_<name>`` (names ending in ``accuracy`` as they are).
    """
    from transformers import Trainer

    class LoggingPartsTrainer(Trainer):
        # Our loss is a per-batch mean: the Trainer must divide it by the accumulation steps
        # (left unset, it assumes a model loss normalised by num_items_in_batch and does not).
        loss_is_scaled_for_ga = False

        def compute_loss(self, model, inputs, return_outputs=False, **kwargs):
            loss, parts = loss_fn(model, inputs)
            if model.training:
                for key, value in parts.items():
                    self.logged_parts.setdefault(key, []).append(value)
            return (loss, None) if return_outputs else loss

        @property
        def logged_parts(self) -> dict[str, list[float]]:
            """Loss parts of the training steps since the last log line."""
            return self.__dict__.setdefault("_logged_parts", {})

        def log(self, logs, *args, **kwargs):
            if "loss" in logs:
                for key, values in self.logged_parts.items():
                    name = key if key.endswith("accuracy") else f"loss_{key}"
                    logs[name] = sum(values) / len(values)
                self.logged_parts.clear()
            super().log(logs, *args, **kwargs)

    return LoggingPartsTrainer


#: What the recipes anchor on: the model itself (each recipe's own AR term) or the frozen base.
ANCHORS = ("self", "base")


def base_logits(model: Any, batch: dict[str, torch.Tensor], base: Any) -> torch.Tensor:
    """The frozen base model's logits on the clean part of every packed row, [B, W, V].

    Both recipes' packed rows start with their clean sequence (prompt + answer) under causal
    attention, ``batch["clean_width"]`` (W) the widest one, and clean tokens attend to clean
    tokens only, so the top-left [W, W] block of the batch gives them exactly; a shorter row's
    other tokens inside it are computed and ignored. ``base`` is a frozen copy, or None for a
    LoRA model: the base is then the same weights with the adapter switched off.
    """
    width = int(batch["clean_width"])
    inputs = {"input_ids": batch["input_ids"][:, :width],
              "position_ids": batch["position_ids"][:, :width],
              "attention_mask": batch["attention_mask"][:, :, :width, :width]}
    with torch.no_grad():
        if base is not None:
            return base(**inputs).logits
        peft_model = getattr(model, "module", model)  # unwrap a distributed wrapper
        with peft_model.disable_adapter():
            return model(**inputs).logits


#: Training precisions: float32 throughout, or bfloat16 mixed precision (weights stay float32).
PRECISIONS = ("fp32", "bf16")


def training_arguments(out: Path, config: Any):
    """The Trainer settings both recipes share (cosine schedule, checkpoints under out/trainer)."""
    from transformers import TrainingArguments

    if config.precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}; got {config.precision!r}")
    if config.stop_step < 0 or 0 < config.max_steps < config.stop_step:
        raise ValueError(f"stop_step {config.stop_step} must lie in 0..max_steps "
                         f"({config.max_steps}): it ends the run inside its schedule")
    return TrainingArguments(
        output_dir=str(out / "trainer"), per_device_train_batch_size=config.batch_size,
        gradient_accumulation_steps=config.grad_accum, learning_rate=config.learning_rate,
        num_train_epochs=config.epochs, max_steps=config.max_steps, lr_scheduler_type="cosine",
        warmup_steps=0.03, logging_steps=config.logging_steps, save_steps=config.save_steps,
        save_total_limit=config.keep_checkpoints or None, report_to=[], seed=config.seed,
        remove_unused_columns=False, bf16=config.precision == "bf16",
        dataloader_num_workers=config.data_workers, use_cpu=not torch.cuda.is_available())


#: Linear layers LoRA adapts in both recipes (Llama-style names).
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def parse_lora_targets(text: str) -> list[str]:
    """A comma-separated list of LoRA target names, checked against :data:`LORA_TARGETS`."""
    targets = [name.strip() for name in text.split(",") if name.strip()]
    unknown = sorted(set(targets) - set(LORA_TARGETS))
    if not targets or unknown:
        hint = f" (unknown: {unknown})" if unknown else ""
        raise ValueError(f"lora_targets {text!r}: expected a comma-separated subset of "
                         f"{','.join(LORA_TARGETS)}{hint}")
    return targets


def with_lora(model: Any, rank: int, alpha: int, targets: list[str] | None = None,
              **extra: Any) -> Any:
    """``model`` wrapped in a LoRA adapter of ``rank`` (peft) on ``targets`` (default
    :data:`LORA_TARGETS`); ``extra`` goes to LoraConfig."""
    from peft import LoraConfig, get_peft_model

    return get_peft_model(model, LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=0.0,
                                            target_modules=targets or LORA_TARGETS,
                                            task_type="CAUSAL_LM", **extra))


def _checkpoint_step(path: Path) -> int:
    return int(path.name.split("-")[-1])


def last_checkpoint(trainer_dir: Path, at_most: int = 0) -> str | None:
    """The newest ``checkpoint-N`` under ``trainer_dir`` (by step number; with ``at_most`` > 0
    the newest with N <= at_most), if any."""
    found = sorted((p for p in trainer_dir.glob("checkpoint-*")
                    if not at_most or _checkpoint_step(p) <= at_most), key=_checkpoint_step)
    return str(found[-1]) if found else None


def _stop_at(step: int):
    """A callback that ends training after optimizer step ``step``, checkpointed there."""
    from transformers import TrainerCallback

    class StopAtStep(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step >= step:
                control.should_save = True
                control.should_training_stop = True
            return control

    return StopAtStep()


def train_and_save(trainer: Any, model: Any, tokenizer: Any, out: Path, *, lora: bool,
                   resume: bool, stop_step: int = 0) -> Path:
    """Train (resuming from the newest checkpoint when asked) and save what a run leaves:
    with LoRA ``out/adapter`` (the trained tensors only, never whole embedding copies) merged
    into ``out/model``; the tokenizer beside the model; ``out/log_history.json``.

    ``stop_step`` > 0 ends the run after that step of its schedule (the learning rate follows
    the whole ``max_steps`` schedule), with a checkpoint there. A run that already holds that
    checkpoint loads it rather than resuming: a resumed Trainer takes a step before any
    callback can stop it."""
    checkpoint = last_checkpoint(out / "trainer", stop_step) if resume else None
    if stop_step and checkpoint and _checkpoint_step(Path(checkpoint)) == stop_step:
        from transformers import TrainerState

        if not hasattr(trainer, "_load_from_checkpoint"):
            import transformers

            raise RuntimeError(f"transformers {transformers.__version__}: Trainer has no "
                               "_load_from_checkpoint to load a finished run's checkpoint")
        trainer._load_from_checkpoint(checkpoint)  # what resuming loads, without a step
        trainer.state = TrainerState.load_from_json(str(Path(checkpoint) / "trainer_state.json"))
    else:
        if stop_step:
            trainer.add_callback(_stop_at(stop_step))
        trainer.train(resume_from_checkpoint=checkpoint)
    if lora:
        model.save_pretrained(out / "adapter", save_embedding_layers=False)
        model = model.merge_and_unload()
    model.save_pretrained(out / "model")
    tokenizer.save_pretrained(out / "model")
    (out / "log_history.json").write_text(json.dumps(trainer.state.log_history))
    return out / "model"
