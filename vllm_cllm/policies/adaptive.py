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
from dataclasses import dataclass, field

import numpy as np

from vllm_cllm.core.drafter import DraftSource
from vllm_cllm.core.requests import RequestState
from vllm_cllm.core.step import VerifyStep
from vllm_cllm.core.tokens import EMPTY
from vllm_cllm.policies.acceptance import HIT, MISSED, UNDRAFTED, Cells, TokenAcceptance
from vllm_cllm.policies.cost_model import (
    SPEC_STEP_OVERHEAD_PER_REQUEST,
    CostModel,
    draft_lengths,
    drafts_cost_time,
    step_cost,
)
from vllm_cllm.policies.fixed_order import gather


def best_candidate(values: dict[str, np.ndarray], knee_tokens: float, floor_tokens: float,
                   token_margin: float = 0.0) -> str | None:
    """The candidate whose best prefix promises the most tokens per step cost for a request
    on its own; None if none beats drafting nothing (each value counting
    ``1 / (1 + token_margin)`` of itself). :func:`draft_lengths` then sizes the chosen one
    against the rest of the batch."""
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


@dataclass
class Outcome:
    """A request's record (state part ``adaptive``): its candidates of the last step, valued
    once vLLM has committed, and how its last draft fared."""

    candidates: dict[str, np.ndarray] = field(default_factory=dict)
    cells: Cells = field(default_factory=dict)
    previous: int = UNDRAFTED


class Adaptive:
    """Chooses among the candidates of ``names`` (the last being the model's tail, which a
    ``restart`` block stands in for) by learned acceptance and sizes them by the cost model
    ``max(floor_tokens, knee_tokens + N)`` (``cost``, which a measurement may refine).

    ``stop_when_compute_bound``: draft nothing, and build no candidate, at a batch whose own
    tokens make the device compute-bound (:func:`drafts_cost_time`), whatever the
    acceptance; without it the cost model weighs acceptance against cost at every batch."""

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

    def observe(self, step: VerifyStep, rows: Sequence[int],
                states: Sequence[RequestState]) -> list[Outcome]:
        """Value last step's candidates against what vLLM committed."""
        outcomes = []
        for i, state in zip(rows, states, strict=True):
            outcome = state.parts.get(self.part)
            committed = step.committed[i]
            if outcome is None:
                outcome = state.parts[self.part] = Outcome()
            else:
                outcome.previous = (HIT if len(committed) > 1 else MISSED) \
                    if state.last_drafted else UNDRAFTED
                if outcome.candidates:
                    self.acceptance.observe(outcome.candidates, outcome.cells, committed)
                    outcome.candidates, outcome.cells = {}, {}
            outcomes.append(outcome)
        return outcomes

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
        lengths = [int(step.rooms[i]) for i in rows]
        candidates = gather(sources, self.names, step, rows, lengths, states)
        bare = [j for j in range(len(rows)) if not len(candidates[self.tail][j])]
        restarts = dict(zip(bare, sources[self.restart].propose(
            step, [rows[j] for j in bare], [lengths[j] for j in bare],
            [states[j] for j in bare])[self.restart], strict=True)) if bare else {}
        chosen, values = {}, {}
        for j, outcome in enumerate(outcomes):
            mine = {name: candidates[name][j] for name in self.names if
                    name != self.tail or j not in restarts}
            cells = self.acceptance.cells(mine, outcome.previous)
            outcome.candidates, outcome.cells = mine, cells
            if j in restarts:  # valued as the tail it buys (drafted after a miss); not counted
                mine = {**mine, self.tail: restarts[j]}
                cells = {**cells, **self.acceptance.cells({self.tail: restarts[j]}, MISSED)}
            value = self.acceptance.values(cells)
            name = best_candidate(value, knee, floor, self.token_margin)
            chosen[rows[j]] = EMPTY if name is None else mine[name]
            values[rows[j]] = () if name is None else value[name]
        sized = draft_lengths([values.get(i, ()) for i in range(len(step))],
                              [int(r) for r in step.rooms], knee, floor,
                              token_margin=self.token_margin)
        return [chosen[i][:sized[i]] for i in rows]
