"""Adaptive draft length: how many draft tokens each request verifies this step.

A fixed k wins at batch 1, where a forward pass costs about the same for 1 or 16 query
tokens, and loses at large batch, where the device is compute-bound and every draft token
costs as much as a committed one. The rule here uses a cost model and the acceptance seen so
far — never timings, so every tensor-parallel rank drafts the same thing:

* a verify step over ``N`` query tokens costs ``max(floor, knee + N)`` (in units of one
  query token): above the floor each query token adds the same time (``knee``: the fixed
  part), below it the device is bound by reading the weights and extra query tokens come free.
  On this 2-core CPU (SmolLM2-135M; ``benchmarks/step_cost.py`` fitted knee 24 and floor
  27.5 on 2026-11-25) the defaults are knee 24, floor 28: a 16-token verify at batch 1 costs
  about 1.4 one-token steps, at batch 16 a draft token per request about +36 %. GPUs stay
  memory-bound up to hundreds of query tokens (knee 256, no floor needed). Plus a small
  per-request overhead once anything is drafted (the spec-decode path);
* draft position ``j`` of a request yields ``first * cont**(j-1)`` tokens (its recent rate of
  first-token acceptance, then of continuing a run);
* positions are added best first while each one raises the step's expected tokens per cost,
  and the result is kept only if it beats drafting nothing by a margin (10 %: the requests
  that look best are partly the luckiest). At batch 1 the first ~2 draft
  tokens are free and longer drafts pay when runs keep being accepted;
* where the batch's own tokens make the device compute-bound (:func:`drafts_cost_time`:
  batch 8 and 16 on this CPU, a GPU only from ~86 requests) nothing is drafted: each draft
  token costs a good part of a request's step there, and in a closed batch only the slowest
  request's gain ends it sooner (README, "Batch 16"), so vLLM runs the step as plain decoding.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

#: Prior of a request with no history: first draft token accepted half the time, and each
#: later one, given the previous was accepted, half the time.
PRIOR_FIRST, PRIOR_CONTINUE = 0.5, 0.5
#: Extra cost of a step that verifies any draft at all, per request in the batch, in query
#: tokens: the spec-decode path (multi-token attention, rejection sampler) costs more than a
#: plain decode step even for a few drafts. Measured here: about 10 % of a batch-16 step.
SPEC_STEP_OVERHEAD_PER_REQUEST = 0.25
#: How much more drafting must promise than drafting nothing (expected tokens per cost), or
#: nothing is drafted. The requests that clear a thin bar are those whose recent drafts were
#: luckiest, so their estimates overstate the next draft (the winner's curse): on the base
#: model at batch 16 drafts chosen with no margin ran 0.93-0.96x of plain decoding.
DRAFT_MARGIN = 0.1
#: Default of the option ``token_margin_pct``: each draft token's expected yield counts
#: ``1 / (1 + margin)`` of its estimate, so where a token costs time (above the floor) it is
#: drafted only if it beats its cost by that much. Below the floor (batch 1's first few
#: tokens) nothing changes. In lock step on the CLLM demo (2026-11-25, README "Batch 16"):
#: batch 16 0.99x against 0.98x with no margin (gsm, 10 rounds) and 0.97x against 0.96x
#: (ShareGPT, 8 rounds); batch 1 (gsm, 12 rounds) 2.51 tokens per verify step either way.
#: Since batch 8 and up draft nothing here (:func:`drafts_cost_time`) it acts past the floor
#: at smaller batches (batch 5-7, a long draft at batch 1-4) and on a GPU below ~86 requests.
TOKEN_MARGIN_PCT = 30


def drafts_cost_time(batch: int, knee_tokens: float, floor_tokens: float) -> bool:
    """Whether the device is compute-bound at this batch: its own query tokens fill the
    floor and make up a quarter of the step's cost or more, so every draft token costs a
    good part of what a request's step does (batch 8 and 16 on this CPU; not batch 1 or 4,
    nor a GPU below ~86 requests). Adaptive k drafts nothing there (the proposer's
    ``_propose_nothing``, vllm_cllm/proposers/jacobi.py)."""
    return knee_tokens + batch > floor_tokens and 3 * batch >= knee_tokens


@dataclass
class AcceptanceRate:
    """Per-request estimate of how many of its draft tokens get accepted.

    Two numbers, as exponential moving averages over the steps that drafted: ``first``, the
    probability that the first draft token is accepted, and ``cont``, the probability that
    a later one is accepted given its predecessor was (accepted / (accepted + rejections)
    over positions 2..n). One geometric rate would let a few long n-gram runs hide that most
    first tokens miss. A step that drafted nothing carries no evidence; the estimate then
    drifts back towards the prior, so a request that stopped drafting is probed again later.
    """

    first: float = PRIOR_FIRST
    cont_accepted: float = PRIOR_CONTINUE
    cont_rejected: float = 1 - PRIOR_CONTINUE
    last_drafted: int = 0

    def observe(self, accepted: int, decay: float = 0.7, recover: float = 0.95) -> None:
        """Record the outcome of the previous step's draft (``accepted`` of ``last_drafted``)."""
        drafted = self.last_drafted
        if drafted > 0:
            self.first = decay * self.first + (1 - decay) * float(accepted > 0)
            if accepted > 0 and drafted > 1:
                self.cont_accepted = decay * self.cont_accepted + (1 - decay) * (accepted - 1)
                self.cont_rejected = decay * self.cont_rejected + (1 - decay) * float(
                    accepted < drafted)
        else:
            self.first = recover * self.first + (1 - recover) * PRIOR_FIRST
            self.cont_accepted = recover * self.cont_accepted + (1 - recover) * PRIOR_CONTINUE
            self.cont_rejected = recover * self.cont_rejected + (1 - recover) * (
                1 - PRIOR_CONTINUE)

    @property
    def cont(self) -> float:
        total = self.cont_accepted + self.cont_rejected
        return self.cont_accepted / total if total > 0 else 0.0

    def values(self, room: int) -> list[float]:
        """Expected tokens from each of ``room`` draft positions (:func:`draft_lengths`)."""
        return geometric_values(self.first, self.cont, room)


def geometric_values(first: float, cont: float, room: int) -> list[float]:
    """Position j (from 1) yields ``first * cont**(j-1)``."""
    return [first * cont ** j for j in range(room)]


def step_cost(query_tokens: float | np.ndarray, knee_tokens: float, floor_tokens: float = 0.0
              ) -> float | np.ndarray:
    """What a verify step over ``query_tokens`` costs, in one-query-token units (the module's
    cost model); element-wise for an array of token counts (one call per candidate, not one
    per position, on the proposer's per-step path)."""
    if isinstance(query_tokens, np.ndarray):
        return np.maximum(floor_tokens, knee_tokens + query_tokens)
    return max(floor_tokens, knee_tokens + query_tokens)


def draft_lengths(values: Sequence[Sequence[float]], rooms: list[int], knee_tokens: float,
                  floor_tokens: float = 0.0,
                  overhead_per_request: float = SPEC_STEP_OVERHEAD_PER_REQUEST,
                  margin: float = DRAFT_MARGIN, token_margin: float = 0.0) -> list[int]:
    """Draft tokens per request that maximise expected committed tokens per step cost.

    ``values[i][j]`` is the expected number of tokens that request i's draft position j + 1
    adds (non-increasing in j: the probability that it and every earlier draft token are
    accepted; :meth:`AcceptanceRate.values`, :class:`vllm_cllm.sizing.acceptance.TokenAcceptance`).
    ``rooms[i]`` caps request i (0 for a request in prefill, which still occupies the batch).
    A step costs ``max(floor_tokens, knee_tokens + query tokens)``, plus the overhead once
    anything is drafted. Greedy over positions in decreasing value is optimal for this ratio:
    the values of one request decrease with j; below the floor any positive value raises it;
    above, an item raises it exactly when its value exceeds it, and once one fails no later
    one (worth less) can pass. Drafting is then kept only if it beats not drafting at all by
    ``margin`` (relative). Each value counts ``1 / (1 + token_margin)`` of itself
    (:data:`TOKEN_MARGIN_PCT`).
    """
    batch = len(values)
    lengths = [0] * batch
    if not batch:
        return lengths
    caps = [min(room, len(v)) for room, v in zip(rooms, values, strict=True)]

    def cost(tokens: float) -> float:
        return step_cost(tokens, knee_tokens, floor_tokens)

    plain = batch / cost(batch)
    trust = 1.0 / (1.0 + token_margin)
    gain, tokens = float(batch), batch * (1 + overhead_per_request)
    heap = [(-float(values[i][0]), i) for i in range(batch) if caps[i] > 0 and values[i][0] > 0]
    heapq.heapify(heap)
    while heap:
        neg_value, i = heapq.heappop(heap)
        value = -neg_value * trust
        if (gain + value) / cost(tokens + 1) <= gain / cost(tokens):
            break
        lengths[i] += 1
        gain, tokens = gain + value, tokens + 1
        if lengths[i] < caps[i]:
            heapq.heappush(heap, (-float(values[i][lengths[i]]), i))
    return lengths if gain / cost(tokens) > plain * (1 + margin) else [0] * batch
