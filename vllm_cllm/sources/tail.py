"""The model's own drafts: the Jacobi tail, and the block (the tail completed by a fill).

The tail is the target's predictions behind what the last verify step committed — the
unconverged part of the Jacobi iterate (:meth:`vllm_cllm.core.step.VerifyStep.tail`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from vllm_cllm.core.drafter import Candidates, propose_each
from vllm_cllm.core.requests import RequestState
from vllm_cllm.core.step import VerifyStep
from vllm_cllm.sources.ngram import Fill


def completed_block(tail: np.ndarray, context: np.ndarray, k: int, fill: Fill,
                    restart: Fill) -> np.ndarray:
    """``tail`` then ``fill`` up to ``k`` tokens; ``restart`` supplies a block when both are
    empty. The fill sees the request's committed tokens (``context``) followed by the tail."""
    tail = tail[:k]
    extra = fill(np.concatenate([context, tail]) if len(tail) else context, k - len(tail))
    draft = np.concatenate([tail, extra]) if len(extra) else tail
    if len(draft) == 0:
        draft = restart(context, k)  # never stall: e.g. the first decode step after prefill
    return np.asarray(draft[:k], dtype=np.int64)


class JacobiTail:
    """Source ``tail``: the Jacobi tail, cut to the length asked for."""

    names = ("tail",)

    def propose(self, step: VerifyStep, rows: Sequence[int], lengths: Sequence[int],
                states: Sequence[RequestState]) -> Candidates:
        return {"tail": step.tails(list(rows), list(lengths))}

    def propose_into(self, step: VerifyStep, rows: Sequence[int], lengths: np.ndarray,
                     states: Sequence[RequestState], into: Mapping[str, np.ndarray]
                     ) -> dict[str, np.ndarray]:
        return {"tail": step.tails_into(list(rows), lengths, into["tail"])}


class JacobiBlock:
    """Source ``block``: the Jacobi tail completed by ``fill`` (:func:`completed_block`)."""

    names = ("block",)

    def __init__(self, fill: Fill, restart: Fill) -> None:
        self.fill, self.restart = fill, restart

    def propose(self, step: VerifyStep, rows: Sequence[int], lengths: Sequence[int],
                states: Sequence[RequestState]) -> Candidates:
        return {"block": propose_each(step, rows, lengths, lambda i, n: completed_block(
            step.tail(i), step.context(i), n, self.fill, self.restart))}
