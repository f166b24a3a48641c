"""The one table of per-request state, and its one release path.

Every part of a drafter that remembers something about a running request (a source's pool,
a policy's scores, the tokens it committed) keeps it in that request's :class:`RequestState`,
under the part's own name. When a request leaves the batch (finished, aborted or preempted)
:meth:`RequestTable.retain` releases it: each subscriber that keeps something *across*
requests (the output history, the suffix trees) is told, with the request's state, and the
state is dropped.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(slots=True)
class RequestState:
    """What the drafter remembers about one running request."""

    #: the tokens it committed while it ran, kept where a subscriber wants them (the history)
    output: list[int] = field(default_factory=list)
    #: each part's own record, by the part's name
    parts: dict[str, Any] = field(default_factory=dict)
    #: draft tokens proposed for it last step
    last_drafted: int = 0
    #: (its prompt's tokens, the context length at which it stops: prompt + ``max_tokens``,
    #: at most the model's length), where vLLM says (a batch that drains: core/flow.py)
    limit: tuple[int, int] | None = None


class ReleaseListener(Protocol):
    def release(self, req_id: str, state: RequestState) -> None:
        """``req_id`` left the batch; ``state`` is what the table held for it."""


class RequestTable:
    """Request id → :class:`RequestState`, for the requests of the current batch."""

    def __init__(self) -> None:
        self._states: dict[str, RequestState] = {}
        self._listeners: list[ReleaseListener] = []
        #: whether states keep the tokens their request commits (a listener wants them)
        self.keeps_output = False

    def subscribe(self, listener: ReleaseListener, wants_output: bool = False) -> None:
        self._listeners.append(listener)
        self.keeps_output = self.keeps_output or wants_output

    def get(self, req_id: str | None) -> RequestState | None:
        return self._states.get(req_id) if req_id is not None else None

    def open(self, req_id: str | None, committed: list[int]) -> RequestState:
        """The request's state (new on its first step), with this step's committed tokens
        added to its output; a request without an id gets a state that is not kept."""
        return self.open_rows([req_id], [committed], [0])[0]

    def open_rows(self, req_ids: list[str | None], committed: list[list[int]],
                  rows: list[int]) -> list[RequestState]:
        """:meth:`open` for the requests ``rows`` of a step (ids ``req_ids[i]``, this step's
        tokens ``committed[i]``), in one pass."""
        states, get = self._states, self._states.get
        keeps_output = self.keeps_output
        opened = []
        for i in rows:
            req_id = req_ids[i]
            state = get(req_id) if req_id is not None else None
            if state is None:
                state = RequestState()
                if req_id is not None:
                    states[req_id] = state
            if keeps_output:
                state.output.extend(committed[i])
            opened.append(state)
        return opened

    def retain(self, live_req_ids: set[str]) -> None:
        """Release every request not in ``live_req_ids``, in the order they were opened."""
        for req_id in [r for r in self._states if r not in live_req_ids]:
            state = self._states.pop(req_id)
            for listener in self._listeners:
                listener.release(req_id, state)

    def __contains__(self, req_id: object) -> bool:
        return req_id in self._states

    def __iter__(self) -> Iterator[str]:
        return iter(self._states)

    def __len__(self) -> int:
        return len(self._states)

    def ids(self) -> set[str]:
        return set(self._states)

    def items(self) -> Iterable[tuple[str, RequestState]]:
        return self._states.items()
