"""The cross-request output history: its lookup equals a spelled-out search, it stays bounded,
and the jacobi proposer fills it only from requests that left the batch."""

from __future__ import annotations

import numpy as np

from vllm_cllm.sources.history import OutputHistory


def _spelled_out(outputs: list[np.ndarray], context: np.ndarray, num_tokens: int,
                 min_match: int, max_match: int) -> list[int]:
    """Longest suffix match (max_match..min_match), newest output first, first occurrence."""
    for m in range(min(max_match, len(context)), min_match - 1, -1):
        for out in reversed(outputs):
            for p in range(m, len(out)):  # p: the position of the token that follows
                if list(out[p - m:p]) == list(context[-m:]):
                    return list(out[p:p + num_tokens])
    return []


def test_lookup_equals_the_spelled_out_search_on_random_outputs():
    rng = np.random.default_rng(0)
    for trial in range(300):
        size = int(rng.integers(1, 5))
        history, kept = OutputHistory(size, min_match=2, max_match=6), []
        for _ in range(int(rng.integers(1, 8))):
            out = rng.integers(0, 4, int(rng.integers(1, 30)))
            history.add(out)
            if len(out) > 2:
                kept = (kept + [out])[-size:]
        context = rng.integers(0, 4, int(rng.integers(0, 12)))
        got = history.continuation(context, 5).tolist()
        assert got == _spelled_out(kept, context, 5, 2, 6), trial
        assert len(history) == len(kept)


def test_history_forgets_the_oldest_output_and_its_index_entries():
    history = OutputHistory(2, min_match=3)
    for start in (0, 100, 200):
        history.add(np.arange(start, start + 10))
    assert len(history) == 2
    assert history.continuation(np.array([1, 2, 3]), 4).tolist() == []  # forgotten
    assert history.continuation(np.array([7, 201, 202, 203]), 4).tolist() == [204, 205, 206, 207]
    assert all(serial in history.outputs for entries in history.index.values()
               for serial, _ in entries)
    assert OutputHistory(0).continuation(np.arange(5), 3).tolist() == []
