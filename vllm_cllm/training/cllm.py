"""CLLM consistency distillation on Hugging Face Trainer (accelerate/FSDP need no code change).

Each training example is one prompt: its greedy answer and the noisy states of every block,
packed into one forward (:mod:`.packing`). The student sees context + noisy block, the
teacher context + fixed point. Loss:
``consistency (global: noisy state vs fixed point; local: vs the next state) + ω · AR``.

Two teachers (``anchor``):

* ``self`` (default, CLLM's code): the model's own stop-gradient output at the fixed point;
  the AR loss is next-token cross-entropy on the greedy answer (CLLM's collapse guard);
* ``base``: the frozen base model's output on the clean sequence, for both terms —
  consistency pulls the student on a noisy state towards it, and the AR term is
  KL(base || student) on the clean answer. The clean behaviour stays the base model's whole
  distribution rather than only its greedy tokens, so the model cannot drift into repeating
  itself while the consistency term is pushed hard (one extra no-grad forward of the clean
  part; with LoRA the base is the same weights with the adapter switched off).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from vllm_cllm.training.batching import pad_packed_rows
from vllm_cllm.training.losses import (
    anchored_answer,
    ar_loss,
    consistency_loss,
    position_weights,
    repeat_excess,
    repeat_mask,
)
from vllm_cllm.training.packing import PackedExample, group_by_prompt, pack_prompt
from vllm_cllm.training.trainer import (
    ANCHORS,
    base_logits,
    logging_trainer_class,
    parse_lora_targets,
    train_and_save,
    training_arguments,
    with_lora,
)
from vllm_cllm.training.trajectories import TrajectoryRecord


@dataclass
class CllmConfig:
    block_size: int = 16
    ar_weight: float = 1.0  # ω; CLLM's code uses 10 with label smoothing (docs/training.md)
    consistency: str = "global"  # or "local"
    consistency_window: int = 0  # >0: loss on the first w positions after a state diverges
    position_decay: float = 1.0  # weight decay**j for the j-th position behind the divergence
    anchor: str = "self"  # teacher: "self" (CLLM's) or "base" (frozen base; see module docs)
    margin_weight: float = 0.0  # hinge on the greedy token's logit margin on the clean answer
    # (anchor "base": the base model's greedy token there, so the answers stay the base's)
    margin: float = 2.0  # the margin (logits) below which the hinge pushes
    repeat_weight: float = 0.0  # anchor "base": weight of the answer's repeated n-grams the
    # student is surer of than the base (losses.repeat_excess); 0 leaves it out
    repeat_ngram: int = 4  # n of those n-grams (4: the distinct-4 the quality checks use)
    learning_rate: float = 1e-4
    epochs: float = 1.0
    batch_size: int = 1  # prompts per device step (each is one packed row)
    states_per_block: int = 0  # 0: every state of a block; k: k of them, seeded
    grad_accum: int = 4
    lora_rank: int = 0  # 0: full fine-tune
    lora_alpha: int = 32
    lora_targets: str = ""  # the linear layers the adapter adapts, comma-separated ("": all
    # seven, or a further round's init_adapter's)
    init_adapter: str = ""  # a LoRA adapter dir to continue training (a further round)
    max_steps: int = -1
    stop_step: int = 0  # >0: end the run after this step of the max_steps schedule
    logging_steps: int = 10
    save_steps: int = 200
    keep_checkpoints: int = 0  # 0: keep every Trainer checkpoint (the training curve uses them)
    seed: int = 0
    precision: str = "fp32"  # or "bf16": mixed precision (a GPU's fast path)
    data_workers: int = 0  # DataLoader processes that pack rows while the device computes


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
    return {**batch, "clean_width": torch.tensor(max(e.clean_len for e in examples)),
            "student_index": torch.cat([e.student_index + b * width
                                        for b, e in enumerate(examples)]),
            "teacher_index": torch.cat([e.teacher_index + b * width
                                        for b, e in enumerate(examples)]),
            "loss_mask": torch.cat([e.loss_mask for e in examples])}


def margin_hinge(z: torch.Tensor, target: torch.Tensor, margin: float) -> torch.Tensor:
    """Mean of relu(margin - (z_target - max other z)) over rows of logits ``z`` [N, V]: zero
    wherever the target token already wins by ``margin``, so it protects a greedy output at
    near-ties without pulling on confident positions."""
    z = z.float()
    gold = z.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    other = z.scatter(-1, target.unsqueeze(-1), float("-inf")).max(-1).values
    return torch.relu(margin - (gold - other)).mean()


def greedy_margin_hinge(logits: torch.Tensor, labels: torch.Tensor, margin: float
                        ) -> torch.Tensor:
    """:func:`margin_hinge` on the labelled next-token positions (the greedy answer's)."""
    keep = labels[:, 1:] != -100
    return margin_hinge(logits[:, :-1][keep], labels[:, 1:][keep], margin)


def cllm_loss(model: Any, batch: dict[str, torch.Tensor], config: CllmConfig,
              base: Any = None) -> tuple[torch.Tensor, dict[str, float]]:
    """Consistency + ω·AR from one packed forward; also returns the parts for logging.

    ``config.anchor == "base"``: teachers from the frozen base (``base``, or ``model`` with its
    LoRA adapter disabled). ``fixed_point_accuracy`` is the share of loss positions where the
    student's argmax on a noisy state equals the teacher's: what a Jacobi step accepts there.
    """
    logits = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"],
                   attention_mask=batch["attention_mask"]).logits
    flat = logits.reshape(-1, logits.shape[-1])
    student = flat[batch["student_index"]]
    mask = batch["loss_mask"]
    weights = position_weights(mask, config.position_decay)
    if config.anchor == "base":
        reference = base_logits(model, batch, base)
        width, row_width = reference.shape[1], logits.shape[1]
        index = batch["teacher_index"]
        teacher = reference.reshape(-1, reference.shape[-1])[
            (index // row_width) * width + index % row_width]
        anchored = anchored_answer(logits, reference, batch["labels"])
        answer, clean, clean_reference = anchored.answer, anchored.logits, anchored.reference
        ar = anchored.loss
        if config.margin_weight:  # hold the base's greedy token, not the answer's
            hinge = margin_hinge(clean, clean_reference.argmax(-1), config.margin)
        if config.repeat_weight:
            repeats = repeat_mask(batch["labels"], config.repeat_ngram)[:, 1:width][answer]
            repeat = repeat_excess(clean, clean_reference, batch["labels"][:, 1:width][answer],
                                   repeats)
    else:
        teacher = flat[batch["teacher_index"]]
        ar = ar_loss(logits, batch["labels"])
        if config.margin_weight:
            hinge = greedy_margin_hinge(logits, batch["labels"], config.margin)
    consistency = consistency_loss(student, teacher, weights)
    total = consistency + config.ar_weight * ar
    parts = {"greedy_agreement": anchored.greedy_agreement} if config.anchor == "base" else {}
    if config.margin_weight:
        total = total + config.margin_weight * hinge
        parts["margin"] = float(hinge.detach())
    if config.repeat_weight:
        total = total + config.repeat_weight * repeat
        parts["repeat"] = float(repeat.detach())
    with torch.no_grad():
        hits = (student.argmax(-1) == teacher.argmax(-1)) & mask
        accuracy = hits.sum() / mask.sum().clamp_min(1)
        first = mask & (torch.cumsum(mask.long(), dim=-1) == 1)
        first_accuracy = (hits & first).sum() / first.sum().clamp_min(1)
    return total, {**parts, "consistency": float(consistency.detach()), "ar": float(ar.detach()),
                   "fixed_point_accuracy": float(accuracy),
                   "first_position_accuracy": float(first_accuracy)}


def _check_config(config: CllmConfig) -> list[str] | None:
    """Refuses a config that cannot train, before any model loads; returns the LoRA layers a
    new adapter adapts (None: the default, or a further round's own)."""
    if config.anchor not in ANCHORS:
        raise ValueError(f"anchor must be one of {ANCHORS}; got {config.anchor!r}")
    if config.repeat_ngram < 1:
        raise ValueError(f"repeat_ngram must be at least 1; got {config.repeat_ngram}")
    if config.repeat_weight and config.anchor != "base":
        raise ValueError("repeat_weight compares the student's repeats with the base model's:"
                         " it needs anchor 'base'")
    if config.anchor == "base" and config.consistency != "global":
        raise ValueError("anchor 'base' needs the global consistency loss (the base model's "
                         "teacher is its output on the clean sequence)")
    targets = parse_lora_targets(config.lora_targets) if config.lora_targets else None
    if targets and not config.lora_rank:
        raise ValueError("lora_targets names the layers a LoRA adapter adapts: set lora_rank"
                         " as well (a full fine-tune trains every weight)")
    if config.init_adapter:
        if not config.lora_rank:
            raise ValueError("init_adapter continues a LoRA run: set lora_rank as well")
        if not (Path(config.init_adapter) / "adapter_config.json").exists():
            raise FileNotFoundError(f"init_adapter {config.init_adapter}: no adapter_config.json"
                                    " (a run's adapter/ or a Trainer checkpoint-N/)")
        from peft import PeftConfig

        modules = PeftConfig.from_pretrained(config.init_adapter).target_modules
        adapted = {modules} if isinstance(modules, str) else set(modules)  # str: a regex
        if targets and set(targets) != adapted:
            raise ValueError(f"lora_targets {','.join(targets)} differ from init_adapter's "
                             f"{','.join(sorted(adapted))}: a further round adapts the same layers")
    return targets


def train_cllm(base_model: str, records: list[TrajectoryRecord], out_dir: str | Path,
               config: CllmConfig, *, resume: bool = True) -> Path:
    """Fine-tune ``base_model`` on the records; saves a vLLM-loadable checkpoint in out_dir.

    With ``lora_rank > 0`` only a LoRA adapter trains; it is saved under ``out_dir/adapter``
    (the small artifact to keep) and merged into the saved full checkpoint.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    targets = _check_config(config)
    random.seed(config.seed)
    torch.manual_seed(config.seed)
    out = Path(out_dir)
    tokenizer = AutoTokenizer.from_pretrained(base_model)
    model = AutoModelForCausalLM.from_pretrained(base_model, dtype=torch.float32)
    if config.init_adapter:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, config.init_adapter, is_trainable=True)
    elif config.lora_rank:
        model = with_lora(model, config.lora_rank, config.lora_alpha, targets)
    base = None
    if config.anchor == "base" and not config.lora_rank:  # a frozen copy for full fine-tunes
        base = AutoModelForCausalLM.from_pretrained(base_model, dtype=torch.float32).eval()
        base.requires_grad_(False)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    trainer_cls = logging_trainer_class(lambda m, batch: cllm_loss(m, batch, config, base))
    trainer = trainer_cls(model=model, args=training_arguments(out, config),
                          train_dataset=TrajectoryDataset(records, config.consistency,
                                                        config.states_per_block, config.seed,
                                                        config.consistency_window),
                          data_collator=lambda items: collate(items, pad_id))
    return train_and_save(trainer, model, tokenizer, out, lora=bool(config.lora_rank),
                          resume=resume, stop_step=config.stop_step)
