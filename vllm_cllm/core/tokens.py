"""Token arrays shared by every part of the drafting core."""

from __future__ import annotations

import numpy as np

#: No tokens: what a source proposes when it has nothing, and an undrafted request's draft.
EMPTY = np.empty(0, dtype=np.int64)


def matched_prefix(candidate: np.ndarray, committed: list[int] | np.ndarray) -> int:
    """How many leading tokens of ``candidate`` equal the tokens vLLM committed."""
    n = min(len(candidate), len(committed))
    mismatch = np.flatnonzero(candidate[:n] != np.asarray(committed[:n]))
    return int(mismatch[0]) if len(mismatch) else n


def write_spans(into: np.ndarray, source: np.ndarray, starts: np.ndarray, sizes: np.ndarray,
                source_rows: np.ndarray | None = None, into_rows: np.ndarray | None = None
                ) -> None:
    """``into[into_rows[j], :sizes[j]] = source[starts[j]:starts[j] + sizes[j]]`` for every
    ``j`` at once: a 1-D ``source``, or row ``source_rows[j]`` of a 2-D one (``source_rows``
    and ``into_rows``: default row ``j``)."""
    j, k = (np.arange(into.shape[-1]) < sizes[:, None]).nonzero()
    if not len(j):
        return
    at = starts[j] + k
    if source.ndim == 1:
        tokens = source[at]
    else:
        tokens = source[j if source_rows is None else source_rows[j], at]
    into[j if into_rows is None else into_rows[j], k] = tokens
