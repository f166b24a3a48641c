"""Draft sources, policies, and the drafter that runs them over a verify step.

A **draft source** proposes candidate drafts for the requests of a step, under one or more
names (:class:`DraftSource`); a **policy** chooses among the sources' candidates and sizes the
drafts (:class:`Policy`); a :class:`Drafter` routes each drafting request to one policy and
keeps the one table of per-request state. ``jacobi`` and ``space`` are each a set of sources
and a policy (:mod:`vllm_cllm.methods`); the vLLM adapter (:mod:`vllm_cllm.proposers`) builds
the step and calls :meth:`Drafter.propose`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from vllm_cllm.core.requests import RequestState, RequestTable
from vllm_cllm.core.step import VerifyStep
from vllm_cllm.core.tokens import EMPTY

#: Per source name, one candidate per requested row.
Candidates = dict[str, list[np.ndarray]]


class DraftSource(Protocol):
    """A producer of candidate drafts, working on a whole verify step.

    Optional hooks a policy calls where the source has them: ``remember(step, rows,
    states)`` after it proposed (a source that keeps something of each step, e.g. the pool of
    iterates); ``levels(states)`` after it proposed, how strongly it backs each request's
    candidate (levels [R] and how many leading tokens are at that level [R]; the suffix
    trees). A source that keeps something across requests subscribes to the request table
    (``release``). A source that skipped steps catches up with the tokens committed meanwhile
    on its next call.
    """

    #: the names of the candidates it proposes (most sources propose one)
    names: tuple[str, ...]

    def propose(self, step: VerifyStep, rows: Sequence[int], lengths: Sequence[int],
                states: Sequence[RequestState]) -> Candidates:
        """For each name, up to ``lengths[j]`` tokens for request ``rows[j]`` (``EMPTY``:
        nothing); ``states[j]`` is that request's state."""


class Policy(Protocol):
    """Chooses and sizes the drafts of the requests routed to it."""

    def draft(self, step: VerifyStep, rows: Sequence[int], states: Sequence[RequestState],
              sources: Mapping[str, DraftSource]) -> list[np.ndarray]:
        """The draft of each request in ``rows`` (at most its room); the drafter gives
        ``rows`` in the step's order."""


class Drafter:
    """Sources and policies over whole verify steps, with the request table.

    Each drafting request (one with room) is routed to a policy by ``route`` (for the step
    and its drafting requests, each one's policy index, or one index for all of them;
    default: the first); the policies run in the order given, each over all of its requests
    at once.
    """

    def __init__(self, sources: Sequence[DraftSource], policies: Sequence[Policy],
                 route: Callable[[VerifyStep, list[int]], Sequence[int] | int] | None = None,
                 table: RequestTable | None = None) -> None:
        self.sources: dict[str, DraftSource] = {}
        for source in sources:
            for name in source.names:
                if name in self.sources:
                    raise ValueError(f"two draft sources are named {name!r}")
                self.sources[name] = source
        self.policies = list(policies)
        self.route = route
        self.table = table if table is not None else RequestTable()
        #: refines a policy's step cost model from timed verify steps, where one does
        #: (:class:`vllm_cllm.policies.measured_cost.CostMeasurement`); fed by the adapter
        self.cost_measurement: Any = None

    def propose(self, step: VerifyStep) -> list[np.ndarray]:
        """Every request's draft for the next step."""
        drafts = [EMPTY] * len(step)
        rows = step.drafting()
        if not rows:
            return drafts
        states = self.table.open_rows(step.req_ids, step.committed, rows)
        routes = self.route(step, rows) if self.route is not None else 0
        routed: list[tuple[list[int], list[RequestState]]] = [([], []) for _ in self.policies]
        if isinstance(routes, int):  # one policy takes them all
            routed[routes] = (rows, states)
        elif len(set(routes)) == 1:
            routed[routes[0]] = (rows, states)
        else:
            for i, state, to in zip(rows, states, routes, strict=True):
                mine, theirs = routed[to]
                mine.append(i)
                theirs.append(state)
        for policy, (mine, theirs) in zip(self.policies, routed, strict=True):
            if mine:
                chosen = policy.draft(step, mine, theirs, self.sources)
                for i, draft, state in zip(mine, chosen, theirs, strict=True):
                    drafts[i] = draft
                    state.last_drafted = len(draft)
        return drafts


def propose_each(step: VerifyStep, rows: Sequence[int], lengths: Sequence[int],
                 one: Callable[[int, int], np.ndarray]) -> list[np.ndarray]:
    """``one(i, n)`` for each request ``i`` of ``rows`` and its length ``n``, in order (for
    sources whose lookups are per request)."""
    return [one(i, n) for i, n in zip(rows, lengths, strict=True)]
