"""Padding packed training rows (each with its own 4-D attention pattern) into one batch."""

from __future__ import annotations

import torch


def pad_packed_rows(rows: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]],
                    pad_id: int = 0) -> tuple[dict[str, torch.Tensor], int]:
    """``(input_ids, position_ids, labels, attention [n, n] bool)`` per row → padded batch.

    Returns the model inputs (``attention_mask`` additive, [B, 1, L, L]; padding attends only
    to itself) and the padded width L, so callers can turn per-row indices into flat ones.
    """
    width = max(len(ids) for ids, *_ in rows)
    batch = len(rows)
    input_ids = torch.full((batch, width), pad_id, dtype=torch.long)
    position_ids = torch.zeros((batch, width), dtype=torch.long)
    labels = torch.full((batch, width), -100, dtype=torch.long)
    allowed = torch.eye(width, dtype=torch.bool).repeat(batch, 1, 1)
    for b, (ids, positions, row_labels, attention) in enumerate(rows):
        size = len(ids)
        input_ids[b, :size] = ids
        position_ids[b, :size] = positions
        labels[b, :size] = row_labels
        allowed[b, :size, :size] = attention
    additive = torch.zeros(allowed.shape, dtype=torch.float32)
    additive.masked_fill_(~allowed, torch.finfo(torch.float32).min)
    return {"input_ids": input_ids, "position_ids": position_ids,
            "attention_mask": additive.unsqueeze(1), "labels": labels}, width
