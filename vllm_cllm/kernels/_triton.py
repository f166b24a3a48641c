"""Triton path of :func:`vllm_cllm.kernels.fixed_point_step`: two launches, no host sync.

1. ``_split_argmax``: grid (rows, splits); each program reduces one contiguous slice of a row's
   vocabulary with a block loop (V need not be a multiple of the block) to a partial
   (value, index). Splitting keeps the GPU busy when a batch has few rows (B = 1, k = 4 is 5).
2. ``_fixed_point``: one program per request. It sums ``num_draft_tokens`` of the requests
   before it to find its offsets (no cumsum launch), merges its rows' partials into the argmax,
   then computes the accepted length and the shifted next draft.

Ties go to the first index and NaN wins (the first NaN), as in ``torch.argmax``.
Imported lazily: importing this module imports triton (and reads ``TRITON_INTERPRET``).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from vllm_cllm.kernels.result import FixedPointResult

#: Vocabulary block of the argmax loop (elements per program per iteration).
ARGMAX_BLOCK = 1024
#: Requests summed per iteration when a program finds its offsets.
SCAN_BLOCK = 1024
#: Rows (positions) per iteration of the per-request kernel, and output columns.
ROW_BLOCK = 32
K_BLOCK = 64
#: The merge's split widths (compile-time): a launch uses the smallest that holds its splits,
#: so the kernels compile in a fixed, small number of variants, all warmed at load time
#: (:func:`warm_up`), and none while serving.
SPLIT_WIDTHS = (16, 256)
#: Programs to aim for in the argmax launch, per streaming multiprocessor.
PROGRAMS_PER_SM = 4
_BIG = tl.constexpr(2147483647)  # "no index yet"; above any vocabulary index


@triton.jit(do_not_specialize=["splits"])
def _split_argmax(logits_ptr, part_val_ptr, part_idx_ptr, V, stride_row, chunk, splits,
                  BLOCK: tl.constexpr, ACC_DTYPE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    split = tl.program_id(1)
    lo = split * chunk
    hi = tl.minimum(lo + chunk, V)
    base = logits_ptr + row * stride_row
    lanes = tl.arange(0, BLOCK)
    best_val = tl.full([BLOCK], float("-inf"), dtype=ACC_DTYPE)
    # A lane never updated keeps -inf and index lo: right when the whole slice is -inf.
    best_idx = tl.zeros([BLOCK], dtype=tl.int32) + lo
    first_nan = tl.full([BLOCK], _BIG, dtype=tl.int32)
    for start in range(lo, hi, BLOCK):
        offs = start + lanes
        x = tl.load(base + offs, mask=offs < hi, other=float("-inf")).to(ACC_DTYPE)
        better = x > best_val  # strict: a lane keeps its first maximum
        best_val = tl.where(better, x, best_val)
        best_idx = tl.where(better, offs, best_idx)
        first_nan = tl.minimum(first_nan, tl.where(x != x, offs, _BIG))
    top = tl.max(best_val, axis=0)
    idx = tl.min(tl.where(best_val == top, best_idx, _BIG), axis=0)
    nan_idx = tl.min(first_nan, axis=0)
    has_nan = nan_idx < _BIG
    out = row * splits + split
    tl.store(part_val_ptr + out, tl.where(has_nan, float("nan"), top))
    tl.store(part_idx_ptr + out, tl.where(has_nan, nan_idx, idx))


@triton.jit
def _merge_rows(part_val_ptr, part_idx_ptr, rows, splits,
                ROWS: tl.constexpr, SPLITS: tl.constexpr):
    """Argmax of ``rows`` (a [ROWS] int64 row index vector, -1 = none) from their partials."""
    cols = tl.arange(0, SPLITS)
    inside = (rows >= 0)[:, None] & (cols < splits)[None, :]
    at = rows[:, None] * splits + cols[None, :]
    val = tl.load(part_val_ptr + at, mask=inside, other=float("-inf"))
    idx = tl.load(part_idx_ptr + at, mask=inside, other=_BIG)
    is_nan = val != val
    nan_split = tl.min(tl.where(is_nan, cols[None, :], SPLITS), axis=1)
    top = tl.max(tl.where(is_nan, float("-inf"), val), axis=1)
    best_split = tl.min(tl.where(val == top[:, None], cols[None, :], SPLITS), axis=1)
    chosen = tl.where(nan_split < SPLITS, nan_split, best_split)
    return tl.min(tl.where(cols[None, :] == chosen[:, None], idx, _BIG), axis=1).to(tl.int64)


@triton.jit(do_not_specialize=["splits", "draft_ptr", "num_ptr", "mask_ptr", "k"])
def _fixed_point(argmax_ptr, part_val_ptr, part_idx_ptr, splits, draft_ptr, num_ptr, mask_ptr,
                 accepted_ptr, next_ptr, next_len_ptr, k, FROM_PARTS: tl.constexpr,
                 HAS_MASK: tl.constexpr, SPLITS: tl.constexpr, SCAN: tl.constexpr,
                 ROWS: tl.constexpr, KCOLS: tl.constexpr):
    req = tl.program_id(0)
    # Offsets of this request: drafts before it, and rows before it (one more per request).
    draft_start = tl.zeros([], dtype=tl.int64)
    for s in range(0, req, SCAN):
        offs = s + tl.arange(0, SCAN)
        draft_start += tl.sum(tl.load(num_ptr + offs, mask=offs < req, other=0).to(tl.int64))
    row_start = draft_start + req
    n = tl.load(num_ptr + req).to(tl.int64)
    real = n
    if HAS_MASK:
        masks = tl.load(mask_ptr + req).to(tl.int64)
        real = n - tl.minimum(tl.maximum(masks, 0), n)

    # Over row positions 0..n: finish the argmax (if given partials), then find the first
    # position whose draft differs from the argmax or is a mask slot.
    accepted = n
    for s in range(0, n + 1, ROWS):
        pos = s + tl.arange(0, ROWS)
        in_rows = pos <= n
        if FROM_PARTS:
            g = _merge_rows(part_val_ptr, part_idx_ptr,
                            tl.where(in_rows, row_start + pos, -1), splits, ROWS, SPLITS)
            tl.store(argmax_ptr + row_start + pos, g, mask=in_rows)
        else:
            g = tl.load(argmax_ptr + row_start + pos, mask=in_rows, other=0)
        in_drafts = pos < n
        d = tl.load(draft_ptr + draft_start + pos, mask=in_drafts, other=0).to(tl.int64)
        stop = ((d != g) | (pos >= real)) & in_drafts
        accepted = tl.minimum(accepted, tl.min(tl.where(stop, pos, n), axis=0))
    if FROM_PARTS:
        tl.debug_barrier()  # the gather below reads argmax rows other threads just stored

    start = accepted + 1
    end = tl.where(accepted < real, real + 1, n + 1)
    length = tl.minimum(tl.maximum(end - start, 0), k)
    out = next_ptr + req.to(tl.int64) * k
    for s in range(0, k, KCOLS):
        cols = s + tl.arange(0, KCOLS)
        g = tl.load(argmax_ptr + row_start + start + cols, mask=cols < length, other=-1)
        tl.store(out + cols, g, mask=cols < k)
    tl.store(accepted_ptr + req, accepted.to(tl.int32))
    tl.store(next_len_ptr + req, length.to(tl.int32))


_ACC = {torch.float16: (tl.float32, torch.float32), torch.bfloat16: (tl.float32, torch.float32),
        torch.float32: (tl.float32, torch.float32), torch.float64: (tl.float64, torch.float64)}


@functools.cache
def _num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def default_splits(rows: int, vocab: int, device: torch.device) -> int:
    """Vocabulary slices per row so that the argmax launch has a few programs per SM."""
    blocks = triton.cdiv(vocab, ARGMAX_BLOCK)
    if device.type != "cuda" or rows == 0:
        return 1
    target = PROGRAMS_PER_SM * _num_sms(device.index if device.index is not None else 0)
    return max(1, min(blocks, triton.cdiv(target, rows), SPLIT_WIDTHS[-1]))


def split_width(splits: int) -> int:
    """The compile-time width of the merge for ``splits`` slices (:data:`SPLIT_WIDTHS`)."""
    return next(w for w in SPLIT_WIDTHS if splits <= w)


def warm_up(vocab: int, dtype: torch.dtype, device: torch.device, k: int,
            with_mask: bool) -> None:
    """Compile every variant a serving step can use (each split width, for this vocabulary,
    logits dtype and mask flag) on a dummy batch, so that no step compiles while serving."""
    blocks = triton.cdiv(vocab, ARGMAX_BLOCK)
    logits = torch.zeros((2, vocab), dtype=dtype, device=device)
    drafts = torch.zeros(1, dtype=torch.int64, device=device)
    num = torch.ones(1, dtype=torch.int32, device=device)
    mask = torch.zeros(1, dtype=torch.int32, device=device) if with_mask else None
    for width in SPLIT_WIDTHS:
        fixed_point_step_triton(logits, drafts, num, k, mask, splits=min(width, blocks))


def fixed_point_step_triton(logits: torch.Tensor, draft_tokens: torch.Tensor,
                            num_draft_tokens: torch.Tensor, k: int,
                            num_mask: torch.Tensor | None = None,
                            splits: int | None = None) -> FixedPointResult:
    """Shapes were checked by the caller. ``splits`` overrides :func:`default_splits`."""
    device = logits.device
    num = num_draft_tokens.to(device).contiguous()
    batch, rows = num.shape[0], logits.shape[0]
    argmax = torch.empty(rows, dtype=torch.int64, device=device)
    accepted = torch.empty(batch, dtype=torch.int32, device=device)
    next_len = torch.empty(batch, dtype=torch.int32, device=device)
    next_draft = torch.empty((batch, k), dtype=torch.int64, device=device)
    if batch == 0:
        return FixedPointResult(argmax, accepted, next_draft, next_len)

    from_parts = logits.dim() == 2
    if from_parts:
        if logits.dtype not in _ACC:
            raise TypeError(f"unsupported logits dtype {logits.dtype}")
        if logits.stride(1) != 1:
            logits = logits.contiguous()
        vocab = logits.shape[1]
        blocks = triton.cdiv(vocab, ARGMAX_BLOCK)
        splits = min(max(1, splits or default_splits(rows, vocab, device)), blocks)
        chunk = triton.cdiv(blocks, splits) * ARGMAX_BLOCK
        splits = triton.cdiv(vocab, chunk)  # no empty slice
        acc_tl, acc_torch = _ACC[logits.dtype]
        part_val = torch.empty((rows, splits), dtype=acc_torch, device=device)
        part_idx = torch.empty((rows, splits), dtype=torch.int32, device=device)
        _split_argmax[(rows, splits)](logits, part_val, part_idx, vocab, logits.stride(0),
                                      chunk, splits, BLOCK=ARGMAX_BLOCK, ACC_DTYPE=acc_tl,
                                      num_warps=8)
    else:
        argmax.copy_(logits)
        splits = 1
        part_val, part_idx = argmax, argmax  # unused

    drafts = draft_tokens.to(device).contiguous()
    if drafts.numel() == 0:  # every load is masked off; still hand the kernel a real pointer
        drafts = torch.zeros(1, dtype=torch.int64, device=device)
    out = next_draft if k else torch.empty((batch, 1), dtype=torch.int64, device=device)
    masks = num if num_mask is None else num_mask.to(device).contiguous()
    _fixed_point[(batch,)](argmax, part_val, part_idx, splits, drafts, num, masks, accepted,
                           out, next_len, k, FROM_PARTS=from_parts,
                           HAS_MASK=num_mask is not None,
                           SPLITS=split_width(splits), SCAN=SCAN_BLOCK,
                           ROWS=ROW_BLOCK, KCOLS=K_BLOCK, num_warps=4)
    return FixedPointResult(argmax, accepted, next_draft, next_len)
