"""The pool of a request's recent Jacobi iterates as a draft source (Lookahead decoding's
n-gram pool, Jacobi Forcing's rejection recycling): tokens guessed a step or two early often
come true after a correction."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from vllm_cllm.core.drafter import Candidates
from vllm_cllm.core.requests import RequestState
from vllm_cllm.core.step import VerifyStep


def pool_continuation(context: np.ndarray, pool: list[np.ndarray], ngram_max: int,
                      num_tokens: int) -> np.ndarray:
    """What followed the context's longest suffix (``ngram_max`` down to 1 token) inside one
    of ``pool``'s token streams: the most recent stream first, its first occurrence.

    The pool holds the request's recent Jacobi iterates: guesses for positions it has not
    committed yet, which often turn out right a step or two later, after a correction. Runs
    every step for every request, so all streams and suffix lengths are compared at once.
    """
    n = min(ngram_max, len(context))
    if n == 0 or not pool:
        return context[:0]
    lengths = np.array([len(stream) for stream in pool])
    # each stream left-padded with n-1 impossible tokens: window p ends at stream position p
    grid = np.full((len(pool), n - 1 + int(lengths.max())), -1, dtype=np.int64)
    for row, stream in enumerate(pool):
        grid[row, n - 1:n - 1 + len(stream)] = stream
    equal = np.lib.stride_tricks.sliding_window_view(grid, n, axis=1) == context[-n:]
    run = np.cumprod(equal[..., ::-1], axis=-1).sum(axis=-1)  # matched suffix length at p
    run[np.arange(run.shape[1]) >= (lengths - 1)[:, None]] = 0  # a token must follow p
    best = int(run.max())
    if best == 0:
        return context[:0]
    rows, cols = np.nonzero(run == best)
    newest = rows.max()
    start = int(cols[rows == newest].min()) + 1
    return pool[newest][start:start + num_tokens]


class IteratePool:
    """Source ``pool``: each request keeps its last ``size`` Jacobi iterates (the last
    committed token, then the tail), in its state; :meth:`remember` adds this step's."""

    names = ("pool",)

    def __init__(self, size: int, ngram_max: int) -> None:
        self.size, self.ngram_max = size, ngram_max

    def propose(self, step: VerifyStep, rows: Sequence[int], lengths: Sequence[int],
                states: Sequence[RequestState]) -> Candidates:
        return {"pool": [np.asarray(pool_continuation(step.context(i),
                                                      state.parts.setdefault("pool", []),
                                                      self.ngram_max, n), dtype=np.int64)
                         for i, n, state in zip(rows, lengths, states, strict=True)]}

    def remember(self, step: VerifyStep, rows: Sequence[int],
                 states: Sequence[RequestState]) -> None:
        for i, state in zip(rows, states, strict=True):
            tail = step.tail(i)
            if len(tail):
                pool = state.parts.setdefault("pool", [])
                pool.append(np.concatenate([step.context(i)[-1:], tail]))
                del pool[:-self.size]
