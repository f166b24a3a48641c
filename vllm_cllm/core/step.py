"""One verify step as the drafting core needs it, built by the vLLM adapter each step."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cache
from itertools import chain
from typing import Any, ClassVar

import numpy as np

from vllm_cllm.core.predictions import VerifyPredictions
from vllm_cllm.core.tokens import EMPTY, write_spans

try:  # the token rows in C (_tokens_native.c), built by setup.py where a compiler is
    from vllm_cllm.core import _tokens_native
except ImportError:
    _tokens_native = None


def every_row_in_order(rows: Sequence[int], count: int) -> bool:
    """Whether ``rows`` are 0..count-1 in order: a selection that is the whole thing, which
    needs no gather."""
    if len(rows) != count:
        return False
    return (rows if isinstance(rows, list) else list(rows)) == _in_order(count)


@cache
def _in_order(count: int) -> list[int]:
    """[0, 1, ..., count - 1] (cached: compared with, never changed)."""
    return list(range(count))


@dataclass
class VerifyStep:
    """The requests of one verify step, in vLLM's input-batch order.

    Request ``i`` committed ``committed[i]`` this step (empty during a partial prefill); its
    committed tokens so far, prompt included, are ``token_ids[i, :num_tokens[i]]``; it may
    draft up to ``rooms[i]`` tokens (0: none this step); ``greedy[i]`` says whether it decodes
    greedily. ``predictions`` are the target's predictions of the step just verified (None in
    a step that was not captured, when the request ids are unknown too). ``remaining[i]``:
    how many more tokens request ``i`` may commit before its ``max_tokens`` or the model's
    length, where the batch drains (:mod:`vllm_cllm.core.flow`; None otherwise).
    """

    req_ids: list[str | None]
    committed: list[list[int]]
    num_tokens: np.ndarray  # [B]
    token_ids: np.ndarray  # [B, max_model_len]; row i valid up to num_tokens[i]
    rooms: np.ndarray  # [B] int
    greedy: np.ndarray  # [B] bool
    predictions: VerifyPredictions | None
    #: [B] how many tokens each request committed this step (``len(committed[i])``)
    num_committed: np.ndarray = field(default=None)  # type: ignore[assignment]
    remaining: np.ndarray | None = None  # [B] int
    #: the requests with room, where the step's builder found them (else from ``rooms``)
    _drafting: list[int] | None = field(default=None, repr=False)
    #: the C module that writes token rows into grids (None: numpy; tests switch it)
    native: ClassVar[Any] = _tokens_native

    def __post_init__(self) -> None:
        if self.num_committed is None:
            self.num_committed = np.fromiter(map(len, self.committed), dtype=np.int64,
                                             count=len(self.committed))

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
        if greedy_ids and greedy_ids.issuperset(req_ids):  # the usual step: all greedy
            greedy = _all_true(batch)
        else:
            greedy = np.fromiter((r in greedy_ids for r in req_ids), dtype=bool, count=batch)
        num_tokens = num_tokens[:batch]
        # the same arrays in one call of the C module, where it reads what vLLM handed
        if cls.native is not None and isinstance(committed, list) and \
                getattr(num_tokens, "dtype", None) in (np.int32, np.int64):
            arrays = np.empty((3, batch), dtype=np.int64)
            drafting = cls.native.step_arrays(committed, num_tokens, max_draft,
                                              max_model_len, arrays)
            lengths, num_committed, rooms = arrays
            return cls(req_ids=req_ids, committed=committed, num_tokens=lengths,
                       token_ids=token_ids, rooms=rooms, greedy=greedy,
                       predictions=predictions, num_committed=num_committed,
                       _drafting=drafting)
        lengths = np.asarray(num_tokens, dtype=np.int64)
        num_committed = np.fromiter(map(len, committed), dtype=np.int64, count=batch)
        # what fits before max_model_len, at most max_draft, and nothing in a partial prefill
        rooms = np.minimum(max_model_len - lengths, max_draft)
        np.maximum(rooms, 0, out=rooms)
        if not num_committed.all():
            rooms[num_committed == 0] = 0
        return cls(req_ids=req_ids, committed=committed, num_tokens=lengths,
                   token_ids=token_ids, rooms=rooms, greedy=greedy, predictions=predictions,
                   num_committed=num_committed)

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

    def all_greedy(self) -> bool:
        """Whether every request of the step decodes greedily."""
        return self.greedy is _all_true(len(self)) or bool(self.greedy.all())

    def drafting(self) -> list[int]:
        """The requests that may draft this step."""
        if self._drafting is not None:
            return list(self._drafting)
        return self.rooms.nonzero()[0].tolist()

    def committed_grid(self, rows: list[int], width: int) -> tuple[np.ndarray, np.ndarray]:
        """The tokens requests ``rows`` committed this step, as a [len(rows), width] grid
        (-2, which no draft holds, past each request's tokens or its first ``width``), and
        how many each committed."""
        grid = np.empty((len(rows), width), dtype=np.int64)
        grid.fill(-2)
        if self.native is not None and isinstance(self.committed, list):
            counts = np.empty(len(rows), dtype=np.int64)
            self.native.lists_into(grid, self.committed, rows, counts)
            return grid, counts
        counts = self.num_committed[rows]
        kept = np.minimum(counts, width)
        if kept.any():
            committed = self.committed
            if int(counts.max()) <= width:
                tokens = list(chain.from_iterable([committed[i] for i in rows]))
            else:
                tokens = list(chain.from_iterable([committed[i][:n] for i, n in
                                                   zip(rows, kept.tolist(), strict=True)]))
            grid[np.arange(width) < kept[:, None]] = tokens
        return grid, counts

    def tails(self, rows: list[int], lengths: list[int]) -> list[np.ndarray]:
        """:meth:`tail` of each request in ``rows``, cut to its ``lengths`` entry: where each
        begins and ends is worked out for all of them at once (:meth:`_tail_spans`)."""
        p = self.predictions
        if p is None:
            return [EMPTY] * len(rows)
        if len(rows) <= 4:  # a few requests: one at a time costs less than the arrays below
            return [self.tail(i)[:n] for i, n in zip(rows, lengths, strict=True)]
        start, size, device = self._tail_spans(self.rows_index(rows),
                                               np.asarray(lengths, dtype=np.int64))
        flat = p.flat
        out = [flat[a:a + n] for a, n in zip(start.tolist(), size.tolist(), strict=True)]
        if device is not None:  # the device's blocks where vLLM accepted the greedy prefix
            for j in device.tolist():
                i = rows[j]
                out[j] = p.next_draft[i, :int(p.next_len[i])][:lengths[j]]
        return out

    def tails_into(self, rows: list[int], lengths: np.ndarray, into: np.ndarray
                   ) -> np.ndarray:
        """:meth:`tails` written into ``into`` ([len(rows), K], all -1) from each row's first
        column; their lengths."""
        p = self.predictions
        if p is None:
            return np.zeros(len(rows), dtype=np.int64)
        if self.native is not None and p.num_mask is None and _all_int64(
                p.flat, p.offsets, self.num_committed, p.accepted, p.next_draft, p.next_len):
            size = np.empty(len(rows), dtype=np.int64)
            at = self.rows_index(rows)
            self.native.tails_into(into, p.flat, p.offsets, self.num_committed,
                                   np.ascontiguousarray(lengths, dtype=np.int64), at,
                                   p.accepted, p.next_draft, p.next_len, size)
            return size
        start, size, device = self._tail_spans(self.rows_index(rows), lengths)
        if device is None:
            write_spans(into, p.flat, start, size)
            return size
        assert p.next_draft is not None and p.next_len is not None
        at = np.asarray(rows, dtype=np.int64)
        on_host = np.ones(len(rows), dtype=bool)
        on_host[device] = False
        write_spans(into, p.flat, start, np.where(on_host, size, 0))
        size[device] = np.minimum(p.next_len[at[device]], lengths[device])
        write_spans(into, p.next_draft, np.zeros(len(device), dtype=np.int64), size[device],
                    source_rows=at[device], into_rows=device)
        return size

    def rows_index(self, rows: list[int]) -> np.ndarray | None:
        """``rows`` as an index array, None where they are every request of the step in
        order (the usual step: nothing to gather)."""
        if every_row_in_order(rows, len(self)):
            return None
        return np.asarray(rows, dtype=np.int64)

    def _tail_spans(self, at: np.ndarray | None, lengths: np.ndarray
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """Where the tails of requests ``at`` (None: all) begin in ``predictions.flat`` and
        how long they are, cut to ``lengths`` (the rule of
        :meth:`VerifyPredictions.next_block`, on the host), and the indices into ``at``
        whose tail is the device's block instead (None: the step has no device blocks)."""
        p = self.predictions
        assert p is not None
        if at is None:
            sampled, begin, end = self.num_committed, p.offsets[:-1], p.offsets[1:]
            at = slice(None)
        else:
            sampled, begin, end = self.num_committed[at], p.offsets[at], p.offsets[at + 1]
        size = end - begin
        device = None
        if p.accepted is not None:
            device = (p.accepted[at] == sampled - 1).nonzero()[0]
        if p.num_mask is None:
            # every slot a real draft: the predictions behind the committed ones, as far as
            # the row goes (what the rule below comes to without masks)
            start = begin + np.minimum(sampled, size)
            return start, np.minimum(end - start, lengths), device
        mask = p.num_mask[at]
        real = size - 1 - np.minimum(np.maximum(mask, 0), size - 1)  # as shifted_block
        rejected = sampled - 1 < real
        start = np.minimum(begin + np.where(rejected, sampled, real + 1), end)
        stop = np.minimum(begin + np.where(rejected, real + 1, size), end)
        stop = np.maximum(np.minimum(stop, start + lengths), start)
        return start, stop - start, device


@cache
def _all_true(batch: int) -> np.ndarray:
    """[batch] all True, read-only (the usual step's ``greedy``, shared by every step)."""
    greedy = np.ones(batch, dtype=bool)
    greedy.flags.writeable = False
    return greedy


def _all_int64(*arrays: np.ndarray | None) -> bool:
    """Whether every array given (None: absent) holds int64: what the C module reads."""
    return all(a is None or a.dtype == np.int64 for a in arrays)
