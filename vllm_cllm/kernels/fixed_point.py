"""One Jacobi fixed-point step over a ragged verify batch, on the device, with no host sync.

Request i has ``n_i`` drafts ``d_1..d_n`` and ``n_i + 1`` logits rows whose argmax are
``g_1..g_{n+1}``. Its accepted length ``a_i`` is the longest prefix with ``d_j == g_j``; vLLM
commits ``g_1..g_{a+1}``, and ``g_{a+2}..g_{n+1}`` (``n - a`` tokens, the same slice as
``capture.shifted_block`` on the host) become the next draft, cut to ``k``.

Acceptance is greedy (argmax), so ``a_i`` equals what vLLM commits for greedy requests only.

SPACE mask slots (``num_mask``): the last ``num_mask[i]`` drafts of request i are mask slots,
never accepted, so with ``r = n - num_mask`` real drafts ``a <= r``. If a real draft was
rejected (``a < r``) the next draft is the Jacobi tail of the real part, ``g_{a+2}..g_{r+1}``;
if all real drafts were accepted it is the argmax at the mask rows, ``g_{r+2}..g_{n+1}``.
Without masks both cases reduce to the plain rule above.

NaN logits: like ``torch.argmax``, a NaN counts as the maximum (the first NaN wins).
"""

from __future__ import annotations

import functools
import importlib.util
import os

import numpy as np
import torch

from vllm_cllm.kernels.result import FixedPointResult

BACKENDS = ("auto", "torch", "triton")


@functools.cache
def triton_available() -> bool:
    """Whether ``import triton`` works here (checked once; the import itself stays lazy)."""
    if importlib.util.find_spec("triton") is None:
        return False
    try:
        import triton  # noqa: F401
    except Exception:  # a broken install counts as absent
        return False
    return True


def resolve_backend(backend: str, device: torch.device) -> str:
    """``auto``: Triton on CUDA or under ``TRITON_INTERPRET=1``, torch otherwise."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend != "auto":
        return backend
    interpret = os.environ.get("TRITON_INTERPRET") == "1"
    if triton_available() and (device.type == "cuda" or interpret):
        return "triton"
    return "torch"


def _check(logits: torch.Tensor, draft_tokens: torch.Tensor, num_draft_tokens: torch.Tensor,
           k: int, num_mask: torch.Tensor | None) -> None:
    """Shape checks only: sum(n_i + 1) == T is ``D + B == T``, which needs no device sync.

    That sum(n_i) == D is not checked (it would need one); a mismatch is the caller's bug.
    """
    if logits.dim() not in (1, 2):
        raise ValueError(f"logits must be [T, V] or an argmax [T], got {tuple(logits.shape)}")
    if logits.dim() == 1 and logits.is_floating_point():
        raise ValueError("a 1-D logits argument must be an integer argmax")
    if logits.dim() == 2 and not logits.is_floating_point():
        raise ValueError("2-D logits must be floating point")
    if logits.dim() == 2 and logits.shape[1] == 0:
        raise ValueError("empty vocabulary")
    if draft_tokens.dim() != 1 or num_draft_tokens.dim() != 1:
        raise ValueError("draft_tokens and num_draft_tokens must be 1-D")
    batch, rows = num_draft_tokens.shape[0], logits.shape[0]
    if draft_tokens.shape[0] + batch != rows:
        raise ValueError(f"{rows} logits rows, but {draft_tokens.shape[0]} drafts over "
                         f"{batch} requests need {draft_tokens.shape[0] + batch}")
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    if num_mask is not None and tuple(num_mask.shape) != (batch,):
        raise ValueError(f"num_mask must have shape ({batch},), got {tuple(num_mask.shape)}")


def fixed_point_step(logits: torch.Tensor, draft_tokens: torch.Tensor,
                     num_draft_tokens: torch.Tensor, k: int, *,
                     num_mask: torch.Tensor | None = None,
                     backend: str = "auto") -> FixedPointResult:
    """Argmax, accepted length and next Jacobi draft of every request, all on the device.

    ``logits`` is [T, V] float or an int argmax [T] with T = sum(n_i + 1); ``draft_tokens``
    is [sum n_i]; ``num_draft_tokens`` [B]; ``num_mask`` (optional, [B]) counts the trailing
    SPACE mask slots of each request (clamped to [0, n_i]).
    """
    _check(logits, draft_tokens, num_draft_tokens, k, num_mask)
    if resolve_backend(backend, logits.device) == "triton":
        from vllm_cllm.kernels._triton import fixed_point_step_triton

        return fixed_point_step_triton(logits, draft_tokens, num_draft_tokens, k, num_mask)
    return fixed_point_step_torch(logits, draft_tokens, num_draft_tokens, k, num_mask)


def row_argmax(logits: torch.Tensor) -> torch.Tensor:
    """Argmax of every row, int64, with ``torch.argmax``'s ties and NaNs (first wins).

    A float32 tensor in CPU memory goes through numpy, whose SIMD argmax is several times
    faster than torch's on a CPU. The logits are not copied: numpy reads the tensor's memory.
    """
    if logits.device.type == "cpu" and logits.dtype == torch.float32 and not logits.requires_grad:
        return torch.from_numpy(np.argmax(logits.numpy(), axis=-1).astype(np.int64, copy=False))
    return logits.argmax(dim=-1).to(torch.int64)


def fixed_point_step_torch(logits: torch.Tensor, draft_tokens: torch.Tensor,
                           num_draft_tokens: torch.Tensor, k: int,
                           num_mask: torch.Tensor | None = None) -> FixedPointResult:
    """Vectorised reference: a fixed number of ops whatever B is, and no ``.item()``."""
    device = logits.device
    argmax = row_argmax(logits) if logits.dim() == 2 else logits.to(torch.int64)
    n = num_draft_tokens.to(device=device, dtype=torch.int64)
    batch, num_drafts = n.shape[0], draft_tokens.shape[0]
    real = n if num_mask is None else n - num_mask.to(device=device, dtype=torch.int64).clamp(
        min=torch.zeros_like(n), max=n)
    draft_start = torch.cumsum(n, 0) - n
    row_start = draft_start + torch.arange(batch, device=device)

    # Per draft: its request, its position j - 1 in that request, and whether it stops a_i.
    req = torch.repeat_interleave(torch.arange(batch, device=device), n, output_size=num_drafts)
    pos = torch.arange(num_drafts, device=device) - draft_start[req]
    stop = (draft_tokens.to(device=device, dtype=torch.int64) != argmax[row_start[req] + pos])
    stop |= pos >= real[req]
    accepted = n.clone().scatter_reduce_(0, req, torch.where(stop, pos, n[req]), "amin")

    # Next draft: row positions [start, end) of the request, cut to k, padded with -1.
    start = accepted + 1
    end = torch.where(accepted < real, real + 1, n + 1)
    next_len = torch.clamp(end - start, min=0, max=k)
    cols = torch.arange(k, device=device)
    valid = cols[None, :] < next_len[:, None]
    index = torch.where(valid, (row_start + start)[:, None] + cols[None, :], 0)
    if argmax.shape[0] == 0:  # B == 0: nothing to gather from
        next_draft = torch.full((batch, k), -1, dtype=torch.int64, device=device)
    else:
        next_draft = torch.where(valid, argmax[index], -1)
    return FixedPointResult(argmax=argmax, accepted=accepted.to(torch.int32),
                            next_draft=next_draft, next_len=next_len.to(torch.int32))


def warm_up(vocab: int, dtype: torch.dtype, device: torch.device, k: int, *,
            with_mask: bool = False) -> bool:
    """Compile what :func:`fixed_point_step` runs on ``device`` before serving starts (every
    Triton variant a step can use); True if anything was compiled. Nothing to do for the
    torch path."""
    if resolve_backend("auto", device) != "triton" or device.type != "cuda":
        return False
    from vllm_cllm.kernels._triton import warm_up as warm_triton

    warm_triton(vocab, dtype, device, k, with_mask)
    return True
