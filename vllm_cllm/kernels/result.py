"""What one fixed-point step returns, on the device (both backends)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class FixedPointResult:
    """Device tensors of one step; ``next_draft[i, :next_len[i]]`` is valid, the rest is -1."""

    argmax: torch.Tensor  # [T] int64
    accepted: torch.Tensor  # [B] int32
    next_draft: torch.Tensor  # [B, k] int64
    next_len: torch.Tensor  # [B] int32
