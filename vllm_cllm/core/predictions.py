"""The target's predictions in one verify step, as the drafting core reads them.

In a verify step over drafts ``d_1..d_n`` the target predicts ``g_1..g_{n+1}``; vLLM commits
``g_1..g_{a+1}`` (a = accepted drafts). :class:`VerifyPredictions` holds every request's
``g`` row and the next Jacobi block behind what was committed: computed on the device by the
fixed-point step (:func:`vllm_cllm.kernels.fixed_point_step`), or, where the logits already
are in host memory, taken as argmax rows and shifted on the host by :func:`shifted_block`
(the same rule).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any

import numpy as np


def shifted_block(row: np.ndarray, num_sampled: int, num_mask: int = 0) -> np.ndarray:
    """The next Jacobi block from one request's predictions (the kernel's rule, on the host).

    ``row`` = ``g_1..g_{n+1}``; vLLM committed ``num_sampled`` = a + 1 tokens. With ``r`` real
    drafts (the last ``num_mask`` are SPACE mask slots): ``g_{a+2}..g_{r+1}`` if a real draft
    was rejected, else the mask rows ``g_{r+2}..g_{n+1}``; without masks, ``g_{a+2}..``.
    """
    real = len(row) - 1 - min(max(num_mask, 0), len(row) - 1)
    if num_sampled - 1 < real:
        return row[num_sampled:real + 1]
    return row[real + 1:]


@dataclass
class VerifyPredictions:
    """Target argmax per row of one verify step, in input-batch order.

    ``flat[offsets[i]:offsets[i+1]]`` are request i's predictions: entry j is the target's
    choice after its j-th scheduled token (j = 0 is the token after the last committed one).
    ``accepted``, ``next_draft`` and ``next_len`` (optional) are the fixed-point step's
    greedy accepted length and next block per request, computed on the device.
    """

    req_ids: list[str]  # [B], input-batch order
    flat: np.ndarray  # [T] int64, T = sum over requests of (drafts + 1)
    offsets: np.ndarray  # [B + 1] int64
    accepted: np.ndarray | None = None  # [B]
    next_draft: np.ndarray | None = None  # [B, k]; row i valid up to next_len[i]
    next_len: np.ndarray | None = None  # [B]
    num_mask: np.ndarray | None = None  # [B] mask slots the step was run with (SPACE)

    def row(self, i: int) -> np.ndarray:
        return self.flat[self.offsets[i]:self.offsets[i + 1]]

    def next_block(self, i: int, num_sampled: int) -> np.ndarray:
        """Request i's next Jacobi block given that vLLM committed ``num_sampled`` tokens.

        The device result whenever vLLM accepted exactly the greedy prefix (always, for a
        greedy request); a sampled request that accepted otherwise gets the same rule on the
        host (:func:`shifted_block`) from its row.
        """
        if self.accepted is not None and int(self.accepted[i]) == num_sampled - 1:
            return self.next_draft[i, :int(self.next_len[i])]
        mask = 0 if self.num_mask is None else int(self.num_mask[i])
        return shifted_block(self.row(i), num_sampled, mask)

    @classmethod
    def without_drafts(cls, req_ids: list[str]) -> VerifyPredictions:
        """A step in which no request drafted: one row each, whose value is never read (the
        sampled token is what vLLM committed; the block behind it is empty)."""
        batch = len(req_ids)
        return cls(req_ids=req_ids, flat=np.zeros(batch, dtype=np.int64),
                   offsets=np.arange(batch + 1, dtype=np.int64))

    @classmethod
    def from_fixed_point(cls, logits: Any, draft_tokens: Any, num_draft_tokens: list[int],
                         req_ids: list[str], k: int, num_mask: list[int] | None = None,
                         backend: str = "auto") -> VerifyPredictions | PendingPredictions | None:
        """The fixed-point step on the device (``logits`` [T, V], ``draft_tokens`` [D] on the
        same device), then one device-to-host copy of argmax, accepted lengths and blocks.

        On CUDA the copy goes into pinned memory behind the step on the same stream and is
        not waited for here: the wait is in ``propose()``, after vLLM has launched its
        sampler (:class:`PendingPredictions`). Elsewhere the result is ready at once."""
        import torch

        from vllm_cllm.kernels import fixed_point_step

        rows = [n + 1 for n in num_draft_tokens]
        if len(rows) != len(req_ids) or sum(rows) != logits.shape[0] \
                or draft_tokens.shape[0] != sum(num_draft_tokens):
            return None  # a dummy/profiling run, not a real batch
        device = logits.device
        num = torch.tensor(num_draft_tokens, dtype=torch.int32).to(device, non_blocking=True)
        mask = None if num_mask is None else \
            torch.tensor(num_mask, dtype=torch.int32).to(device, non_blocking=True)
        out = fixed_point_step(logits, draft_tokens, num, k, num_mask=mask, backend=backend)
        packed = torch.cat([out.argmax, out.accepted.to(torch.int64),
                            out.next_len.to(torch.int64), out.next_draft.reshape(-1)])
        if packed.is_cuda:
            host = torch.empty(packed.shape, dtype=packed.dtype, pin_memory=True)
            host.copy_(packed, non_blocking=True)
            done = torch.cuda.Event()
            done.record()
            return PendingPredictions(req_ids, host, done, rows, k, num_mask)
        return PendingPredictions(req_ids, packed, None, rows, k, num_mask).resolve()

    @classmethod
    def from_packed(cls, req_ids: list[str], host: np.ndarray, rows: list[int], k: int,
                    num_mask: list[int] | None) -> VerifyPredictions:
        """Unpack ``[argmax (T) | accepted (B) | next_len (B) | next_draft (B*k)]``."""
        batch, rows_total = len(rows), sum(rows)
        accepted_at, len_at = rows_total, rows_total + batch
        return cls(req_ids=req_ids, flat=host[:rows_total], offsets=_offsets(rows),
                   accepted=host[accepted_at:len_at], next_len=host[len_at:len_at + batch],
                   next_draft=host[len_at + batch:].reshape(batch, k),
                   num_mask=None if num_mask is None else np.asarray(num_mask, np.int64))


    @classmethod
    def on_host(cls, logits: Any, num_draft_tokens: list[int], req_ids: list[str],
                num_mask: list[int] | None = None) -> VerifyPredictions | None:
        """Argmax rows only, for logits already in host memory (the CPU platform): each
        request's next block then comes from :func:`shifted_block` when it is asked for. A
        device step there would only add torch's per-op dispatch to every decode step."""
        from vllm_cllm.kernels.fixed_point import row_argmax

        rows = [n + 1 for n in num_draft_tokens]
        if len(rows) != len(req_ids) or sum(rows) != logits.shape[0]:
            return None  # a dummy/profiling run, not a real batch
        return cls(req_ids=req_ids, flat=row_argmax(logits).numpy(), offsets=_offsets(rows),
                   num_mask=None if num_mask is None else np.asarray(num_mask, np.int64))


@dataclass
class PendingPredictions:
    """A device step's result on its way to the host: the copy into ``host`` (pinned) was
    queued behind the step on the device's stream and ``done`` is recorded after it. Nothing
    waits until :meth:`resolve`, which the proposer calls in ``propose()``, so vLLM's
    sampler is launched without a host sync in between.

    Where ``host`` is in host memory its views (:class:`VerifyPredictions`) are built here,
    in the capture, where the host is ahead of the device's forward pass; the copy fills
    them before ``done``, and :meth:`resolve` only waits for it."""

    req_ids: list[str]
    host: Any  # [T + 2B + B*k] int64: argmax | accepted | next_len | next_draft
    done: Any  # torch.cuda.Event, or None when ``host`` is already readable
    rows: list[int]
    k: int
    num_mask: list[int] | None
    ready: VerifyPredictions | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.ready is None and self.host.device.type == "cpu":
            self.ready = VerifyPredictions.from_packed(self.req_ids, self.host.numpy(),
                                                       self.rows, self.k, self.num_mask)

    def resolve(self) -> VerifyPredictions:
        if self.done is not None:
            self.done.synchronize()
        if self.ready is not None:
            return self.ready
        return VerifyPredictions.from_packed(self.req_ids, self.host.cpu().numpy(), self.rows,
                                             self.k, self.num_mask)


def _offsets(num_rows_per_req: list[int]) -> np.ndarray:
    """[B + 1] where each request's rows begin, and the end (a running sum from 0)."""
    return np.fromiter(accumulate(num_rows_per_req, initial=0), dtype=np.int64,
                       count=len(num_rows_per_req) + 1)
