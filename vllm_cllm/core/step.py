"""One verify step as the drafting core needs it, built by the vLLM adapter each step."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vllm_cllm.core.predictions import VerifyPredictions
from vllm_cllm.core.tokens import EMPTY


@dataclass
class VerifyStep:
    """The requests of one verify step, in vLLM's input-batch order.

    Request ``i`` committed ``committed[i]`` this step (empty during a partial prefill); its
    committed tokens so far, prompt included, are ``token_ids[i, :num_tokens[i]]``; it may
    draft up to ``rooms[i]`` tokens (0: none this step); ``greedy[i]`` says whether it decodes
    greedily. ``predictions`` are the target's predictions of the step just verified (None in
    a step that was not captured, when the request ids are unknown too).
    """

    req_ids: list[str | None]
    committed: list[list[int]]
    num_tokens: np.ndarray  # [B]
    token_ids: np.ndarray  # [B, max_model_len]; row i valid up to num_tokens[i]
    rooms: np.ndarray  # [B] int
    greedy: np.ndarray  # [B] bool
    predictions: VerifyPredictions | None

    @classmethod
    def from_vllm(cls, committed: list[list[int]], num_tokens: np.ndarray,
                  token_ids: np.ndarray, predictions: VerifyPredictions | None,
                  greedy_ids: set[str], max_draft: int, max_model_len: int) -> VerifyStep:
        """The step from what vLLM hands a ``custom_class`` proposer, with the request ids of
        the captured predictions; each request may draft ``max_draft`` tokens where it has
        sampled a token and they fit before ``max_model_len``."""
        batch = len(committed)
        req_ids: list[str | None] = list(predictions.req_ids) if predictions is not None \
            else [None] * batch
        lengths = np.asarray(num_tokens[:batch], dtype=np.int64)
        rooms = np.where([bool(c) for c in committed],
                         np.clip(max_model_len - lengths, 0, max_draft), 0) if batch else \
            np.zeros(0, dtype=np.int64)
        greedy = np.array([r is not None and r in greedy_ids for r in req_ids], dtype=bool)
        return cls(req_ids=req_ids, committed=committed, num_tokens=lengths,
                   token_ids=token_ids, rooms=np.asarray(rooms, dtype=np.int64),
                   greedy=greedy, predictions=predictions)

    def __len__(self) -> int:
        return len(self.committed)

    def context(self, i: int) -> np.ndarray:
        """Request ``i``'s committed tokens, prompt included."""
        return self.token_ids[i, :int(self.num_tokens[i])]

    def prompt_end(self, i: int) -> int:
        """Where the tokens committed this step begin in request ``i``'s context."""
        return int(self.num_tokens[i]) - len(self.committed[i])

    def tail(self, i: int) -> np.ndarray:
        """Request ``i``'s Jacobi tail: the target's predictions behind what it committed
        (the unconverged part of the iterate); empty without predictions."""
        if self.predictions is None:
            return EMPTY
        return self.predictions.next_block(i, len(self.committed[i]))

    def drafting(self) -> list[int]:
        """The requests that may draft this step."""
        return [int(i) for i in np.flatnonzero(self.rooms)]

    def committed_grid(self, rows: list[int], width: int) -> tuple[np.ndarray, np.ndarray]:
        """The tokens requests ``rows`` committed this step, as a [len(rows), width] grid
        (-2, which no draft holds, past each request's tokens or its first ``width``), and
        how many each committed."""
        counts = np.fromiter((len(self.committed[i]) for i in rows), dtype=np.int64,
                             count=len(rows))
        grid = np.full((len(rows), width), -2, dtype=np.int64)
        kept = np.minimum(counts, width)
        if kept.any():
            grid[np.arange(width) < kept[:, None]] = np.fromiter(
                (t for i, n in zip(rows, kept.tolist(), strict=True)
                 for t in self.committed[i][:n]), dtype=np.int64, count=int(kept.sum()))
        return grid, counts

    def tails(self, rows: list[int], lengths: list[int]) -> list[np.ndarray]:
        """:meth:`tail` of each request in ``rows``, cut to its ``lengths`` entry: where each
        begins and ends is worked out for all of them at once (the same rule as
        :meth:`VerifyPredictions.next_block`)."""
        p = self.predictions
        if p is None:
            return [EMPTY] * len(rows)
        if len(rows) <= 4:  # a few requests: one at a time costs less than the arrays below
            return [self.tail(i)[:n] for i, n in zip(rows, lengths, strict=True)]
        at = np.asarray(rows, dtype=np.int64)
        sampled = np.fromiter((len(self.committed[i]) for i in rows), dtype=np.int64,
                              count=len(rows))
        begin, size = p.offsets[at], p.offsets[at + 1] - p.offsets[at]
        mask = np.zeros(len(rows), dtype=np.int64) if p.num_mask is None else p.num_mask[at]
        real = size - 1 - np.minimum(np.maximum(mask, 0), size - 1)  # as shifted_block
        rejected = sampled - 1 < real
        start = begin + np.where(rejected, sampled, real + 1)
        stop = begin + np.where(rejected, real + 1, size)
        end = begin + size
        start = np.minimum(start, end)
        stop = np.minimum(np.minimum(stop, end), start + np.asarray(lengths, dtype=np.int64))
        stop = np.maximum(stop, start)
        flat = p.flat
        out = [flat[a:b] for a, b in zip(start.tolist(), stop.tolist(), strict=True)]
        if p.accepted is not None:  # the device's blocks where vLLM accepted the greedy prefix
            on_device = np.flatnonzero(p.accepted[at] == sampled - 1)
            for j in on_device.tolist():
                i = rows[j]
                out[j] = p.next_draft[i, :int(p.next_len[i])][:lengths[j]]
        return out
