"""Draft sizing: how many draft tokens each request verifies this step.

A fixed k wins where a forward pass costs about the same for 1 or 16 query tokens (small
batches) and loses where the device is compute-bound (large batches), since there every
draft token costs as much as a committed one. The rule uses a cost model and the acceptance
seen so far — never timings, so every tensor-parallel rank drafts the same thing:

* a verify step over ``N`` query tokens costs ``max(floor, knee + N)`` (in units of one
  query token): above the floor each query token adds the same time (``knee``: the fixed
  part), below it the device is bound by reading the weights and extra query tokens come
  free; plus a small per-request overhead once anything is drafted (the spec-decode path).
  ``benchmarks/step_cost.py`` fits knee and floor on a machine (docs/results.md);
* each draft position of a request has an expected yield (the product of the acceptance
  rates of it and the tokens before it, :mod:`vllm_cllm.policies.acceptance`);
* positions are added best first while each one raises the step's expected tokens per cost,
  and the result is kept only if it beats drafting nothing by a margin (the requests that
  look best are partly the luckiest). This holds at every batch size: no batch size stops
  drafting by itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

#: Extra cost of a step that verifies any draft at all, per request in the batch, in query
#: tokens: the spec-decode path (multi-token attention, rejection sampler) costs more than a
#: plain decode step even for a few drafts.
SPEC_STEP_OVERHEAD_PER_REQUEST = 0.25
#: How much more a step's drafts must promise than what their cost would buy without them
#: (the batch's own tokens at the plain rate), or nothing is drafted. The requests that clear
#: a thin bar are those whose recent drafts were luckiest, so their estimates overstate the
#: next draft (the winner's curse). On the drafts alone, not the whole step's rate: a bar on
#: the step's rate would ask a batch of B to gain a share of B tokens, a cut-off by batch size.
DRAFT_MARGIN = 0.1
#: Default of the option ``token_margin_pct``: each draft token's expected yield counts
#: ``1 / (1 + margin)`` of its estimate, so where a token costs time (above the floor) it is
#: drafted only if it beats its cost by that much. Below the floor nothing changes.
TOKEN_MARGIN_PCT = 30


@dataclass
class CostModel:
    """The step cost model's parameters in use: a step of ``B`` requests over ``N`` query
    tokens costs ``p·B + max(floor, knee + N)`` one-query-token units (``p``:
    ``per_request_tokens``, what a request costs on top of its query tokens). Mutable: a
    measurement of the machine may refine them while the engine serves."""

    knee_tokens: float
    floor_tokens: float
    per_request_tokens: float = 0.0

    def at(self, batch: int) -> tuple[float, float]:
        """Knee and floor for a step of ``batch`` requests: the requests' own part added to
        both (a floor of 0 stays 0: none)."""
        extra = self.per_request_tokens * batch
        return self.knee_tokens + extra, self.floor_tokens + extra if self.floor_tokens \
            else 0.0


def step_cost(query_tokens: float | np.ndarray, knee_tokens: float, floor_tokens: float = 0.0
              ) -> float | np.ndarray:
    """What a verify step over ``query_tokens`` costs, in one-query-token units (the module's
    cost model); element-wise for an array of token counts (one call per candidate, not one
    per position, on the proposer's per-step path)."""
    if isinstance(query_tokens, np.ndarray):
        return np.maximum(floor_tokens, knee_tokens + query_tokens)
    return max(floor_tokens, knee_tokens + query_tokens)


@lru_cache(maxsize=64)
def draft_costs(width: int, knee_tokens: float, floor_tokens: float) -> np.ndarray:
    """[width] what a step costs a request on its own that drafts 1..width tokens (the spec
    overhead included), as :func:`best_candidate` prices it; cached, read-only."""
    costs = step_cost(1 + SPEC_STEP_OVERHEAD_PER_REQUEST + np.arange(1, width + 1),
                      knee_tokens, floor_tokens)
    costs.flags.writeable = False
    return costs


@lru_cache(maxsize=64)
def _batch_costs(batch: int, positions: int, overhead_per_request: float, knee_tokens: float,
                 floor_tokens: float) -> np.ndarray:
    """[positions + 1] what a step of ``batch`` requests that drafts 0..positions tokens costs
    (the overhead counted from the first), each count of tokens the running sum that
    :func:`draft_lengths_grid` takes; cached, read-only (a prefix of a running sum is the
    running sum of the prefix)."""
    tokens = np.cumsum(np.concatenate([[batch * (1 + overhead_per_request)],
                                       np.ones(positions)]))
    costs = np.maximum(floor_tokens, knee_tokens + tokens)
    costs.flags.writeable = False
    return costs


def batch_costs(batch: int, width: int, knee_tokens: float, floor_tokens: float) -> np.ndarray:
    """[batch * width + 1] what a step of ``batch`` requests that drafts 0.. tokens of a
    grid ``width`` wide costs, as :func:`draft_lengths_grid` prices it (cached, read-only)."""
    return _batch_costs(batch, batch * width, SPEC_STEP_OVERHEAD_PER_REQUEST, knee_tokens,
                        floor_tokens)


def draft_lengths(values: Sequence[Sequence[float]], rooms: list[int], knee_tokens: float,
                  floor_tokens: float = 0.0,
                  overhead_per_request: float = SPEC_STEP_OVERHEAD_PER_REQUEST,
                  margin: float = DRAFT_MARGIN, token_margin: float = 0.0) -> list[int]:
    """Draft tokens per request that maximise expected committed tokens per step cost.

    ``values[i][j]`` is the expected number of tokens that request i's draft position j + 1
    adds (non-increasing in j: the probability that it and every earlier draft token are
    accepted; :class:`vllm_cllm.policies.acceptance.TokenAcceptance`).
    ``rooms[i]`` caps request i (0 for a request in prefill, which still occupies the batch).
    A step costs ``max(floor_tokens, knee_tokens + query tokens)``, plus the overhead once
    anything is drafted. Greedy over positions in decreasing value is optimal for this ratio:
    the values of one request decrease with j; below the floor any positive value raises it;
    above, an item raises it exactly when its value exceeds it, and once one fails no later
    one (worth less) can pass. Drafting is then kept only if it beats not drafting at all by
    ``margin`` (relative). Each value counts ``1 / (1 + token_margin)`` of itself
    (:data:`TOKEN_MARGIN_PCT`).
    """
    width = max((len(v) for v in values), default=0)
    grid = np.zeros((len(values), width), dtype=np.float64)
    for i, v in enumerate(values):
        grid[i, :len(v)] = v
    caps = np.array([min(room, len(v)) for room, v in zip(rooms, values, strict=True)],
                    dtype=np.int64)
    return draft_lengths_grid(grid, caps, knee_tokens, floor_tokens, overhead_per_request,
                              margin, token_margin).tolist()


def draft_lengths_grid(values: np.ndarray, caps: np.ndarray, knee_tokens: float,
                       floor_tokens: float = 0.0,
                       overhead_per_request: float = SPEC_STEP_OVERHEAD_PER_REQUEST,
                       margin: float = DRAFT_MARGIN, token_margin: float = 0.0,
                       batch: int | None = None) -> np.ndarray:
    """:func:`draft_lengths` over a grid: ``values`` [R, K] (row i valid up to ``caps[i]``,
    already capped by its room), the requests in the step's order; ``batch``: the step's
    batch size where ``values`` holds only the requests that may draft (default R). The
    greedy is a merge of the rows' non-increasing values: all positions sorted by (value,
    highest first; request; position) come in exactly the order a heap of each request's
    next position pops them, and the running gain and cost are the same sums taken in the
    same order."""
    rows = len(values)
    batch = rows if batch is None else batch
    if not batch:
        return np.zeros(0, dtype=np.int64)
    caps = np.where(values[:, 0] > 0, caps, 0) if values.shape[1] else np.zeros_like(caps)
    which, where = (np.arange(values.shape[1]) < caps[:, None]).nonzero()
    value = values[which, where]
    # positions come by request, then position (np.nonzero's order): a stable sort by value
    # alone keeps that order among equal values
    order = (-value).argsort(kind="stable")
    trust = 1.0 / (1.0 + token_margin)
    gain = np.concatenate([[float(batch)], value[order] * trust]).cumsum()
    costs = _batch_costs(batch, batch * values.shape[1], overhead_per_request, knee_tokens,
                         floor_tokens)
    rate = gain / costs[:len(gain)]
    worse = (rate[1:] <= rate[:-1]).nonzero()[0]  # adding item m + 1 would not raise it
    taken = int(worse[0]) if len(worse) else len(order)
    if not beats_plain(float(gain[taken]), float(costs[taken]), batch, knee_tokens,
                       floor_tokens, margin):
        return np.zeros(rows, dtype=np.int64)
    return np.bincount(which[order[:taken]], minlength=rows).astype(np.int64)


def beats_plain(gain: float, cost: float, batch: int, knee_tokens: float, floor_tokens: float,
                margin: float = DRAFT_MARGIN) -> bool:
    """Whether a step of ``batch`` requests whose drafts bring it to ``gain`` expected tokens
    at ``cost`` is worth drafting: the tokens the drafts add must beat, by ``margin``, what
    the cost they add would have bought at the rate of drafting nothing. Below the floor,
    where drafts add no cost, any gain is."""
    plain_cost = step_cost(batch, knee_tokens, floor_tokens)
    return gain - batch > (1 + margin) * (cost - plain_cost) * batch / plain_cost
