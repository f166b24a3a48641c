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
