"""Adaptive drafting: each request drafts the candidate whose tokens promise the most tokens
per step cost, and the batch's drafts are sized together.

Every token of every candidate is valued by how often tokens like it were accepted
(:mod:`vllm_cllm.policies.acceptance`); per request the candidate whose best prefix promises
the most tokens per step cost is chosen (:func:`best_candidate`), then every chosen
candidate is sized against the rest of the batch by the cost model
(:func:`vllm_cllm.policies.cost_model.draft_lengths`). A request without a Jacobi tail (its
last draft was accepted whole, or nothing was drafted) is offered a restart block, valued as
the tail it buys. Where the batch alone makes the device compute-bound
(:func:`~vllm_cllm.policies.cost_model.drafts_cost_time`) nothing is drafted and no candidate
is built: sources that follow the requests' tokens (the suffix trees) still take them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from vllm_cllm.core.drafter import DraftSource
from vllm_cllm.core.requests import RequestState
from vllm_cllm.core.step import VerifyStep
from vllm_cllm.core.tokens import EMPTY
from vllm_cllm.policies.acceptance import HIT, MISSED, UNDRAFTED, TokenAcceptance
from vllm_cllm.policies.cost_model import (
    SPEC_STEP_OVERHEAD_PER_REQUEST,
    CostModel,
    draft_lengths_grid,
    drafts_cost_time,
    step_cost,
)
from vllm_cllm.policies.fixed_order import gather


def best_candidate(values: dict[str, np.ndarray], knee_tokens: float, floor_tokens: float,
                   token_margin: float = 0.0) -> str | None:
    """The candidate whose best prefix promises the most tokens per step cost for a request
    on its own; None if none beats drafting nothing (each value counting
    ``1 / (1 + token_margin)`` of itself). :func:`draft_lengths` then sizes the chosen one
    against the rest of the batch. :func:`best_candidates` is the same over a whole step."""
    plain = 1.0 / step_cost(1, knee_tokens, floor_tokens)
    best, best_rate = None, plain
    for name, value in values.items():
        if not len(value):
            continue
        drafted = np.arange(1, len(value) + 1)
        costs = step_cost(1 + SPEC_STEP_OVERHEAD_PER_REQUEST + drafted, knee_tokens,
                          floor_tokens)
        rate = float(((1 + np.cumsum(value) / (1 + token_margin)) / costs).max())
        if rate > best_rate:
            best, best_rate = name, rate
    return best


def best_candidates(values: np.ndarray, lengths: np.ndarray, knee_tokens: float,
                    floor_tokens: float, token_margin: float = 0.0) -> np.ndarray:
    """:func:`best_candidate` for every row at once: ``values`` [R, S, K] each candidate's
    values (valid up to ``lengths`` [R, S]), in the order the per-request function would see
    them; per row the chosen slot, -1 for none. The same float operations, the first of
    equal rates winning and having to beat drafting nothing strictly."""
    plain = 1.0 / step_cost(1, knee_tokens, floor_tokens)
    width = values.shape[-1]
    drafted = np.arange(1, width + 1)
    costs = step_cost(1 + SPEC_STEP_OVERHEAD_PER_REQUEST + drafted, knee_tokens, floor_tokens)
    rates = (1 + np.cumsum(values, axis=-1) / (1 + token_margin)) / costs
    rates = np.where(np.arange(width) < lengths[:, :, None], rates, -np.inf).max(axis=-1)
    best = rates.argmax(axis=1)
    return np.where(rates[np.arange(len(best)), best] > plain, best, -1)


@dataclass
class Outcome:
    """A request's record (state part ``adaptive``): its candidates of the last step (row
    ``row`` of that step's grid and votes, ``batch``, -1 past each candidate), valued once
    vLLM has committed, and how its last draft fared."""

    batch: tuple[np.ndarray, np.ndarray] | None = None  # ([R, S, K] grid, votes)
    row: int = 0
    cell_previous: int = UNDRAFTED  # the outcome cell the candidates were valued in
    previous: int = UNDRAFTED


class Adaptive:
    """Chooses among the candidates of ``names`` (the last being the model's tail, which a
    ``restart`` block stands in for) by learned acceptance and sizes them by the cost model
    ``max(floor_tokens, knee_tokens + N)`` (``cost``, which a measurement may refine).

    ``stop_when_compute_bound``: draft nothing, and build no candidate, at a batch whose own
    tokens make the device compute-bound (:func:`drafts_cost_time`), whatever the
    acceptance; without it the cost model weighs acceptance against cost at every batch.

    The whole step is valued at once: the candidates as one padded grid, the acceptance
    table read and updated for every row together (:mod:`vllm_cllm.policies.acceptance`),
    the same choices as valuing each request in turn."""

    part = "adaptive"

    def __init__(self, names: Sequence[str], cost: CostModel, token_margin: float,
                 tail: str = "tail", restart: str = "restart",
                 stop_when_compute_bound: bool = True) -> None:
        self.names = tuple(names)
        self.tail, self.restart = tail, restart
        self.cost, self.token_margin = cost, token_margin
        self.stop_when_compute_bound = stop_when_compute_bound
        #: how often each kind of candidate token gets accepted
        self.acceptance = TokenAcceptance(self.names)
        self._rows = np.array([self.acceptance.sources.index(n) for n in self.names])
        self._tail = self.names.index(self.tail)

    def observe(self, step: VerifyStep, rows: Sequence[int],
                states: Sequence[RequestState]) -> list[Outcome]:
        """Value last step's candidates against what vLLM committed."""
        outcomes, seen = [], []
        for i, state in zip(rows, states, strict=True):
            outcome = state.parts.get(self.part)
            if outcome is None:
                outcome = state.parts[self.part] = Outcome()
            else:
                outcome.previous = (HIT if len(step.committed[i]) > 1 else MISSED) \
                    if state.last_drafted else UNDRAFTED
                if outcome.batch is not None:
                    seen.append((i, outcome))
            outcomes.append(outcome)
        if seen:
            self._count(step, seen)
        return outcomes

    def _count(self, step: VerifyStep, seen: list[tuple[int, Outcome]]) -> None:
        """Count the candidates of ``seen`` (request, its record) against what vLLM
        committed, in order, and forget them."""
        batch = seen[0][1].batch
        assert batch is not None
        which = np.array([outcome.row for _, outcome in seen], dtype=np.int64)
        if all(outcome.batch is batch for _, outcome in seen):  # all drafted last step
            grid, votes = batch[0][which], batch[1][which]
        else:
            width = max(outcome.batch[0].shape[2] for _, outcome in seen)
            grid = np.full((len(seen), len(self.names), width), -1, dtype=np.int64)
            votes = np.zeros(grid.shape, dtype=np.int64)
            for r, (_, outcome) in enumerate(seen):
                them, w = outcome.batch, outcome.batch[0].shape[2]
                grid[r, :, :w], votes[r, :, :w] = them[0][outcome.row], them[1][outcome.row]
        previous = np.array([outcome.cell_previous for _, outcome in seen])
        known, num_known = step.committed_grid([i for i, _ in seen], grid.shape[2])
        self.acceptance.observe_grid(self._rows, grid, votes, previous, known, num_known)
        for _, outcome in seen:
            outcome.batch = None

    def draft(self, step: VerifyStep, rows: Sequence[int], states: Sequence[RequestState],
              sources: Mapping[str, DraftSource]) -> list[np.ndarray]:
        outcomes = self.observe(step, rows, states)
        knee, floor = self.cost.knee_tokens, self.cost.floor_tokens
        if self.stop_when_compute_bound and drafts_cost_time(len(step), knee, floor):
            for name in self.names:
                follow = getattr(sources[name], "follow", None)
                if follow is not None:
                    follow(step, rows, states)
            return [EMPTY] * len(rows)
        rooms = step.rooms[np.asarray(rows, dtype=np.int64)]
        lengths = rooms.tolist()
        candidates = gather(sources, self.names, step, rows, lengths, states)
        width = int(rooms.max())
        grid = np.full((len(rows), len(self.names), width), -1, dtype=np.int64)
        sizes = np.zeros((len(rows), len(self.names)), dtype=np.int64)
        for s, name in enumerate(self.names):
            sizes[:, s] = pack(candidates[name], grid[:, s])
        votes = self.acceptance.grid_votes(grid)
        previous = np.array([outcome.previous for outcome in outcomes], dtype=np.int64)
        kept = (grid, votes)
        for r, outcome in enumerate(outcomes):
            outcome.batch, outcome.row, outcome.cell_previous = kept, r, outcome.previous
        # a request without a tail is offered a restart block of its room, valued as the tail
        # it buys (drafted after a miss, agreeing with nothing); drawn only where chosen
        bare = sizes[:, self._tail] == 0
        cell_previous = np.repeat(previous[:, None], len(self.names), axis=1)
        if bare.any():
            votes = votes.copy()
            votes[bare, self._tail] = 0
            cell_previous[bare, self._tail] = MISSED
            sizes[bare, self._tail] = np.where(step.num_tokens[np.asarray(rows)[bare]] > 0,
                                               rooms[bare], 0)
        values = self.acceptance.grid_values(self._rows, votes, cell_previous)
        best = best_candidates(values, sizes, knee, floor, self.token_margin)
        chosen = np.flatnonzero(best >= 0)
        room_all = np.zeros((len(step), width), dtype=np.float64)
        caps = np.zeros(len(step), dtype=np.int64)
        at = np.asarray(rows, dtype=np.int64)[chosen]
        room_all[at] = values[chosen, best[chosen]]
        caps[at] = np.minimum(step.rooms[at], sizes[chosen, best[chosen]])
        sized = draft_lengths_grid(room_all, caps, knee, floor, token_margin=self.token_margin)
        drafts = [EMPTY] * len(rows)
        restarts = [j for j in chosen.tolist() if bare[j] and best[j] == self._tail
                    and sized[rows[j]] > 0]
        if restarts:
            drawn = sources[self.restart].propose(
                step, [rows[j] for j in restarts], [lengths[j] for j in restarts],
                [states[j] for j in restarts])[self.restart]
            for j, block in zip(restarts, drawn, strict=True):
                drafts[j] = block[:sized[rows[j]]]
        for j in chosen.tolist():
            n = int(sized[rows[j]])
            if n and not (bare[j] and best[j] == self._tail):
                drafts[j] = candidates[self.names[best[j]]][j][:n]
        return drafts


def pack(candidates: Sequence[np.ndarray], into: np.ndarray) -> np.ndarray:
    """Write each row's candidate into ``into`` ([R, K], already -1) from its first column;
    their lengths."""
    sizes = np.fromiter((len(c) for c in candidates), dtype=np.int64, count=len(candidates))
    if sizes.any():
        into[np.arange(into.shape[1]) < sizes[:, None]] = np.concatenate(candidates)
    return sizes
