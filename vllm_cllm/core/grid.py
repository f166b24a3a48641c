"""A step's candidates as one padded grid: what the adaptive policy values all at once.

Row ``j`` of a grid is request ``rows[j]``, slot ``s`` its candidate of the ``s``-th name,
column ``k`` its ``k``-th token, -1 past the candidate's length (a candidate's tokens are a
prefix of its row). A source that can write its candidates straight into the grid
(:class:`GridSource`) does so, without a list of arrays per request; any other source's
candidates are packed into it (:func:`pack`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

import numpy as np

from vllm_cllm.core.drafter import DraftSource
from vllm_cllm.core.requests import RequestState
from vllm_cllm.core.step import VerifyStep


class GridSource(Protocol):
    """A draft source with a second way to propose: straight into a grid."""

    def propose_into(self, step: VerifyStep, rows: Sequence[int], lengths: np.ndarray,
                     states: Sequence[RequestState], into: Mapping[str, np.ndarray]
                     ) -> dict[str, np.ndarray]:
        """What :meth:`DraftSource.propose` proposes for each name in ``into``, written into
        ``into[name]`` ([len(rows), K], all -1, K at least ``lengths.max()``) from each row's
        first column; each name's candidate lengths ([len(rows)])."""


def candidate_grid(sources: Mapping[str, DraftSource], names: Sequence[str], step: VerifyStep,
                   rows: Sequence[int], lengths: np.ndarray, states: Sequence[RequestState]
                   ) -> tuple[np.ndarray, np.ndarray]:
    """The candidates of ``names`` for requests ``rows`` (at most ``lengths[j]`` tokens each)
    as a [R, S, max(lengths)] grid, and their lengths [R, S]. Each source is asked once, in
    the order of ``names``, as :func:`vllm_cllm.policies.fixed_order.gather` asks them."""
    # (the widest from a list: a ufunc reduction costs more than the list of a step's rows)
    grid = np.empty((len(rows), len(names), max(lengths.tolist())), dtype=np.int64)
    grid.fill(-1)
    sizes = np.zeros((len(rows), len(names)), dtype=np.int64)
    slots = {name: s for s, name in enumerate(names)}
    asked: set[int] = set()
    for name in names:
        source = sources[name]
        if id(source) in asked:
            continue
        asked.add(id(source))
        mine = [n for n in names if sources[n] is source]
        into = {n: grid[:, slots[n]] for n in mine}
        propose_into = getattr(source, "propose_into", None)
        if propose_into is not None:
            found = propose_into(step, rows, lengths, states, into)
        else:
            candidates = source.propose(step, rows, lengths.tolist(), states)
            found = {n: pack(candidates[n], into[n]) for n in mine}
        for n in mine:
            sizes[:, slots[n]] = found[n]
    return grid, sizes


def pack(candidates: Sequence[np.ndarray], into: np.ndarray) -> np.ndarray:
    """Write each row's candidate into ``into`` ([R, K], already -1) from its first column;
    their lengths."""
    sizes = np.fromiter((len(c) for c in candidates), dtype=np.int64, count=len(candidates))
    if sizes.any():
        into[np.arange(into.shape[1]) < sizes[:, None]] = np.concatenate(candidates)
    return sizes
